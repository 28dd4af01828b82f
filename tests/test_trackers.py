"""--report-to: TensorBoard by default, wandb and trackio when named (checkpoint.tracker_run), each read back
offline after a 2-rank run and its resume: rank 0 alone logs, every row of metrics.jsonl at its step,
the run's name and config once, and the resume continues the same tracker run."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import checkpoint
import config
from config import Config
from helpers import metrics, run_main, torchrun
from test_train import SMALL  # a small batch, short responses, a short eval

ROOT = Path(__file__).resolve().parent.parent
INSTALLED = [name for name in ("wandb", "trackio") if importlib.util.find_spec(name)]


def test_report_to_names_trackers_and_refuses_others():
    assert config.trackers(Config()) == ["tensorboard"]  # the default
    assert config.trackers(Config(report_to="tensorboard, wandb,trackio")) == ["tensorboard", "wandb", "trackio"]
    assert config.trackers(Config(report_to="none")) == []
    for wrong in ("tensorbord", "wandb,", "none,wandb"):
        assert run_main(["--report-to", wrong]) == (f"error: report_to={wrong!r}: name trackers among tensorboard, "
                                                    f"wandb, trackio, comma-separated, or none")


def test_a_missing_tracker_stops_before_anything_loads(tmp_path, monkeypatch):
    """Said before the model folder is read (--model /nonexistent would be the error after it), nothing written."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trackio" else real(name, *a))
    assert run_main(["--report-to", "tensorboard,trackio", "--model", "/nonexistent", "--out", str(tmp_path / "run")]) \
        == "error: --report-to tensorboard,trackio needs trackio, not installed here: pip install trackio"
    assert not (tmp_path / "run").exists()


def test_the_logger_opens_only_the_trackers_named_and_only_on_rank_0(tmp_path, monkeypatch):
    """TensorBoard's events with the default, metrics.jsonl alone with none; neither wandb nor trackio is
    imported for either, nor on a rank other than 0 (a None in sys.modules makes its import fail)."""
    for tracker in ("wandb", "trackio"):
        monkeypatch.setitem(sys.modules, tracker, None)
    for name, report_to in (("default", "tensorboard"), ("none", "none")):
        (tmp_path / name).mkdir()
        cfg = Config(report_to=report_to)
        logger = checkpoint.Logger(tmp_path / name, True, None, cfg, config.trackers(cfg))
        logger.log(1, {"reward/mean": 0.5})
        logger.close()
        assert metrics(tmp_path / name) == [{"step": 1, "reward/mean": 0.5}]
        assert len(list((tmp_path / name).glob("events.out.tfevents.*"))) == (name == "default")
    silent = checkpoint.Logger(tmp_path / "rank1", False, None, Config(), ["tensorboard", "wandb", "trackio"])
    silent.log(1, {"reward/mean": 0.5})
    silent.close()
    assert not (tmp_path / "rank1").exists()


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A 2-rank run of 2 steps (checkpoints at 1 and 2) reporting to TensorBoard and every installed tracker
    offline, then resumed from step 1 to step 3 on one rank (step 2 replayed). (its folder, its trackio
    dir, metrics.jsonl rows and config.yaml after the first launch)."""
    tmp = tmp_path_factory.mktemp("trackers")
    run, trackio_dir = tmp / "run", tmp / "trackio"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "TRACKIO_"))}
    env.update(WANDB_MODE="offline", WANDB_CONFIG_DIR=str(tmp / "wandb-config"), WANDB_CACHE_DIR=str(tmp / "cache"),
               WANDB_DATA_DIR=str(tmp / "data"), TRACKIO_DIR=str(trackio_dir), OMP_NUM_THREADS="1")
    flags = [*SMALL, "--eval-every", "2", "--save-every", "1", "--lr-schedule", "constant"]
    first = torchrun("train.py", *flags, "--max-steps", "2", "--report-to", ",".join(["tensorboard", *INSTALLED]),
                     "--out", str(run), env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    rows, saved = metrics(run), yaml.safe_load((run / "config.yaml").read_text())
    resumed = subprocess.run([sys.executable, "train.py", "--resume", str(run / "checkpoints" / "step-1"),
                              "--max-steps", "3"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return run, trackio_dir, rows, saved


def wandb_records(folder: Path) -> list[dict]:
    """The records of an offline wandb run folder, as `wandb leet inspect --json` prints them."""
    done = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(folder)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def logged_rows(records: list[dict]) -> list[dict]:
    """The history records as metrics.jsonl rows: {"step": N, ...}, wandb's own _keys left out."""
    return [{"step": h["history"]["step"]["num"], **{k: v for k, v in h["history"]["item"].items() if k[0] != "_"}}
            for h in records if h["type"] == "history"]


@pytest.mark.slow
@pytest.mark.needs("wandb")
def test_wandb_offline_gets_every_row_once_and_the_resume_continues_its_run(tracked):
    run, _, rows, saved = tracked
    folders = sorted((run / "wandb").glob("offline-run-*"))
    assert len(folders) == 2  # one for each launch: the first launch's rank 1 started none
    first, second = map(wandb_records, folders)
    (start,) = [r["run"] for r in first if r["type"] == "run"]
    assert start["display_name"] == "run" and start["run_id"] == (run / "wandb-id").read_text().strip()
    assert {k: v for k, v in start["config"]["update"].items() if k != "_wandb"} == saved
    assert logged_rows(first) == rows  # steps 0 (the eval before training), 1, 2: the same values
    (again,) = [r["run"] for r in second if r["type"] == "run"]
    assert again["run_id"] == start["run_id"] and again.get("resume") is True
    assert logged_rows(second) == [row for row in metrics(run) if row["step"] >= 2]  # the replayed step 2, and 3


def trackio_cli(trackio_dir: Path, *args: str) -> dict:
    """What `trackio ARGS --project rlvr --json` prints, reading the database in trackio_dir."""
    done = subprocess.run([sys.executable, "-m", "trackio.cli", *args, "--project", "rlvr", "--json"],
                          env={**os.environ, "TRACKIO_DIR": str(trackio_dir)}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.mark.slow
@pytest.mark.needs("trackio")
def test_trackio_gets_every_row_and_the_resume_continues_its_run(tracked):
    """One trackio run across both launches, its rows in the order logged: step 2, logged by the first
    launch and replayed by the resume, holds both rows (here from 2 ranks and then 1, so they differ; a
    resume on as many ranks as the first launch replays the same values, time/ aside)."""
    run, trackio_dir, rows, _ = tracked
    summary = trackio_cli(trackio_dir, "get", "run", "--run", "run")
    latest = yaml.safe_load((run / "config.yaml").read_text())  # a resumed trackio run keeps the resume's config
    assert summary["last_step"] == 3 and {k: summary["config"][k] for k in latest} == latest
    logged = trackio_cli(trackio_dir, "query", "project", "--sql",
                         "SELECT step, metrics FROM metrics WHERE run_name = 'run' ORDER BY id")["rows"]
    assert [{"step": r["step"], **json.loads(r["metrics"])} for r in logged] == \
        rows + [row for row in metrics(run) if row["step"] >= 2]
