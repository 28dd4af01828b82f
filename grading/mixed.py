"""Several sources in one run: `--data running_sum,math.jsonl,code.jsonl --data-weights 0.5,0.3,0.2`.

Every problem carries its source's name (Problem.domain: a built-in task's name or a file's stem,
tasks.domain_name). `MixedTask` sends each response to its source's grader, the sources of a
batch at once; `MixedStream` draws each training prompt's source by weight, seeded, and resumes
exactly; `stats` logs each source's prompts, reward and grader details. train.py and eval.py see
only the Task protocol (tasks.Task: stream, stats); eval gives each metric per source as well.
"""
from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rewards import Problem, Verdict, graded
from tasks import PromptStream, Task, detail_means, per_domain


def mix(loaded: dict[str, tuple[Task, list[Problem], list[Problem]]], weights: list[float]):
    """{domain: (task, train, held-out)} of each source -> (MixedTask, train, held-out), every
    problem tagged with its domain."""
    tagged = {d: [[dataclasses.replace(p, domain=d) for p in ps] for ps in (train, held)]
              for d, (_, train, held) in loaded.items()}
    return (MixedTask({d: task for d, (task, _, _) in loaded.items()}, dict(zip(loaded, weights))),
            [p for train, _ in tagged.values() for p in train], [p for _, held in tagged.values() for p in held])


class MixedTask(Task):
    """Several sources in one run (`--data a,b,c --data-weights 0.5,0.3,0.2`): `sources` maps each
    domain name (domain_name) to its task, `weights` to its share of the training prompts
    (MixedStream draws them). A problem goes to the task of its Problem.domain; the domains of
    a batch grade at once, each within the budget, so a slow one does not hold up the others."""

    name = "mixed"

    def __init__(self, sources: dict[str, Task], weights: dict[str, float]):
        self.sources, self.weights = sources, weights
        self.warnings = tuple(note for task in sources.values() for note in task.warnings)

    def grade(self, problem: Problem, response: str) -> Verdict:
        return graded(self.sources[problem.domain].grade, problem, response)

    def grade_batch(self, items: list[tuple[Problem, str]], budget: float) -> list[Verdict]:
        rows: dict[str, list[int]] = {}
        for i, (problem, _) in enumerate(items):
            rows.setdefault(problem.domain, []).append(i)

        def grade(domain: str) -> list[Verdict]:
            task = self.sources[domain]
            return task.grade_batch([items[i] for i in rows[domain]], budget or task.budget)

        verdicts: list = [None] * len(items)
        with ThreadPoolExecutor(max(len(rows), 1)) as threads:
            for domain, graded_rows in zip(rows, threads.map(grade, rows)):
                for i, verdict in zip(rows[domain], graded_rows):
                    verdicts[i] = verdict
        return verdicts

    def stream(self, problems: list[Problem], seed: int) -> MixedStream:
        return MixedStream(problems, self.weights, seed)

    def stats(self, episodes: list, group_size: int) -> dict:
        """Per source: prompts/<d> (its prompts in the batch), reward/<d>, and its grader details
        named by tasks.per_domain (code/tests_passed -> code/<d>/tests_passed). A source drawn for
        no prompt of the batch logs only its count, 0."""
        out = {}
        for d in self.sources:
            mine = [e for e in episodes if e.problem.domain == d]
            out[per_domain("prompts", d)] = len(mine) // group_size
            if mine:
                out[per_domain("reward", d)] = float(np.mean([e.reward for e in mine]))
                out.update({per_domain(name, d): v for name, v in detail_means([e.details for e in mine]).items()})
        return out

    def close(self) -> None:
        for task in self.sources.values():
            task.close()


class MixedStream:
    """A mixed run's prompts: each batch of prompts draws its sources by weight, one draw per prompt
    seeded by the batch's first position, and each source hands out its own problems in its own
    PromptStream order. Where each source stands is trainer state (state / load), so a resumed run
    draws the same sources and problems.

    weights: {domain: share}, summing to 1. Batches must be asked for in order, from where the
    stream stands: get(0, 16), get(16, 16), ...
    """

    def __init__(self, problems: list[Problem], weights: dict[str, float], seed: int):
        self.seed, self.domains = seed, list(weights)
        self.p = np.array([weights[d] for d in self.domains])
        self.streams = {d: PromptStream([x for x in problems if x.domain == d], seed) for d in self.domains}
        self.at, self.taken = 0, {d: 0 for d in self.domains}  # prompts handed out: all, and per source

    def get(self, start: int, count: int) -> list[Problem]:
        if start != self.at:
            raise RuntimeError(f"MixedStream: asked for prompt {start}, but it stands at {self.at} (ask in order)")
        # the trailing 1 keeps these draws apart from PromptStream's [seed, epoch] permutations
        drawn = np.random.default_rng([self.seed, start, 1]).choice(len(self.domains), size=count, p=self.p)
        out = []
        for d in (self.domains[i] for i in drawn):
            out += self.streams[d].get(self.taken[d], 1)
            self.taken[d] += 1
        self.at += count
        return out

    def state(self) -> dict:
        return {"at": self.at, "taken": dict(self.taken)}

    def load(self, state: dict) -> None:
        self.at, self.taken = state["at"], {d: state["taken"].get(d, 0) for d in self.domains}
