"""The registry: `--algo NAME` -> Algorithm.

An algorithm is small and pure. It gives
  preset      Config values it starts from (a YAML file and the command line override them);
  advantages  (scores [n_groups, G] of the whole global batch, cfg) -> advantages, same shape;
  loss        (micro-batch tensors, cfg, global mini-batch counts) -> (loss, metrics),
              both already divided by the mini-batch's global counts (see algos/grpo.py);
and declares what train.update must compute for it:
  vocab_mean  the loss reads mb["vocab_mean"] and mb["old_vocab_mean"] (ROVER)
  whole_groups  every group sits whole inside one micro-batch (PACS compares a group's rows)
  response_tokens  advantages also gets tokens [n_groups, G]: the tokens of each response that the
              loss trains on (REINFORCE++ whitens over the batch's tokens, not its responses);
              the others keep the two-argument call
  select_tokens  (tokens, cfg, generator) -> bool [N]: a choice of tokens that needs the whole
              mini-batch (Clip-Cov, KL-Cov). tokens: flat [N] tensors of the mini-batch on all
              ranks, in one order (response after response): logp at the current weights, old_logp,
              entropy, adv, mask; the generator is seeded alike on every rank. The loss reads the
              result as mb["selected"] [n, T] (train.token_flags).
`--top-entropy-quantile` (the 80/20 rule, algos/high_entropy.py) works with every algorithm:
train.update detaches logp of the tokens below the mini-batch's entropy quantile.
Which responses the update trains on is the `train_on` knob, so a preset sets it (PSR, NSR).
A new method is one new file here plus its lines below.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from algos import cispo, cov, delethink, grpo, gspo, nsr, pacs, reinforce_pp, rover, sapo


@dataclass(frozen=True)
class Algorithm:
    name: str
    preset: dict
    advantages: Callable
    loss: Callable
    vocab_mean: bool = False
    whole_groups: bool = False
    response_tokens: bool = False
    select_tokens: Callable | None = None


ALGORITHMS = {
    **{name: Algorithm(name, preset, grpo.batch_advantages, grpo.loss)
       for name, preset in grpo.PRESETS.items()},
    **{name: Algorithm(name, preset, nsr.advantages, grpo.loss) for name, preset in nsr.PRESETS.items()},
    "rover": Algorithm("rover", rover.PRESET, rover.advantages, rover.loss, vocab_mean=True),
    "pacs": Algorithm("pacs", pacs.PRESET, pacs.advantages, pacs.loss, whole_groups=True),
    # Markovian thinking is the rollout (rollout.Chunking); its loss is GRPO's with trace-level
    # aggregation, which train.update provides for every algorithm (see algos/delethink.py)
    "delethink": Algorithm("delethink", delethink.PRESET, grpo.batch_advantages, grpo.loss),
    # SPEC §7, the 2025-26 losses
    "gspo": Algorithm("gspo", gspo.PRESET, grpo.batch_advantages, gspo.loss),
    "cispo": Algorithm("cispo", cispo.PRESET, grpo.batch_advantages, cispo.loss),
    "sapo": Algorithm("sapo", sapo.PRESET, grpo.batch_advantages, sapo.loss),
    "reinforce_pp": Algorithm("reinforce_pp", reinforce_pp.PRESET, reinforce_pp.advantages, grpo.loss,
                              response_tokens=True),
    "clip_cov": Algorithm("clip_cov", cov.PRESETS["clip_cov"], grpo.batch_advantages, cov.clip_cov_loss,
                          select_tokens=cov.select_clip_cov),
    "kl_cov": Algorithm("kl_cov", cov.PRESETS["kl_cov"], grpo.batch_advantages, cov.kl_cov_loss,
                        select_tokens=cov.select_kl_cov),
}


def get(name: str) -> Algorithm:
    if name not in ALGORITHMS:
        raise ValueError(f"--algo {name!r}: unknown; choose one of {', '.join(ALGORITHMS)}")
    return ALGORITHMS[name]
