"""--data -> the run's task, training problems and held-out problems, read and checked before any
model is loaded (train.py and eval.py alike).

A source is a built-in task or a task of your own (tasks.py), a data file, a saved dataset folder or a
Hub dataset by name (grading/files.py), or a file of code problems (grading/code.py), imported only then;
several sources make one mixed task (grading/mixed.py).
"""
from __future__ import annotations

from pathlib import Path

from config import CODE_KNOBS, RunConfig, data_weights, held_out_files, sources
from rewards import DataError, Problem
from tasks import TASKS, RunningSumTask, Task, domain_name, has_own_splits, load_task, plugin_spec, with_template


def load(cfg: RunConfig) -> tuple[Task, list[Problem], list[Problem]]:
    """(task, train problems, held-out problems). Each source keeps eval_problems held-out problems;
    in a mixed run (several --data sources) the task is an grading.mixed.MixedTask and every problem carries
    its source's name (Problem.domain)."""
    srcs, mixed = sources(cfg), "," in cfg.data
    code_file = {src: code_problems(src) for src in srcs}  # each reads the file's first row
    loaded = {}
    for src, held_out in zip(srcs, held_out_files(cfg)):
        task = make_task(src, sum_min_terms=cfg.sum_min_terms, sum_max_terms=cfg.sum_max_terms,
                         sum_digits=cfg.sum_digits, grade_timeout=cfg.grade_timeout, grade_workers=cfg.grade_workers,
                         grade_budget=cfg.grade_budget, grade_cpu=cfg.grade_cpu,
                         code=dict(template=cfg.code_template, isolation=cfg.sandbox, timeout=cfg.sandbox_timeout,
                                   memory=cfg.sandbox_memory),
                         reward="" if mixed and code_file[src] else cfg.reward)  # a code file has its tests
        problems, held = task.splits()
        if held_out:
            held = task.read(held_out)
        held = held[:cfg.eval_problems or None]
        template = "" if code_file[src] else cfg.prompt_template  # a code file's recipe (--code-template) is its own
        problems, held = (with_template(problems, template, cfg.system_prompt),
                          with_template(held, template, cfg.system_prompt))
        loaded[domain_name(src)] = task, problems, held
    code_files = [src for src in srcs if code_file[src]]
    unread = [f"{name}={getattr(cfg, name)!r}" for name in CODE_KNOBS
              if getattr(cfg, name) != RunConfig.__dataclass_fields__[name].default
              and not (getattr(cfg, "env", "") == "python" and name.startswith("sandbox"))]  # --env python's too
    if unread and not code_files:
        raise DataError(f"{', '.join(unread)}: no source of --data {cfg.data} is a file of code problems (rows "
                        f"with tests), so nothing reads it; leave it at its default")
    if cfg.prompt_template and len(code_files) == len(srcs):
        from grading.code import CODE_TEMPLATES

        raise DataError(f"--prompt-template {cfg.prompt_template}: --data {cfg.data} is code problems, whose "
                        f"prompt recipe is --code-template ({', '.join(CODE_TEMPLATES)})")
    if not (mixed or cfg.reward_terms):
        return loaded[domain_name(srcs[0])]
    return composed(loaded, cfg, mixed)


def composed(loaded: dict, cfg: RunConfig, mixed: bool) -> tuple[Task, list[Problem], list[Problem]]:
    """load's sources made one task (grading/mixed.py) when several, its reward made of --reward-terms' terms
    (grading/terms.py) when given: each file imported only then."""
    if mixed:
        from grading.mixed import mix

        task, problems, held = mix(loaded, data_weights(cfg))
    else:
        [(task, problems, held)] = loaded.values()
    if cfg.reward_terms:
        from grading.terms import weighted

        task = weighted(task, cfg)
    return task, problems, held


def code_problems(src: str) -> bool:
    """Whether a --data source is a file of code problems (grading.files.is_code_file reads its first
    row); a built-in task or a task of your own never is."""
    if has_own_splits(src):
        return False
    from grading.files import is_code_file

    return is_code_file(src)


def make_task(data: str, *, sum_min_terms: int = 3, sum_max_terms: int = 5, sum_digits: int = 2,
              grade_timeout: float = 10.0, grade_workers: int = 4, grade_budget: float = 0.0,
              grade_cpu: float = 4.0, reward: str = "", code: dict | None = None) -> Task:
    """One --data source -> its Task: a name of TASKS, path/to/file.py:Class, a file of code
    problems (CodeTask, built with `code`, its keyword arguments), or any other data file, a saved dataset
    folder or a Hub dataset org/name[:config[:split]] (graded by math-verify, or by the --reward function)."""
    if data == "running_sum":
        return RunningSumTask(sum_min_terms, sum_max_terms, sum_digits)
    if data == "countdown":
        from grading.countdown import CountdownTask  # the task and its grader in one file, read only by countdown runs

        return CountdownTask()
    if plugin_spec(data):
        return load_task(data)
    if code_problems(data):
        if reward:
            raise DataError(f"--reward {reward}: {data} is a file of code problems (its rows have tests), "
                            f"graded by running them; drop --reward")
        from grading.code import CodeTask  # the sandbox is imported only when a run has code problems

        return CodeTask(data, workers=grade_workers, budget=grade_budget, **(code or {}))
    from grading.files import DATA_SUFFIXES, FileTask, is_dataset_name  # rows, golds, math-verify or --reward

    if data.endswith(DATA_SUFFIXES) or Path(data).exists() or is_dataset_name(data):
        return FileTask(data, grade_timeout, grade_workers, grade_budget, reward=reward, cpu=grade_cpu)
    raise DataError(f"--data {data!r}: not a built-in task ({', '.join(TASKS)}), a .jsonl/.json/.parquet "
                    f"file, a saved dataset folder, a Hub dataset org/name[:config[:split]], nor path/to/file.py:Class")
