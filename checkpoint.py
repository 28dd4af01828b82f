"""Run folders and checkpoints that survive a kill at any moment.

A run folder (--out):
    config.yaml  metrics.jsonl  samples.jsonl  events.out.tfevents.*   written by global rank 0
    .lock                          held by the process that trains in it (a second one is refused)
    checkpoints/step-N/            a complete checkpoint: HF weights (with LoRA: the adapter folder,
                                   and in the last one merged/, HF weights), tokenizer, trainer_state.pt,
                                   train_config.yaml (the run's Config), train_state/ (DCP shards)
    checkpoints/.step-N.partial/   a checkpoint being written
    checkpoints/discarded/         checkpoints after the one a run was resumed from (set aside)

Atomicity: every file of a checkpoint is written and fsynced under `.step-N.partial`, then one
rename publishes it as `step-N`, so a folder named step-N is always complete and the newest
complete checkpoint is the highest such N. A kill leaves at most a `.partial` (or a `.deleting`,
from pruning) folder, which the next start removes. `--resume RUN` continues from the newest
checkpoint with the run's saved config; rows that metrics.jsonl and samples.jsonl logged after it
are dropped and TensorBoard purges them, so a replayed step is logged once.

A NaN never reaches the weights or a checkpoint (`StepGuard`, `save_run`): an optimizer step
whose loss (summed over ranks) or global gradient norm is not finite is not applied, neither AdamW
nor the lr schedule steps, and a line on stderr names the step and the two values; NONFINITE_LIMIT
such steps in a row stop the run. A checkpoint whose trained weights or AdamW state hold a NaN or an
inf is not written. Both decisions are taken alike on every rank.
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import math
import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path

import torch
import yaml
from torch.distributed.checkpoint import CheckpointException, FileSystemReader

from model import load_trainer_state, save_checkpoint, save_hf, unreadable
from parallel import (all_reduce_sum, compute_dtype, full_state_dict, full_tensor, load_train_state, nonfinite,
                      save_train_state)

COMPLETE = ("trainer_state.pt", "train_config.yaml", "train_state/.metadata")  # every checkpoint, and its weights:
WEIGHTS = {False: ("config.json", "model.safetensors"),  # a full fine-tune's HF folder
           True: ("adapter_config.json", "adapter_model.safetensors")}  # LoRA's adapters (merged/: optional)
LOGS = ("metrics.jsonl", "samples.jsonl")
NONFINITE_LIMIT = 3  # optimizer steps in a row with a NaN or inf loss or gradient norm: the run stops


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be written or read, or a run that cannot go on to its next one (NaN
    steps); the message says what is still intact."""


# ----------------------------------------------------------------------------- no NaN in the weights

class StepGuard:
    """Whether each optimizer step of the run may apply (see the module docstring); the Learner holds one."""
    in_a_row = 0  # optimizer steps skipped since the last one applied
    skipped = 0  # optimizer steps skipped since this launch began: the metric update/nonfinite_skipped

    def applies(self, grad_norm: float, loss: float, *, step: int, rank: int, device) -> bool:
        """Collective, every rank calls: the gradient norm is the same on every rank already (the ranks'
        gradients are summed before it is taken), this rank's share of the loss is summed here. True:
        step; False: skip (said on rank 0); the NONFINITE_LIMIT-th False in a row raises CheckpointError."""
        loss = all_reduce_sum({"loss": loss}, device)["loss"]
        if math.isfinite(loss) and math.isfinite(grad_norm):
            self.in_a_row = 0
            return True
        self.in_a_row, self.skipped = self.in_a_row + 1, self.skipped + 1
        what = f"step {step}: loss {loss:g}, gradient norm {grad_norm:g}"
        if self.in_a_row >= NONFINITE_LIMIT:
            raise CheckpointError(f"{what}: {self.in_a_row} optimizer steps in a row had a NaN or inf loss or "
                                  f"gradient norm and none was applied, so the newest checkpoint is intact: "
                                  f"resume from it (--resume RUN_DIR) with a lower --lr, --grad-clip or the knob "
                                  f"that made it (docs/runs-and-checkpoints.md#nan-and-inf)")
        if rank == 0:
            print(f"warning: {what}: not finite, so this optimizer step is not applied (AdamW and the lr "
                  f"schedule do not step; {self.in_a_row} in a row, {NONFINITE_LIMIT} stop the run)",
                  file=sys.stderr, flush=True)
        return False


# ----------------------------------------------------------------------------- the logs

class Logger:
    """Rank 0 writes metrics.jsonl and samples.jsonl, and hands every row to the trackers --report-to
    names (`names`: config.trackers): TensorBoard's scalars and sample text, wandb's and trackio's
    runs (tracker_run; each library imported only when named); other ranks are silent. purge_step:
    TensorBoard hides what an earlier launch logged from this step on (a resume); wandb and trackio
    continue the run they began."""

    def __init__(self, out: Path, enabled: bool, tokenizer, cfg, names: list[str], purge_step: int | None = None):
        self.enabled, self.tokenizer = enabled, tokenizer
        if enabled:
            from torch.utils.tensorboard import SummaryWriter
            self.metrics = (out / "metrics.jsonl").open("a")
            self.samples = (out / "samples.jsonl").open("a")
            self.tb = SummaryWriter(str(out), purge_step=purge_step) if "tensorboard" in names else None
            self.runs = [tracker_run(name, out, cfg) for name in names if name != "tensorboard"]  # in the order named

    def log(self, step: int, metrics: dict, samples: list = ()) -> None:  # samples: rollout.Episodes
        if not self.enabled:
            return
        metrics = {k: round(float(v), 6) for k, v in metrics.items()}
        self.metrics.write(json.dumps({"step": step, **metrics}) + "\n")
        self.metrics.flush()
        for run in self.runs:  # wandb, trackio
            run.log(metrics, step=step)
        for e in samples:  # a Markovian trace also with what each chunk wrote, a multi-turn one with its transcript
            self.samples.write(json.dumps({"step": step, "prompt": e.problem.prompt, "gold": e.problem.answer,
                                           "response": e.text, "extracted": e.extracted, "reward": e.reward,
                                           **({"transcript": e.transcript} if e.transcript else
                                              {"chunks": e.chunk_texts(self.tokenizer)} if len(e.chunks) > 1 else {}),
                                           **({"details": e.details} if e.details else {})}) + "\n")
        self.samples.flush()
        if self.tb is not None:
            for k, v in metrics.items():
                self.tb.add_scalar(k, v, step)
            for e in samples:
                self.tb.add_text("samples", f"**{e.problem.prompt}** → {e.text} (reward {e.reward})", step)
            self.tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.metrics.close()
            self.samples.close()
            for run in self.runs:
                run.finish()
            if self.tb is not None:
                self.tb.close()


def tracker_run(name: str, out: Path, cfg):
    """wandb's or trackio's started run, which Logger hands every row of metrics.jsonl (the same rounded
    values at the same step) through the calls both libraries' runs share: run.log(metrics, step=step),
    run.finish(). Each gets the run folder's name (runs/grpo-20261127-120000 -> grpo-20261127-120000) and
    the whole config, in the project WANDB_PROJECT / TRACKIO_PROJECT, else "rlvr".

    A resumed run (--resume) continues the tracker's run: wandb's run id is kept in the run folder
    (wandb-id; only a resume may continue a folder that holds one: run_folder) and given back with
    resume="allow"; trackio finds its run by project and name, and a fresh run never joins an older one
    of the same name. The steps that a killed launch logged after its checkpoint are logged again as the
    resume replays them: wandb online keeps the first rows (offline, each launch's folder holds its own),
    trackio keeps both (equal but for time/ when the resume has as many ranks as the first launch).
    wandb writes under the run folder (RUN/wandb/, or WANDB_DIR) and uploads unless WANDB_MODE=offline;
    trackio keeps a local database in TRACKIO_DIR (default ~/.cache/huggingface/trackio; `trackio show`)
    and syncs to a Space only when TRACKIO_SPACE_ID says which."""
    config = dataclasses.asdict(cfg)
    if name == "wandb":
        import wandb

        kept = out / "wandb-id"
        run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlvr"), name=out.name, config=config,
                         id=kept.read_text().strip() if kept.is_file() else None, resume="allow",
                         dir=os.environ.get("WANDB_DIR", str(out)))
        kept.write_text(run.id + "\n")
        return run
    import trackio

    return trackio.init(project=os.environ.get("TRACKIO_PROJECT", "rlvr"), name=out.name, config=config,
                        resume="allow" if cfg.resume else "never")


# ----------------------------------------------------------------------------- finding them

def step_of(path: Path) -> int:
    return int(path.name.split("-", 1)[1])


def complete_checkpoints(run: Path) -> list[Path]:
    """The run's published checkpoints, oldest first ("step-N" folders; the rest is ignored)."""
    root = Path(run) / "checkpoints"
    found = [p for p in root.glob("step-*") if p.name[5:].isdigit() and p.is_dir()] if root.is_dir() else []
    return sorted(found, key=step_of)


def resolve_resume(resume: str, out: str) -> tuple[Path, Path | None]:
    """--resume (and --out) -> (run folder, checkpoint to load; None: start the run afresh).

    RUN -> its newest checkpoint; RUN/checkpoints/step-N -> that one; "auto" -> --out's newest,
    or a fresh start when it has none yet (the same command restarts a preempted job). Found by
    name only: run_folder checks that the checkpoint loads."""
    if resume == "auto":
        if not out:
            raise CheckpointError("--resume auto continues the run in --out: give --out RUN_DIR too")
        run = Path(out)
    elif (Path(resume) / "trainer_state.pt").is_file() or Path(resume).name.startswith("step-"):
        return Path(resume).parent.parent, Path(resume)
    else:
        run = Path(resume)
        if not run.is_dir():
            raise CheckpointError(f"--resume {resume}: no such run folder (give a run folder, one of its "
                                  f"checkpoints/step-N folders, or auto with --out)")
    found = complete_checkpoints(run)
    if found:
        return run, found[-1]
    if resume == "auto":
        return run, None
    raise CheckpointError(f"--resume {resume}: no complete checkpoint in {run / 'checkpoints'} "
                          f"(train.py writes one every --save-every steps and at the end)")


def _loadable(path: Path) -> Path:
    """The checkpoint, after checks that name what is missing or truncated (no traceback)."""
    earlier = [p for p in complete_checkpoints(path.parent.parent) if step_of(p) < step_of(path)] \
        if path.name[5:].isdigit() else []
    advice = (f"resume from the one before: --resume {earlier[-1]} (later ones are then moved to "
              f"checkpoints/discarded/)" if earlier else "no earlier checkpoint to resume from")

    def damaged(what: str) -> CheckpointError:
        return CheckpointError(f"checkpoint {path}: {what}; {advice}")

    lora = (path / "train_config.yaml").is_file() and bool(saved_config(path).get("lora_rank"))
    missing = [name for name in WEIGHTS[lora] + COMPLETE if not (path / name).is_file()]
    if missing:
        raise damaged(f"incomplete, no {', '.join(missing)}")
    try:
        torch.load(path / "trainer_state.pt", map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - EOFError, UnpicklingError, RuntimeError: all "unreadable"
        raise damaged(f"trainer_state.pt is truncated or corrupt ({type(e).__name__})") from None
    # a LoRA checkpoint's merged/ copy, if any, too: named by its path in the checkpoint
    problem = next((f"{w.parent.relative_to(path) / unreadable(w)}".removeprefix("./")
                    for w in sorted(path.rglob("*.safetensors")) if unreadable(w)), "")
    problem = problem or _shard_problem(path / "train_state")
    if problem:
        raise damaged(problem)
    return path


def _shard_problem(path: Path) -> str:
    """What is wrong with a DCP folder: every byte range its metadata points at must lie inside
    its file. "" when nothing is."""
    try:
        storage = FileSystemReader(str(path)).read_metadata().storage_data
    except Exception as e:  # noqa: BLE001
        return f"train_state/.metadata is truncated or corrupt ({type(e).__name__})"
    need = {}
    for info in storage.values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in need.items():
        file = path / name
        if not file.is_file() or file.stat().st_size < size:
            return f"train_state/{name} is missing or truncated (needs {size} bytes)"
    return ""


def run_folder(resume: str, out: str, default: Path) -> tuple[Path, Path | None]:
    """(the folder this launch trains in, the checkpoint it starts from or None), refusing a new
    run (or a checkpoint continued under a new --out) in a folder that holds one."""
    if resume:
        run, checkpoint = resolve_resume(resume, out)
        if checkpoint is not None:
            _loadable(checkpoint)
        if not out or Path(out).resolve() == run.resolve():
            return run, checkpoint  # auto with nothing saved yet: the run starts afresh in its folder
        run = Path(out)  # a new run that starts from another run's checkpoint
    else:
        run, checkpoint = Path(out or default), None
    if (run / "metrics.jsonl").exists() or (run / "checkpoints").exists():
        raise CheckpointError(f"--out {run} holds a run already: continue it with --resume {run}, "
                              f"or choose another --out" if complete_checkpoints(run) else
                              f"--out {run} holds a run that saved no checkpoint (one stopped before its first "
                              f"save): start it afresh there with --resume auto --out {run}, or choose another --out")
    _creatable(run)
    return run, checkpoint


def _creatable(run: Path) -> None:
    """Whether the run folder can be made, before anything is loaded: its nearest existing
    ancestor (or itself) must be a folder this process may write in. runs/x/y with runs/x a file ->
    CheckpointError naming runs/x."""
    existing = next(p for p in [run, *run.parents] if p.exists())  # "." or "/" at the latest
    if not existing.is_dir():
        raise CheckpointError(f"--out {run}: {existing} is a file, not a folder; choose another --out")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CheckpointError(f"--out {run}: no permission to create folders in {existing}; choose another --out")


def set_aside_later(run: Path, step: int) -> list[str]:
    """Move the checkpoints after `step` (a resume from an earlier one, e.g. past a damaged newest)
    into checkpoints/discarded/, out of the way of the steps this run writes again; nothing is
    deleted. Returns their names."""
    later = [p for p in complete_checkpoints(run) if step_of(p) > step]
    for p in later:
        target = run / "checkpoints" / "discarded" / p.name
        n = 1
        while target.exists():
            target, n = target.with_name(f"{p.name}.{n}"), n + 1
        target.parent.mkdir(exist_ok=True)
        os.rename(p, target)
    return [p.name for p in later]


def saved_config(checkpoint: Path) -> dict:
    return yaml.safe_load((checkpoint / "train_config.yaml").read_text()) or {}


# ----------------------------------------------------------------------------- the run folder

@contextmanager
def lock(run: Path):
    """Hold an exclusive lock on the run folder (the OS drops it on any exit, kill -9 included);
    a second process on the same folder gets a CheckpointError naming the holder."""
    run.mkdir(parents=True, exist_ok=True)
    with (run / ".lock").open("a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            raise CheckpointError(f"{run} is in use by another training process (pid {f.read().strip() or '?'}); "
                                  f"wait for it, or choose another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield


def clean_partials(run: Path) -> list[str]:
    """Remove what a killed save or prune left behind; returns the names removed."""
    root = run / "checkpoints"
    stale = sorted(p for p in root.glob(".step-*") if p.is_dir()) if root.is_dir() else []
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
    return [p.name for p in stale]


def truncate_logs(run: Path, last_step: int) -> None:
    """Keep the rows of metrics.jsonl and samples.jsonl up to `last_step` (the checkpoint's) and
    drop the rest, a half-written last line included; replaced atomically."""
    for name in LOGS:
        path = run / name
        if not path.is_file():
            continue
        kept = []
        for line in path.read_text(errors="replace").splitlines(keepends=True):
            try:
                if line.endswith("\n") and json.loads(line)["step"] <= last_step:
                    kept.append(line)
            except (ValueError, KeyError, TypeError):
                pass
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)


# ----------------------------------------------------------------------------- a training run's

def resume(start: Path | None, lm, optimizer, scheduler, stream, cfg, world: int, say) -> dict:
    """Load checkpoint `start` into the run (every rank): the exact fp32 weights and AdamW state
    (DCP shards), the lr schedule, the prompt stream's state (tasks.PromptStream.load); say what this
    launch changes. Returns the trainer state: step, data_pos (prompts handed out so far); a fresh run's for None."""
    if start is None:
        return {"step": 0, "data_pos": 0}
    state = load_trainer_state(start)
    state.setdefault("stream", state.pop("mix", {}))  # a checkpoint before 2026-11-26 kept a mixed stream as "mix"
    load_train_state(start / "train_state", lm, optimizer)
    scheduler.load_state_dict(state["scheduler"])
    stream.load(state["stream"])
    say(f"resumed at step {state['step']} (prompt {state['data_pos']}) from {start}")
    for k, was in saved_config(start).items():
        if k not in ("resume", "out") and hasattr(cfg, k) and was != getattr(cfg, k):
            say(f"resume: {k} {was} -> {getattr(cfg, k)} (given on this launch)")
    if state.get("world", world) != world:
        say(f"warning: the checkpoint was written by {state['world']} rank(s), this run has {world}: it continues, "
            f"but sampling is seeded per rank, so its trajectory differs from the uninterrupted run's")
    return state


def open_run(run: Path, cfg, logged: int, say) -> None:
    """Global rank 0 readies the run folder: on a resume, what a killed save left is removed, checkpoints
    after the one resumed from are set aside and log rows after step `logged` dropped (they are replayed);
    then config.yaml is written (train.py then says what it sets apart from the defaults: config.config_note).
    A new run's folder holds no checkpoint and no log (run_folder refuses one that does)."""
    if cfg.resume:
        removed = clean_partials(run)
        if removed:
            say(f"removed unfinished checkpoint folder(s) {', '.join(removed)} (a run killed while saving)")
        for name in set_aside_later(run, logged):
            say(f"moved {name}, written after the checkpoint this run resumes from, to checkpoints/discarded/")
        truncate_logs(run, logged)
    (run / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))


def save_run(run: Path, step: int, *, cfg, lm, optimizer, adapters, trainer_state: dict, hf_config, tokenizer,
             rank: int, device) -> None:
    """Checkpoint step-N of a training run (every rank calls: the weights are gathered, the optimizer
    state written as shards): HF weights in save_dtype, or with LoRA (adapters: the peft model that
    extras/lora.py's add_lora made) the files of lora_files, plus trainer_state.pt and train_config.yaml,
    which --resume reads. Weights or AdamW state holding a NaN or an inf are never written (CheckpointError on
    every rank)."""
    bad = nonfinite([*lm.parameters(), *(t for state in optimizer.state.values() for t in state.values())], device)
    if bad:
        raise CheckpointError(f"checkpoint step-{step} not written: {bad} weight or AdamW state tensor(s) "
                              f"hold NaN or inf, and {intact(run)}")
    dtype = {"auto": compute_dtype(cfg, device), "fp32": torch.float32, "bf16": torch.bfloat16}[cfg.save_dtype]
    weights, more = ((full_state_dict(lm, dtype), None) if adapters is None else
                     ({}, lora_files(lm, adapters, dtype=dtype, scale=cfg.lora_alpha / cfg.lora_rank,
                                     merge=cfg.lora_save_merged or step == cfg.max_steps)))

    def rank0_files(path):
        save_checkpoint(path, config=hf_config, tokenizer=tokenizer, weights=weights, trainer_state=trainer_state,
                        run_config=dataclasses.asdict(cfg))
        weights.clear()  # rank 0's full CPU copy goes before the sharded state is written
        if more:
            more(path, lambda folder, w: save_hf(folder, config=hf_config, tokenizer=tokenizer, weights=w))

    save(run, step, rank, device, keep=cfg.keep_checkpoints, rank0_files=rank0_files,
         sharded=lambda path: save_train_state(path / "train_state", lm, optimizer))


def lora_files(lm, adapters, *, dtype: torch.dtype, scale: float, merge: bool):
    """A LoRA checkpoint's own files, gathered now on every rank (each gather is a collective): returns
    write(folder, save_hf), which global rank 0 calls to write the adapter folder (adapter_config.json +
    adapter_model.safetensors, what PeftModel.from_pretrained and model.load_model read: the adapters' fp32
    tensors, r · (in + out) per targeted layer) and, with merge, merged/: the base + scale·BA in `dtype`, an HF
    folder that save_hf(folder, weights) writes. (The adapters and merged weights never share a folder:
    from_pretrained would apply the adapters twice.)"""
    weights = full_state_dict(lm, dtype, scale) if merge else {}
    state = {f"base_model.model.{name}": full_tensor(t).detach().cpu()  # under PeftModel's names
             for name, t in lm.state_dict(keep_vars=True).items() if ".lora_" in name}

    def write(path: Path, save_hf) -> None:
        from peft import get_peft_model_state_dict
        from safetensors.torch import save_file

        save_file(get_peft_model_state_dict(adapters, state_dict=state), str(path / "adapter_model.safetensors"),
                  metadata={"format": "pt"})
        adapters.peft_config["default"].save_pretrained(str(path))  # "default": peft's name for the one adapter
        if weights:
            save_hf(path / "merged", weights)
        weights.clear()

    return write


# ----------------------------------------------------------------------------- writing one

def save(run: Path, step: int, rank: int, device, *, rank0_files, sharded, keep: int = 0) -> None:
    """Write checkpoint step-N atomically, every rank calling: rank0_files(folder) writes the
    single files on global rank 0, sharded(folder) the DCP shards on every rank. Then rank 0
    fsyncs and publishes it and keeps the newest `keep` checkpoints (0: all). Any failure (a full
    disk) removes the partial folder and raises CheckpointError on every rank; the previous
    checkpoints are untouched."""
    root = run / "checkpoints"
    partial, final = root / f".step-{step}.partial", root / f"step-{step}"

    def start(folder):
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        rank0_files(folder)

    def publish(folder):
        _fsync_tree(folder)
        if final.exists():
            _remove(final)
        os.rename(folder, final)
        _fsync(root)
        for old in complete_checkpoints(run)[:-keep] if keep else []:
            _remove(old)

    for stage, everyone in ((start, False), (sharded, True), (publish, False)):
        error = None
        if everyone or rank == 0:
            try:
                stage(partial)
            # a full disk raises OSError, SafetensorError, torch.save's RuntimeError, or DCP's
            # CheckpointException (a BaseException)
            except (Exception, CheckpointException) as e:  # noqa: BLE001
                error = e
        if all_reduce_sum({"failed": error is not None}, device)["failed"]:
            if rank == 0:
                shutil.rmtree(partial, ignore_errors=True)
            free = shutil.disk_usage(root).free / 2**20
            raise CheckpointError(f"could not write checkpoint {final} ({_reason(error)}; {free:.1f} MiB free on "
                                  f"its disk); the partial folder was removed and {intact(run)}: free space, then "
                                  f"--resume {run}")


def intact(run: Path) -> str:
    """What a failed save leaves: "the newest complete checkpoint, step-4, is intact", or that there is none."""
    previous = [p.name for p in complete_checkpoints(run)]
    return f"the newest complete checkpoint, {previous[-1]}, is intact" if previous else "no checkpoint before it"


def _reason(error) -> str:
    if error is None:
        return "another rank failed"
    if isinstance(error, CheckpointException):  # one failing rank's (exception, traceback) says why
        error = next(iter(error.failures.values()), (error,))[0]
    return f"{type(error).__name__}: {error}"


def _remove(path: Path) -> None:
    """Rename first, so that a kill during the rmtree leaves a hidden folder, never a step-N
    that looks complete and is not."""
    doomed = path.with_name(f".{path.name}.deleting")
    shutil.rmtree(doomed, ignore_errors=True)
    os.rename(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _fsync_tree(folder: Path) -> None:
    for dirpath, _, files in os.walk(folder):
        for name in files:
            _fsync(Path(dirpath, name))
        _fsync(Path(dirpath))


def _fsync(path: Path) -> None:
    """A file's bytes, or a folder's entries (what a rename into it changed), on the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
