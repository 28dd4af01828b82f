"""Several reward terms, weighted: `--reward-terms correct=1,examples/brevity.py:brevity=0.3`.

A run's reward is then R = Σ_j w_j r_j over its terms: `correct`, the task's own grader (built in,
math-verify, or --reward's function), and functions of yours in --reward's plug-in form,
`path/to/file.py:function` (prompt, response, answer) -> float, or the batch form (prompts,
responses, answers) -> list, each run in worker processes under --grade-timeout as --reward runs
(grading.pool.RewardFunction). A term that raises, times out or returns anything but a finite
number scores 0 for that response and is counted, and the run goes on: reward/<name>_failures is the
number of responses of the batch (a training step's, on all ranks; an eval's samples) on which it
failed, the same count in training and eval (tasks.detail_means sums a detail named *_failures).
Its first failure's text (the exception, or the value returned) is said once per term on stderr by
each rank that meets it, and a step in which a term failed is followed by one line of the counts. A
term that fails on every response of ALL_FAILED_STEPS training steps in a row stops the run (a
RolloutError): it would only add a constant 0. A weight is a finite number ≥ 0, not all of them 0;
a term without `=w` weighs 1.

`Weighted` wraps the run's task (data.load builds it), so that every grader call of the trainer
and of eval goes through it: each Verdict's reward is R, its details hold every term's value
(reward/<name>, averaged over the batch into that metric, in eval too, and kept per response in
the logged samples) and reward/correct, the task's own grader's verdict, which eval counts as
correct whether or not it is a term. --algo gdpo (algos/gdpo.py) reads the terms apart
(docs/math.md §9); every other algorithm sees R.
"""
from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass

from tqdm import tqdm

from grading.pool import RewardFunction, reward_signature
from rewards import DataError, Problem, Verdict, plugin_spec
from tasks import Task

CORRECT = "correct"  # the task's own grader
ALL_FAILED_STEPS = 3  # training steps in a row in which a term failed on every response: the run stops
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
            terms.append(Term(reward_signature(spec, "--reward-terms")[1], w, spec))  # read, not run
        else:
            raise DataError(f"--reward-terms {value}: unknown term {spec!r}; a term is `{CORRECT}` (the task's grader) "
                            f"or path/to/file.py:function, each optionally =weight")
    names = [t.name for t in terms]
    clash = sorted({n for n in names if names.count(n) > 1} | set(names) & set(TAKEN))
    if clash:
        raise DataError(f"--reward-terms {value}: two terms named {', '.join(clash)}, or a name the batch's own "
                        f"reward/ metrics take ({', '.join(TAKEN)}): name each function apart")
    if not any(t.weight for t in terms):
        raise DataError(f"--reward-terms {value}: every weight is 0, so every reward would be 0 and nothing "
                        f"learned: give some term a weight > 0")
    return terms


class Weighted:
    """The run's task with its reward made of several terms (see the module docstring); everything else
    (its problems, prompt stream, name, budget) is the task's own."""

    def __init__(self, task: Task, terms: list[Term], timeout: float, workers: int):
        self.task, self.terms = task, terms
        self.functions = {t.name: RewardFunction(t.spec, timeout, workers, "--reward-terms") for t in terms if t.spec}
        self.first = {}  # term -> its first failure's text, said once
        self.all_failed = {}  # term -> training steps in a row in which it failed on every response

    def __getattr__(self, name):  # not a subclass of Task, whose defaults would hide the task's own
        return getattr(self.task, name)

    def grade_batch(self, items: list[tuple[Problem, str]], budget: float) -> list[Verdict]:
        verdicts = self.task.grade_batch(items, budget)
        scored = {name: f.grade_items(items, budget) for name, f in self.functions.items()}
        for name, verdicts_of_term in scored.items():
            failure = next((v.failure for v in verdicts_of_term if v.failure), "")
            if failure and name not in self.first:
                self.first[name] = failure
                rank = f" (rank {os.environ['RANK']})" if "RANK" in os.environ else ""
                print(f"warning: --reward-terms {self.functions[name].spec} failed{rank}: {failure}; such a response "
                      f"scores 0 for {name}, counted in reward/{name}_failures (said once)", file=sys.stderr,
                      flush=True)
        out = []
        for i, v in enumerate(verdicts):
            values = {CORRECT: v.reward, **{name: s[i].reward for name, s in scored.items()}}
            failed = {f"reward/{name}_failures": float(bool(s[i].failure)) for name, s in scored.items()}
            details = {**v.details, **{f"reward/{name}": r for name, r in values.items()}, **failed}
            out.append(Verdict(sum(t.weight * values[t.name] for t in self.terms), v.answer, v.failure, details))
        return out

    def stats(self, episodes: list, group_size: int) -> dict:
        """The task's own. Called once a training step with the whole batch (the same on every rank): says each
        term's failures on rank 0, and stops the run where a term failed on every response too long."""
        failed = {name: int(sum(e.details.get(f"reward/{name}_failures", 0.0) for e in episodes))
                  for name in self.functions}
        if any(failed.values()) and os.environ.get("RANK", "0") == "0":
            tqdm.write("reward terms failed: " + ", ".join(f"{name} on {n} of {len(episodes)} responses"
                                                          for name, n in failed.items() if n), file=sys.stderr)
        for name, n in failed.items():
            self.all_failed[name] = self.all_failed.get(name, 0) + 1 if n == len(episodes) else 0
            if self.all_failed[name] >= ALL_FAILED_STEPS:
                from rollout import RolloutError  # stats runs in training alone, where torch is loaded

                raise RolloutError(f"--reward-terms {self.functions[name].spec} failed on every response of "
                                   f"{ALL_FAILED_STEPS} steps in a row (first: {self.first.get(name, '?')}): fix the "
                                   f"function, or drop the term")
        return self.task.stats(episodes, group_size)

    def close(self) -> None:
        for f in self.functions.values():
            f.close()
        self.task.close()


def weighted(task: Task, cfg) -> Weighted:
    """The run's task with --reward-terms' terms (checked before any model loads: a function that does not
    import fails here, its worker started)."""
    return Weighted(task, parse_terms(cfg.reward_terms), cfg.grade_timeout, cfg.grade_workers)
