"""The registry: `--algo NAME` -> Algorithm.

An algorithm is small and pure. It gives
  preset      Config values it starts from (a YAML file and the command line override them);
  advantages  (scores [n_groups, G] of the whole global batch, cfg) -> advantages, same shape;
  loss        (micro-batch tensors, cfg, global mini-batch counts) -> (loss, metrics),
              both already divided by the mini-batch's global counts (see algos/grpo.py).
A new method is one new file here plus its lines below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from algos import grpo


@dataclass(frozen=True)
class Algorithm:
    name: str
    preset: dict
    advantages: Callable
    loss: Callable


ALGORITHMS = {name: Algorithm(name, preset, grpo.batch_advantages, grpo.loss)
              for name, preset in grpo.PRESETS.items()}


def get(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"--algo {name!r}: unknown; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
