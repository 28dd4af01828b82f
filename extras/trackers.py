"""wandb and trackio, the trackers that --report-to names beside TensorBoard, each imported only when named.

checkpoint.Logger starts them on global rank 0 alone and hands each one every row it writes to metrics.jsonl
(the same rounded values at the same step) through the two calls both libraries' runs share:
run.log(metrics, step=step) and run.finish(). Once, at the start, each gets the run's name (its
folder's: runs/grpo-20261127-120000 -> grpo-20261127-120000) and its whole config (config.yaml's fields).

A resumed run (--resume) continues the tracker's run where the tracker allows it: wandb's run id is kept
in the run folder (wandb-id) and given back with resume="allow"; trackio finds its run by project and
name (resume="allow"). The steps that the killed launch logged after its checkpoint are logged again as
the resume replays them: wandb online keeps the first rows (it ignores a step below the run's current
one; offline, each launch's folder holds its own), trackio keeps both (equal but for time/ when the
resume has as many ranks as the first launch: the same trajectory).

Where they write: the project is WANDB_PROJECT / TRACKIO_PROJECT, else "rlvr"; wandb writes under
the run folder (RUN/wandb/, or WANDB_DIR when set) and uploads unless WANDB_MODE=offline; trackio keeps
a local database in TRACKIO_DIR (default ~/.cache/huggingface/trackio; `trackio show` opens it) and
syncs to a Space only when TRACKIO_SPACE_ID says which.
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

PROJECT = "rlvr"  # both trackers' project unless WANDB_PROJECT / TRACKIO_PROJECT names another


def start_runs(names: list[str], *, out: Path, cfg) -> list:
    """A started run of each tracker named but TensorBoard (checkpoint.Logger's own), in the order named:
    ["tensorboard", "trackio", "wandb"] -> [trackio's run, wandb's run]."""
    config = dataclasses.asdict(cfg)
    return [wandb_run(out, config) if name == "wandb" else trackio_run(out, config, resumed=bool(cfg.resume))
            for name in names if name != "tensorboard"]


def wandb_run(out: Path, config: dict):
    """wandb's run, one across launches: a fresh run folder gets the new run's id, kept in RUN/wandb-id. (A
    folder that holds an id holds metrics.jsonl too, which only a resume may continue: checkpoint.run_folder.)"""
    import wandb

    kept = out / "wandb-id"
    run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=out.name, config=config,
                     id=kept.read_text().strip() if kept.is_file() else None, resume="allow",
                     dir=os.environ.get("WANDB_DIR", str(out)))
    kept.write_text(run.id + "\n")
    return run


def trackio_run(out: Path, config: dict, resumed: bool):
    """trackio's run, found again by project and name when resumed; a fresh run never joins an older
    run of the same name (another folder called runs/job)."""
    import trackio

    return trackio.init(project=os.environ.get("TRACKIO_PROJECT", PROJECT), name=out.name, config=config,
                        resume="allow" if resumed else "never")
