"""Every knob of a run: the Config dataclass, YAML + command-line parsing, and validation.

train.py and eval.py both build their Config here (eval.py accepts every field as a flag), and
the helpers that turn fields into rollout / eval settings live next to the fields they read, so
that the two scripts never disagree and never import each other.

Precedence: dataclass defaults < the algorithm's preset < --config YAML < command line.
"""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path

import yaml

import algos
from algos.grpo import ADV_NORMS, LOSS_AGGS
from algos.pacs import PACS_PSIS
from algos.rover import ROVER_ADVS
from checkpoint import resolve_resume, saved_config
from rewards import BUILTIN_TASKS, DataError, builtin_splits, load_file, make_task, prompt_template, with_template
from rollout import Chunking, Sampling

TRAIN_ON = ("all", "correct", "incorrect")  # Config.train_on
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
    resume: str = ""  # continue a run: its folder (newest checkpoint), a checkpoints/step-N folder, or auto (--out's, if any)
    # --- task
    sum_min_terms: int = 3  # running_sum: fewest integers to add
    sum_max_terms: int = 5  # running_sum: most integers to add
    sum_digits: int = 2  # running_sum: digits per integer
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    prompt_template: str = ""  # the problem -> the user message: a paper's (pacs, rover, delethink, nsr, dr_grpo, dapo, gsm8k) or a string with {problem}; "" = as is
    answer_after: str = ""  # answer gate: grade only the text after this (Delethink recipe: </think>); a response without it scores 0
    grade_timeout: float = 10.0  # seconds per math-verify grading (file tasks); over it scores 0, counted
    grade_workers: int = 4  # math-verify worker processes per rank, grading a batch in parallel (file tasks)
    grade_budget: float = 120.0  # seconds a rank may spend grading one batch; the rest scores 0, counted; 0 = no limit
    # --- batch sizes
    prompts_per_step: int = 16  # B: prompts per rollout batch, over all ranks
    group_size: int = 8  # G: responses sampled per prompt
    mini_batches: int = 1  # K: optimizer steps per full rollout batch (mini-batches of B·G/K rows, whole groups)
    epochs: int = 1  # μ: passes over the rollout batch
    micro_batch_size: int = 64  # sequences per forward/backward on one rank (grad accumulation)
    max_tokens_per_micro_batch: int = 0  # also cap rows × padded length; rows sorted by length; 0 = off
    rollout_batch_size: int = 0  # sequences per generate call per rank (whole groups); 0 = all at once
    # --- sampling (never inherited from the checkpoint's generation_config)
    temperature: float = 1.0  # rollout temperature τ; log-probs use z/τ too
    top_p: float = 1.0  # nucleus sampling; 1 = off
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 80  # tokens per generate call: the response budget, or with max_chunks > 1 the chunk size C
    prefill_chunk: int = 0  # prompt tokens per prefill forward (bounds its activations); 0 = one forward
    engine: str = "hf"  # who generates: hf (model.generate) | fast (rollout.decode: in-place KV cache, one prefill per group)
    tis_cap: float = 0.0  # truncated IS on the sampler/trainer ratio: PG loss × min(π_old/π_sampler, cap) per token; 0 = off (Delethink: 2)
    mis_cap: float = 0.0  # masked IS: tokens whose π_old/π_sampler is over cap or under 1/cap get weight 0; 0 = off
    # --- optimizer
    lr: float = 3e-4  # AdamW learning rate after warm-up
    warmup_steps: int = 5  # optimizer steps of linear warm-up, then constant
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    # --- LoRA (lora.py; needs `pip install peft`)
    lora_rank: int = 0  # r > 0: train rank-r adapters on the decoder's linear layers, the rest frozen; 0 = off (full fine-tune)
    lora_alpha: float = 32.0  # α: the adapters' output is scaled by α/r (LoRA Without Regret keeps α = 32 for every r)
    lora_targets: str = ""  # comma-separated linear layers to adapt (q_proj,v_proj); "" = every one of the decoder (never the LM head)
    lora_lr_scale: float = 10.0  # with LoRA the learning rate is lr × this (LoRA Without Regret: the best LoRA lr is ~10× full fine-tuning's)
    lora_save_merged: bool = False  # with LoRA every checkpoint also holds the merged HF weights (merged/); the last one always does
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
    # --- 2025-26 losses (SPEC §7; algos/gspo.py, cispo.py, sapo.py, reinforce_pp.py, cov.py, high_entropy.py)
    sapo_tau_pos: float = 1.0  # SAPO gate temperature where A > 0: ℓ = −σ(τ(r − 1))·4/τ·A
    sapo_tau_neg: float = 1.05  # SAPO gate temperature where A ≤ 0 (larger: negative updates fade faster off-policy)
    clip_cov_ratio: float = 2e-4  # Clip-Cov: at most this fraction of the valid tokens loses its gradient
    clip_cov_lb: float = 1.0  # Clip-Cov: only tokens with lb < cov(A, logp) < ub are candidates
    clip_cov_ub: float = 5.0  # Clip-Cov: upper end of that window
    kl_cov_ratio: float = 2e-4  # KL-Cov: this fraction of the valid tokens, top by cov(A, logp), pays the penalty (paper 7B: 2e-3)
    kl_cov_coef: float = 0.1  # KL-Cov: β_cov, penalty β_cov·|logp − logp_old| on those tokens (paper 7B: 1)
    top_entropy_quantile: float = 1.0  # ρ, any algorithm: policy gradient only on the top ρ of tokens by entropy (80/20 paper: 0.2); 1 = off
    # --- Markovian thinking (Delethink, SPEC §5; rollout.py), with any algorithm but PACS
    max_chunks: int = 1  # I: chunks of max_new_tokens (C) per trace, context reset between; 1 = plain
    carryover: int = 0  # m < C: tokens carried into each next chunk's prompt; 0 = C/2
    chunk_head: int = -1  # h ≤ m: of those, the first h tokens of chunk 1; the rest is the latest tail; -1 = min(100, m) (official 100)
    eval_max_chunks: int = 0  # I at eval; more than max_chunks = test-time scaling; 0 = max_chunks
    # --- batch shaping (DAPO)
    mask_truncated: bool = False  # truncated responses get loss mask 0 (overlong filtering)
    overlong_penalty: bool = False  # soft length penalty added to the reward
    overlong_cache: int = 0  # penalty ramps from 0 to −1 over the last this-many tokens; 0 = a fifth of the budget (DAPO: 4096 of 20480)
    zero_truncated: bool = False  # a response with no EOS within the budget scores 0 whatever the grader says (Dr. GRPO)
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
    keep_checkpoints: int = 0  # keep only the newest this-many checkpoints; 0 = keep all
    log_samples: int = 2  # completions written to samples.jsonl per step
    # --- system
    parallel: str = "auto"  # ddp | fsdp (FSDP2: weights, grads, AdamW sharded over ranks) | auto: fsdp on CUDA, else ddp
    precision: str = "auto"  # auto (bf16 on CUDA, fp32 on CPU) | fp32 | bf16: the compute dtype; master weights stay fp32
    save_dtype: str = "auto"  # dtype of the HF weights in checkpoints: auto (the compute dtype) | fp32 | bf16
    gradient_checkpointing: bool = False  # recompute each decoder layer in backward: activation memory ÷ ~layers
    dist_timeout: int = 60  # minutes a rank waits in a collective (e.g. for rank 0 writing a checkpoint)
    logprob_chunk: int = 0  # tokens per chunk of the log-prob computation; 0 = auto: 32 MiB of fp32 logits, ≤ 512 (model.logprob_chunk)
    trust_remote_code: bool = False  # allow model code shipped with a checkpoint
    # --- memory plan (python train.py --config X.yaml --plan --world-size 8): reads no weights
    plan: bool = False  # print the per-GPU memory plan and exit: 0 if it fits gpu_memory, 1 if not
    world_size: int = 0  # ranks the plan assumes; 0 = this launch's
    gpu_memory: float = 80.0  # GiB per GPU the plan must fit
    plan_prompt_tokens: int = 512  # prompt length the plan assumes (use your data's longest)


def parse_config(argv=None) -> Config:
    parser = argparse.ArgumentParser(description="RL with verifiable rewards (see README.md)",
                                     argument_default=argparse.SUPPRESS)
    for f in fields(Config):
        kind = _kind(f.name)
        flag = {"nargs": "?", "const": True} if kind is bool else {}  # a bare --plan means --plan true
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_parser_for(kind),
                            help=_help(f.name), metavar=kind.__name__.upper(), **flag)
    cli = vars(parser.parse_args(argv))
    file_values = _read_yaml(cli["config"]) if cli.get("config") else {}
    given = {**file_values, **cli}
    base = algos.get(given.get("algo", Config.algo)).preset
    if given.get("resume"):  # the run's own config, as its checkpoint saved it, replaces defaults and preset
        _, checkpoint = resolve_resume(given["resume"], given.get("out", ""))
        if checkpoint is not None and (checkpoint / "train_config.yaml").is_file():  # else train.preflight says so
            known = {f.name for f in fields(Config)} - {"out", "resume"}  # where the run is now, not was
            base = {k: v for k, v in saved_config(checkpoint).items() if k in known}
    return Config(**{**base, **given})


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
                        f"see the Config dataclass in config.py for the names")
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
        (not cfg.dynamic_sampling or cfg.group_size >= 2,
         "dynamic_sampling keeps only groups whose rewards differ, which a group of one never has: "
         "group_size ≥ 2 (or dynamic_sampling false)"),
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
        (cfg.algo not in ("gspo", "sapo") or cfg.loss_agg == "seq-mean-token-mean",
         f"--algo {cfg.algo} always aggregates seq-mean-token-mean (as verl does): drop loss_agg={cfg.loss_agg}"),
        (cfg.algo != "gspo" or cfg.max_chunks == 1,
         "--algo gspo clips each response's whole ratio, which a Markovian trace split over rows does not "
         "have in one row: set max_chunks 1"),
        (cfg.sapo_tau_pos > 0 and cfg.sapo_tau_neg > 0 and cfg.kl_cov_coef >= 0
         and 0 < cfg.clip_cov_ratio <= 1 and 0 < cfg.kl_cov_ratio <= 1 and cfg.clip_cov_lb < cfg.clip_cov_ub,
         "sapo_tau_pos and sapo_tau_neg must be > 0, kl_cov_coef ≥ 0, clip_cov_ratio and kl_cov_ratio "
         "in (0, 1], clip_cov_lb < clip_cov_ub"),
        (0 < cfg.top_entropy_quantile <= 1,
         f"top_entropy_quantile={cfg.top_entropy_quantile}: the kept fraction ρ must be in (0, 1] (1 = off)"),
        (cfg.max_chunks >= 1 and cfg.eval_max_chunks >= 0, "max_chunks must be ≥ 1, eval_max_chunks ≥ 0"),
        (max(cfg.max_chunks, cfg.eval_max_chunks) == 1 or 0 <= chunking(cfg).head <= chunking(cfg).carryover
         < cfg.max_new_tokens, f"Markovian thinking needs 0 ≤ chunk_head ({chunking(cfg).head}) ≤ carryover "
         f"({chunking(cfg).carryover}) < max_new_tokens (the chunk size, {cfg.max_new_tokens})"),
        (not algos.get(cfg.algo).whole_groups or cfg.max_chunks == 1,
         f"--algo {cfg.algo} scores whole responses against their group; with max_chunks > 1 a "
         f"response is split over several rows, which it does not support: set max_chunks 1"),
        (cfg.temperature > 0, "temperature must be > 0 for RL rollouts (log-probs use z/τ)"),
        (cfg.max_steps >= 1 and cfg.max_new_tokens >= 1, "max_steps and max_new_tokens must be ≥ 1"),
        (cfg.eval_temperature >= 0 and 0 < cfg.eval_top_p <= 1 and cfg.eval_batch_size >= 1
         and cfg.eval_problems >= 0 and cfg.grade_timeout > 0 and cfg.grade_workers >= 1
         and cfg.grade_budget >= 0 and cfg.keep_checkpoints >= 0,
         "eval_temperature must be ≥ 0, eval_top_p in (0, 1], eval_batch_size ≥ 1, eval_problems ≥ 0, "
         "grade_timeout > 0, grade_workers ≥ 1, grade_budget ≥ 0, keep_checkpoints ≥ 0"),
        (all(1 <= k <= cfg.eval_samples for k in cfg.eval_k),
         f"eval_k={cfg.eval_k}: every k must be between 1 and eval_samples={cfg.eval_samples}"),
        (cfg.precision in ("auto", "fp32", "bf16") and cfg.save_dtype in ("auto", "fp32", "bf16"),
         "precision and save_dtype must be auto, fp32 or bf16"),
        (cfg.parallel in ("auto", "ddp", "fsdp"), f"parallel={cfg.parallel!r}: choose auto, ddp or fsdp"),
        (cfg.engine in ("fast", "hf"), f"engine={cfg.engine!r}: choose fast or hf"),
        (not (cfg.chat_template and "<|im_start|>" in prompt_template(cfg.prompt_template or "{problem}")),
         f"--prompt-template {cfg.prompt_template} is already in the chat format: set chat_template false"),
        ((cfg.tis_cap == 0 or cfg.tis_cap >= 1) and (cfg.mis_cap == 0 or cfg.mis_cap > 1),
         f"tis_cap ({cfg.tis_cap}) must be 0 (off) or ≥ 1, mis_cap ({cfg.mis_cap}) 0 (off) or > 1"),
        (not (cfg.tis_cap or cfg.mis_cap) or cfg.algo not in ("rover", "pacs"),
         f"--algo {cfg.algo}'s loss is not a per-token policy gradient, so tis_cap / mis_cap do not apply to it"),
        (min(cfg.max_tokens_per_micro_batch, cfg.rollout_batch_size, cfg.prefill_chunk, cfg.world_size) >= 0
         and cfg.dist_timeout > 0 and cfg.gpu_memory > 0 and cfg.plan_prompt_tokens > 0,
         "max_tokens_per_micro_batch, rollout_batch_size, prefill_chunk and world_size must be ≥ 0; "
         "dist_timeout, gpu_memory and plan_prompt_tokens > 0"),
        (not cfg.overlong_penalty or 0 <= cfg.overlong_cache <= budget(cfg),
         f"overlong_cache must be in [0, {budget(cfg)}] (the response budget; 0 = a fifth of it)"),
        (cfg.lora_rank >= 0 and cfg.lora_alpha > 0 and cfg.lora_lr_scale > 0,
         "lora_rank must be ≥ 0 (0 = off), lora_alpha and lora_lr_scale > 0"),
        (cfg.lora_rank > 0 or not (cfg.lora_targets or cfg.lora_save_merged),
         "lora_targets and lora_save_merged apply to LoRA adapters: give --lora-rank r (e.g. 32), or drop them"),
        (cfg.chunk_head >= -1, f"chunk_head={cfg.chunk_head}: give h ≥ 0, or -1 for min(100, carryover)"),
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
    carryover = cfg.carryover or cfg.max_new_tokens // 2
    return Chunking(carryover=carryover, head=min(100, carryover) if cfg.chunk_head < 0 else cfg.chunk_head,
                    max_chunks=chunks)


def budget(cfg: Config) -> int:
    """Generated tokens a training response can reach: C + (I − 1)(C − m), or max_new_tokens."""
    return chunking(cfg).budget(cfg.max_new_tokens)


def learning_rate(cfg: Config) -> float:
    """AdamW's learning rate: lr, times lora_lr_scale with LoRA. lr 1e-6, LoRA -> 1e-5."""
    return cfg.lr * (cfg.lora_lr_scale if cfg.lora_rank else 1.0)


def eval_settings(cfg: Config) -> dict:
    """evaluate()'s keyword arguments from the eval fields: train.py's periodic eval and a
    stand-alone `eval.py --config` run take them from here, so their numbers agree."""
    return dict(n=cfg.eval_samples, ks=cfg.eval_k, greedy=cfg.eval_greedy, batch_size=cfg.eval_batch_size,
                sampling=Sampling(cfg.eval_temperature, cfg.eval_top_p, cfg.top_k, cfg.max_new_tokens, cfg.prefill_chunk,
                                  cfg.engine),
                chunking=chunking(cfg, evaluation=True), chat_template=cfg.chat_template,
                answer_after=cfg.answer_after, seed=cfg.seed + 7919)


def load_problems(cfg: Config):
    """(task, train problems, held-out problems), read and checked before any model is loaded."""
    task = make_task(cfg.data, sum_min_terms=cfg.sum_min_terms, sum_max_terms=cfg.sum_max_terms,
                     sum_digits=cfg.sum_digits, grade_timeout=cfg.grade_timeout,
                     grade_workers=cfg.grade_workers, grade_budget=cfg.grade_budget)
    if cfg.data in BUILTIN_TASKS:
        train, heldout = builtin_splits(task)
    else:
        train, heldout = task.problems, []
    if cfg.eval_data:
        heldout = load_file(cfg.eval_data)
    heldout = heldout[:cfg.eval_problems or None]
    return task, with_template(train, cfg.prompt_template), with_template(heldout, cfg.prompt_template)
