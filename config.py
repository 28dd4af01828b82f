"""Every knob of a run: the Config dataclass, YAML + command-line parsing, and validation.

train.py and eval.py both build their Config here (eval.py accepts every field as a flag), and
the helpers that turn fields into rollout / eval settings live next to the fields they read, so
that the two scripts never disagree and never import each other.

Precedence: dataclass defaults < the algorithm's preset < --config YAML < command line.
The fields of RunConfig below are the run's; a run's config (run_config) adds the knobs its
algorithm can read, and Config every knob an algorithm declares (algos.KNOBS: its name, default,
help line and bounds live next to the loss that reads it), when a Config is first made (with_knobs);
the modules that need torch are imported where they are used, so that grading given responses
(eval.py --responses: a RunConfig, parse_config(argv, knobs=False)) starts without the algorithms,
torch or transformers.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import functools

import yaml

from bounds import out_of_bounds
from rewards import DataError
from tasks import TASKS, domain_name, has_own_splits, prompt_template

TRACKERS = ("tensorboard", "wandb", "trackio")  # Config.report_to; checkpoint.Logger starts each
DEFAULT_MODEL = str(Path(__file__).resolve().parent / "assets" / "tiny-running-sum")


@dataclass
class RunConfig:
    # --- run
    algo: str = "grpo"  # a name from algos/__init__.py; its preset sets some of its knobs (the last fields of Config)
    config: str = ""  # YAML preset file; its keys are Config fields
    model: str = DEFAULT_MODEL  # any local HF causal LM folder; default: the shipped tiny model
    data: str = "running_sum"  # built-in task (running_sum, countdown), a .jsonl/.json/.parquet file (of code problems when its rows have tests), a dataset by name (org/name[:config[:split]]) or saved folder (needs datasets), or file.py:Class (a tasks.Task); several, comma-separated, for a mixed run
    data_weights: str = ""  # mixed run: each --data source's share of the training prompts, comma-separated (0.5,0.3,0.2), normalised; "" = equal
    reward: str = ""  # grader of a data file: file.py:function (prompt, response, answer) -> float, run bounded; "" = math-verify
    reward_terms: str = ""  # several weighted rewards, name=weight comma-separated: correct (the task's grader) and file.py:function (as --reward), each logged as reward/<name>; "" = correct alone
    eval_data: str = ""  # held-out file; built-in tasks use their own held-out split; mixed run: one entry per source, comma-separated, empty for a built-in task
    out: str = ""  # run directory; default runs/<algo>-<timestamp>
    max_steps: int = 150  # rollout batches (each gives K × μ optimizer steps)
    seed: int = 0  # fixes data order, sampling and everything else
    resume: str = ""  # continue a run: its folder (newest checkpoint), a checkpoints/step-N folder, or auto (--out's, if any)
    # --- task
    sum_min_terms: int = 3  # running_sum: fewest integers to add
    sum_max_terms: int = 5  # running_sum: most integers to add
    sum_digits: int = 2  # running_sum: digits per integer
    chat_template: bool = True  # wrap prompts in the tokenizer's chat template when it has one
    chat_template_kwargs: dict = field(default_factory=dict)  # more keyword arguments of the chat template, a JSON object: '{"enable_thinking": false}'
    system_prompt: str = ""  # a system turn before every prompt (training and eval): the text, or @FILE; refused beside a data row's own
    prompt_template: str = ""  # the problem -> the user message: a paper's (pacs, rover, delethink, nsr, dr_grpo, dapo, gsm8k) or a string with {problem}; "" = as is; not code files
    code_template: str = ""  # code files: the prompt recipe (deepcoder, lcb, prime; stdin or function form by the row's tests); "" = the row's prompt as is
    sandbox: str = "auto"  # code files and --env python: how programs are isolated: auto (the strongest that works here) | bwrap | unshare | none
    sandbox_timeout: float = 5.0  # code files and --env python: wall-clock seconds per program run (one stdin test, or all calls of a function problem)
    sandbox_memory: int = 1024  # code files and --env python: MiB of address space per process of a program
    answer_after: str = ""  # answer gate: grade only the text after this (Delethink recipe: </think>); a response without it scores 0
    grade_timeout: float = 10.0  # seconds per grading of a data file's row (math-verify or --reward); over it scores 0, counted
    grade_cpu: float = 4.0  # CPU seconds a math-verify worker spends on one answer; over it scores 0 as a timeout
    grade_workers: int = 4  # grading worker processes per rank, grading a batch in parallel (data files)
    grade_budget: float = 120.0  # seconds a rank may spend grading one batch; the rest scores 0, counted; 0 = no limit
    # --- batch sizes
    prompts_per_step: int = 16  # B: prompts per rollout batch, over all ranks
    group_size: int = 8  # G: responses sampled per prompt
    mini_batches: int = 1  # K: optimizer steps per full rollout batch (mini-batches of B·G/K rows, whole groups)
    epochs: int = 1  # μ: passes over the rollout batch
    micro_batch_size: int = 64  # sequences per forward/backward on one rank (grad accumulation)
    max_tokens_per_micro_batch: int = 0  # also cap rows × padded length; rows sorted by length; 0 = off
    pack: bool = False  # the update's rows packed end to end (no padding), ranks and micro-batches cut by real tokens (packing.py); max_tokens_per_micro_batch then counts real tokens
    rollout_batch_size: int = 0  # sequences per generate call per rank (whole groups); 0 = all at once
    # --- sampling (never inherited from the checkpoint's generation_config)
    temperature: float = 1.0  # rollout temperature τ; log-probs use z/τ too
    top_p: float = 1.0  # nucleus sampling; 1 = off
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 80  # tokens per generate call: the response budget, or with max_chunks > 1 the chunk size C
    prefill_chunk: int = 0  # prompt tokens per prefill forward (bounds its activations); 0 = one forward
    engine: str = "auto"  # who generates: hf (model.generate, the reference) | fast (engine.py: a capturable decode step) | vllm (extras/vllm_engine.py: vLLM in every rank; docs/gpus-and-memory.md installs it) | auto: hf on every device (the reference, tutorial/grpo.py's sampler; on CUDA the engine's whole training steps are not yet measured faster)
    engine_compile: str = "auto"  # the engine's decode step: auto (inductor + CUDA graphs on CUDA, off on CPU) | off | eager (traced whole, run as traced: the CUDA path's trace on a CPU) | inductor
    engine_release: bool = False  # give the engine's KV slab back to the allocator after each call, for the update (on CUDA its graphs are then recorded anew every call); else it is kept all run
    vllm_memory: float = 0.0  # --engine vllm's share, taken when it starts: on CUDA a fraction of the GPU that vLLM fills, on a CPU GiB of KV cache; 0: a KV cache for the largest call's rows where it fits 0.3 of the GPU with the weights (0.25 GiB on a CPU), else that share
    # --- optimizer
    lr: float = 3e-4  # AdamW learning rate after warm-up
    warmup_steps: int = 5  # optimizer steps of linear warm-up, then the schedule
    lr_schedule: str = "linear"  # after warm-up: linear (to 0 at the run's end, TRL's default) | constant (verl's default)
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 1.0  # max global grad norm; 0 = no clipping
    # --- LoRA (extras/lora.py; needs `pip install peft`)
    lora_rank: int = 0  # r > 0: train rank-r adapters on the decoder's linear layers, the rest frozen; 0 = off (full fine-tune)
    lora_alpha: float = 32.0  # α: the adapters' output is scaled by α/r (LoRA Without Regret keeps α = 32 for every r)
    lora_targets: str = ""  # comma-separated linear layers to adapt (q_proj,v_proj); "" = every one of the decoder (never the LM head)
    lora_lr_scale: float = 10.0  # with LoRA the learning rate is lr × this (LoRA Without Regret: the best LoRA lr is ~10× full fine-tuning's)
    lora_save_merged: bool = False  # with LoRA every checkpoint also holds the merged HF weights (merged/); the last one always does
    # --- any algorithm (each algorithm's own knobs come from algos/, see Config below)
    entropy_coef: float = 0.0  # entropy bonus, any algorithm: loss −= c · token-mean entropy (c < 0: a penalty)
    train_on: str = "all"  # responses the update keeps: all | correct (PSR) | incorrect (NSR)
    # --- Markovian thinking (Delethink, docs/math.md §5; environments/markovian.py), with any algorithm but PACS and GSPO
    max_chunks: int = 1  # I: chunks of max_new_tokens (C) per trace, context reset between; 1 = plain
    carryover: int = 0  # m < C: tokens carried into each next chunk's prompt; 0 = C/2
    chunk_head: int = -1  # h ≤ m: of those, the first h tokens of chunk 1; the rest is the latest tail; -1 = min(100, m) (official 100)
    eval_max_chunks: int = 0  # I at eval; more than max_chunks = test-time scaling; 0 = max_chunks
    # --- multi-turn rollouts (environments/, docs/math.md §8), with any algorithm but PACS and GSPO
    env: str = ""  # "" = one turn | calculator (<calc>EXPR</calc>) | python (```python blocks, sandboxed) | path/file.py:Class
    max_turns: int = 4  # model turns per trace at most (with --env); a turn writes up to max_new_tokens
    max_observation_tokens: int = 256  # tokens of one observation (a tool's output); the rest is cut
    max_trace_tokens: int = 0  # a trace's context at most: query, turns, observations and the next turn's budget; 0 = no cap
    env_timeout: float = 10.0  # seconds per step of a path/file.py:Class environment; over it the trace scores 0, counted
    env_budget: float = 0.0  # a path/file.py:Class environment's round of turns on a rank ends once it has answered no step for this many seconds (0: env_timeout); the steps left score 0, counted
    env_fail_fraction: float = 1.0  # a training step in which at least this fraction of traces failed in the environment counts as failing
    env_fail_steps: int = 1  # that many failing steps in a row stop the run, quoting the environment's first error; 0 = never
    # --- batch shaping (DAPO)
    mask_truncated: bool = False  # truncated responses get loss mask 0 (overlong filtering)
    overlong_penalty: bool = False  # soft length penalty added to the reward
    overlong_cache: int = 0  # penalty ramps from 0 to −1 over the last this-many tokens; 0 = a fifth of the budget (DAPO: 4096 of 20480)
    zero_truncated: bool = False  # a response with no EOS within the budget scores 0 whatever the grader says (Dr. GRPO)
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal; resample
    max_sampling_rounds: int = 3  # extra generation rounds dynamic sampling may use per step
    # --- eval
    eval_every: int = 25  # steps between held-out evals (and one before step 1); 0 = off
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
    health: bool = True  # at each eval, a line on the run's curves so far and the report as TensorBoard text (extras/health.py; python -m extras.health RUN reads any run)
    report_to: str = "tensorboard"  # trackers that get every metric besides metrics.jsonl, comma-separated: tensorboard, wandb, trackio (pip install each of the last two; checkpoint.tracker_run); none = metrics.jsonl alone
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

    @property
    def chunk_carryover(self) -> int:
        """m, the tokens a Markovian chunk carries into the next one's prompt: carryover, or C/2 when 0."""
        return self.carryover or self.max_new_tokens // 2

    @property
    def chunk_head_tokens(self) -> int:
        """h ≤ m, the first tokens of chunk 1 every later chunk keeps: chunk_head, or min(100, m) when −1
        (the official 100)."""
        return min(100, self.chunk_carryover) if self.chunk_head < 0 else self.chunk_head


class Config(RunConfig):
    """A config with every knob of the registry: every field of RunConfig above, and one field for each
    knob an algorithm declares (clip_low, beta, adv_norm, ...: in algos/, next to the loss that reads it,
    with its default, help line and bounds; `python train.py --help` lists them). A run's own config
    (parse_config) is run_config(its --algo)'s instead: the knobs that algorithm can read, so that a run
    imports no other algorithm. with_knobs adds the fields to this class the first time a Config is made
    or parsed, not when this file is imported: the algorithms import torch, and grading given responses
    (eval.py --responses, a RunConfig) starts without it. Until then dataclasses.fields(Config) lists
    RunConfig's alone: with_knobs() returns the whole class."""

    def __new__(cls, *args, **kwargs):
        with_knobs()  # before __init__ runs: it is the one with every knob's field
        return super().__new__(cls)


@functools.cache
def with_knobs() -> type:
    """Config, once given a field for every knob of the registry (algos.KNOBS), defaults included."""
    import algos

    return _with_fields(Config, algos.KNOBS)


@functools.cache
def run_config(algo: str) -> type:
    """The config class of a run of --algo `algo`: RunConfig's fields, the knobs every run has
    (algos.SHARED_KNOBS: the trainer reads beta, tis_cap, mis_cap and the turn credit) and the
    algorithm's own; it imports no other algorithm. A knob of another algorithm is no field of it."""
    import algos

    knobs = {k.name: k for k in (*algos.SHARED_KNOBS, *algos.get(algo).knobs)}
    return _with_fields(type("Config", (RunConfig,), {"__doc__": run_config.__doc__, "__module__": __name__}), knobs)


def _with_fields(cls: type, knobs: dict) -> type:
    """cls (a RunConfig) made a dataclass with a field for each knob, its default included; cls.KNOBS: the knobs."""
    clash = sorted(set(knobs) & set(RunConfig.__dataclass_fields__))
    if clash:
        raise ValueError(f"algos: knob(s) {', '.join(clash)} are already fields of RunConfig in config.py")
    cls.__annotations__ = {name: type(k.default).__name__ for name, k in knobs.items()}
    for name, k in knobs.items():
        setattr(cls, name, k.default)
    cls.KNOBS = knobs
    return dataclass(cls)  # its __init__, __repr__, __eq__ and fields() hold RunConfig's fields and the knobs


class Parser(argparse.ArgumentParser):
    """argparse that raises DataError where it would print and exit: a bad flag is then said once,
    by rank 0, as `error: ...`, like every other mistake (argparse prints from every rank)."""

    def error(self, message):
        raise DataError(f"{message} (--help lists every flag)")


def parse_config(argv=None, knobs: bool = True) -> RunConfig:
    """The config of the flags in argv (sys.argv without it): run_config(--algo)'s, or Config's for
    --help and when a flag or key is none of its fields (a knob of another algorithm, which validate
    then names; or a mistake, which argparse names). knobs False: a RunConfig, without the algorithms'
    knobs or presets; a --config file's other fields are then left unread."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if not knobs:
        return RunConfig(**_given(argv, RunConfig))
    config = run_config(_given(argv, RunConfig, known=True).get("algo", RunConfig.algo))
    try:
        given = _given(argv, config)
    except DataError:  # --help, a knob of another algorithm (validate names who reads it), or a mistake
        config = with_knobs()
        given = _given(argv, config)
    import algos

    base = algos.get(given.get("algo", RunConfig.algo)).preset
    if given.get("resume"):  # the run's own config, as its checkpoint saved it, replaces defaults and preset
        from checkpoint import resolve_resume, saved_config

        _, checkpoint = resolve_resume(given["resume"], given.get("out", ""))
        if checkpoint is not None and (checkpoint / "train_config.yaml").is_file():  # else train.preflight says so
            saved = saved_config(checkpoint)
            if "algo" not in given and saved.get("algo", RunConfig.algo) != RunConfig.algo:  # its algorithm's knobs too
                return parse_config([*argv, "--algo", saved["algo"]])
            known = {f.name for f in fields(config)} - {"out", "resume"}  # where the run is now, not was
            base = {k: v for k, v in saved.items() if k in known}
    return config(**{**base, **given})


def _given(argv: list, config: type, known: bool = False) -> dict:
    """The fields that argv and its --config file give config (the command line over the file). known:
    only config's, the rest of argv left unread (which --algo and --config), with no help lines. RunConfig's
    and Config's parsers say --help; a run's leaves it to Config's, which knows every knob."""
    described = not known and (config is RunConfig or config is Config)
    parser = Parser(description="RL with verifiable rewards (see README.md)", argument_default=argparse.SUPPRESS,
                    add_help=described)
    for f in fields(config):
        kind = type(default(f))
        flag = {"nargs": "?", "const": True} if kind is bool else {}  # a bare --plan means --plan true
        parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_parser_for(kind),
                            help=_help(f.name) if described else None, metavar=kind.__name__.upper(), **flag)
    cli = vars(parser.parse_known_args(argv)[0] if known else parser.parse_args(argv))
    file_values = _read_yaml(cli["config"], config) if cli.get("config") else {}
    return {**file_values, **cli}


def _kind(config: type, name: str) -> type:
    return type(default(config.__dataclass_fields__[name]))


def default(f: dataclasses.Field):
    """A dataclass field's default value."""
    return f.default_factory() if f.default is dataclasses.MISSING else f.default


def config_note(cfg: RunConfig, saved: Path) -> str:
    """What a run says of its config before its first step: where every field went, and the fields this
    run sets apart from the defaults (the algorithm's preset, a --config file, the command line), one
    `key: value` line each, instead of all ~100."""
    changed = {f.name: getattr(cfg, f.name) for f in fields(cfg) if getattr(cfg, f.name) != default(f)}
    if not changed:
        return f"config: every field in {saved}; this run keeps every default"
    return (f"config: every field in {saved}; this run sets apart from the defaults:\n"
            + "\n".join("  " + line for line in yaml.safe_dump(changed, sort_keys=False).splitlines()))


def _to_bool(s: str) -> bool:
    if s.lower() not in ("true", "false", "1", "0", "yes", "no"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {s!r}")
    return s.lower() in ("true", "1", "yes")


def _parser_for(kind):
    """The function that reads a flag of a field of this type: --plan true, --eval-k 1,4,
    --chat-template-kwargs '{}'."""
    return {bool: _to_bool, list: lambda s: [int(x) for x in s.split(",") if x], dict: json_object}.get(kind, kind)


def json_object(text: str) -> dict:
    """A field given as a JSON object (--chat-template-kwargs): '{"enable_thinking": false}' ->
    {"enable_thinking": False}; anything else is refused, naming the form."""
    try:
        value = json.loads(text)
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object such as '{{\"enable_thinking\": false}}', "
                                         f"got {text!r}")
    return value


def _help(name: str, _source=Path(__file__).read_text()) -> str:
    """The field's comment in RunConfig, or an algorithm knob's help and who reads it, so that
    --help, the dataclass and the registry never disagree."""
    if name not in RunConfig.__dataclass_fields__:
        import algos

        return f"{algos.KNOBS[name].help} [{', '.join(readers(name))}]"
    line = _source.split(f"\n    {name}: ", 1)[1].split("\n", 1)[0]
    return line.split("# ", 1)[1] if "# " in line else ""


def readers(knob: str) -> list[str]:
    """The --algo names whose algorithm reads this knob."""
    import algos

    return [a.name for a in algos.ALGORITHMS.values() if any(k.name == knob for k in a.knobs)]


def _read_yaml(path: str, config: type) -> dict:
    p = Path(path)
    if not p.is_file():
        raise DataError(f"--config {path}: no such file")
    try:
        values = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as e:
        raise DataError(f"--config {path}: not valid YAML ({e})") from None
    if not isinstance(values, dict):
        raise DataError(f"--config {path}: expected a mapping of Config fields")
    known = {f.name for f in fields(config)}
    if config is RunConfig:  # the algorithms' knobs (and any other field) grade nothing
        values = {k: v for k, v in values.items() if k in known}
    unknown = sorted(set(values) - known)
    if unknown:
        raise DataError(f"--config {path}: unknown field(s) {', '.join(unknown)}; "
                        f"python train.py --help lists the names (write them with _, not -)")
    out = {}
    for name, value in values.items():  # YAML reads 1e-6 as a string; the field type decides
        kind = _kind(config, name)
        if kind is str and isinstance(value, list):  # data: [running_sum, countdown] = --data running_sum,countdown
            value = ",".join(map(str, value))
        if isinstance(value, dict):  # chat_template_kwargs: {enable_thinking: false}, read as its JSON
            value = json.dumps(value, default=str)  # a date YAML read (date_string: 2026-12-02) as it was written
        try:
            out[name] = ([int(v) for v in value] if kind is list and isinstance(value, list)
                         else _parser_for(kind)(str(value)))
        except (ValueError, argparse.ArgumentTypeError):
            raise DataError(f"--config {path}: field {name}: {value!r} is not a {kind.__name__}") from None
    return out


DTYPES = ("auto", "fp32", "bf16")  # Config.precision, Config.save_dtype
OWN_TEMPLATE_ARGS = {"conversation", "tools", "add_generation_prompt", "tokenize"}  # apply_chat_template's, ours
SAMPLERS = {  # --engine NAME -> who samples: its class (a rollout.Generate), imported only by a run that names it
    "hf": "rollout:Generate",
    "auto": "rollout:Generate",  # generate on every device, for now (rollout.Generate says why)
    "fast": "engine:Fast",
    "vllm": "extras.vllm_engine:VLLM",
}
BOUNDS = {  # what each of the run's own fields may be (an algorithm's knobs carry their own bounds)
    "group_size": dict(at_least=1), "epochs": dict(at_least=1), "micro_batch_size": dict(at_least=1),
    "max_steps": dict(at_least=1), "max_new_tokens": dict(at_least=1), "temperature": dict(above=0),
    "train_on": dict(choices=("all", "correct", "incorrect")), "max_chunks": dict(at_least=1),
    "eval_max_chunks": dict(at_least=0), "chunk_head": dict(at_least=-1), "lora_rank": dict(at_least=0),
    "lora_alpha": dict(above=0), "lora_lr_scale": dict(above=0), "eval_temperature": dict(at_least=0),
    "eval_top_p": dict(above=0, at_most=1),
    "eval_batch_size": dict(at_least=1), "eval_problems": dict(at_least=0), "grade_timeout": dict(above=0),
    "grade_cpu": dict(above=0), "grade_workers": dict(at_least=1), "grade_budget": dict(at_least=0),
    "keep_checkpoints": dict(at_least=0),
    "max_tokens_per_micro_batch": dict(at_least=0), "rollout_batch_size": dict(at_least=0),
    "prefill_chunk": dict(at_least=0), "world_size": dict(at_least=0), "dist_timeout": dict(above=0),
    "gpu_memory": dict(above=0), "plan_prompt_tokens": dict(above=0), "precision": dict(choices=DTYPES),
    "save_dtype": dict(choices=DTYPES), "parallel": dict(choices=("auto", "ddp", "fsdp")),
    "engine": dict(choices=SAMPLERS), "vllm_memory": dict(at_least=0),
    "engine_compile": dict(choices=("auto", "off", "eager", "inductor")),
    "lr_schedule": dict(choices=("constant", "linear")),
    "sandbox": dict(choices=("auto", "bwrap", "unshare", "none")), "sandbox_timeout": dict(above=0),
    "sandbox_memory": dict(at_least=64), "max_turns": dict(at_least=1), "max_observation_tokens": dict(at_least=1),
    "max_trace_tokens": dict(at_least=0), "env_timeout": dict(above=0),
    "env_budget": dict(at_least=0), "env_fail_fraction": dict(above=0), "env_fail_steps": dict(at_least=0),
    "lr": dict(at_least=0), "weight_decay": dict(at_least=0),  # what AdamW refuses, said before any load
    "entropy_coef": {}, "grad_clip": {},  # finite (bounds.out_of_bounds): inf makes every step NaN
}
CODE_KNOBS = ("code_template", "sandbox", "sandbox_timeout", "sandbox_memory")  # read by code files (sandbox_*: --env python too)
# A domain's reward is logged as reward/<domain>: these names are the batch's own reward/ metrics
TAKEN_DOMAINS = ("mean", "std", "zero_std_groups", "grader_failures")


def validate(cfg: RunConfig, world: int) -> None:
    """Every mistake we can see before loading a model, with the field to change: one check and one
    message per field, then the rules between fields. The first one broken is raised. A RunConfig
    (parse_config(knobs=False): grading given responses) gets the checks of grading only."""
    checks = field_checks(cfg)
    if type(cfg) is not RunConfig:
        import algos

        algo = algos.get(cfg.algo)
        checks += knob_checks(cfg, algo) + batch_checks(cfg, world, algo) + run_checks(cfg)
    for ok, message in checks + grading_checks(cfg):
        if not ok:
            raise DataError(message)


def run_checks(cfg: RunConfig) -> list[tuple[bool, str]]:
    """The rules between the fields of a training run (or a sampled eval)."""
    return markovian_checks(cfg) + [
        (not (cfg.env and max(cfg.max_chunks, cfg.eval_max_chunks) > 1),
         "--env writes multi-turn traces and max_chunks > 1 Markovian ones: one or the other"),
        (cfg.turn_credit == "outcome" or bool(cfg.env),
         f"turn_credit={cfg.turn_credit!r} credits the turns of multi-turn traces: give --env, or drop it"),
        (cfg.turn_gamma == 1 or cfg.turn_credit == "return",
         f"turn_gamma={cfg.turn_gamma} is the discount of --turn-credit return, not {cfg.turn_credit}"),
        (cfg.turn_adv_coef == 1 or cfg.turn_credit == "mt_grpo",
         f"turn_adv_coef={cfg.turn_adv_coef} weighs the turn advantages of --turn-credit mt_grpo, not {cfg.turn_credit}"),
        (not cfg.max_trace_tokens or cfg.max_trace_tokens >= cfg.max_new_tokens,
         f"max_trace_tokens={cfg.max_trace_tokens} leaves no room for a turn of max_new_tokens={cfg.max_new_tokens}"),
        (not cfg.overlong_penalty or 0 <= cfg.overlong_cache <= response_tokens(cfg),
         f"overlong_cache must be in [0, {response_tokens(cfg)}] (the response budget; 0 = a fifth of it)"),
        (cfg.lora_rank > 0 or not (cfg.lora_targets or cfg.lora_save_merged),
         "lora_targets and lora_save_merged apply to LoRA adapters: give --lora-rank r (e.g. 32), or drop them"),
        (all(name in TRACKERS for name in trackers(cfg)),
         f"report_to={cfg.report_to!r}: name trackers among {', '.join(TRACKERS)}, comma-separated, or none"),
        (cfg.engine == "vllm" or not cfg.vllm_memory,
         "vllm_memory applies to --engine vllm: give --engine vllm, or drop --vllm-memory"),
        (cfg.engine == "fast" or cfg.engine_compile == "auto",
         f"engine_compile={cfg.engine_compile!r} applies to the engine, and --engine {cfg.engine} does not use it "
         f"(auto: HF generate): "
         f"give --engine fast, or drop --engine-compile"),
    ]


def trackers(cfg: RunConfig) -> list[str]:
    """The trackers --report-to names, in order: "tensorboard, wandb" -> ["tensorboard", "wandb"]; "none" -> []."""
    return [] if cfg.report_to == "none" else [name.strip() for name in cfg.report_to.split(",")]


def require_trackers(cfg: RunConfig) -> None:
    """Stop before any model loads when a tracker that --report-to names is not installed, with the pip
    command: --report-to wandb without wandb -> "--report-to wandb needs wandb, not installed here: pip install wandb"."""
    missing = [name for name in trackers(cfg) if importlib.util.find_spec(name) is None]  # package = module name
    if missing:
        raise DataError(f"--report-to {cfg.report_to} needs {' and '.join(missing)}, not installed here: "
                        f"pip install {' '.join(missing)}")


def markovian_checks(cfg: RunConfig) -> list[tuple[bool, str]]:
    """The rule of Markovian thinking's knobs, when a run (or its eval) writes chunks."""
    if max(cfg.max_chunks, cfg.eval_max_chunks) == 1:
        return []
    m, h = cfg.chunk_carryover, cfg.chunk_head_tokens
    return [(0 <= h <= m < cfg.max_new_tokens, f"Markovian thinking needs 0 ≤ chunk_head ({h}) ≤ carryover "
                                               f"({m}) < max_new_tokens (the chunk size, {cfg.max_new_tokens})")]


def grading_checks(cfg: RunConfig) -> list[tuple[bool, str]]:
    """The rules between the fields that grading reads: the data, its prompts, pass@k."""
    return [
        (all(1 <= k <= cfg.eval_samples for k in cfg.eval_k),
         f"eval_k={cfg.eval_k}: every k must be between 1 and eval_samples={cfg.eval_samples}"),
        (not (cfg.chat_template and "<|im_start|>" in prompt_template(cfg.prompt_template or "{problem}")),
         f"--prompt-template {cfg.prompt_template} is already in the chat format: set chat_template false"),
        (cfg.chat_template or not (cfg.system_prompt or cfg.chat_template_kwargs),
         "--system-prompt and --chat-template-kwargs are the chat template's, and chat_template is false: "
         "set it true, or drop them"),
        (not set(cfg.chat_template_kwargs) & OWN_TEMPLATE_ARGS,
         f"--chat-template-kwargs {json.dumps(cfg.chat_template_kwargs, default=str)}: "
         f"{', '.join(sorted(set(cfg.chat_template_kwargs) & OWN_TEMPLATE_ARGS))} the project passes itself "
         f"(rollout.encode_prompts: the turns, --env's tools, the generation prompt, text): drop it"),
        (bool(cfg.eval_k), "eval_k is empty (--eval-k, eval.py's --k): give the pass@k values, e.g. 1,4"),
        *data_checks(cfg),
    ]


def field_checks(cfg: RunConfig) -> list[tuple[bool, str]]:
    """Each of the run's own fields within its BOUNDS, and --code-template one of grading/code.py's recipes.
    --grade-workers 0 -> "grade_workers=0: must be ≥ 1 (grading worker processes per rank, ...)"."""
    ranges = BOUNDS
    if cfg.code_template:  # the recipes are read only by a run that names one
        from grading.code import CODE_TEMPLATES
        ranges = {**BOUNDS, "code_template": dict(choices=("", *CODE_TEMPLATES))}
    return [(False, f"{name}={getattr(cfg, name)!r}: {problem} ({_help(name)})") for name, bounds in ranges.items()
            if (problem := out_of_bounds(getattr(cfg, name), **bounds))]  # the broken ones: a message each


def knob_checks(cfg: RunConfig, algo) -> list[tuple[bool, str]]:
    """Each knob that is a field of cfg: off its default only if --algo reads it, and within its
    bounds; then the algorithm's own rule (Algorithm.check). --algo rover --beta 0.1 -> "beta=0.1:
    --algo rover does not read beta (its loss has no KL term, ...)"."""
    reads = {k.name for k in algo.knobs}
    checks = []
    for name, knob in type(cfg).KNOBS.items():
        value = getattr(cfg, name)
        if name not in reads and value != knob.default:  # who does read it: the whole registry, only now
            why = f" ({algo.refuses[name]})" if name in algo.refuses else ""
            checks.append((False, f"{name}={value!r}: --algo {algo.name} does not read {name}{why}; leave it at its "
                                  f"default {knob.default!r}, or choose an algorithm that reads it "
                                  f"({', '.join(readers(name))})"))
        checks.append((not knob.problem(value), f"{name}={value!r}: {knob.problem(value)} ({knob.help})"))
    problem = algo.check(cfg) if algo.check else ""
    return checks + [(not problem, problem)]


def batch_checks(cfg: RunConfig, world: int, algo) -> list[tuple[bool, str]]:
    """How the rollout batch is cut into mini-batches, groups and micro-batches."""
    from algos.base import several_rows  # (the registry is loaded: `algo` came from it)

    whole = f"--algo {cfg.algo} compares every response with the rest of its group"
    grouped = not algo.group_baseline or cfg.group_size >= 2
    alone = "" if grouped else ", ".join(without_group_baseline())  # the whole registry, for the message alone
    return [
        (cfg.prompts_per_step % world == 0,
         f"prompts_per_step={cfg.prompts_per_step} must be divisible by the {world} ranks"),
        (1 <= cfg.mini_batches <= cfg.prompts_per_step and cfg.prompts_per_step % cfg.mini_batches == 0,
         f"mini_batches={cfg.mini_batches} must divide prompts_per_step={cfg.prompts_per_step}: every "
         f"optimizer step takes the same number of whole groups (choose one of "
         f"{', '.join(str(k) for k in range(1, cfg.prompts_per_step + 1) if cfg.prompts_per_step % k == 0)})"),
        (not cfg.dynamic_sampling or cfg.group_size >= 2,
         "dynamic_sampling keeps only groups whose rewards differ, which a group of one never has: "
         "group_size ≥ 2 (or dynamic_sampling false)"),
        (grouped,
         f"group_size={cfg.group_size}: the advantage of --algo {cfg.algo} compares each response with the "
         f"rest of its group, and a group of one has none (its advantage would be its raw reward): "
         f"group_size ≥ 2, or an algorithm without a group baseline ({alone})"),
        (not algo.whole_groups or cfg.group_size >= 2, f"{whole}: group_size ≥ 2"),
        (not algo.whole_groups or cfg.micro_batch_size >= cfg.group_size,
         f"--algo {cfg.algo} keeps each group whole in a micro-batch: micro_batch_size="
         f"{cfg.micro_batch_size} must be ≥ group_size={cfg.group_size}"),
        (not algo.whole_groups or cfg.train_on == "all",
         f"{whole}: it needs train_on=all and mask_truncated=false, not train_on={cfg.train_on}"),
        (not algo.whole_groups or not cfg.mask_truncated,
         f"{whole}: it needs train_on=all and mask_truncated=false, not mask_truncated=true"),
        (not algo.whole_groups or not several_rows(cfg),
         f"--algo {cfg.algo} scores whole responses against their group; with "
         f"{'--env' if cfg.env else 'max_chunks > 1'} a response is split over several rows, which it does not "
         f"support: {'drop --env' if cfg.env else 'set max_chunks 1'}"),
    ]


def without_group_baseline() -> list[str]:
    """The algorithms whose advantage needs no group: they train on a group of one."""
    import algos

    return [name for name, a in algos.ALGORITHMS.items() if not a.group_baseline and not a.whole_groups]


def data_checks(cfg: RunConfig) -> list[tuple[bool, str]]:
    """What --data, --data-weights, --eval-data and --reward may be together, for each source."""
    if cfg.data in TASKS and not (cfg.data_weights or cfg.eval_data or cfg.reward):
        return []  # one built-in task, graded by its own rules on its own held-out split: nothing to clash
    srcs, mixed = sources(cfg), "," in cfg.data
    names, evals, weights = [domain_name(src) for src in srcs], held_out_files(cfg), weights_problem(cfg, len(srcs))
    checks = [
        (all(srcs), f"--data {cfg.data}: an empty source between commas"),
        (len(set(names)) == len(names), f"--data {cfg.data}: two sources have the same name ({', '.join(names)}); a "
                                        f"source is named by its built-in task or its file's stem: rename a file"),
        (not mixed or not set(names) & set(TAKEN_DOMAINS),
         f"--data {cfg.data}: a source named {', '.join(sorted(set(names) & set(TAKEN_DOMAINS)))} would log its "
         f"reward as reward/mean, std, zero_std_groups or grader_failures, the batch's own: rename the file"),
        (not cfg.data_weights or mixed,
         f"--data-weights weighs the sources of a mixed run; --data {cfg.data} is one source: drop --data-weights, "
         f"or give several sources (--data a,b)"),
        (not weights, weights),
        (len(evals) == len(srcs), f"--eval-data {cfg.eval_data}: {len(evals)} entries for the {len(srcs)} sources of "
                                  f"--data {cfg.data}: give one per source, in order, empty for a built-in task"),
    ]
    for src, held_out in zip(srcs, evals):
        own = "built in" if src in TASKS else "a task of its own"
        checks += [
            (not held_out or not has_own_splits(src),
             f"--eval-data is the held-out file of a data file; --data {src} is {own} and is graded by its own "
             f"rules on its own held-out split: " + ("leave its --eval-data entry empty" if mixed else
                                                     "drop --eval-data, or train on a file")),
            (has_own_splits(src) or held_out or cfg.eval_every == 0,
             f"--data {src} is data (a file or a dataset) with no held-out split of its own: give --eval-data "
             f"(a file, or a dataset's split) for held-out eval, or --eval-every 0"
             + (" (one entry per source, in order, comma-separated)" if mixed else "")),
        ]
    own = "built in" if cfg.data in TASKS else "a task of its own"
    return checks + [
        (not cfg.reward or not all(map(has_own_splits, srcs)),
         f"--reward grades the rows of a data file; --data {cfg.data} is {own if not mixed else 'no data file'} with "
         f"its own grader: drop --reward, or train on a file"),
    ]


def sources(cfg: RunConfig) -> list[str]:
    """The sources of --data: "running_sum, code.jsonl" -> ["running_sum", "code.jsonl"]."""
    return [src.strip() for src in cfg.data.split(",")]


def held_out_files(cfg: RunConfig) -> list[str]:
    """--eval-data's entry for each source ("" where it has none): ",test.jsonl" -> ["", "test.jsonl"]."""
    return [e.strip() for e in cfg.eval_data.split(",")] if cfg.eval_data else [""] * len(sources(cfg))


def weights_problem(cfg: RunConfig, n: int) -> str:
    """What is wrong with --data-weights for n sources, or ""."""
    if not cfg.data_weights:
        return ""
    given = [w.strip() for w in cfg.data_weights.split(",")]
    if len(given) != n:
        return (f"--data-weights {cfg.data_weights}: {len(given)} weight(s) for the {n} sources of --data "
                f"{cfg.data}: give one per source, in order")
    for w in given:
        try:
            value = float(w)
        except ValueError:
            return f"--data-weights {cfg.data_weights}: {w!r} is not a number"
        if not 0 <= value < float("inf"):  # False for nan too
            return f"--data-weights {cfg.data_weights}: {w} is not a share: every weight must be a finite number ≥ 0"
    if not any(float(w) for w in given):
        return f"--data-weights {cfg.data_weights}: every weight is 0, so no source would be sampled"
    return ""


def data_weights(cfg: RunConfig) -> list[float]:
    """Each source's share of the training prompts, summing to 1 ("0.5,1.5" -> [0.25, 0.75]; "" = equal);
    checked by validate (weights_problem)."""
    given = [float(w) for w in cfg.data_weights.split(",")] if cfg.data_weights else [1.0] * len(sources(cfg))
    return [w / sum(given) for w in given]


def response_tokens(cfg: RunConfig) -> int:
    """Generated tokens a training response can reach: max_new_tokens, or for a Markovian trace
    C + (I − 1)(C − m); with --env, max_turns turns of max_new_tokens (observations are not generated)."""
    if cfg.env:
        return cfg.max_turns * cfg.max_new_tokens
    if cfg.max_chunks == 1:
        return cfg.max_new_tokens
    from environments.markovian import chunking

    return chunking(cfg).max_tokens(cfg.max_new_tokens)


def rollout_shapes(cfg: RunConfig, tokenizer) -> tuple:
    """(the training rollout's shape, the held-out eval's), as rollout.generate takes them, built once
    before any model loads: turns with an environment (--env, environments/rollout.py; a user's file
    and the python tool's sandbox are checked here), Markovian chunks (max_chunks > 1, at eval
    eval_max_chunks: environments/markovian.py), or the plain rollout (rollout.PLAIN)."""
    if not cfg.env:
        from rollout import PLAIN

        if max(cfg.max_chunks, cfg.eval_max_chunks) == 1:
            return PLAIN, PLAIN
        from environments.markovian import chunking

        train, held_out = chunking(cfg), chunking(cfg, evaluation=True)
        return (train if train.max_chunks > 1 else PLAIN), (held_out if held_out.max_chunks > 1 else PLAIN)
    from environments import Turns, environment_for
    from environments.rollout import MultiTurn

    turns = Turns(cfg.max_turns, cfg.max_observation_tokens, cfg.max_trace_tokens)
    shape = MultiTurn(environment_for(cfg.env, turns, tokenizer, cfg.chat_template, cfg.env_timeout,
                                      (cfg.sandbox, cfg.sandbox_timeout, cfg.sandbox_memory), cfg.env_budget,
                                      cfg.chat_template_kwargs), turns,
                      (cfg.env_fail_fraction, cfg.env_fail_steps))
    return shape, shape


def sampler_class(cfg: RunConfig) -> type:
    """The class of --engine's sampler (SAMPLERS): hf -> rollout.Generate; engine.py is read only by a run
    that asks for it."""
    module, _, name = SAMPLERS[cfg.engine].partition(":")
    return getattr(importlib.import_module(module), name)


def learning_rate(cfg: RunConfig) -> float:
    """AdamW's learning rate: lr, times lora_lr_scale with LoRA. lr 1e-6, LoRA -> 1e-5."""
    return cfg.lr * (cfg.lora_lr_scale if cfg.lora_rank else 1.0)


def lr_factor(s: int, cfg: RunConfig) -> float:
    """The learning rate's multiple at optimizer step s (from 0): a linear warm-up, then 1, or with
    lr_schedule linear a straight line from 1 to 0 just past the run's last optimizer step (the
    form of TRL's default, transformers' get_linear_schedule_with_warmup)."""
    warm = min(1.0, (s + 1) / max(cfg.warmup_steps, 1))
    if cfg.lr_schedule == "constant":
        return warm
    last = cfg.max_steps * cfg.mini_batches * cfg.epochs  # optimizer steps in the whole run
    return min(warm, max(0.0, (last - s) / max(last - cfg.warmup_steps, 1)))


def eval_settings(cfg: RunConfig, shape, sampler) -> dict:
    """evaluate()'s keyword arguments from the eval fields, the eval's rollout shape (rollout_shapes) and the
    run's sampler (rollout.Generate or another of SAMPLERS): train.py's periodic eval and a stand-alone
    `eval.py --config` run take them from here, so their numbers agree."""
    from rollout import Sampling

    return dict(n=cfg.eval_samples, ks=cfg.eval_k, greedy=cfg.eval_greedy, batch_size=cfg.eval_batch_size,
                sampling=Sampling(cfg.eval_temperature, cfg.eval_top_p, cfg.top_k, cfg.max_new_tokens, cfg.prefill_chunk,
                                  sampler=sampler),
                shape=shape, chat_template=cfg.chat_template, chat_kwargs=cfg.chat_template_kwargs,
                answer_after=cfg.answer_after, seed=cfg.seed + 7919)


def check_prompts_fit(cfg: RunConfig, tokenizer, hf_config, problems, tools: list[dict] | None = None) -> None:
    """Every prompt, as the rollout encodes it (its turns, --env's tools listed, --chat-template-kwargs),
    plus max_new_tokens within the model's context (model.check_context); train.py and eval.py both check
    before loading any weight. A keyword argument the chat template ignores is said, once."""
    from model import check_context
    from rollout import encode_prompts, warn_ignored_kwargs

    if cfg.chat_template_kwargs:
        warn_ignored_kwargs(tokenizer, cfg.chat_template_kwargs)
    # a chat before the prompt (a data row's, --system-prompt) without a template is refused here, before any load
    encode_prompts(tokenizer, [p for p in problems if p.turns][:1], cfg.chat_template, tools, cfg.chat_template_kwargs)
    check_context(tokenizer, hf_config, problems,
                  lambda chosen: encode_prompts(tokenizer, chosen, cfg.chat_template, tools, cfg.chat_template_kwargs),
                  cfg.max_new_tokens)
