"""The registry: `--algo NAME` -> Algorithm.

An algorithm is small and pure. It gives
  preset      Config values it starts from (a YAML file and the command line override them);
  advantages  (scores [n_groups, G] of the whole global batch, cfg) -> advantages, same shape;
  loss        (micro-batch tensors, cfg, global mini-batch counts) -> (loss, metrics),
              both already divided by the mini-batch's global counts (see algos/grpo.py);
and declares what train.update must compute for it:
  vocab_mean  the loss reads mb["vocab_mean"] and mb["old_vocab_mean"] (ROVER)
  whole_groups  every group sits whole inside one micro-batch (PACS compares a group's rows)
Which responses the update trains on is the `train_on` knob, so a preset sets it (PSR, NSR).
A new method is one new file here plus its lines below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from algos import delethink, grpo, nsr, pacs, rover


@dataclass(frozen=True)
class Algorithm:
    name: str
    preset: dict
    advantages: Callable
    loss: Callable
    vocab_mean: bool = False
    whole_groups: bool = False


ALGORITHMS = {
    **{name: Algorithm(name, preset, grpo.batch_advantages, grpo.loss)
       for name, preset in grpo.PRESETS.items()},
    **{name: Algorithm(name, preset, nsr.advantages, grpo.loss) for name, preset in nsr.PRESETS.items()},
    "rover": Algorithm("rover", rover.PRESET, rover.advantages, rover.loss, vocab_mean=True),
    "pacs": Algorithm("pacs", pacs.PRESET, pacs.advantages, pacs.loss, whole_groups=True),
    # Markovian thinking is the rollout (rollout.Chunking); its loss is GRPO's with trace-level
    # aggregation, which train.update provides for every algorithm (see algos/delethink.py)
    "delethink": Algorithm("delethink", delethink.PRESET, grpo.batch_advantages, grpo.loss),
}


def get(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"--algo {name!r}: unknown; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
