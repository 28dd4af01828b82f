"""RL with verifiable rewards, top to bottom.

    torchrun --nproc_per_node 2 train.py --algo grpo      # the default: tiny model, running sums
    python train.py --algo dapo --model PATH --data train.jsonl --eval-data test.jsonl

Each step:
  1. rollout   every rank samples G responses for its share of B prompts (one generate call,
               or one per chunk round with Markovian thinking, one per turn with an environment,
               --env: tools, observations as context); the task grades them; episodes
               are gathered so that every rank holds the global batch (global counts and batch
               std then need no further collective)
  2. filter    optional DAPO dynamic sampling: drop groups whose rewards are all equal and
               sample more prompts until B groups are kept or the round cap is hit
  3. advantage per response, from its whole group (algos/); PSR/NSR then drop the responses
               they do not train on (train_on), and a step that keeps none skips its update
  4. update    K mini-batches of whole groups × μ epochs, one optimizer step per mini-batch; each
               rank takes its share of the mini-batch in micro-batches of rows (a row is a
               response, a chunk of a Markovian trace or a turn); every loss is divided by counts of
               the whole mini-batch on all ranks (docs/math.md §0)
  5. log, eval, checkpoint

The knobs live in config.py (precedence: dataclass defaults < the algorithm's preset < --config
YAML < command line); the task and its problems come from data.py, which hands out the prompt
stream (tasks.Task.stream); resume and checkpoints are checkpoint.py's; data parallelism (DDP, or
FSDP2 with sharded fp32 state and bf16 compute), its set-up on one node or several, and sharded
checkpoints in parallel.py; the memory plan (`--plan true`) in extras/plan.py. Who samples is the run's
sampler (config.SAMPLERS: HF generate, engine.py's `fast`, vLLM), built once and asked for everything.
Left out on purpose: tensor/pipeline parallelism, value models (PPO with a critic), reward models.
"""
from __future__ import annotations

import importlib
import math
import os
import random
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm import tqdm
from transformers.utils import logging as hf_logging

import algos
import data
from algos.base import LossInputs, batch_wide
from checkpoint import CheckpointError, Logger, StepGuard, lock, open_run, resume, run_folder, save_run
from config import (Config, check_prompts_fit, config_note, eval_settings, learning_rate, lr_factor, parse_config,
                    require_trackers, response_tokens, rollout_shapes, sampler_class, trackers, validate)
from model import (ModelError, ResponseLogProbs, check_logprobs, check_model_folder, count_parameters, load_model,
                   require_peft)
from parallel import (all_reduce_sum, autocast_context, clip_grad_norm, compute_dtype, gather_objects,
                      grad_sync, parallel_mode, peak_memory, setup_distributed, teardown, weights_dtype, wrap)
from rewards import grade_batch, overlong_penalty
from rollout import (Episode, RolloutError, Sampling, collate, encode_prompts, generate, mismatch_stats,
                     sampler_correction)
from tasks import detail_means


# ============================================================================ rollout

def collect_rollouts(lm, tokenizer, task, stream, data_pos, cfg: Config, rank: int, world: int, shape, sampler):
    """Generate, grade and gather until the batch is full. Returns (episodes of the kept groups,
    identical on every rank and group-major; all episodes generated; new data_pos; stats).
    shape: the rollout's (config.rollout_shapes: plain, Markovian chunks or turns with an environment);
    sampler: who samples (config.SAMPLERS)."""
    b_local = cfg.prompts_per_step // world
    sampling = Sampling(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens, cfg.prefill_chunk, sampler=sampler)
    kept, generated, rounds = [], [], 0
    while True:
        problems = stream.get(data_pos, cfg.prompts_per_step)[rank * b_local:(rank + 1) * b_local]
        prompt_ids = encode_prompts(tokenizer, problems, cfg.chat_template, shape.tools, cfg.chat_template_kwargs)
        # group ids unique over the run: a group's is its prompt's position in the stream
        episodes = generate(lm, tokenizer, problems, prompt_ids, group_size=cfg.group_size, sampling=sampling,
                            shape=shape, first_group=data_pos + rank * b_local, batch_size=cfg.rollout_batch_size)
        verdicts = grade_batch(task, [(e.problem, e.text) for e in episodes], answer_after=cfg.answer_after)
        for e, verdict in zip(episodes, verdicts):
            e.settle(verdict)
            e.score = shaped_score(e, cfg)
        episodes = [e for part in gather_objects(episodes, world) for e in part]
        data_pos += cfg.prompts_per_step
        generated += episodes
        groups = [episodes[i:i + cfg.group_size] for i in range(0, len(episodes), cfg.group_size)]
        # DAPO's dynamic sampling keeps the groups whose rewards differ
        kept += [g for g in groups if not cfg.dynamic_sampling or len({e.reward for e in g}) > 1]
        if not cfg.dynamic_sampling or len(kept) >= cfg.prompts_per_step or rounds >= cfg.max_sampling_rounds:
            break
        rounds += 1
    stats = {**rollout_stats(generated, cfg.group_size), **task.stats(generated, cfg.group_size)}
    if cfg.max_chunks > 1:
        stats["length/chunks"] = float(np.mean([len(e.chunks) for e in generated]))
    if cfg.dynamic_sampling:  # the groups generated and not kept had rewards all equal
        stats.update({"dynamic/extra_rounds": rounds, "dynamic/kept_groups": min(len(kept), cfg.prompts_per_step),
                      "dynamic/dropped_groups": len(generated) // cfg.group_size - len(kept)})
    return [e for g in kept[:cfg.prompts_per_step] for e in g], generated, data_pos, stats


def shaped_score(e: Episode, cfg: Config) -> float:
    """What the advantages see: the reward (0 without EOS under zero_truncated, Dr. GRPO), DAPO's soft
    overlong penalty (its ramp overlong_cache tokens; 0: a fifth of response_tokens, DAPO's 4096 of
    20480) and a multi-turn trace's turn rewards. Response tokens 80, length 72, reward 1 -> 1 − 8/16."""
    score = 0.0 if cfg.zero_truncated and e.truncated else e.reward
    if cfg.overlong_penalty:
        most = response_tokens(cfg)
        score += overlong_penalty(len(e.response_ids), most, cfg.overlong_cache or most // 5)
    return score + sum(e.turn_rewards)


def rollout_stats(episodes: list[Episode], group_size: int) -> dict:
    rewards = np.array([e.reward for e in episodes])
    lengths = np.array([len(e.response_ids) for e in episodes])
    return {"reward/mean": rewards.mean(), "reward/std": rewards.std(),
            "reward/zero_std_groups": float((rewards.reshape(-1, group_size).std(1) == 0).mean()),
            "score/mean": float(np.mean([e.score for e in episodes])),
            "length/mean": lengths.mean(), "length/min": lengths.min(), "length/max": lengths.max(),
            "tokens/generated": lengths.sum(), "reward/grader_failures": float(sum(e.grader_failed for e in episodes)),
            # of the zeros, the share in which the grader found no answer at all (a format failure)
            "reward/format_failures": float(np.mean([e.extracted is None and not e.grader_failed
                                                     for e in episodes if e.reward == 0] or [0.0])),
            "length/truncated": float(np.mean([e.truncated for e in episodes])),
            **detail_means([e.details for e in episodes])}


# ============================================================================ update

@dataclass
class Learner:
    """The policy being trained and what trains it: what update() needs besides the batch, the same
    for the whole run (train() builds it once)."""
    scorer: torch.nn.Module  # the policy as model.ResponseLogProbs (DDP/FSDP-wrapped): logp, entropy per token
    lm: torch.nn.Module  # the policy's model: the parameters the optimizer steps
    ref_scorer: torch.nn.Module | None  # the frozen reference when cfg.beta > 0, or OPD's teacher (--teacher)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    algo: algos.Algorithm
    cfg: Config
    autocast: Callable  # () -> the compute-dtype context (parallel.autocast_context)
    pad_id: int
    rank: int
    world: int
    device: torch.device
    guard: StepGuard = field(default_factory=StepGuard)  # a NaN or inf step is not applied (checkpoint.py)


def update(learner: Learner, episodes: list[Episode], step: int = 0) -> dict:
    """K mini-batches × μ epochs of optimizer steps on the global batch (docs/math.md §0).

    The algorithm's advantages, then per mini-batch (whole groups) the loss of this rank's
    micro-batches, each divided by counts of the whole mini-batch on all ranks, and one optimizer
    step. Returns the metrics averaged over optimizer steps and ranks.
    """
    cfg = learner.cfg
    set_advantages(episodes, algo=learner.algo, cfg=cfg)
    episodes = [e for e in episodes if trains_on(e, cfg)]  # PSR/NSR drop the rest; the same list on every rank
    if not episodes:
        return {"update/skipped": 1.0, "update/responses": 0}
    minibatches = split_minibatches(episodes, cfg, learner.rank, learner.world, learner.algo.whole_groups)
    olds, refs = fixed_passes(learner, minibatches=minibatches)  # π_old and π_ref, before the first step moves θ
    sums, steps, mismatch = {}, 0, []
    for epoch in range(cfg.epochs):  # μ passes over the batch
        for i, (mb_episodes, micro) in enumerate(minibatches):  # K mini-batches, one optimizer step each
            totals = mini_batch_totals(mb_episodes, cfg)
            # the draw's seed is the same on every rank: group ids are unique over the run
            flags = batch_flags(learner, mb_episodes=mb_episodes, micro=micro, olds=olds[i],
                                on_policy=epoch == i == 0,
                                seed=mixed_seed(cfg.seed, mb_episodes[0].group, epoch))
            loss = 0.0  # this rank's share of the mini-batch's loss, which the guard reads
            for j, rows in enumerate(micro):  # this rank's share: gradients accumulate
                metrics, olds[i][j] = micro_step(
                    learner, rows=rows, mb_episodes=mb_episodes, old=olds[i][j], ref_logp=refs[i][j],
                    flags=flags[j], totals=totals, sync=j == len(micro) - 1 or learner.world == 1,
                    mismatch=mismatch if epoch == 0 else None)
                sums.update({name: sums.get(name, 0.0) + v for name, v in metrics.items()})
                loss += metrics["loss/total"]
            sums["grad/norm"] = sums.get("grad/norm", 0.0) + optimizer_step(learner, loss, step) / learner.world
            steps += 1
    return update_metrics(learner, episodes=episodes, sums=sums, steps=steps, mismatch=mismatch)


def set_advantages(episodes: list[Episode], *, algo, cfg: Config) -> None:
    """e.advantage of every response from the scores [n_groups, G] of the whole global batch (none for
    PACS: its loss reads the labels); under --turn-credit, each turn row's own (algos/credit.py)."""
    if algo.advantages is None:
        return
    if cfg.turn_credit != "outcome":
        from algos.credit import set_turn_advantages
        return set_turn_advantages(episodes, algo.norm(cfg), cfg)
    scores = torch.tensor([e.score for e in episodes], dtype=torch.float64).view(-1, cfg.group_size)
    # REINFORCE++ whitens over the batch's tokens: it reads each response's trained tokens; GDPO each reward term
    extra = [torch.tensor([loss_tokens(e, cfg) for e in episodes], dtype=torch.float64).view_as(scores)] \
        if algo.response_tokens else [episodes] if algo.reward_terms else []
    adv = algo.advantages(scores, cfg, *extra).flatten().float()
    for e, a in zip(episodes, adv.tolist()):
        e.advantage = a


def trains_on(e: Episode, cfg: Config) -> bool:
    """Whether the update keeps this response at all (PSR/NSR drop the others, docs/math.md §2).
    Correct means score > 0: with 0/1 rewards, reward 1."""
    return cfg.train_on == "all" or (e.score > 0) == (cfg.train_on == "correct")


def in_loss(e: Episode, cfg: Config) -> bool:
    """Whether the loss sees this kept response: DAPO overlong filtering (mask_truncated) masks
    truncated ones. The loss mask and the global normalisers both follow this one rule."""
    return not (cfg.mask_truncated and e.truncated)


def stand_in(mb_episodes: list[Episode]) -> list:
    """What a rank with an empty micro-batch runs: the mini-batch's first row, with weight 0, so that
    DDP's gradient all-reduce (and FSDP's collectives) happen on every rank alike."""
    return [(mb_episodes[0], mb_episodes[0].rows()[0])]


def collate_rows(learner: Learner, rows: list):
    """(Batch, the scorer's tensor arguments) of (episode, chunk) rows."""
    batch = collate([c for _, c in rows], learner.pad_id, learner.device)
    return batch, (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask)


def fixed_passes(learner: Learner, *, minibatches: list) -> tuple[list[list], list[list]]:
    """(olds, refs) [mini-batch][micro-batch]: π_old outputs and π_ref log-probs before a step moves θ; None
    where micro_step's own forward is π_old, detached (mini-batch 1, no batch-wide choice): K = 1, β = 0 run none."""
    cfg, algo = learner.cfg, learner.algo
    olds = [[None] * len(micro) for _, micro in minibatches]
    refs = [[None] * len(micro) for _, micro in minibatches]
    if len(minibatches) == 1 and not batch_wide(algo, cfg) and learner.ref_scorer is None:
        return olds, refs
    with torch.no_grad(), learner.autocast():
        for i, (mb_episodes, micro) in enumerate(minibatches):
            for j, rows in enumerate(micro):
                _, args = collate_rows(learner, rows or stand_in(mb_episodes))
                if i > 0 or batch_wide(algo, cfg):
                    olds[i][j] = learner.scorer(*args, cfg.temperature, vocab_mean=algo.vocab_mean)
                if learner.ref_scorer is not None:
                    refs[i][j] = learner.ref_scorer(*args, cfg.temperature)["logp"]
    return olds, refs


def batch_flags(learner: Learner, *, mb_episodes: list[Episode], micro: list, olds: list, on_policy: bool,
                seed: int) -> list[dict]:
    """Per micro-batch of this rank, the token flags that need the whole mini-batch (algos/select.py),
    from its scores at the current weights: π_old's own when nothing has moved yet (on_policy), else
    a no-grad pass. {} each when the run has no such choice."""
    cfg = learner.cfg
    if not batch_wide(learner.algo, cfg):
        return [{} for _ in micro]
    current = olds
    if not on_policy:
        with torch.no_grad(), learner.autocast():
            current = [learner.scorer(*collate_rows(learner, rows or stand_in(mb_episodes))[1],
                                      cfg.temperature) for rows in micro]
    from algos.select import token_flags
    return token_flags(learner.algo, cfg, mb_episodes, micro, current, olds, seed=seed,
                       in_loss=[in_loss(e, cfg) for e in mb_episodes],
                       gather=partial(gather_objects, world=learner.world))


def micro_step(learner: Learner, *, rows: list, mb_episodes: list[Episode], old: dict | None, ref_logp,
               flags: dict, totals: dict, sync: bool, mismatch: list | None) -> tuple[dict, dict]:
    """Forward, loss and backward of one micro-batch of this rank; (its metrics, its π_old outputs). An empty
    micro-batch runs its mini-batch's stand_in with weight 0 (its backward adds exact zeros), so that every rank
    joins the gradient all-reduce; its metrics are zeros. old None: this forward is π_old (the first mini-batch,
    before any step). mismatch: where to collect the sampler/trainer gap, or None."""
    cfg, algo = learner.cfg, learner.algo
    dummy = not rows
    rows = rows or stand_in(mb_episodes)
    batch, args = collate_rows(learner, rows)
    with grad_sync(learner.scorer, sync), learner.autocast():
        out = learner.scorer(*args, cfg.temperature, vocab_mean=algo.vocab_mean, entropy_grad=cfg.entropy_coef != 0)
        if old is None:
            old = {name: v.detach() for name, v in out.items()}
        inputs = loss_inputs(learner, rows=rows, batch=batch, out=out, old=old, ref_logp=ref_logp, flags=flags)
        loss, metrics = algo.loss(inputs, cfg, totals)
        if inputs.high_entropy is not None:  # the share of valid tokens that carry the policy loss
            metrics["entropy/high_frac"] = (inputs.mask * inputs.high_entropy).sum() / max(totals["tokens"], 1)
        entropy = (inputs.mask * out["entropy"]).sum() / max(totals["tokens"], 1)
        if cfg.entropy_coef:  # a bonus, or below 0 a penalty (entropy minimisation)
            loss = loss - cfg.entropy_coef * entropy
        # the loss is already a share of the global mini-batch: ranks' gradients add (parallel.wrap sums)
        (out["logp"].sum() * 0.0 if dummy else loss).backward()
    if mismatch is not None and not dummy and batch.sampler_logp is not None:
        mismatch.append((old["logp"] - batch.sampler_logp)[inputs.mask > 0].cpu().numpy())
    # every rank sums the same metric names (a stand-in adds zeros) for the all-reduce
    metrics.update({"loss/total": loss.detach(), "entropy/mean": entropy.detach(),
                    "layout/real_tokens": batch.attention_mask.sum(), "layout/tensor_tokens": batch.input_ids.numel()
                    if not cfg.pack else importlib.import_module("packing").packed_tokens(batch.attention_mask)})
    return {name: 0.0 if dummy else float(v) for name, v in metrics.items()}, old


def loss_inputs(learner: Learner, *, rows: list, batch, out: dict, old: dict, ref_logp, flags: dict) -> LossInputs:
    """The micro-batch as its loss receives it (algos/base.py): the scorer's outputs at θ and π_old,
    the loss mask (DAPO's overlong filtering masks truncated rows), and per-row values."""
    cfg, device = learner.cfg, learner.device
    episodes = [e for e, _ in rows]
    keep = torch.tensor([in_loss(e, cfg) for e in episodes], device=device)
    mask = batch.response_mask * keep[:, None]
    is_weight = None
    if batch.sampler_logp is not None and (cfg.tis_cap or cfg.mis_cap):  # π_old: the rollout's weights in the trainer
        is_weight = sampler_correction(old["logp"], batch.sampler_logp, mask, tis_cap=cfg.tis_cap, mis_cap=cfg.mis_cap)
    return LossInputs(
        logp=out["logp"], old_logp=old["logp"], mask=mask,
        adv=torch.tensor([e.row_advantage(c) for e, c in rows], device=device),
        labels=torch.tensor([float(e.score > 0) for e in episodes], device=device),
        group=torch.tensor([e.group for e in episodes], device=device),
        # a row's whole response, which for a chunk is its trace (docs/math.md §5)
        seq_tokens=torch.tensor([loss_tokens(e, cfg) for e in episodes], device=device),
        entropy=out["entropy"], ref_logp=ref_logp,
        vocab_mean=out.get("vocab_mean"), old_vocab_mean=old.get("vocab_mean"), is_weight=is_weight,
        selected=flags.get("selected"), high_entropy=flags.get("high_entropy"))


def optimizer_step(learner: Learner, loss: float = 0.0, step: int = 0) -> float:
    """Clip the global gradient norm, step the optimizer and the schedule unless the loss or the norm is
    not finite (the guard); the norm before clipping (the same on every rank)."""
    params = [p for p in learner.lm.parameters() if p.grad is not None]
    grad_norm = clip_grad_norm(params, learner.cfg.grad_clip if learner.cfg.grad_clip > 0 else math.inf)
    if learner.guard.applies(grad_norm, loss, step=step, rank=learner.rank, device=learner.device):
        learner.optimizer.step()
        learner.scheduler.step()
    learner.optimizer.zero_grad(set_to_none=True)
    return grad_norm


def update_metrics(learner: Learner, *, episodes: list[Episode], sums: dict, steps: int, mismatch: list) -> dict:
    """The update's metrics: the loss metrics averaged over optimizer steps and summed over ranks
    (each is already a share of its mini-batch), the sampler/trainer gap, and what was trained."""
    out = {k: v / steps for k, v in all_reduce_sum(sums, learner.device).items()}
    if all(c.sampler_logp for e in episodes for c in e.rows()):  # the same answer on every rank
        out.update(mismatch_stats([d for part in gather_objects(mismatch, learner.world) for d in part]))
    return {**out, "update/skipped": 0.0, "update/responses": len(episodes), "update/optimizer_steps": steps,
            "update/nonfinite_skipped": learner.guard.skipped,
            # prompt and response tokens through the update's forwards (μ times), the share of padding in their
            # tensors, and the busiest rank's real tokens over the mean
            "tokens/forward": round(out["layout/real_tokens"] * steps),
            "layout/padding_share": 1 - out["layout/real_tokens"] / out["layout/tensor_tokens"],
            "layout/rank_spread": max(gather_objects(sums["layout/real_tokens"], learner.world)) * learner.world
            / (out["layout/real_tokens"] * steps)}


def balanced_split(sizes: list[int], parts: int, nonempty: bool = False) -> list[range]:
    """Cut a sequence of items into `parts` contiguous runs of about equal total size.

    sizes [4, 4, 4], 2 parts -> [range(0, 2), range(2, 3)] (8 and 4 rows);
    sizes [1, 1, 6, 1, 1], 2 parts -> [range(0, 3), range(3, 5)]. A run may be empty unless
    `nonempty` (then len(sizes) ≥ parts is required).
    """
    cum = np.concatenate([[0], np.cumsum(sizes)])
    bounds = [0]
    for j in range(1, parts):
        b = int(np.searchsorted(cum, j * cum[-1] / parts))  # first cut with ≥ j/parts of the rows
        if nonempty:
            b = min(max(b, bounds[-1] + 1), len(sizes) - (parts - j))
        bounds.append(max(b, bounds[-1]))
    bounds.append(len(sizes))
    return [range(lo, hi) for lo, hi in zip(bounds, bounds[1:])]


def pack(units: list[list], cap: int, max_tokens: int = 0) -> list[list]:
    """Consecutive units of rows into micro-batches of at most `cap` rows and, with max_tokens,
    at most that many padded tokens; a unit is never split (one over the budget goes alone).
    [[a, b], [c, d], [e, f]], cap 4 -> [[a, b, c, d], [e, f]]."""
    micro = []
    for unit in units:
        joined = micro[-1] + unit if micro else unit
        if micro and len(joined) <= cap and (not max_tokens or padded_tokens(joined) <= max_tokens):
            micro[-1] = joined
        else:
            micro.append(list(unit))
    return micro


def padded_tokens(rows) -> int:
    """Tokens of the collated tensors of (episode, chunk) rows, padding included: rows ×
    (longest prompt + longest response). Prompts of 3 and 5 tokens, responses of 4 and 1 -> 18."""
    return len(rows) * (max(len(c.prompt_ids) for _, c in rows) + max(len(c.response_ids) for _, c in rows))


def split_minibatches(episodes: list[Episode], cfg: Config, rank: int, world: int,
                      whole_groups: bool = False):
    """Group-major episodes -> per mini-batch: (all its episodes, this rank's micro-batches).

    Mini-batches hold whole groups, about B·G/K episodes each: a batch of n episodes gets
    ceil(n·K / (B·G)) of them, so when PSR/NSR drop some there are fewer. A training row is an
    (episode, chunk) pair: one per episode, or one per chunk of a Markovian trace. Inside a
    mini-batch, rows (or, with whole_groups, groups) are spread over ranks as evenly as they go,
    and every rank gets the same number of micro-batches (some possibly empty) so that DDP's and
    FSDP's collectives line up. With max_tokens_per_micro_batch, units are first sorted by
    response then prompt length and spread by padded tokens (prompts and responses are padded
    separately, so this keeps a Markovian chunk-1 row, short prompt and C tokens, apart from later
    chunks, long prompt and C − m tokens). 12 one-chunk episodes, 2 ranks, micro-batch 4: rank 0 gets rows 0-5 as
    [0-3], [4-5]; rank 1 rows 6-11 as [6-9], [10-11].
    """
    by_group = {}
    for e in episodes:  # group-major, so each group's rows are one run
        by_group.setdefault(e.group, []).append(e)
    groups = list(by_group.values())
    full = cfg.prompts_per_step * cfg.group_size
    count = min(len(groups), math.ceil(len(episodes) * cfg.mini_batches / full))  # K, or fewer after PSR/NSR
    out = []
    for part in balanced_split([len(g) for g in groups], count, nonempty=True):
        mb_groups = [groups[i] for i in part]
        rows = [[(e, c) for e in g for c in e.rows()] for g in mb_groups]
        units = rows if whole_groups else [[row] for g in rows for row in g]
        sizes = [len(u) for u in units]
        if cfg.max_tokens_per_micro_batch:  # sorted by response, then prompt length: little padding
            units.sort(key=lambda u: max((len(c.response_ids), len(c.prompt_ids)) for _, c in u))
            sizes = [padded_tokens(u) for u in units]
        per_rank = (importlib.import_module("packing").share(units, world, cfg) if cfg.pack else  # by real tokens
                    [pack([units[i] for i in r], cfg.micro_batch_size, cfg.max_tokens_per_micro_batch)
                     for r in balanced_split(sizes, world)])
        n_micro = max(1, max(len(m) for m in per_rank))
        mine = per_rank[rank] + [[] for _ in range(n_micro - len(per_rank[rank]))]
        out.append(([e for g in mb_groups for e in g], mine))
    return out


def loss_tokens(e: Episode, cfg: Config) -> int:
    """Tokens of the response (all chunks of a trace) that the loss sees."""
    return len(e.response_ids) if in_loss(e, cfg) else 0


def mini_batch_totals(episodes: list[Episode], cfg: Config) -> dict:
    """Global normalisers of a mini-batch (docs/math.md §0): valid tokens, responses (traces) with any,
    and the response budget L of Dr. GRPO's constant normaliser."""
    lengths = [loss_tokens(e, cfg) for e in episodes]
    return {"tokens": sum(lengths), "seqs": sum(1 for n in lengths if n > 0), "max_len": response_tokens(cfg)}


# ============================================================================ logging

def say(rank: int, *msg) -> None:
    if rank == 0:
        tqdm.write(" ".join(str(m) for m in msg))


# ============================================================================ main

@dataclass
class Setup:
    """What preflight checked and built before any weight loads, the same on every rank."""
    task: object  # tasks.Task: its prompt stream, its grader, its per-batch metrics
    train_problems: list
    heldout: list  # held-out problems for the periodic eval (empty: none)
    shape: object  # the training rollout's shape (config.rollout_shapes): plain, Markovian chunks, or turns
    eval_shape: object  # the held-out eval's (Markovian: eval_max_chunks)
    tokenizer: object
    hf_config: object
    out: Path  # the run folder
    start: Path | None  # the checkpoint to resume from, or None


def preflight(cfg: Config) -> Setup:
    """Every check that needs no model weights, on every rank before any rank starts: the config,
    the data, the model folder, prompt lengths, the rollout's shape (--env's environment), the run folder."""
    validate(cfg, (cfg.plan and cfg.world_size) or int(os.environ.get("WORLD_SIZE", "1")))
    if cfg.plan:
        from extras.plan import print_plan

        sys.exit(print_plan(cfg))
    require_trackers(cfg)  # each tracker --report-to names is installed, or its pip command before any load
    task, train_problems, heldout = data.load(cfg)
    tokenizer, hf_config = check_model_folder(cfg.model, cfg.trust_remote_code)
    if cfg.lora_rank:  # peft installed, --lora-targets naming the model's layers (extras/lora.py)
        from extras.lora import check_targets
        require_peft("--lora-rank")
        check_targets(hf_config, cfg.lora_targets)
    sampler_class(cfg).check(cfg, hf_config)  # --engine's sampler able to run here (vllm: installed)
    shape, eval_shape = rollout_shapes(cfg, tokenizer)
    check_prompts_fit(cfg, tokenizer, hf_config, train_problems + heldout, shape.tools)
    out, start = run_folder(cfg.resume, cfg.out, Path("runs") / f"{cfg.algo}-{time.strftime('%Y%m%d-%H%M%S')}")
    return Setup(task=task, train_problems=train_problems, heldout=heldout, shape=shape, eval_shape=eval_shape,
                 tokenizer=tokenizer, hf_config=hf_config, out=out, start=start)


def main(argv=None) -> None:
    first = os.environ.get("RANK", "0") == "0"  # every rank finds the same mistake; one says it
    with ExitStack() as held:
        try:
            cfg = parse_config(argv)
            setup = preflight(cfg)
            if first:
                held.enter_context(lock(setup.out))  # the run folder is this process's until it exits
                for note in (*setup.task.warnings, *setup.shape.warnings):  # a weak sandbox, said once
                    print(f"warning: {note}", file=sys.stderr, flush=True)
        except (ValueError, FileNotFoundError, CheckpointError) as e:  # DataError is a ValueError
            if not first:  # rank 0 says why first: torchrun, seeing this rank gone, could stop rank 0 before it did
                time.sleep(5)
            sys.exit(f"error: {e}" if first else 1)
        error = ""
        try:
            train(cfg, setup)
        except (CheckpointError, ModelError, RolloutError) as e:
            error = f"error: {e}"
        if error and first:
            print(error, file=sys.stderr, flush=True)
        # After train()'s frames are gone: a DDP model that outlives its process group can deadlock
        # gloo at exit. And no rank leaves before rank 0 has said why (torchrun stops the rest).
        teardown()
        if error:
            sys.exit(1)


def models(cfg: Config, start: Path | None, tokenizer, train_problems, device, world: int):
    """(the policy lm, its peft model or None, the scorer train.update calls, the reference scorer
    or None), on this rank's device, wrapped for DDP / FSDP2. What trains is held in fp32 (master
    weights); with LoRA (extras/lora.py) that is the adapters, peft's layers go into lm itself, which keeps
    serving rollouts, the scorer and checkpoints, and the reference is that scorer with adapters off."""
    dtype, mode = compute_dtype(cfg, device), parallel_mode(cfg, device)
    # a LoRA checkpoint need not hold the base weights: a LoRA run loads them from --model, resumed or not
    lm = load_model(str(cfg.model if cfg.lora_rank else start or cfg.model), device=device,
                    trust_remote_code=cfg.trust_remote_code, gradient_checkpointing=cfg.gradient_checkpointing)
    # before any step: our log-probs must be the model's own (an unknown logit transform stops here)
    check_logprobs(lm, encode_prompts(tokenizer, train_problems[:1], cfg.chat_template,
                                      chat_kwargs=cfg.chat_template_kwargs)[0] + [tokenizer.eos_token_id],
                   cfg.temperature)
    adapters = None
    if cfg.lora_rank:
        from extras.lora import add_lora

        adapters = add_lora(lm, rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=cfg.lora_targets, base=cfg.model,
                            dtype=weights_dtype(cfg, device), seed=cfg.seed)
    scorer = wrap(ResponseLogProbs(lm, cfg.logprob_chunk, cfg.pack), mode=mode, world=world, device=device, dtype=dtype)
    if cfg.beta == 0 and not cfg.teacher:
        return lm, adapters, scorer, None
    if adapters is not None and not cfg.teacher:  # the base itself: no second copy of the weights
        from extras.lora import AdaptersOff

        return lm, adapters, scorer, AdaptersOff(scorer, adapters)
    # frozen: no fp32 master copy, the weights as the policy's forward sees them. OPD's teacher
    # (algos/opd.py) is this frozen scorer, loaded from --teacher: the loss reads its log-probs as the reference's
    ref_lm = load_model(cfg.teacher or cfg.model, dtype=weights_dtype(cfg, device), device=device,
                        trust_remote_code=cfg.trust_remote_code, trainable=False)
    return lm, adapters, scorer, wrap(ResponseLogProbs(ref_lm, cfg.logprob_chunk, cfg.pack), mode=mode, world=world,
                                      device=device, dtype=dtype, trainable=False)


def learner_for(cfg: Config, start: Path | None, tokenizer, train_problems, rank: int, world: int, device):
    """(the Learner, the policy's peft model or None): the models, AdamW and the lr schedule, said in one line."""
    lm, adapters, scorer, ref_scorer = models(cfg, start, tokenizer, train_problems, device, world)
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=learning_rate(cfg),
                                  weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, partial(lr_factor, cfg=cfg))
    lora_note = f", LoRA rank {cfg.lora_rank}: {count_parameters(lm, trainable=True)} trained" if adapters else ""
    reference = (f"the teacher {cfg.teacher}" if cfg.teacher else "none (beta = 0)" if cfg.beta == 0
                 else "the base (adapters off)" if adapters else "yes")
    say(rank, f"policy {start or cfg.model}: {count_parameters(lm)} parameters{lora_note} on {device} × {world} "
              f"rank(s), {parallel_mode(cfg, device)}, compute {str(compute_dtype(cfg, device))[6:]}, "
              f"lr {learning_rate(cfg):g}; reference model: {reference}")
    return Learner(scorer=scorer, lm=lm, ref_scorer=ref_scorer, optimizer=optimizer, scheduler=scheduler,
                   algo=algos.get(cfg.algo), cfg=cfg, autocast=autocast_context(cfg, device),
                   pad_id=tokenizer.pad_token_id, rank=rank, world=world, device=device), adapters


def mixed_seed(seed: int, a: int, b: int) -> int:
    """One seed from the run's seed and two counters, (step, rank) or (group, epoch): a resumed run
    replays the same draws without saving RNG states."""
    return seed * 1_000_003 + a * 1_009 + b


def train(cfg: Config, setup: Setup) -> None:
    task, heldout, tokenizer, start = setup.task, setup.heldout, setup.tokenizer, setup.start
    rank, world, device = setup_distributed(cfg)
    out = Path(gather_objects(str(setup.out), world)[0])  # rank 0's timestamp names the run
    hf_logging.disable_progress_bar()  # our tqdm is the one progress bar
    learner, adapters = learner_for(cfg, start, tokenizer, setup.train_problems, rank, world, device)
    lm, scheduler, log = learner.lm, learner.scheduler, partial(say, rank)
    stream = task.stream(setup.train_problems, cfg.seed)
    state = resume(start, lm, learner.optimizer, scheduler, stream, cfg, world, log)
    step, data_pos = state["step"], state["data_pos"]
    logged = step if start is not None else -1  # the last step whose rows the logs keep
    if rank == 0:
        open_run(out, cfg, logged, log)
    log(config_note(cfg, out / "config.yaml"))
    logger = Logger(out, rank == 0, tokenizer, cfg, trackers(cfg), purge_step=logged + 1 if cfg.resume else None)

    def run_eval(step, keys=None, row=()):  # keys: the metrics its line shows, with ± (None: all); row: the step's
        from eval import evaluate, shown, write_problems  # a run with --eval-every 0 never loads the eval script
        with sampler.serving(learner.scorer, learner.autocast):
            metrics, records = evaluate(lm, tokenizer, task, heldout, **eval_settings(cfg, setup.eval_shape, sampler))
        if rank == 0:  # per problem, for eval.py --compare and extras/seeds.py
            write_problems(out / "evals" / f"step-{step}.jsonl", records)
        log(f"step {step} " + shown(metrics, keys or metrics))
        if cfg.health and rank == 0 and step:  # the curves so far, read for the user (the step never calls it)
            from extras.health import verdict
            log(verdict(out, {"step": step, **dict(row), **metrics}, logger.tb))
        return metrics

    sampler = sampler_class(cfg).start(cfg, lm, world, learner.optimizer)  # who samples, built once
    if cfg.eval_every and step == 0 and heldout:
        logger.log(0, run_eval(0))

    peak_memory(device, "set-up")  # the first rollout's peak starts here
    bar = tqdm(range(step + 1, cfg.max_steps + 1), disable=rank != 0, desc=cfg.algo, initial=step, total=cfg.max_steps)
    for step in bar:
        torch.manual_seed(mixed_seed(cfg.seed, step, rank))  # every random draw of a step
        random.seed(mixed_seed(cfg.seed, step, rank))
        t0 = time.perf_counter()
        with sampler.serving(learner.scorer, learner.autocast):  # --algo sft: its demonstrations (algos/sft.py)
            episodes, generated, data_pos, metrics = getattr(learner.algo, "source", collect_rollouts)(
                lm, tokenizer, task, stream, data_pos, cfg, rank, world, setup.shape, sampler)
        setup.shape.check(generated)  # an environment failing every trace stops the run here
        metrics.update(peak_memory(device, "rollout"), **sampler.metrics())
        t1 = time.perf_counter()
        # dynamic sampling that kept nothing: every rank skips the update alike
        metrics.update(update(learner, episodes, step) if episodes else {"update/skipped": 1.0})
        t2 = time.perf_counter()
        metrics.update({**peak_memory(device, "update"), "time/rollout": t1 - t0, "time/update": t2 - t1,
                        "time/step": t2 - t0, "lr": scheduler.get_last_lr()[0]})
        if cfg.eval_every and step % cfg.eval_every == 0 and heldout:
            metrics.update(run_eval(step, ["eval/accuracy", *(f"eval/pass@{k}" for k in cfg.eval_k)], metrics))
        logger.log(step, metrics, generated[:cfg.log_samples])
        bar.set_postfix(reward=f"{metrics.get('reward/mean', math.nan):.3f}", len=f"{metrics['length/mean']:.1f}")
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.max_steps:
            save_run(out, step, cfg=cfg, lm=lm, optimizer=learner.optimizer, adapters=adapters,
                     hf_config=setup.hf_config, tokenizer=tokenizer, rank=rank, device=device,
                     trainer_state={"step": step, "data_pos": data_pos, "scheduler": scheduler.state_dict(),
                                    "world": world, "stream": stream.state()})
    logger.close()


if __name__ == "__main__":
    main()
