"""RL with verifiable rewards, top to bottom.

    torchrun --nproc_per_node 2 train.py --algo grpo      # the default: tiny model, running sums
    python train.py --algo dapo --model PATH --data train.jsonl --eval-data test.jsonl

Each step:
  1. rollout   every rank samples G responses for its share of B prompts (one generate call,
               or with Markovian thinking one per chunk round); the task grades them; episodes
               are gathered so that every rank holds the global batch (global counts and batch
               std then need no further collective)
  2. filter    optional DAPO dynamic sampling: drop groups whose rewards are all equal and
               sample more prompts until B groups are kept or the round cap is hit
  3. advantage per response, from its whole group (algos/); PSR/NSR then drop the responses
               they do not train on (train_on), and a step that keeps none skips its update
  4. update    K mini-batches of whole groups × μ epochs, one optimizer step per mini-batch; each
               rank takes its share of the mini-batch in micro-batches of rows (a row is a
               response, or one chunk of a Markovian trace); every loss is divided by counts of
               the whole mini-batch on all ranks (SPEC §0)
  5. log, eval, checkpoint

Config precedence: dataclass defaults < the algorithm's preset < --config YAML < command line.
Left out on purpose: vLLM/SGLang generation, tensor/pipeline parallelism, multi-node, value
models (PPO with a critic), reward models.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import random
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import yaml
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm
from transformers.utils import logging as hf_logging

import algos
from algos.grpo import ADV_NORMS, LOSS_AGGS
from algos.pacs import PACS_PSIS
from algos.rover import ROVER_ADVS
from eval import evaluate
from model import (ResponseLogProbs, count_parameters, load_model, load_tokenizer,
                   load_trainer_state, save_checkpoint)
from rewards import BUILTIN_TASKS, DataError, builtin_splits, load_file, make_task, overlong_penalty
from rollout import Chunking, Episode, Sampling, collate, encode_prompts, generate

DEFAULT_MODEL = str(Path(__file__).resolve().parent / "assets" / "tiny-running-sum")


@dataclass
class Config:
    # --- run
    algo: str = "grpo"  # a name from algos/__init__.py; its preset sets the loss knobs below
    config: str = ""  # YAML preset file; its keys are Config fields
    model: str = DEFAULT_MODEL  # any local HF causal LM folder; default: the shipped tiny model
    data: str = "running_sum"  # built-in task (running_sum, countdown) or a .jsonl/.json/.parquet file
    eval_data: str = ""  # held-out file; built-in tasks use their own held-out split
    out: str = ""  # run directory; default runs/<algo>-<timestamp>
    max_steps: int = 400  # rollout batches (each gives K × μ optimizer steps)
    seed: int = 0  # fixes data order, sampling and everything else
    resume: str = ""  # a checkpoints/step-N folder to continue from
    # --- task
    sum_min_terms: int = 3  # running_sum: fewest integers to add
    sum_max_terms: int = 5  # running_sum: most integers to add
    sum_digits: int = 2  # running_sum: digits per integer
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    grade_timeout: float = 10.0  # seconds per math-verify grading (file tasks); over it scores 0, counted
    # --- batch sizes
    prompts_per_step: int = 16  # B: prompts per rollout batch, over all ranks
    group_size: int = 8  # G: responses sampled per prompt
    mini_batches: int = 1  # K: optimizer steps per full rollout batch (mini-batches of B·G/K rows, whole groups)
    epochs: int = 1  # μ: passes over the rollout batch
    micro_batch_size: int = 64  # sequences per forward/backward on one rank (grad accumulation)
    # --- sampling (never inherited from the checkpoint's generation_config)
    temperature: float = 1.0  # rollout temperature τ; log-probs use z/τ too
    top_p: float = 1.0  # nucleus sampling; 1 = off
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 80  # tokens per generate call: the response budget, or with max_chunks > 1 the chunk size C
    # --- optimizer
    lr: float = 3e-4  # AdamW learning rate after warm-up
    warmup_steps: int = 5  # optimizer steps of linear warm-up, then constant
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    # --- GRPO-family loss knobs (the --algo preset fills these; see algos/grpo.py)
    adv_norm: str = "group"  # group | batch (Lite PPO) | none (Dr. GRPO) | rloo
    std_estimator: str = "unbiased"  # unbiased (n − 1, TRL/verl) | population
    adv_eps: float = 1e-6  # added to the std before dividing
    clip_low: float = 0.2  # ε_low: ratio clipped below at 1 − ε_low
    clip_high: float = 0.2  # ε_high: ratio clipped above at 1 + ε_high (DAPO clip-higher 0.28)
    dual_clip: float = 0.0  # c > 1 caps the loss of negative-advantage tokens at −c·A; 0 = off
    loss_agg: str = "seq-mean-token-mean"  # | token-mean | seq-mean-token-sum-norm (L = max_new_tokens)
    beta: float = 0.0  # k3 KL weight to a frozen reference; 0 loads no reference model
    entropy_coef: float = 0.0  # entropy bonus, any algorithm: loss −= c · token-mean entropy
    # --- PSR / NSR / W-REINFORCE (algos/nsr.py)
    train_on: str = "all"  # responses the update keeps: all | correct (PSR) | incorrect (NSR)
    positive_advantage_weight: float = 0.1  # λ: advantage of a correct response (W-REINFORCE)
    # --- ROVER (algos/rover.py)
    rover_temp: float = 1.0  # ρ: Q = ρ · (logp − logp_old)
    rover_adv: str = "group"  # group (official math recipe) | mean (paper: R − group mean)
    # --- PACS (algos/pacs.py)
    pacs_beta: float = 1.0  # β: score r̂ = β · Σ_t (logp − logp_old) over the response
    pacs_psi: str = "loo"  # r̂ -> logit ψ within the group: loo (leave-one-out) | zscore | none
    # --- Markovian thinking (Delethink, SPEC §5; rollout.py), with any algorithm but PACS
    max_chunks: int = 1  # I: chunks of max_new_tokens (C) per trace, context reset between; 1 = plain
    carryover: int = 0  # m < C: tokens carried into each next chunk's prompt; 0 = C/2
    chunk_head: int = 100  # h ≤ m: of those, the first h tokens of chunk 1; the rest is the latest tail
    eval_max_chunks: int = 0  # I at eval; more than max_chunks = test-time scaling; 0 = max_chunks
    # --- batch shaping (DAPO)
    mask_truncated: bool = False  # truncated responses get loss mask 0 (overlong filtering)
    overlong_penalty: bool = False  # soft length penalty added to the reward
    overlong_cache: int = 16  # penalty ramps from 0 to −1 over the last this-many tokens
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal; resample
    max_sampling_rounds: int = 3  # extra generation rounds dynamic sampling may use per step
    # --- eval
    eval_every: int = 50  # steps between held-out evals (and one before step 1); 0 = off
    eval_problems: int = 200  # held-out problems per eval; 0 = all
    eval_samples: int = 4  # n: samples per problem (avg@n, maj@n)
    eval_k: list = field(default_factory=lambda: [1, 4])  # pass@k values, each ≤ eval_samples
    eval_temperature: float = 1.0  # sampling temperature at eval
    eval_top_p: float = 1.0  # nucleus sampling at eval (papers: 0.95 with temperature 0.6)
    eval_greedy: bool = False  # also score one greedy (temperature 0) response per problem
    eval_batch_size: int = 256  # sequences per generate call at eval; eval samples depend on it
    # --- checkpoints and logs
    save_every: int = 0  # steps between checkpoints (one is always written at the end); 0 = end only
    log_samples: int = 2  # completions written to samples.jsonl per step
    # --- system
    precision: str = "auto"  # auto (bf16 autocast on CUDA, fp32 on CPU) | fp32 | bf16
    gradient_checkpointing: bool = False  # trade compute for memory in training forwards
    logprob_chunk: int = 512  # tokens per chunk of the log-prob computation (peak ~ 5·chunk·vocab·4 B)
    trust_remote_code: bool = False  # allow model code shipped with a checkpoint


# ============================================================================ config

def parse_config(argv=None) -> Config:
    parser = argparse.ArgumentParser(description="RL with verifiable rewards (see README.md)",
                                     argument_default=argparse.SUPPRESS)
    for f in fields(Config):
        kind = _kind(f.name)
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_parser_for(kind),
                            help=_help(f.name), metavar=kind.__name__.upper())
    cli = vars(parser.parse_args(argv))
    file_values = _read_yaml(cli["config"]) if cli.get("config") else {}
    algo = cli.get("algo", file_values.get("algo", Config.algo))
    values = {**algos.get(algo).preset, **file_values, **cli}
    return Config(**values)


def _kind(name: str) -> type:
    f = Config.__dataclass_fields__[name]
    return type(f.default_factory() if f.default is dataclasses.MISSING else f.default)


def _parser_for(kind):
    if kind is bool:
        def to_bool(s: str) -> bool:
            if s.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")
            return s.lower() in ("true", "1", "yes")
        return to_bool
    if kind is list:
        return lambda s: [int(x) for x in s.split(",") if x]
    return kind


def _help(name: str, _source=Path(__file__).read_text()) -> str:
    """The field's comment in Config, so --help and the dataclass never disagree."""
    line = _source.split(f"\n    {name}: ", 1)[1].split("\n", 1)[0]
    return line.split("# ", 1)[1] if "# " in line else ""


def _read_yaml(path: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"--config {path}: no such file")
    try:
        values = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise DataError(f"--config {path}: not valid YAML ({e})") from None
    if not isinstance(values, dict):
        raise DataError(f"--config {path}: expected a mapping of Config fields")
    known = {f.name for f in fields(Config)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise DataError(f"--config {path}: unknown field(s) {', '.join(unknown)}; "
                        f"see the Config dataclass in train.py for the names")
    out = {}
    for name, value in values.items():  # YAML reads 1e-6 as a string; the field type decides
        kind = _kind(name)
        try:
            out[name] = ([int(v) for v in value] if kind is list and isinstance(value, list)
                         else _parser_for(kind)(str(value)))
        except (ValueError, argparse.ArgumentTypeError):
            raise DataError(f"--config {path}: field {name}: {value!r} is not a {kind.__name__}") from None
    return out


def validate(cfg: Config, world: int) -> None:
    """Every mistake we can see before loading a model, with the field to change."""
    checks = [
        (cfg.prompts_per_step % world == 0,
         f"prompts_per_step={cfg.prompts_per_step} must be divisible by the {world} ranks"),
        (1 <= cfg.mini_batches <= cfg.prompts_per_step,
         f"mini_batches={cfg.mini_batches} must be between 1 and prompts_per_step="
         f"{cfg.prompts_per_step} (each mini-batch holds whole groups)"),
        (cfg.group_size >= 1 and cfg.epochs >= 1 and cfg.micro_batch_size >= 1,
         "group_size, epochs and micro_batch_size must be ≥ 1"),
        (cfg.adv_norm != "rloo" or cfg.group_size >= 2, "adv_norm=rloo needs group_size ≥ 2"),
        (cfg.adv_norm in ADV_NORMS, f"adv_norm={cfg.adv_norm!r}: choose one of {ADV_NORMS}"),
        (cfg.loss_agg in LOSS_AGGS, f"loss_agg={cfg.loss_agg!r}: choose one of {LOSS_AGGS}"),
        (cfg.std_estimator in ("unbiased", "population"),
         f"std_estimator={cfg.std_estimator!r}: choose unbiased or population"),
        (cfg.train_on in TRAIN_ON, f"train_on={cfg.train_on!r}: choose one of {TRAIN_ON}"),
        (cfg.rover_adv in ROVER_ADVS, f"rover_adv={cfg.rover_adv!r}: choose one of {ROVER_ADVS}"),
        (cfg.pacs_psi in PACS_PSIS, f"pacs_psi={cfg.pacs_psi!r}: choose one of {PACS_PSIS}"),
        (not algos.get(cfg.algo).whole_groups or cfg.group_size >= 2,
         f"--algo {cfg.algo} compares each response with the rest of its group: group_size ≥ 2"),
        (not algos.get(cfg.algo).whole_groups or cfg.micro_batch_size >= cfg.group_size,
         f"--algo {cfg.algo} keeps each group whole in a micro-batch: micro_batch_size="
         f"{cfg.micro_batch_size} must be ≥ group_size={cfg.group_size}"),
        (not algos.get(cfg.algo).whole_groups or (cfg.train_on == "all" and not cfg.mask_truncated),
         f"--algo {cfg.algo} compares every response with the rest of its group: it needs "
         f"train_on=all and mask_truncated=false"),
        (cfg.rover_temp > 0 and cfg.pacs_beta > 0, "rover_temp and pacs_beta must be > 0"),
        (cfg.max_chunks >= 1 and cfg.eval_max_chunks >= 0, "max_chunks must be ≥ 1, eval_max_chunks ≥ 0"),
        (max(cfg.max_chunks, cfg.eval_max_chunks) == 1 or 0 <= cfg.chunk_head <= chunking(cfg).carryover
         < cfg.max_new_tokens, f"Markovian thinking needs 0 ≤ chunk_head ({cfg.chunk_head}) ≤ carryover "
         f"({chunking(cfg).carryover}) < max_new_tokens (the chunk size, {cfg.max_new_tokens})"),
        (not algos.get(cfg.algo).whole_groups or cfg.max_chunks == 1,
         f"--algo {cfg.algo} scores whole responses against their group; with max_chunks > 1 a "
         f"response is split over several rows, which it does not support: set max_chunks 1"),
        (cfg.temperature > 0, "temperature must be > 0 for RL rollouts (log-probs use z/τ)"),
        (cfg.max_steps >= 1 and cfg.max_new_tokens >= 1, "max_steps and max_new_tokens must be ≥ 1"),
        (cfg.eval_temperature >= 0 and 0 < cfg.eval_top_p <= 1 and cfg.eval_batch_size >= 1
         and cfg.eval_problems >= 0 and cfg.grade_timeout > 0,
         "eval_temperature must be ≥ 0, eval_top_p in (0, 1], eval_batch_size ≥ 1, eval_problems ≥ 0, "
         "grade_timeout > 0"),
        (all(1 <= k <= cfg.eval_samples for k in cfg.eval_k),
         f"eval_k={cfg.eval_k}: every k must be between 1 and eval_samples={cfg.eval_samples}"),
        (cfg.precision in ("auto", "fp32", "bf16"), "precision must be auto, fp32 or bf16"),
        (not cfg.overlong_penalty or 0 < cfg.overlong_cache <= budget(cfg),
         f"overlong_cache must be in (0, {budget(cfg)}] (the response budget)"),
        (not cfg.eval_data or cfg.data not in BUILTIN_TASKS,
         f"--eval-data is the held-out file of a file task; --data {cfg.data} is built in and is "
         f"graded by its own rules on its own held-out split: drop --eval-data, or train on a file"),
        (cfg.data in BUILTIN_TASKS or cfg.eval_data or cfg.eval_every == 0,
         f"--data {cfg.data} is a file: give --eval-data FILE for held-out eval, "
         f"or --eval-every 0"),
    ]
    for ok, message in checks:
        if not ok:
            raise DataError(message)


def chunking(cfg: Config, evaluation: bool = False) -> Chunking:
    """The Markovian-thinking knobs as rollout.py takes them (max_chunks 1: a plain rollout)."""
    chunks = (cfg.eval_max_chunks or cfg.max_chunks) if evaluation else cfg.max_chunks
    return Chunking(carryover=cfg.carryover or cfg.max_new_tokens // 2, head=cfg.chunk_head,
                    max_chunks=chunks)


def budget(cfg: Config) -> int:
    """Generated tokens a training response can reach: C + (I − 1)(C − m), or max_new_tokens."""
    return chunking(cfg).budget(cfg.max_new_tokens)


def eval_settings(cfg: Config) -> dict:
    """evaluate()'s keyword arguments from the eval fields: train.py's periodic eval and a
    stand-alone `eval.py --config` run take them from here, so their numbers agree."""
    return dict(n=cfg.eval_samples, ks=cfg.eval_k, greedy=cfg.eval_greedy, batch_size=cfg.eval_batch_size,
                sampling=Sampling(cfg.eval_temperature, cfg.eval_top_p, cfg.top_k, cfg.max_new_tokens),
                chunking=chunking(cfg, evaluation=True), chat_template=cfg.chat_template,
                seed=cfg.seed + 7919)


def load_problems(cfg: Config):
    """(task, train problems, held-out problems), read and checked before any model is loaded."""
    task = make_task(cfg.data, sum_min_terms=cfg.sum_min_terms, sum_max_terms=cfg.sum_max_terms,
                     sum_digits=cfg.sum_digits, grade_timeout=cfg.grade_timeout)
    if cfg.data in BUILTIN_TASKS:
        train, heldout = builtin_splits(task)
    else:
        train, heldout = task.problems, []
    if cfg.eval_data:
        heldout = load_file(cfg.eval_data)
    return task, train, heldout[:cfg.eval_problems or None]


# ============================================================================ distributed

def autocast_context(cfg: Config, device):
    """A factory of the context the forwards run in: bf16 autocast (auto: on CUDA), or nothing."""
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    return (lambda: torch.autocast(device.type, dtype=torch.bfloat16)) if bf16 else nullcontext


def setup_distributed():
    """(rank, world, device). torchrun sets RANK; plain `python train.py` is one process."""
    if "RANK" not in os.environ:
        device = "cuda" if torch.cuda.is_available() else "cpu"
        return 0, 1, torch.device(device)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl")
        return dist.get_rank(), dist.get_world_size(), torch.device("cuda", local_rank)
    # CPU ranks share the cores: oversubscribed threads make every rank slower.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size(), torch.device("cpu")


def gather_objects(obj, world: int) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(values: dict, device) -> dict:
    if not dist.is_initialized() or not values:
        return {k: float(v) for k, v in values.items()}
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


# ============================================================================ rollout

class PromptStream:
    """Prompt number i of the run -> a training problem, reshuffled every epoch with the seed.
    The run's position in this stream is part of the trainer state, so resume is exact."""

    def __init__(self, problems, seed: int):
        self.problems, self.seed, self._epoch, self._perm = problems, seed, -1, None

    def get(self, start: int, count: int) -> list:
        out = []
        for i in range(start, start + count):
            epoch, j = divmod(i, len(self.problems))
            if epoch != self._epoch:
                self._epoch = epoch
                self._perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.problems))
            out.append(self.problems[self._perm[j]])
        return out


def collect_rollouts(lm, tokenizer, task, stream: PromptStream, data_pos: int, cfg: Config,
                     rank: int, world: int):
    """Generate, grade and gather until the batch is full. Returns (episodes of the kept groups,
    identical on every rank and group-major; all episodes generated; new data_pos; stats)."""
    b_local = cfg.prompts_per_step // world
    sampling = Sampling(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens)
    kept, generated, rounds, dropped = [], [], 0, 0
    while True:
        problems = stream.get(data_pos + rank * b_local, b_local)
        first_group = data_pos + rank * b_local  # group ids unique over the run
        episodes = generate(lm, tokenizer, problems, encode_prompts(tokenizer, problems, cfg.chat_template),
                            group_size=cfg.group_size, sampling=sampling, chunking=chunking(cfg),
                            first_group=first_group)
        for e in episodes:
            verdict = task.grade(e.problem, e.text)
            e.reward, e.grader_failed = verdict.reward, bool(verdict.failure)
            e.score = e.reward + (overlong_penalty(len(e.response_ids), budget(cfg),
                                                   cfg.overlong_cache) if cfg.overlong_penalty else 0.0)
        episodes = [e for part in gather_objects(episodes, world) for e in part]
        data_pos += cfg.prompts_per_step
        generated += episodes
        groups = [episodes[i:i + cfg.group_size] for i in range(0, len(episodes), cfg.group_size)]
        if cfg.dynamic_sampling:
            informative = [g for g in groups if len({e.reward for e in g}) > 1]
            dropped += len(groups) - len(informative)
            groups = informative
        kept += groups
        if not cfg.dynamic_sampling or len(kept) >= cfg.prompts_per_step or rounds >= cfg.max_sampling_rounds:
            break
        rounds += 1
    kept = kept[:cfg.prompts_per_step]
    stats = rollout_stats(generated, cfg.group_size)
    if cfg.max_chunks > 1:
        stats["length/chunks"] = float(np.mean([len(e.chunks) for e in generated]))
    if cfg.dynamic_sampling:
        stats.update({"dynamic/extra_rounds": rounds, "dynamic/dropped_groups": dropped,
                      "dynamic/kept_groups": len(kept)})
    return [e for g in kept for e in g], generated, data_pos, stats


def rollout_stats(episodes: list[Episode], group_size: int) -> dict:
    rewards = np.array([e.reward for e in episodes])
    lengths = np.array([len(e.response_ids) for e in episodes])
    grouped = rewards.reshape(-1, group_size)
    return {"reward/mean": rewards.mean(), "reward/std": rewards.std(),
            "reward/zero_std_groups": float((grouped.std(1) == 0).mean()),
            "score/mean": float(np.mean([e.score for e in episodes])),
            "length/mean": lengths.mean(), "length/min": lengths.min(), "length/max": lengths.max(),
            "tokens/generated": lengths.sum(),
            "reward/grader_failures": float(sum(e.grader_failed for e in episodes)),
            "length/truncated": float(np.mean([e.truncated for e in episodes]))}


# ============================================================================ update

TRAIN_ON = ("all", "correct", "incorrect")


def selected(e: Episode, cfg: Config) -> bool:
    """Whether the update keeps this response at all (PSR/NSR drop the others, SPEC §2).
    Correct means score > 0: with 0/1 rewards, reward 1."""
    return cfg.train_on == "all" or (e.score > 0) == (cfg.train_on == "correct")


def trained(e: Episode, cfg: Config) -> bool:
    """Whether the loss sees this kept response: DAPO overlong filtering (mask_truncated) masks
    truncated ones. The loss mask and the global normalisers both follow this one rule."""
    return not (cfg.mask_truncated and e.truncated)


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


def pack(units: list[list], cap: int) -> list[list]:
    """Consecutive units into micro-batches of at most `cap` rows; a unit is never split.
    [[a, b], [c, d], [e, f]], cap 4 -> [[a, b, c, d], [e, f]]."""
    micro = []
    for unit in units:
        if micro and len(micro[-1]) + len(unit) <= cap:
            micro[-1] = micro[-1] + unit
        else:
            micro.append(list(unit))
    return micro


def split_minibatches(episodes: list[Episode], cfg: Config, rank: int, world: int,
                      whole_groups: bool = False):
    """Group-major episodes -> per mini-batch: (all its episodes, this rank's micro-batches).

    Mini-batches hold whole groups, about B·G/K episodes each: a batch of n episodes gets
    ceil(n·K / (B·G)) of them, so when PSR/NSR drop some there are fewer. A training row is an
    (episode, chunk) pair: one per episode, or one per chunk of a Markovian trace. Inside a
    mini-batch, rows (or, with whole_groups, groups) are spread over ranks as evenly as they go,
    and every rank gets the same number of micro-batches (some possibly empty) so that DDP's
    collectives line up. 12 one-chunk episodes, 2 ranks, micro-batch 4: rank 0 gets rows 0-5 as
    [0-3], [4-5]; rank 1 rows 6-11 as [6-9], [10-11].
    """
    by_group = {}
    for e in episodes:  # group-major, so each group's rows are one run
        by_group.setdefault(e.group, []).append(e)
    groups = list(by_group.values())
    full = cfg.prompts_per_step * cfg.group_size
    k = min(len(groups), math.ceil(len(episodes) * cfg.mini_batches / full))
    out = []
    for part in balanced_split([len(g) for g in groups], k, nonempty=True):
        mb_groups = [groups[i] for i in part]
        rows = [[(e, c) for e in g for c in e.rows()] for g in mb_groups]
        units = rows if whole_groups else [[row] for g in rows for row in g]
        per_rank = [pack([units[i] for i in r], cfg.micro_batch_size)
                    for r in balanced_split([len(u) for u in units], world)]
        n_micro = max(1, max(len(m) for m in per_rank))
        mine = per_rank[rank] + [[] for _ in range(n_micro - len(per_rank[rank]))]
        out.append(([e for g in mb_groups for e in g], mine))
    return out


def trained_tokens(e: Episode, cfg: Config) -> int:
    """Tokens of the response (all chunks of a trace) that the loss sees."""
    return len(e.response_ids) if trained(e, cfg) else 0


def mini_batch_totals(episodes: list[Episode], cfg: Config) -> dict:
    """Global normalisers of a mini-batch (SPEC §0): valid tokens, responses (traces) with any,
    and the response budget L of Dr. GRPO's constant normaliser."""
    lengths = [trained_tokens(e, cfg) for e in episodes]
    return {"tokens": sum(lengths), "seqs": sum(1 for n in lengths if n > 0), "max_len": budget(cfg)}


def update(scorer, lm, ref_scorer, optimizer, scheduler, algo, episodes, cfg: Config, autocast,
           pad_id: int, rank: int, world: int, device) -> dict:
    """K mini-batches × μ epochs of optimizer steps on the global batch. Returns mean metrics."""
    scores = torch.tensor([e.score for e in episodes], dtype=torch.float64)
    adv = algo.advantages(scores.view(-1, cfg.group_size), cfg).flatten().float()
    for e, a in zip(episodes, adv.tolist()):
        e.advantage = a
    episodes = [e for e in episodes if selected(e, cfg)]  # the same list on every rank
    if not episodes:
        return {"update/skipped": 1.0, "update/rows": 0}
    plan = split_minibatches(episodes, cfg, rank, world, algo.whole_groups)
    want = dict(vocab_mean=algo.vocab_mean, entropy_grad=cfg.entropy_coef > 0)

    def tensors(rows):
        batch = collate([c for _, c in rows], pad_id, device)
        args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask)
        return batch, args

    def first_row(mb_rows):  # what a rank with an empty micro-batch runs, with weight 0
        return [(mb_rows[0], mb_rows[0].rows()[0])]

    # π_old and π_ref quantities are fixed before the first optimizer step. The first
    # mini-batch's π_old is its own first forward, detached (same weights), so the on-policy
    # case K = μ = 1 costs no extra pass.
    fixed = {}
    with torch.no_grad(), autocast():
        for k, (mb_rows, micro) in enumerate(plan):
            for j, rows in enumerate(micro):
                _, args = tensors(rows or first_row(mb_rows))  # an empty micro-batch runs a dummy
                if k > 0:
                    fixed[("old", k, j)] = scorer(*args, cfg.temperature, vocab_mean=algo.vocab_mean)
                if ref_scorer is not None:
                    fixed[("ref", k, j)] = ref_scorer(*args, cfg.temperature)["logp"]

    sums, n_opt = {}, 0
    for _ in range(cfg.epochs):
        for k, (mb_rows, micro) in enumerate(plan):
            totals = mini_batch_totals(mb_rows, cfg)
            for j, rows in enumerate(micro):
                # A rank with nothing left in this mini-batch still runs a forward/backward
                # (on a row with weight 0) so that DDP's gradient all-reduce happens everywhere.
                dummy = not rows
                rows = rows or first_row(mb_rows)
                batch, args = tensors(rows)
                traces = [e for e, _ in rows]
                sync = j == len(micro) - 1 or world == 1
                with (nullcontext() if sync else scorer.no_sync()), autocast():
                    out = scorer(*args, cfg.temperature, **want)
                    old = fixed.setdefault(("old", k, j), {n: v.detach() for n, v in out.items()})
                    keep = torch.tensor([trained(e, cfg) for e in traces], device=device)
                    mask = batch.response_mask * keep[:, None]
                    # seq_tokens: a row's whole response, which for a chunk is its trace (SPEC §5)
                    mb = {"logp": out["logp"], "old_logp": old["logp"], "mask": mask,
                          "ref_logp": fixed.get(("ref", k, j)), "entropy": out["entropy"],
                          "adv": torch.tensor([e.advantage for e in traces], device=device),
                          "group": torch.tensor([e.group for e in traces], device=device),
                          "seq_tokens": torch.tensor([trained_tokens(e, cfg) for e in traces], device=device)}
                    if algo.vocab_mean:
                        mb.update(vocab_mean=out["vocab_mean"], old_vocab_mean=old["vocab_mean"])
                    loss, metrics = algo.loss(mb, cfg, totals)
                    entropy = (mask * out["entropy"]).sum() / max(totals["tokens"], 1)
                    if cfg.entropy_coef > 0:
                        loss = loss - cfg.entropy_coef * entropy
                    # DDP averages gradients over ranks; the loss is already a share of the
                    # global mini-batch, so undo the average. A dummy row adds exact zeros.
                    (out["logp"].sum() * 0.0 if dummy else loss * world).backward()
                # every rank sums the same metric names (dummies add zeros) for the all-reduce
                metrics.update({"loss/total": loss.detach(), "entropy/mean": entropy.detach()})
                for name, v in metrics.items():
                    sums[name] = sums.get(name, 0.0) + (0.0 if dummy else float(v))
            params = [p for p in lm.parameters() if p.grad is not None]
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else math.inf)
            sums["grad/norm"] = sums.get("grad/norm", 0.0) + grad_norm.item() / world  # same on all ranks
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            n_opt += 1
    out = {k: v / n_opt for k, v in all_reduce_sum(sums, device).items()}
    out.update({"update/skipped": 0.0, "update/rows": len(episodes), "update/optimizer_steps": n_opt,
                "tokens/trained": cfg.epochs * sum(len(c.prompt_ids) + len(c.response_ids)
                                                   for e in episodes for c in e.rows())})
    return out


# ============================================================================ logging

class Logger:
    """Rank 0 writes metrics.jsonl, TensorBoard scalars and samples.jsonl; other ranks are silent."""

    def __init__(self, out: Path, enabled: bool, tokenizer):
        self.enabled, self.tokenizer = enabled, tokenizer
        if enabled:
            from torch.utils.tensorboard import SummaryWriter
            self.metrics = (out / "metrics.jsonl").open("a")
            self.samples = (out / "samples.jsonl").open("a")
            self.tb = SummaryWriter(str(out))

    def log(self, step: int, metrics: dict, samples: list[Episode] = ()) -> None:
        if not self.enabled:
            return
        metrics = {k: round(float(v), 6) for k, v in metrics.items()}
        self.metrics.write(json.dumps({"step": step, **metrics}) + "\n")
        self.metrics.flush()
        for k, v in metrics.items():
            self.tb.add_scalar(k, v, step)
        for e in samples:
            chunks = {"chunks": e.chunk_texts(self.tokenizer)} if len(e.chunks) > 1 else {}
            self.samples.write(json.dumps({"step": step, "prompt": e.problem.prompt, "answer": e.problem.answer,
                                           "response": e.text, "reward": e.reward, **chunks}) + "\n")
            self.tb.add_text("samples", f"**{e.problem.prompt}** → {e.text} (reward {e.reward})", step)
        self.samples.flush()
        self.tb.flush()

    def close(self) -> None:
        if self.enabled:
            self.metrics.close()
            self.samples.close()
            self.tb.close()


def say(rank: int, *msg) -> None:
    if rank == 0:
        tqdm.write(" ".join(str(m) for m in msg))


# ============================================================================ main

def main(argv=None) -> None:
    try:
        cfg = parse_config(argv)
        world_env = int(os.environ.get("WORLD_SIZE", "1"))
        validate(cfg, world_env)
        task, train_problems, heldout = load_problems(cfg)
        if cfg.resume:
            load_trainer_state(Path(cfg.resume))  # fail now, not after loading the model
    except (ValueError, FileNotFoundError) as e:  # DataError is a ValueError
        sys.exit(f"error: {e}")
    rank, world, device = setup_distributed()
    algo = algos.get(cfg.algo)
    hf_logging.disable_progress_bar()  # our tqdm is the one progress bar

    out = Path(cfg.out or (Path(cfg.resume).parent.parent if cfg.resume else
                           Path("runs") / f"{cfg.algo}-{datetime.now():%Y%m%d-%H%M%S}"))
    out = Path(gather_objects(str(out), world)[0])  # rank 0's timestamp names the run
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
        say(rank, yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))

    autocast = autocast_context(cfg, device)
    tokenizer = load_tokenizer(cfg.model, cfg.trust_remote_code)
    lm = load_model(cfg.resume or cfg.model, device=device, trust_remote_code=cfg.trust_remote_code,
                    gradient_checkpointing=cfg.gradient_checkpointing)
    ref_lm = load_model(cfg.model, device=device, trust_remote_code=cfg.trust_remote_code,
                        trainable=False) if cfg.beta > 0 else None
    ref_scorer = ResponseLogProbs(ref_lm, cfg.logprob_chunk) if ref_lm is not None else None
    scorer = ResponseLogProbs(lm, cfg.logprob_chunk)
    if world > 1:
        scorer = DistributedDataParallel(scorer, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / max(cfg.warmup_steps, 1)))
    say(rank, f"policy {cfg.resume or cfg.model}: {count_parameters(lm)} parameters on {device} "
              f"× {world} rank(s); reference model: {'yes' if ref_lm else 'none (beta = 0)'}")

    step, data_pos = 0, 0
    if cfg.resume:
        state = load_trainer_state(Path(cfg.resume))
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step, data_pos = state["step"], state["data_pos"]
        say(rank, f"resumed at step {step} (prompt {data_pos}) from {cfg.resume}")

    stream = PromptStream(train_problems, cfg.seed)
    logger = Logger(out, rank == 0, tokenizer)

    def run_eval():
        with autocast():
            return evaluate(lm, tokenizer, task, heldout, **eval_settings(cfg))[0]

    def checkpoint():
        if rank == 0:
            state = {"step": step, "data_pos": data_pos, "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict()}
            save_checkpoint(out / "checkpoints" / f"step-{step}", model=lm, tokenizer=tokenizer,
                            trainer_state=state)
        if world > 1:
            dist.barrier()

    if cfg.eval_every and step == 0 and heldout:
        metrics = run_eval()
        logger.log(0, metrics)
        say(rank, "step 0 " + " ".join(f"{k} {v:.3f}" for k, v in metrics.items()))

    bar = tqdm(range(step + 1, cfg.max_steps + 1), disable=rank != 0, desc=cfg.algo, initial=step,
               total=cfg.max_steps)
    for step in bar:
        # Every random draw of a step comes from (seed, step, rank): a resumed run replays the
        # same trajectory without saving RNG states.
        torch.manual_seed(cfg.seed * 1_000_003 + step * 1_009 + rank)
        random.seed(cfg.seed * 1_000_003 + step * 1_009 + rank)
        t0 = time.perf_counter()
        with autocast():
            episodes, generated, data_pos, metrics = collect_rollouts(
                lm, tokenizer, task, stream, data_pos, cfg, rank, world)
        t1 = time.perf_counter()
        if episodes:
            metrics.update(update(scorer, lm, ref_scorer, optimizer, scheduler, algo, episodes, cfg,
                                  autocast, tokenizer.pad_token_id, rank, world, device))
        else:  # dynamic sampling kept nothing: every rank skips the update alike
            metrics["update/skipped"] = 1.0
        t2 = time.perf_counter()
        metrics.update({"time/rollout": t1 - t0, "time/update": t2 - t1, "time/step": t2 - t0,
                        "lr": scheduler.get_last_lr()[0]})
        if cfg.eval_every and step % cfg.eval_every == 0 and heldout:
            metrics.update(run_eval())
        logger.log(step, metrics, generated[:cfg.log_samples])
        bar.set_postfix(reward=f"{metrics['reward/mean']:.3f}", len=f"{metrics['length/mean']:.1f}")
        if "eval/accuracy" in metrics:
            say(rank, f"step {step} eval/accuracy {metrics['eval/accuracy']:.3f} "
                      + " ".join(f"pass@{k} {metrics[f'eval/pass@{k}']:.3f}" for k in cfg.eval_k))
        if (cfg.save_every and step % cfg.save_every == 0) or step == cfg.max_steps:
            checkpoint()
    logger.close()
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
