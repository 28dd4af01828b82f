"""A NaN never reaches the weights (checkpoint.StepGuard, checkpoint.save_run): an optimizer step whose loss or
gradient norm is not finite is not applied, on one rank or two, DDP or FSDP, with the loss planted on one rank
only; NONFINITE_LIMIT such steps in a row stop a run with one error line and its last checkpoint intact; a
checkpoint of non-finite weights is never written.

A loss is planted two ways: × NaN (its backward makes every gradient NaN, so the gradient norm says it) and
+ inf (the gradient stays finite and only the loss, summed over ranks by the guard, says it).
"""
import math
import os
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch.distributed.tensor import DTensor

import algos
import checkpoint
import config as config_module
import train
from checkpoint import NONFINITE_LIMIT, CheckpointError, StepGuard, complete_checkpoints
from model import ResponseLogProbs, load_model
from parallel import wrap
from test_invariance import config, make_episodes
from train import Learner, update
from helpers import metrics, run_main, share_two_ranks

CPU = torch.device("cpu")
PLANTS = {"nan": lambda loss: loss * math.nan, "inf": lambda loss: loss + math.inf}
GRPO = algos.get("grpo")


def planted(how: str, ranks: tuple = (0,), calls: tuple = (), rank: int = 0):
    """GRPO whose loss is made non-finite on `ranks`, at those of its calls that `calls` counts (from 1; () = every)."""
    count = [0]

    def loss(inputs, cfg, totals):
        value, metrics = GRPO.loss(inputs, cfg, totals)
        count[0] += 1
        if rank in ranks and (not calls or count[0] in calls):
            value = PLANTS[how](value)
        return value, metrics
    return replace(GRPO, loss=loss)


def weights(lm) -> dict:
    """Full fp32 weights (gathered under FSDP: every rank calls)."""
    return {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone() for k, v in lm.state_dict().items()}


def planted_update(model_dir, how: str, mode: str = "ddp", rank: int = 0, world: int = 1, ranks=(0,)) -> dict:
    """One update of 3 groups with AdamW, the loss planted on `ranks`: (weights before and after, whether AdamW
    and the schedule stepped, the update's metrics)."""
    torch.manual_seed(0)
    lm = load_model(model_dir)
    scorer = wrap(ResponseLogProbs(lm), mode=mode, world=world, device=CPU, dtype=torch.float32)
    before = weights(lm)
    opt = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    learner = Learner(scorer=scorer, lm=lm, ref_scorer=None, optimizer=opt, scheduler=sched,
                      algo=planted(how, ranks, rank=rank), cfg=config("grpo", {}, 3), autocast=nullcontext, pad_id=0,
                      rank=rank, world=world, device=CPU)
    metrics = update(learner, make_episodes(), step=7)
    return {"before": before, "after": weights(lm), "adam": bool(opt.state), "lr_steps": sched.last_epoch,
            "metrics": metrics, "in_a_row": learner.guard.in_a_row}


def on_two_ranks(rank, world, dirs) -> dict:
    """The planted update on 2 ranks, the loss planted on rank 1 only: DDP with each plant, FSDP with NaN."""
    cases = [("ddp", "nan"), ("ddp", "inf"), ("fsdp", "nan"), ("fsdp", "inf")]
    return {(mode, how): planted_update(dirs["random_model"], how, mode, rank, world, ranks=(1,)) for mode, how in cases}


share_two_ranks("nonfinite", on_two_ranks)


def not_applied(result) -> None:
    assert not result["adam"] and result["lr_steps"] == 0  # neither AdamW nor the schedule stepped
    assert all(torch.equal(result["before"][k], result["after"][k]) for k in result["before"])  # bit for bit
    assert result["metrics"]["update/nonfinite_skipped"] == 1 and result["in_a_row"] == 1


@pytest.mark.parametrize("how", PLANTS)
def test_a_non_finite_step_is_not_applied_on_one_rank(how, random_model_dir, capsys):
    result = planted_update(random_model_dir, how)
    not_applied(result)
    said = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(said) == 1 and said[0].startswith("warning: step 7: loss ") and "not applied" in said[0], said
    assert ("gradient norm nan" in said[0]) == (how == "nan")  # + inf leaves the gradient finite: the loss says it


def test_a_finite_step_is_applied_and_counts_nothing(random_model_dir):
    result = planted_update(random_model_dir, "nan", ranks=())
    assert result["adam"] and result["lr_steps"] == 1 and result["metrics"]["update/nonfinite_skipped"] == 0
    assert not all(torch.equal(result["before"][k], result["after"][k]) for k in result["before"])


@pytest.mark.parametrize("case", [("ddp", "nan"), ("ddp", "inf"), ("fsdp", "nan"), ("fsdp", "inf")])
def test_a_loss_planted_on_one_rank_stops_both(case, spawned_ranks):
    """Rank 1's loss alone is non-finite; rank 0 (whose result this is) does not step either, and its weights
    (gathered, under FSDP) are bit for bit what they were."""
    not_applied(spawned_ranks["nonfinite"][case])


def test_the_guard_stops_at_its_limit_and_a_finite_step_resets_it():
    guard = StepGuard()
    assert guard.applies(1.0, 0.5, step=1, rank=0, device=CPU)
    for step in range(2, NONFINITE_LIMIT + 1):
        assert not guard.applies(math.nan, 0.5, step=step, rank=0, device=CPU)
    assert guard.applies(1.0, 0.5, step=9, rank=0, device=CPU) and guard.in_a_row == 0  # not in a row: reset
    for step in range(10, 10 + NONFINITE_LIMIT - 1):
        assert not guard.applies(2.0, math.inf, step=step, rank=0, device=CPU)
    with pytest.raises(CheckpointError, match=f"{NONFINITE_LIMIT} optimizer steps in a row had a NaN or inf"):
        guard.applies(2.0, -math.inf, step=20, rank=0, device=CPU)
    assert guard.skipped == 2 * NONFINITE_LIMIT - 1


def test_a_checkpoint_of_non_finite_weights_is_never_written(tmp_path, random_model_dir):
    lm = load_model(random_model_dir)
    opt = torch.optim.AdamW(lm.parameters())
    next(lm.parameters()).data[0, 0] = math.inf
    with pytest.raises(CheckpointError, match="checkpoint step-3 not written: 1 weight or AdamW state tensor"):
        checkpoint.save_run(tmp_path, 3, cfg=config_module.Config(), lm=lm, optimizer=opt, adapters=None,
                            trainer_state={}, hf_config=lm.config, tokenizer=None, rank=0, device=CPU)
    assert not (tmp_path / "checkpoints").exists()


# ----------------------------------------------------------------------------- whole runs

RUN = ["--max-steps", "6", "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "16",
       "--eval-every", "0", "--save-every", "2", "--report-to", "none"]


def same_weights(run: Path, a: str, b: str) -> bool:
    """Whether two checkpoints of a run hold the same HF weights, bit for bit."""
    first, second = (load_file(run / "checkpoints" / name / "model.safetensors") for name in (a, b))
    return first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


@pytest.mark.slow
def test_a_run_of_non_finite_steps_stops_with_its_last_checkpoint_intact(tmp_path, monkeypatch, capsys):
    """One rank: steps 1 and 2 train (step-2 saved); from step 3 every loss is NaN, so steps 3-5 are not applied
    (step-4 is saved with step-2's weights, bit for bit), and the run stops at step 5 (NONFINITE_LIMIT = 3) with
    one error line and exit status 1."""
    algo = planted("nan", calls=(3, 4, 5, 6))
    monkeypatch.setattr(algos, "get", lambda name: algo)
    out = tmp_path / "run"
    said = run_main([*RUN, "--out", str(out)])
    assert said == "1"  # the error line is printed by main, then exit status 1
    err = capsys.readouterr().err
    assert err.count("not applied") == NONFINITE_LIMIT - 1 and "step 5: loss nan, gradient norm nan: 3 optimizer" in err
    assert [p.name for p in complete_checkpoints(out)] == ["step-2", "step-4"]
    assert checkpoint._loadable(out / "checkpoints" / "step-4") and same_weights(out, "step-2", "step-4")
    assert [row["update/nonfinite_skipped"] for row in metrics(out)] == [0, 0, 1, 2]  # step 5 stopped unlogged


def runs_on_two_ranks(rank, world, dirs) -> dict:
    """train.main on 2 ranks as torchrun starts it, DDP then FSDP, rank 1's loss NaN from its 3rd call on (rank 0's
    finite): {mode: how main ended, "<mode> checkpoints": the run's complete checkpoints}."""
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    unplanted, out = algos.get, {}
    try:
        for mode in ("ddp", "fsdp"):
            algo = planted("nan", ranks=(1,), calls=(3, 4, 5, 6), rank=rank)
            algos.get = lambda name: algo
            run = Path(dirs["random_model"]).parent / f"nonfinite-{mode}"  # the same folder on both ranks
            try:
                train.main([*RUN, "--parallel", mode, "--out", str(run)])
                out[mode] = "finished"
            except SystemExit as e:
                out[mode] = str(e.code)
            out[f"{mode} checkpoints"] = [p.name for p in complete_checkpoints(run)]
            out[f"{mode} unchanged"] = rank == 0 and same_weights(run, "step-2", "step-4")
    finally:
        algos.get = unplanted
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            os.environ.pop(name)
    return out


share_two_ranks("nonfinite runs", runs_on_two_ranks)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_run_on_two_ranks_stops_alike_with_its_last_checkpoint_intact(mode, spawned_ranks):
    """Rank 1's NaN from step 3 on stops both ranks at step 5 (exit status 1, no hang); step-4 holds step-2's weights."""
    result = spawned_ranks["nonfinite runs"]
    assert result[mode] == "1" and result[f"{mode} checkpoints"] == ["step-2", "step-4"], result
    assert result[f"{mode} unchanged"]
