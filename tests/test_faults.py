"""Faults a run must survive (issue 14): kill -9 during a checkpoint write, a second process on the
same run folder, checkpoints damaged by hand, a file system that refuses a checkpoint's bytes.

Every run is the shipped tiny model on 1 rank with 24-token responses and a checkpoint every step,
on one CPU thread (in this process and in the one run that is killed, so that their numbers agree
bit for bit whatever thread count earlier tests left). Runs that need no kill run in this process,
which saves the imports of a fresh one. The longer version, over 1 and 2 ranks and random kill
moments, is bench/kill_resume.py."""
import resource
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from transformers import AutoModelForCausalLM

import train
from helpers import kill_9, metrics, run_main, same_run, start_train, wait_until

STEPS = 4
TINY = ["--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "24", "--eval-every", "0",
        "--log-samples", "2", "--save-every", "1", "--max-steps", str(STEPS)]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py: every test here on one thread


@pytest.fixture(scope="module")
def reference(tmp_path_factory, one_thread):
    """An uninterrupted run: step-1 ... step-4 and its logs."""
    run = tmp_path_factory.mktemp("faults") / "reference"
    train.main([*TINY, "--out", str(run)])
    assert complete(run) == [f"step-{n}" for n in range(1, STEPS + 1)]
    return run


def hidden(run: Path) -> list[str]:
    """The .step-N.partial / .step-N.deleting folders in the run's checkpoints/."""
    return sorted(p.name for p in (run / "checkpoints").glob(".step-*"))


def complete(run: Path) -> list[str]:
    return sorted((p.name for p in (run / "checkpoints").glob("step-*")), key=lambda name: int(name[5:]))


def weights(checkpoint: Path) -> dict:
    return load_file(str(checkpoint / "model.safetensors"))


def train_state(checkpoint: Path, scratch: Path) -> dict:
    """The checkpoint's fp32 weights and AdamW state (its DCP shards) as one dict."""
    dcp_to_torch_save(str(checkpoint / "train_state"), str(scratch / "train_state.pt"))
    return torch.load(scratch / "train_state.pt", weights_only=False)


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


@pytest.mark.slow
@pytest.mark.extended  # a run of its own process, killed and resumed; the damaged checkpoints below run in this one
def test_kill_9_while_a_checkpoint_is_written_then_resume(reference, tmp_path, capsys):
    """A run in another process holds its folder: a second launch there is refused. SIGKILL it as
    soon as a checkpoint folder after step-1 appears (.step-K.partial): step-(K-1) is the newest
    complete checkpoint, and `--resume RUN` removes the partial folder and replays the steps after
    it exactly as the uninterrupted run had them, each logged once."""
    run, lock_file = tmp_path / "run", tmp_path / "run" / ".lock"
    proc = start_train(TINY, run)
    try:
        wait_until(proc, lambda: lock_file.is_file() and lock_file.read_text().strip() == str(proc.pid),
                   "the run folder's lock")
        msg = run_main(["--resume", "auto", "--out", str(run), *TINY])
        assert msg.startswith("error: ") and "in use by another training process" in msg, msg
        assert f"(pid {proc.pid})" in msg, msg

        def writing():
            return [p.name for p in run.glob("checkpoints/.step-*.partial") if p.name != ".step-1.partial"]
        wait_until(proc, writing, "a checkpoint write after step-1")
    finally:
        kill_9(proc)
    partial = hidden(run)
    assert len(partial) == 1 and partial[0].endswith(".partial"), \
        f"{partial}: the kill landed after the write (this process slept through its ~50 ms)"
    killed_at = int(partial[0].split("-")[1].split(".")[0])  # .step-K.partial
    assert killed_at >= 2 and complete(run) == [f"step-{n}" for n in range(1, killed_at)]
    capsys.readouterr()

    train.main(["--resume", str(run)])  # the run's saved config, in this process (the kill freed the lock)
    out = capsys.readouterr().out
    assert f"resumed at step {killed_at - 1}" in out and partial[0] in out  # it said it removed the folder
    assert hidden(run) == [] and complete(run) == complete(reference)
    final, expected = run / "checkpoints" / f"step-{STEPS}", reference / "checkpoints" / f"step-{STEPS}"
    assert equal(weights(final), weights(expected))
    assert equal(train_state(final, tmp_path), train_state(expected, tmp_path))  # fp32 weights, AdamW
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))  # the killed step's row is logged once
    assert same_run(metrics(reference), rows)
    assert (run / "samples.jsonl").read_text() == (reference / "samples.jsonl").read_text()


def copy_run(reference: Path, to: Path) -> Path:
    """A copy of the run. Resume it with --resume auto --out COPY: its saved config names the
    reference's folder as --out, which a plain --resume COPY would train in."""
    return shutil.copytree(reference, to, ignore=shutil.ignore_patterns(".lock"))


def truncate(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


@pytest.mark.parametrize("damage,named,says", [
    (lambda c: (c / "model.safetensors").unlink(), "model.safetensors", "incomplete, no model.safetensors"),
    (lambda c: truncate(c / "trainer_state.pt"), "trainer_state.pt", "is truncated or corrupt"),
    (lambda c: truncate(c / "model.safetensors"), "model.safetensors", "is truncated or corrupt"),
    (lambda c: truncate(c / "train_state" / "__0_0.distcp"), "train_state/__0_0.distcp", "is missing or truncated"),
], ids=["no-model.safetensors", "truncated-trainer_state.pt", "truncated-model.safetensors", "truncated-shard"])
def test_a_damaged_newest_checkpoint_is_named_and_not_loaded(reference, tmp_path, damage, named, says):
    """A step-N folder that a user damaged is neither loaded nor silently passed over: the resume
    stops before training with one error line that names the file (main() exits with the message:
    exit status 1, no traceback) and writes nothing to the run."""
    run = copy_run(reference, tmp_path / "run")
    newest = run / "checkpoints" / f"step-{STEPS}"
    damage(newest)
    before = (run / "metrics.jsonl").read_text()
    msg = run_main(["--resume", str(run)])
    assert msg.startswith("error: ") and "\n" not in msg, msg
    assert str(newest) in msg and named in msg and says in msg, msg
    assert (run / "metrics.jsonl").read_text() == before and complete(run) == complete(reference)


@pytest.mark.parametrize("refused", ["model.safetensors", "train_state"])
def test_a_checkpoint_that_cannot_be_written_stops_the_run_and_keeps_the_previous_one(reference, tmp_path, refused,
                                                                                     capsys):
    """The run resumes from step-1 under a file-size limit (RLIMIT_FSIZE: a write past it fails with
    EFBIG, as one on a full disk fails with ENOSPC) that step 2's checkpoint cannot meet: in its
    model.safetensors, or (that one fitting) in its DCP shard. The run stops with one error line,
    removes the partial folder and leaves step-1 as it was."""
    run = copy_run(reference, tmp_path / "run")
    for n in range(2, STEPS + 1):
        shutil.rmtree(run / "checkpoints" / f"step-{n}")
    step1 = run / "checkpoints" / "step-1"
    model_size = (step1 / "model.safetensors").stat().st_size
    shard_size = (step1 / "train_state" / "__0_0.distcp").stat().st_size
    assert 100_000 < model_size < shard_size  # every other file the run writes is far smaller
    limit = model_size // 2 if refused == "model.safetensors" else (model_size + shard_size) // 2
    before = {p.relative_to(step1): p.read_bytes() for p in step1.rglob("*") if p.is_file()}

    capsys.readouterr()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))  # Python ignores SIGXFSZ: write() fails
    try:
        with pytest.raises(SystemExit) as stopped:  # any other exception would be a traceback
            train.main(["--resume", "auto", "--out", str(run)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    out, err = capsys.readouterr()
    code = stopped.value.code  # sys.exit("error: ...") prints the message and exits with status 1
    said = err + (code + "\n" if isinstance(code, str) else "")
    assert "resumed at step 1" in out and (isinstance(code, str) or code == 1), code
    errors = [line for line in said.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, said
    assert errors[0].startswith(f"error: could not write checkpoint {run / 'checkpoints' / 'step-2'} ("), errors
    assert "the newest complete checkpoint, step-1, is intact" in errors[0], errors
    assert hidden(run) == [] and complete(run) == ["step-1"]
    assert {p.relative_to(step1): p.read_bytes() for p in step1.rglob("*") if p.is_file()} == before
    AutoModelForCausalLM.from_pretrained(step1)  # still a loadable checkpoint
