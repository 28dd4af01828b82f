"""tutorial/grpo.py, GRPO in one file, is train.py's default path: the same run, number for number.

Both run with the same seed and settings for two steps (16 prompts × 8 samples, so one rank takes
its 128 responses in two micro-batches of 64 and two ranks one each; on three ranks 12 prompts, 32
responses a rank), with an eval before the first step and after the last. The rewards, losses,
gradient norms and eval accuracy they log must be equal as train.py logs them (6 decimals), and the
final weights equal bit for bit: there is no tolerance to state, because both do the same float
operations in the same order. What makes that hold on any number of ranks:
  - each rank's loss is already its share of the whole batch (divided by the global count of
    sequences), so the gradient of the batch is the plain sum of the ranks' and micro-batches'
    gradients: nothing is multiplied by the world size and divided again (g·3/3 is rounded);
  - micro-batches add into .grad in the same order in both;
  - ranks add in rank order, ((g_0 + g_1) + g_2) element by element: the file all-gathers each
    gradient and adds, train.py's DDP hook (parallel.sum_in_rank_order) does the same per bucket. An
    all-reduce would not do: gloo's adds in an order set by each element's place in the buffer, which
    differs between one tensor and DDP's bucket of many on 3 or more ranks (2 ranks: a + b = b + a).
When a default of train.py changes (its loss aggregation, clip, learning rate, schedule, sampling...),
the weights differ and this test fails until the file follows.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from helpers import ROOT, metrics, torchrun

FILE = ROOT / "tutorial" / "grpo.py"
EVAL = ["--eval-every", "2", "--eval-problems", "16"]  # with a batch of 32: two calls of 8 problems × 4 samples
FILE_FLAGS = ["--steps", "2", *EVAL, "--eval-batch", "32"]
TRAIN_FLAGS = ["--algo", "grpo", "--max-steps", "2", *EVAL, "--eval-batch-size", "32",
               "--report-to", "none"]


def test_the_file_is_one_sitting_and_imports_only_the_task():
    """At most 300 lines, and of the project only tasks.py (the problems and the grader)."""
    source = FILE.read_text()
    assert len(source.splitlines()) <= 300
    imported = {alias.name.split(".")[0] for node in ast.walk(ast.parse(source)) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(ast.parse(source))
                 if isinstance(node, ast.ImportFrom) and node.module}
    ours = {p.stem for p in ROOT.glob("*.py")} | {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert imported & ours == {"tasks"}


def run_both(tmp_path: Path, world: int, prompts: int = 16) -> tuple[Path, Path]:
    """(the file's folder, train.py's folder) after two steps of each on `world` ranks."""
    mine, theirs = tmp_path / "file", tmp_path / "train"
    runs = [[str(script), *flags, "--out", str(out)]
            for script, flags, out in ((FILE, [*FILE_FLAGS, "--prompts", str(prompts)], mine),
                                       (ROOT / "train.py", [*TRAIN_FLAGS, "--prompts-per-step", str(prompts)], theirs))]
    if world == 1:  # the two at once, on one thread each, as each of two ranks has: one a core
        started = [subprocess.Popen([sys.executable, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, env={**os.environ, "OMP_NUM_THREADS": "1"}) for args in runs]
        for process in started:
            stderr = process.communicate(timeout=600)[1]
            assert process.returncode == 0, stderr[-3000:]
    else:
        for args in runs:
            done = torchrun(*args, nproc=world, timeout=600)
            assert done.returncode == 0, done.stderr[-3000:]
    return mine, theirs


def assert_same_run(mine: Path, theirs: Path) -> None:
    logged = metrics(mine)
    assert [row["step"] for row in logged] == [0, 1, 2]
    assert {"reward/mean", "loss/total", "grad/norm", "eval/accuracy"} <= {k for row in logged for k in row}
    for row, reference in zip(logged, metrics(theirs), strict=True):
        assert row == {k: reference[k] for k in row}, (row, reference)
    weights = load_file(str(mine / "model.safetensors"))
    reference = load_file(str(theirs / "checkpoints" / "step-2" / "model.safetensors"))
    assert set(weights) == set(reference)
    different = [name for name in reference if not (weights[name] == reference[name]).all()]
    assert not different, f"weights differ after 2 steps: {different}"
    # the run learned something, so equal weights are not two untouched copies of the shipped model
    shipped = load_file(str(ROOT / "assets" / "tiny-running-sum" / "model.safetensors"))
    assert any(not (weights[name] == shipped[name]).all() for name in shipped)


@pytest.mark.slow
def test_the_file_equals_train_py_on_one_rank(tmp_path):
    assert_same_run(*run_both(tmp_path, world=1))


@pytest.mark.slow
def test_the_file_equals_train_py_on_two_ranks(tmp_path):
    assert_same_run(*run_both(tmp_path, world=2))


@pytest.mark.slow
@pytest.mark.extended  # 3 ranks on 2 cores: 40 s; 1 and 2 ranks stay in the README's line
def test_the_file_equals_train_py_on_three_ranks(tmp_path):
    """A world size that is not a power of two: 12 prompts (16 do not split over 3 ranks)."""
    assert_same_run(*run_both(tmp_path, world=3, prompts=12))
