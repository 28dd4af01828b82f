"""Several reward terms, weighted: `--reward-terms correct=1,examples/brevity.py:brevity=0.3`.

A run's reward is then R = Σ_j w_j r_j over its terms: `correct`, the task's own grader (built in,
math-verify, or --reward's function), and functions of yours in --reward's plug-in form,
`path/to/file.py:function` (prompt, response, answer) -> float, or the batch form (prompts,
responses, answers) -> list, each run in worker processes under --grade-timeout as --reward runs
(grading.pool.RewardFunction). A term that raises, times out or returns anything but a finite
number scores 0 for that response and is counted (reward/<name>_failures), and the run goes on.
A weight is a finite number ≥ 0; a term without `=w` weighs 1.

`Weighted` wraps the run's task (data.load builds it), so that every grader call of the trainer
and of eval goes through it: each Verdict's reward is R, its details hold every term's value
(reward/<name>, averaged over the batch into that metric, in eval too, and kept per response in
the logged samples) and reward/correct, the task's own grader's verdict, which eval counts as
correct whether or not it is a term. --algo gdpo (algos/gdpo.py) reads the terms apart
(docs/math.md §9); every other algorithm sees R.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from grading.pool import RewardFunction, reward_signature
from rewards import DataError, Problem, Verdict, plugin_spec
from tasks import Task

CORRECT = "correct"  # the task's own grader
TAKEN = ("mean", "std", "zero_std_groups", "grader_failures")  # the batch's own reward/ metrics


@dataclass(frozen=True)
class Term:
    name: str  # its metric is reward/<name>: `correct`, or the function's name
    weight: float
    spec: str = ""  # path/to/file.py:function; "" for the task's own grader


def parse_terms(value: str) -> list[Term]:
    """--reward-terms -> its terms, or a DataError naming what is wrong: an unknown term, a weight that is not
    a finite number ≥ 0, a function that is not there, two terms of one name. "correct=1,ex/b.py:brevity=0.3"
    -> [Term("correct", 1.0), Term("brevity", 0.3, "ex/b.py:brevity")]."""
    terms = []
    for part in (p.strip() for p in value.split(",")):
        spec, _, weight = part.rpartition("=") if "=" in part else (part, "", "1")
        try:
            w = float(weight)
        except ValueError:
            w = math.nan
        if not (math.isfinite(w) and w >= 0):
            raise DataError(f"--reward-terms {value}: the weight of {spec or part!r} is {weight!r}; give a finite "
                            f"number ≥ 0 (name=weight)")
        if spec == CORRECT:
            terms.append(Term(CORRECT, w))
        elif plugin_spec(spec):
            terms.append(Term(reward_signature(spec)[1], w, spec))  # the file and its function, read, not run
        else:
            raise DataError(f"--reward-terms {value}: unknown term {spec!r}; a term is `{CORRECT}` (the task's grader) "
                            f"or path/to/file.py:function, each optionally =weight")
    names = [t.name for t in terms]
    clash = sorted({n for n in names if names.count(n) > 1} | set(names) & set(TAKEN))
    if clash:
        raise DataError(f"--reward-terms {value}: two terms named {', '.join(clash)}, or a name the batch's own "
                        f"reward/ metrics take ({', '.join(TAKEN)}): name each function apart")
    return terms


class Weighted:
    """The run's task with its reward made of several terms (see the module docstring); everything else
    (its problems, prompt stream, name, budget) is the task's own."""

    def __init__(self, task: Task, terms: list[Term], timeout: float, workers: int):
        self.task, self.terms = task, terms
        self.functions = {t.name: RewardFunction(t.spec, timeout, workers) for t in terms if t.spec}

    def __getattr__(self, name):  # not a subclass of Task, whose defaults would hide the task's own
        return getattr(self.task, name)

    def grade_batch(self, items: list[tuple[Problem, str]], budget: float) -> list[Verdict]:
        verdicts = self.task.grade_batch(items, budget)
        scored = {name: f.grade_items(items, budget) for name, f in self.functions.items()}
        out = []
        for i, v in enumerate(verdicts):
            values = {CORRECT: v.reward, **{name: s[i].reward for name, s in scored.items()}}
            failed = {f"reward/{name}_failures": float(bool(s[i].failure)) for name, s in scored.items()}
            details = {**v.details, **{f"reward/{name}": r for name, r in values.items()}, **failed}
            out.append(Verdict(sum(t.weight * values[t.name] for t in self.terms), v.answer, v.failure, details))
        return out

    def stats(self, episodes: list, group_size: int) -> dict:
        """The task's own, and each function term's failures counted over the batch (as grader_failures is)."""
        failures = {key: float(sum(e.details.get(key, 0.0) for e in episodes))
                    for key in (f"reward/{name}_failures" for name in self.functions)}
        return {**self.task.stats(episodes, group_size), **failures}

    def close(self) -> None:
        for f in self.functions.values():
            f.close()
        self.task.close()


def weighted(task: Task, cfg) -> Weighted:
    """The run's task with --reward-terms' terms (checked before any model loads: a function that does not
    import fails here, its worker started)."""
    return Weighted(task, parse_terms(cfg.reward_terms), cfg.grade_timeout, cfg.grade_workers)
