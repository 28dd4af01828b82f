"""Tasks: where the problems come from, and who grades them (`--data`).

A task hands out `Problem`s (a prompt and a gold answer, rewards.Problem) and grades a response
to one with a `Verdict` (the reward and the extracted answer, which maj@n votes on). The protocol
is the `Task` base class below; `TASKS` names the built-in ones:

- `running_sum`: "Add 12+7+35" -> scratchpad of partial sums, answer in a tag:
  "12+7=19 19+35=54 <answer>54</answer>". Knobs: number of terms, digits per term, so traces
  can be made as long as Markovian-thinking experiments need.
- `countdown` (TinyZero format): reach a target with each given number used once; the grader
  parses the arithmetic itself (never Python `eval` on model output). Its task and grader are
  grading/countdown.py's, read only by a countdown run.

Any other `--data` is a data file (JSONL, a JSON list, parquet) in the usual schemas, read and
graded by math-verify or by your own `--reward path/to/file.py:function` (grading/files.py), or a
file of code problems graded in the sandbox (grading/code.py); or `path/to/file.py:Class`, a task
of your own (examples/task_small_sums.py). data.py turns `--data` into tasks; several sources at
once are grading/mixed.py's. The official prompt templates of the papers (`--prompt-template`) are
here too: they wrap a task's problems before training (code RL's, `--code-template`, are grading/code.py's).
"""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np

from rewards import DataError, Problem, Verdict, grade_running_sum, graded, plugin_spec

TRAIN_SIZE, HELDOUT_SIZE = 20000, 500  # sampled splits; held-out prompts never appear in train


class Task:
    """What `--data` names. A task of your own subclasses this and defines

        sample(rng) -> (Problem, anything)   one problem drawn with a random.Random; the seeded
                                             train and held-out splits then come for free (splits)
          or splits() -> (train, held-out)   two lists of Problem, if the task has fixed ones
        grade(problem, response) -> Verdict  or a plain number, the reward

    grade runs in the trainer's process, one response after another (grade_batch); an exception
    or a return that is not a number scores 0 and is counted in reward/grader_failures. Like the
    built-in graders, it should read a bounded part of the response: a model's output is hostile
    input. A grader you do not trust to be fast belongs in a reward function on a data file
    (`--reward`), which runs in worker processes with a timeout.

    The trainer also asks a task for its prompt stream (`stream`) and for metrics of its own on
    each batch (`stats`); the defaults serve one source, and a mixed run (grading/mixed.py) overrides both.
    """

    name = "task"  # names the seeded splits, so two tasks never share a held-out split by accident
    budget = 0.0  # seconds grade_batch may spend on one batch; 0 = no limit
    warnings: tuple[str, ...] = ()  # what the run should say at its start (rank 0): a weak sandbox

    def sample(self, rng: random.Random) -> tuple[Problem, object]:
        raise NotImplementedError(f"{type(self).__name__} defines neither sample(rng) nor splits()")

    def splits(self) -> tuple[list[Problem], list[Problem]]:
        """(train, held-out) problems."""
        return builtin_splits(self)

    def read(self, path: str) -> list[Problem]:
        """The held-out problems of an --eval-data file; only the tasks of data files read one
        (config.py stops a run that gives one to any other task)."""
        raise DataError(f"--eval-data {path}: task {self.name} has its own held-out problems")

    def grade(self, problem: Problem, response: str) -> Verdict:
        raise NotImplementedError

    def grade_batch(self, items: list[tuple[Problem, str]], budget: float) -> list[Verdict]:
        """One Verdict per (problem, response), in order: the built-in graders take milliseconds on
        any response, so one after another."""
        return [graded(self.grade, problem, response) for problem, response in items]

    def stream(self, problems: list[Problem], seed: int) -> PromptStream:
        """The run's training prompts in order (train.py asks for each step's batch)."""
        return PromptStream(problems, seed)

    def stats(self, episodes: list, group_size: int) -> dict:
        """Metrics of this task on a batch of graded episodes (rollout.Episode), beside the
        trainer's own; none here."""
        return {}

    def close(self) -> None:
        """Stop what the task started (grading workers)."""


class PromptStream:
    """Prompt number i of the run -> a training problem, reshuffled every epoch with the seed.
    The run's position in this stream (train.py's data_pos) is part of the trainer state, so resume
    is exact; state() is whatever else the stream needs to resume (nothing here)."""

    def __init__(self, problems: list[Problem], seed: int):
        self.problems, self.seed, self._epoch, self._perm = problems, seed, -1, None

    def get(self, start: int, count: int) -> list[Problem]:
        out = []
        for i in range(start, start + count):
            epoch, j = divmod(i, len(self.problems))
            if epoch != self._epoch:
                self._epoch = epoch
                self._perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))
            out.append(self.problems[self._perm[j]])
        return out

    def state(self) -> dict:
        return {}

    def load(self, state: dict) -> None:
        pass


def detail_means(details: list[dict]) -> dict:
    """The mean of each grader detail (Verdict.details) over the responses that have it, but a count, the
    sum, for one named *_failures (a reward term's, grading/terms.py: the responses it failed on, as
    grader_failures counts): [{"code/tests_passed": 0.5}, {"code/tests_passed": 1.0}, {}] ->
    {"code/tests_passed": 0.75}; {} for graders without details (the built-in ones). Training and eval
    logs both use it."""
    values: dict[str, list] = {}
    for d in details:
        for name, value in d.items():
            values.setdefault(name, []).append(value)
    return {name: float(np.sum(v) if name.endswith("_failures") else np.mean(v)) for name, v in values.items()}


def per_domain(name: str, domain: str) -> str:
    """A metric's name for one source of a mixed run, in training and eval logs alike: the source
    after the name's first part. ("code/tests_passed", "lcb") -> "code/lcb/tests_passed";
    ("eval/pass@1", "lcb") -> "eval/lcb/pass@1"; ("reward", "lcb") -> "reward/lcb"."""
    head, _, tail = name.partition("/")
    return f"{head}/{domain}/{tail}" if tail else f"{head}/{domain}"


# ----------------------------------------------------------------------------- built-in tasks

class RunningSumTask(Task):
    """Add a list of integers; the response writes the partial sums, then the answer.

    "Add 12+7+35" -> "12+7=19 19+35=54 <answer>54</answer>"
    """

    name = "running_sum"

    def __init__(self, min_terms: int = 3, max_terms: int = 5, digits: int = 2):
        if not 2 <= min_terms <= max_terms or digits < 1:
            raise DataError(f"running_sum: need 2 <= sum_min_terms ({min_terms}) <= sum_max_terms "
                            f"({max_terms}) and sum_digits ({digits}) >= 1")
        self.min_terms, self.max_terms, self.digits = min_terms, max_terms, digits

    def sample(self, rng: random.Random) -> tuple[Problem, list[int]]:
        n = rng.randint(self.min_terms, self.max_terms)
        terms = [rng.randint(1, 10 ** self.digits - 1) for _ in range(n)]
        return Problem(prompt="Add " + "+".join(map(str, terms)), answer=str(sum(terms))), terms

    @staticmethod
    def solution(terms: list[int]) -> str:
        """The reference response, used to pre-train the shipped tiny model."""
        steps, total = [], terms[0]
        for t in terms[1:]:
            steps.append(f"{total}+{t}={total + t}")
            total += t
        return " ".join(steps) + f" <answer>{total}</answer>"

    def grade(self, problem: Problem, response: str) -> Verdict:
        return grade_running_sum(problem, response)


# the built-in --data names; data.make_task builds each: a new built-in task is a class, a name here and a line there
TASKS = ("running_sum", "countdown")


def domain_name(data: str) -> str:
    """A --data source's name in a mixed run's metrics: a built-in task's name, else its file's
    stem: "running_sum" -> "running_sum", "data/math500.jsonl" -> "math500", "my.py:Task" -> "my"."""
    if data in TASKS:
        return data
    found = plugin_spec(data)
    return (found[0] if found else Path(data)).stem


def has_own_splits(data: str) -> bool:
    """Whether --data is a task with its own held-out split and grader (built in, or file.py:Class),
    rather than a data file."""
    return data in TASKS or plugin_spec(data) is not None


def load_task(spec: str) -> Task:
    """`path/to/file.py:Class` -> Class(), which must subclass Task. The file is imported into this
    process: it is code you wrote, like an algorithm file (a reward you want bounded is --reward)."""
    import importlib.util  # only a file.py:Class task imports a file
    import sys

    path, name = plugin_spec(spec)
    if not path.is_file():
        raise DataError(f"--data {spec}: no such file {path}")
    module_spec = importlib.util.spec_from_file_location(f"rlvr_task_{path.stem}", path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[module_spec.name] = module  # dataclasses and pickle look classes up by module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - any error in the user's file is theirs to see, named
        raise DataError(f"--data {spec}: importing {path} failed: {type(e).__name__}: {e}") from None
    cls = getattr(module, name, None)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise DataError(f"--data {spec}: {path} defines no class {name} that subclasses tasks.Task")
    return cls()


def builtin_splits(task: Task, seed: int = 0) -> tuple[list[Problem], list[Problem]]:
    """Seeded (train, held-out) splits of a task that samples its problems (the built-in ones);
    held-out prompts are kept out of train. The held-out split depends on the task's name and
    knobs only, never on the run's seed."""
    held_rng, train_rng = random.Random(f"{task.name}-heldout"), random.Random(f"{task.name}-{seed}")
    heldout = [task.sample(held_rng)[0] for _ in range(HELDOUT_SIZE)]
    seen = {p.prompt for p in heldout}
    train = []
    while len(train) < TRAIN_SIZE:
        p = task.sample(train_rng)[0]
        if p.prompt not in seen:
            train.append(p)
    return train, heldout


# ----------------------------------------------------------------------------- prompt templates

# The instruction each paper's official code wraps a problem in (`--prompt-template NAME`), read
# off its data preprocessing. The chat-format ones (nsr, dr_grpo) are the whole prompt: the
# official code writes the Qwen chat format by hand, so they need chat_template false.
BOXED = "Please reason step by step, and put your final answer within \\boxed{}."
PROMPT_TEMPLATES = {
    # ritzz-ai/PACS @ bbe1dc6, src/preprocess_dataset.py
    "pacs": "{problem} " + BOXED,
    # tinnerhrhe/ROVER @ b0fa587, the problems of Math/data/*.parquet and Math/eval/benchmarks
    "rover": "{problem} Let's think step by step and output the final answer within \\boxed{}.",
    # McGill-NLP/the-markovian-thinker @ 4478839, delethink_tracing_demo.py (its training YAML's
    # single-quoted '\n\n' reaches the model as a literal backslash-n; we use the demo's newlines)
    "delethink": "{problem}\n\n" + BOXED,
    # TianHongZXY/RLVR-Decomposed @ a5d4e7c, verl/utils/dataset/rl_dataset.py (prompt_template_type qwen)
    "nsr": "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n{problem}\n"
           + BOXED + "<|im_end|>\n<|im_start|>assistant\n",
    # sail-sg/understand-r1-zero @ dfca49d, train_zero_math.py (qwen_math)
    "dr_grpo": "<|im_start|>system\n" + BOXED + "<|im_end|>\n<|im_start|>user\n{problem}<|im_end|>\n"
               "<|im_start|>assistant\n",
    # BytedTsinghua-SIA/DAPO @ 33fe317, eval/aime-2024.parquet (DAPO-Math-17k is built the same way)
    "dapo": "Solve the following math problem step by step. The last line of your response should be of the "
            "form Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{problem}\n\n"
            "Remember to put your answer on its own line after \"Answer:\".",
    # volcengine/verl @ b178a3c, examples/data_preprocess/gsm8k.py
    "gsm8k": "{problem} Let's think step by step and output the final answer after \"####\".",
}


def prompt_template(template: str) -> str:
    """A --prompt-template value -> the format: a name of PROMPT_TEMPLATES, or a string holding
    {problem} once (other braces are kept as written, so \\boxed{} needs no escaping)."""
    text = PROMPT_TEMPLATES.get(template, template)
    if text.count("{problem}") != 1:
        raise DataError(f"--prompt-template {template!r}: give one of {', '.join(PROMPT_TEMPLATES)} or a "
                        f"string containing {{problem}} exactly once")
    return text


def with_template(problems: list[Problem], template: str, system: str = "") -> list[Problem]:
    """Each problem's prompt put into the template: "{problem} Answer briefly." with "2+2?" -> "2+2? Answer briefly.";
    and with `system` (--system-prompt: the text, or @FILE) a system turn before each prompt. A problem whose
    data row has a system turn of its own is refused beside it: neither is dropped in silence."""
    if not (template or system):
        return problems
    if template:
        text = prompt_template(template)
        problems = [dataclasses.replace(p, prompt=text.replace("{problem}", p.prompt)) for p in problems]
    if system:
        turn = {"role": "system", "content": system_text(system)}
        own = [p for p in problems if any(t["role"] == "system" for t in p.turns)]
        if own:
            raise DataError(f"--system-prompt: {len(own)} problem(s) carry their own system turn (the first: "
                            f"{own[0].prompt[:60]!r}); drop --system-prompt to keep the data's, or take the system "
                            f"turns out of the data to use this one")
        problems = [dataclasses.replace(p, turns=(turn, *p.turns)) for p in problems]
    return problems


def system_text(system: str) -> str:
    """--system-prompt's text: as given, or @FILE's contents ("@prompts/r1.txt"); a missing file is a DataError."""
    if not system.startswith("@"):
        return system
    path = Path(system[1:])
    if not path.is_file():
        raise DataError(f"--system-prompt {system}: no such file {path}; give the text, or @ and a file's path")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"--system-prompt {system}: {path} is not UTF-8 text ({e.reason} at byte {e.start}); "
                        f"save it as UTF-8") from None
    if not text.strip():
        raise DataError(f"--system-prompt {system}: {path} is empty; write the system prompt in it, or drop "
                        f"--system-prompt")
    return text
