"""The registry: `--algo NAME` -> Algorithm (algos/base.py says what one is).

Each file listed in MODULES defines ALGORITHMS, its registry entries: a preset, an advantage, a
loss, the knobs it reads and what train.update must compute for it. A new method is one new file
here plus one line in MODULES (the file and the names it defines); config.py learns its knobs from
it, so nothing else changes. A run imports the file of its --algo alone (get); ALGORITHMS and
KNOBS, the whole registry, import every file the first time they are read (--help, the message
for a knob the chosen algorithm does not read).
SHARED_KNOBS, those of the pieces most losses share (algos/policy_gradient.py), are fields of every
run's Config: the trainer reads beta, tis_cap, mis_cap, the turn credit and the teacher whatever the algorithm.
`--top-entropy-quantile` (the 80/20 rule, algos/high_entropy.py) is a knob of every method here.
Which responses the update trains on is the `train_on` Config field, so a preset sets it (PSR, NSR).
"""
from __future__ import annotations

import functools
import importlib

from algos.base import Algorithm, Knob, LossInputs
from algos.policy_gradient import ADVANTAGE_KNOBS, AGGREGATE_KNOBS, CLIP_KNOBS, DUAL_CLIP, LOSS_AGG, TURN_CREDIT_KNOBS

MODULES = {  # file -> the --algo names its ALGORITHMS define
    "grpo": ("grpo", "dapo", "dr_grpo", "lite_ppo", "rloo", "maxrl"),
    "nsr": ("psr", "nsr", "w_reinforce"),
    "rover": ("rover",),
    "pacs": ("pacs",),
    "delethink": ("delethink",),
    "gspo": ("gspo",),  # the 2025-26 losses of docs/math.md §7
    "cispo": ("cispo",),
    "sapo": ("sapo",),
    "reinforce_pp": ("reinforce_pp",),
    "cov": ("clip_cov", "kl_cov"),
    "gdpo": ("gdpo",),  # several reward terms, docs/math.md §9
    "opd": ("opd",),  # on-policy distillation, docs/math.md §10
    "dppo": ("dppo_tv", "dppo_kl"),  # the 2026 losses of docs/math.md §11
    "gmpo": ("gmpo",),
    "opsm": ("opsm",),
    "sft": ("sft",),  # supervised fine-tuning on demonstrations, docs/math.md §12
}
# the frozen model a distillation loss reads in the reference's place (algos/opd.py): train.models loads it,
# so like beta it is a field of every run, refused (config.knob_checks) where the algorithm does not read it
TEACHER = Knob("teacher", "", "the teacher's model folder: frozen, scored on the student's sampled tokens; it "
               "must share the student's tokenizer")
SHARED_KNOBS = (*ADVANTAGE_KNOBS, *TURN_CREDIT_KNOBS, *CLIP_KNOBS, DUAL_CLIP, LOSS_AGG, *AGGREGATE_KNOBS, TEACHER)


def get(name: str) -> Algorithm:
    """The registry entry of --algo `name`, importing its file alone."""
    module = next((m for m, names in MODULES.items() if name in names), None)
    if module is None:
        raise ValueError(f"--algo {name!r}: unknown; choose one of {', '.join(n for ns in MODULES.values() for n in ns)}")
    return next(a for a in importlib.import_module(f"algos.{module}").ALGORITHMS if a.name == name)


@functools.cache
def _registry() -> tuple[dict, dict]:
    """(name -> Algorithm, knob name -> Knob) over every file; one name must mean one knob (else a fork's
    two files disagree), and a file must define the names MODULES gives it."""
    algorithms, knobs = {}, {}
    for module, names in MODULES.items():
        entries = {a.name: a for a in importlib.import_module(f"algos.{module}").ALGORITHMS}
        if tuple(entries) != names:
            raise ValueError(f"algos: {module}.py defines {', '.join(entries)}; MODULES says {', '.join(names)}")
        algorithms.update(entries)
    for algo in algorithms.values():
        for k in algo.knobs:
            if knobs.setdefault(k.name, k) != k:
                raise ValueError(f"algos: knob {k.name!r} of --algo {algo.name} differs from the one another "
                                 f"file declares ({knobs[k.name]}); declare it once and import it")
    return algorithms, knobs


def __getattr__(name: str):
    """ALGORITHMS (name -> Algorithm) and KNOBS (knob name -> Knob): the whole registry, built when first read."""
    if name in ("ALGORITHMS", "KNOBS"):
        return _registry()[name == "KNOBS"]
    raise AttributeError(f"module 'algos' has no attribute {name!r}")


__all__ = ["ALGORITHMS", "Algorithm", "KNOBS", "Knob", "LossInputs", "MODULES", "SHARED_KNOBS", "TEACHER", "get"]
