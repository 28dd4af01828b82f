"""One torchrun launch of 2 CPU ranks, shared by the whole test session.

A launch costs 6-10 s on 2 cores before any work: two interpreters import torch and
transformers and meet in gloo's rendezvous. Tests that need train.py or eval.py on 2 ranks
register their run here when their module is imported (`register`); the first test that asks for
the `two_rank_runs` fixture (conftest.py) starts one launch that runs every registered run in
turn, in registration order, inside one process group (parallel.setup_distributed uses a group
that exists and leaves it standing), each in its own folder; each test then reads its folder
(`folder`). A run is exactly what `torchrun --nproc_per_node 2 train.py FLAGS` does, minus
the launch: its seeds come from the step and rank alone.

Under torchrun this file is the worker: `pair.py ROOT`, the runs in ROOT/runs.json.
"""
import json
import os
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = []  # (name, program, flags): what the launch runs, in order

# what a 2-step run needs: 4 prompts × 4 samples (2 per rank), no periodic eval unless asked
SMALL = ["--max-steps", "2", "--prompts-per-step", "4", "--group-size", "4", "--eval-every", "0"]


def register(name: str, flags, program: str = "train") -> None:
    """A run of `program`.main(flags) in the shared launch, with "--out" its own folder unless the
    flags name one. A flag may name "{random_model}" (conftest's random Llama) or "{root}" (the
    launch's folder); or `flags` is a function of that folder, called before the launch, that
    makes what the run reads and returns the flags."""
    assert name not in {n for n, _, _ in RUNS}, f"run {name} registered twice"
    RUNS.append((name, program, flags))


def launch(root: Path, random_model: str) -> Path:
    runs = [(name, program, flags(root) if callable(flags) else
             [f.format(random_model=random_model, root=root) for f in flags]) for name, program, flags in RUNS]
    (root / "runs.json").write_text(json.dumps(runs, default=str))
    from helpers import torchrun
    r = torchrun(__file__, str(root), timeout=900, env={**os.environ, "PYTHONPATH": str(ROOT)})
    (root / "launch.log").write_text(r.stdout + r.stderr)
    assert r.returncode == 0, r.stderr[-3000:]
    return root


def folder(root: Path, name: str) -> Path:
    """The run's output folder; a test fails here with the run's traceback if the run raised."""
    for failed in root.glob(f"{name}.*-*"):
        raise AssertionError(failed.read_text()[-3000:])
    return root / name


def exits(root: Path, name: str) -> dict:
    """{rank: what the run's sys.exit said on that rank}, for a run that is meant to stop early."""
    return {int(f.name.rsplit("-", 1)[1]): f.read_text() for f in root.glob(f"{name}.exit-*")}


def _worker(root: Path) -> None:
    """Each run in turn. A run that stops or raises on a rank is written down and the next one starts
    (a run that fails on one rank only leaves the other waiting in a collective: the launch's
    timeout ends that)."""
    import torch.distributed as dist

    import eval as evaluation
    import train

    dist.init_process_group("gloo")  # before any run: so no run owns it, and each leaves it standing
    rank = os.environ["RANK"]
    for name, program, flags in json.loads((root / "runs.json").read_text()):
        main = {"train": train.main, "eval": evaluation.main}[program]
        try:
            main(flags if "--out" in flags else [*flags, "--out", str(root / name)])
        except SystemExit as e:  # the run's own error exit: what the interpreter would print and exit with
            (root / f"{name}.exit-{rank}").write_text(str(e.code))
        except Exception:
            (root / f"{name}.error-{rank}").write_text(traceback.format_exc())
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    _worker(Path(sys.argv[1]))
