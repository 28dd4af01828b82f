"""Decode throughput against its memory-bandwidth bound, HF `generate` ("hf") vs the engine ("fast").

    python bench/decode_bound.py                       # GPU: Qwen2.5-1.5B shape, batch 64 128 256, both regimes
    python bench/decode_bound.py --shape Qwen2.5-7B --regime bound
    python bench/decode_bound.py --device cpu --quick  # CPU smoke run: 2 narrow layers, batch 4 8, 24 tokens

A random-initialised model of a real shape (assets/shapes/<shape>, --layers of it), random prompts.
- bound: the bare model in the compute dtype, τ 1, a stop id no logit belongs to: every row writes
  all --new tokens, so each step does the same work in both engines.
- training: a rollout as train.py runs one: the fp32 model in model.ResponseLogProbs wrapped by
  parallel.wrap (FSDP2, world 1), generating inside full_weights and autocast; the recipe's
  sampling (--recipe: temperature, top-p, top-k, group size); the engine's slab sized by a call of
  the largest batch first; and rows that stop. The stops are the vocabulary's last k = q · vocab
  ids (prompts use its first half): on a random model, whose ids are exchangeable, one of them is
  drawn with probability q a token on average, q such that lengths, geometric truncated at --new,
  have mean --mean. The model itself is untouched (the engine may decode from a copy rebuilt from
  its config, which would drop, e.g., a bias added to the LM head). Realised lengths are printed.

A call's decode steps read every weight once a step and each token's K and V context, so take at least

    ((longest row − 1) · weight bytes + Σ over decoded tokens of context · KV bytes a token) / bandwidth

(compute dtype; token t ≥ 1 of a row has prompt + t columns of context, token 0 is the prefill's;
only tokens written up to each row's stop count): the bandwidth bound. Bandwidth: a device-to-device
copy's (read + write). The roofline takes each step at the larger of its bytes / bandwidth and its
FLOPs / peak, FLOPs being 2 a live row for every matmul weight (the layers' projections and the LM
head) and 4 · layers · heads · head_dim a row for every column of context (QKᵀ and PV); peak: the
data sheet's dense bf16 rate for a GPU in PEAK_FLOPS, else a square matmul's in the compute dtype,
measured.

Decode time: the timed calls' time less, for each, the median of PREFILLS calls of the same rows
with 1 new token (the prefill and the first draw). When that is not above NOISE times the 1-token
calls' spread (max − min) a call, the row says "too short to time" and gives no rate: under load,
rows that stop after a token or two decode for less time than the noise. Each engine first runs
one untimed call per batch (compiling and capturing once per run, not per rollout); `compiles`
counts graphs compiled in the timed calls (engine.compile_count). On CPU only ratios mean much.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace

import torch
import yaml
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
import engine  # noqa: E402
from config import Config  # noqa: E402
from model import ResponseLogProbs  # noqa: E402
from parallel import autocast_context, compute_dtype, full_weights, setup_distributed, teardown, wrap  # noqa: E402
from rollout import Generate, Sampling, sample  # noqa: E402

ENGINES = ("hf", "fast")
SAMPLER = {"hf": Generate, "fast": engine.Fast}  # who samples, by --engine's name
# narrowed too: at the real width one CPU thread spends ~0.2 s a step reading the LM head alone
QUICK = dict(layers=2, batch=[4, 8], prompt=16, new=24, repeats=1, mean=6, copy_bytes=2**26,
             widths=dict(hidden_size=256, intermediate_size=1024, num_attention_heads=4, num_key_value_heads=2,
                         vocab_size=32768))
COLUMNS = ("regime", "batch", "engine", "length mean [min, max]", "decode s", "tokens/s", "bound tokens/s",
           "of bound", "of roofline", "× hf", "compiles")
PREFILLS = 3  # 1-token calls after each timed call: their median stands for its prefill, their spread for noise
NOISE = 3  # a decode time is a figure only above this many spreads of the 1-token calls
# dense bf16 tensor-core FLOP/s from the data sheets; the first key in the device's name is its peak
PEAK_FLOPS = {"H100 PCIe": 756e12, "H100": 989e12, "H200": 989e12, "A100": 312e12}


@dataclass
class Regime:
    name: str
    lm: nn.Module  # what rollout.sample is given
    tok: SimpleNamespace  # stop and pad ids
    sampling: Sampling
    group: int  # rows that share a prompt
    scorer: nn.Module | None = None  # training: the FSDP-wrapped model.ResponseLogProbs around lm
    autocast: object = nullcontext  # () -> the compute dtype's autocast
    calls: int = 0  # engine ("fast") calls made so far: Engine.moves is out of these

    @contextmanager
    def rollout(self):
        """What a sample() call runs in: under training, what train.py's loop wraps a rollout in."""
        with full_weights(self.scorer) if self.scorer else nullcontext(), self.autocast():
            yield


def build_model(shape: str, layers: int, device, **overrides):
    """A random fp32 model of a shipped shape, cut to `layers` (0: all), HF config `overrides`, in
    train mode as train.py holds it. -> (model, HF config)"""
    config = AutoConfig.from_pretrained(ROOT / "assets" / "shapes" / shape, **overrides)
    if layers:
        config.num_hidden_layers = layers
        config.layer_types = config.layer_types[:layers] if getattr(config, "layer_types", None) else None
    torch.manual_seed(0)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32).train(), config


def random_prompts(rows: int, width: int, vocab: int, group: int = 1) -> list[list[int]]:
    """Prompts of ids from the vocabulary's first half, each repeated for a group of `group` rows."""
    ids = torch.randint(1, vocab // 2, (-(-rows // group), width))
    return ids.repeat_interleave(group, 0)[:rows].tolist()


def stop_probability(mean: float, budget: int) -> float:
    """q whose geometric lengths truncated at `budget` have mean `mean`: (1 − (1 − q)^budget) / q = mean."""
    lo, hi = 0.0, 1.0
    for _ in range(60):  # the mean falls from budget (q → 0) to 1 (q = 1)
        q = (lo + hi) / 2
        lo, hi = (q, hi) if (1 - (1 - q) ** budget) / q > mean else (lo, q)
    return q


def best_seconds(work, device: torch.device) -> float:
    """The shortest of 5 timings of work()."""
    best = float("inf")
    for _ in range(5):
        t0 = sync(device)
        work()
        best = min(best, sync(device) - t0)
    return best


def bandwidth(device: torch.device, nbytes: int) -> float:
    """Bytes per second a copy of `nbytes` moves (it reads and writes them), best of 5."""
    x, y = torch.empty(nbytes, dtype=torch.uint8, device=device), torch.empty(nbytes, dtype=torch.uint8, device=device)
    return 2 * nbytes / best_seconds(lambda: y.copy_(x), device)


def peak_flops(device: torch.device, dtype: torch.dtype) -> tuple[float, str]:
    """FLOP/s of dense matmuls: the data sheet's for a GPU named in PEAK_FLOPS, else the best of 5 square
    matmuls in `dtype`. -> (rate, "data sheet" or "measured")"""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    for key, rate in PEAK_FLOPS.items():
        if key in name:
            return rate, "data sheet"
    n = 8192 if device.type == "cuda" else 1024
    a = torch.randn(n, n, dtype=dtype, device=device)
    return 2 * n ** 3 / best_seconds(lambda: a @ a, device), "measured"


def sync(device: torch.device) -> float:
    """The time, once the device has finished what it was given."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def timed(regime: Regime, prompts, sampling: Sampling, device) -> tuple[float, list[int]]:
    """Seconds of one rollout.sample call and each row's count of new tokens."""
    regime.calls += isinstance(sampling.sampler, engine.Fast)
    t0 = sync(device)
    with regime.rollout():
        out = sample(regime.lm, regime.tok, prompts, sampling)
    return sync(device) - t0, [len(tokens) for tokens, _ in out]


def training_regime(lm, device, stops: range, recipe: dict) -> Regime:
    """lm (fp32, as built) wrapped as train.py wraps the policy, sampling as the recipe does."""
    cfg = Config(parallel="fsdp")
    setup_distributed(cfg)
    scorer = wrap(ResponseLogProbs(lm), mode="fsdp", world=1, device=device, dtype=compute_dtype(cfg, device))
    sampling = Sampling(recipe.get("temperature", 1.0), recipe.get("top_p", 1.0), recipe.get("top_k", 0))
    return Regime("training", lm, SimpleNamespace(eos_token_id=stops[0], stop_ids=stops, pad_token_id=0), sampling,
                  recipe.get("group_size", 1), scorer, autocast_context(cfg, device))


def decode_seconds(full: list[float], one_token: list[float]) -> float | None:
    """Seconds the decode steps of len(full) calls took: their time less, for each, the median of the
    1-token calls (its prefill and first draw). None when that is not above NOISE times the 1-token
    calls' spread a call: too short to tell from the noise. [2.0], [0.5, 0.6, 0.4] -> 1.5;
    [0.8], [0.5, 0.6, 0.4] -> None (0.3 against 3 · 0.2)."""
    decode = sum(full) - len(full) * statistics.median(one_token)
    return decode if decode > NOISE * len(full) * (max(one_token) - min(one_token)) else None


def bound_seconds(lengths: list[int], prompt: int, sizes) -> tuple[float, float]:
    """The least seconds the decode steps of a call can take that writes rows of these lengths after a
    prompt of `prompt` columns: (bandwidth bound, roofline). Step t ≥ 1 feeds the rows longer than t,
    each with prompt + t columns of context."""
    bandwidth = roofline = 0.0
    for t in range(1, max(lengths)):
        rows = sum(n > t for n in lengths)
        columns = rows * (prompt + t)
        memory = (sizes.weight_bytes + columns * sizes.kv_bytes) / sizes.rate
        compute = (2 * sizes.matmul_weights * rows + sizes.attention_flops * columns) / sizes.peak
        bandwidth += memory
        roofline += max(memory, compute)
    return bandwidth, roofline


def measure_batch(regime: Regime, batch: int, args, sizes, device) -> list[dict]:
    """One row per engine, over args.repeats calls interleaved so that both see the same machine, each
    followed by PREFILLS 1-token calls. Rates are None where decode_seconds is (too short to time)."""
    prompts = random_prompts(batch, args.prompt, sizes.vocab, regime.group)
    calls = {e: (lambda n, e=e: timed(regime, prompts, replace(regime.sampling, max_new_tokens=n, sampler=SAMPLER[e]()),
                                         device))
             for e in ENGINES}
    for call in calls.values():
        call(args.new)  # warm-up: compile and capture
    runs = {e: dict(full=[], one_token=[], bandwidth=0.0, roofline=0.0, lengths=[], compiles=0) for e in ENGINES}
    for _ in range(args.repeats):
        for e, call in calls.items():
            r, before = runs[e], engine.compile_count()
            seconds, lengths = call(args.new)
            r["full"].append(seconds)
            r["one_token"] += [call(1)[0] for _ in range(PREFILLS)]
            r["compiles"] += engine.compile_count() - before
            r["lengths"] += lengths
            bandwidth, roofline = bound_seconds(lengths, args.prompt, sizes)
            r["bandwidth"] += bandwidth
            r["roofline"] += roofline
    rows = []
    for e, r in runs.items():
        n, tokens = r["lengths"], sum(r["lengths"]) - len(r["lengths"])  # token 0 of a row is the prefill's
        decode = decode_seconds(r["full"], r["one_token"])
        rows.append(dict(regime=regime.name, batch=batch, engine=e, length_mean=sum(n) / len(n), length_min=min(n),
                         length_max=max(n), decode_s=decode, tokens_s=decode and tokens / decode,
                         bound_tokens_s=tokens / r["bandwidth"] if tokens else None,
                         fraction=decode and r["bandwidth"] / decode, roofline=decode and r["roofline"] / decode,
                         compiles=r["compiles"]))
    hf = rows[0]["tokens_s"]
    return [dict(row, vs_hf=hf and row["tokens_s"] and row["tokens_s"] / hf) for row in rows]


def cell(value, spec: str, missing: str = "–") -> str:
    """`value` formatted by `spec`, or `missing` where there is none (a row too short to time)."""
    return missing if value is None else format(value, spec)


def run(lm, config, device, args, say=print, after=None, measured=None) -> list[dict]:
    """The regimes asked for on build_model's `lm`, `say`-ing a header and each table row as it is
    measured; measured(regime, rows so far) after each batch; after(regime, rows so far) once a regime
    is measured, while its engine's step is still the one compiled (the next regime's engine resets
    the compiler). -> the rows as dicts."""
    text, recipe = config.get_text_config(), yaml.safe_load(Path(args.recipe).read_text())
    dtype = compute_dtype(Config(), device)
    size, head_dim = dtype.itemsize, getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    peak, source = peak_flops(device, dtype)
    sizes = SimpleNamespace(vocab=text.vocab_size, rate=bandwidth(device, args.copy_bytes), peak=peak,
                            weight_bytes=sum(p.numel() for p in lm.parameters()) * size,
                            kv_bytes=2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * size,
                            matmul_weights=sum(m.weight.numel() for m in lm.modules() if isinstance(m, nn.Linear)),
                            attention_flops=4 * text.num_hidden_layers * text.num_attention_heads * head_dim)
    q = stop_probability(args.mean, args.new)
    # a random model's ids are exchangeable: k of them carry k / vocab of the probability on average. A range,
    # not a list: rollout cuts a row at its first stop with `token in stops`, token by token
    stops = range(text.vocab_size - max(1, round(q * text.vocab_size)), text.vocab_size)
    say(f"{args.shape}{f' narrowed to {args.widths}' if args.widths else ''}, {text.num_hidden_layers} layers, "
        f"{sizes.weight_bytes / 2**30:.2f} GiB of {dtype} weights on "
        f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else 'CPU'} ({torch.get_num_threads()} "
        f"threads); copy bandwidth {sizes.rate / 1e9:.0f} GB/s, peak {peak / 1e12:.3g} TFLOP/s ({source}); "
        f"prompt {args.prompt}, budget {args.new} tokens")
    say(f"bound: the bare {dtype} model, τ 1, every row writes {args.new} tokens\ntraining: FSDP world 1 + "
        f"autocast, {Path(args.recipe).name}: τ {recipe.get('temperature', 1.0)}, top-p {recipe.get('top_p', 1.0)}, "
        f"top-k {recipe.get('top_k', 0)}, groups of {recipe.get('group_size', 1)}; {len(stops)} stop ids, one "
        f"drawn w.p. q = {q:.4f} a token: lengths geometric, mean {args.mean:g} truncated at {args.new}; the slab "
        f"sized by a call of {max(args.batch)} rows first")
    say("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    rows = []
    for name in ("bound", "training") if args.regime == "both" else (args.regime,):
        if name == "bound":
            regime = Regime("bound", copy.deepcopy(lm).to(dtype).eval(),
                            SimpleNamespace(eos_token_id=text.vocab_size, pad_token_id=0), Sampling(), 1)
            # the slab sized for the largest batch before the first call, as a training run sizes it
            engine.Engine.of(regime.lm).reserve(max(args.batch), args.prompt + args.new)
        else:
            regime = training_regime(lm, device, stops, recipe)
            timed(regime, random_prompts(max(args.batch), args.prompt, text.vocab_size),
                  replace(regime.sampling, max_new_tokens=args.new, sampler=engine.Fast()), device)
        for batch in args.batch:
            rows += measure_batch(regime, batch, args, sizes, device)
            say("\n".join(f"| {r['regime']} | {r['batch']} | {r['engine']} | "
                          f"{r['length_mean']:.1f} [{r['length_min']}, {r['length_max']}] | "
                          f"{cell(r['decode_s'], '.2f', 'too short to time')} | "
                          f"{cell(r['tokens_s'], ',.0f')} | {cell(r['bound_tokens_s'], ',.0f')} | "
                          f"{cell(r['fraction'], '.1%')} | {cell(r['roofline'], '.1%')} | {cell(r['vs_hf'], '.2f')} | "
                          f"{r['compiles']} |" for r in rows[-len(ENGINES):]))
            if measured:
                measured(regime, rows)
        if after:
            after(regime, rows)
    return rows


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="Qwen2.5-1.5B-Instruct")
    parser.add_argument("--layers", type=int, default=0, help="decoder layers to keep; 0 = all")
    parser.add_argument("--batch", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=1024, help="the token budget of a row")
    parser.add_argument("--mean", type=float, default=0, help="the training regime's mean length; 0 = new / 4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--regime", choices=("bound", "training", "both"), default="both")
    parser.add_argument("--recipe", default=str(ROOT / "configs" / "qwen2.5-1.5b_gsm8k_grpo.yaml"))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="a CPU smoke size: " + str(QUICK))
    parser.add_argument("--copy-bytes", type=int, default=2**30, help=argparse.SUPPRESS)
    parser.set_defaults(widths={})  # HF config overrides (--quick's)
    args = parser.parse_args(argv)
    if args.quick:
        vars(args).update(QUICK)
    args.mean = args.mean or args.new / 4
    return args


def main() -> None:
    args = parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)
    lm, config = build_model(args.shape, args.layers, device, **args.widths)
    run(lm, config, device, args)
    teardown()


if __name__ == "__main__":
    main()
