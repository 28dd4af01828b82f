"""One command that settles on one GPU, within `timeout 420`, whether the engine (`--engine fast`)
earns its place and where its time goes: how long its step takes to compile at depth, what a
training step costs with it against HF `generate` (what `--engine auto` on CUDA waits for), how close
it decodes to the hardware's limits, whether it writes what `generate` writes. The parts, in order:

    timeout 420 python bench/gpu_check.py             # probe, train, pack, decode, agree, as far as WINDOW goes
    python bench/gpu_check.py --parts decode,agree    # chosen parts: probe, train, pack, decode, agree, rng, lora, vllm
    python bench/gpu_check.py --skip agree --caps decode=300   # a part left out; a part's cap in seconds
    python bench/gpu_check.py --device cpu --quick    # the parts tiny on CPU: the test suite's smoke run

Random-initialised models of a real shape and vocabulary (assets/shapes/Qwen2.5-1.5B-Instruct, no
download), bf16 on the GPU. Without CUDA it stops at once, saying so, with status 1.

- probe: the engine's step on its inference copy (fp32 weights under bf16 autocast, as DDP holds
  them: q|k|v and gate|up stacked), 2 and then 8 of the shape's layers at their real widths. A first
  call (8 rows) compiles; a second in another rows bucket, whose context crosses a column bucket,
  must compile nothing. Per depth: compile seconds, graphs, recompiles, the second call's seconds,
  and the attention's kernels in a profiled step (softmax, flex, attention or fmha in the name): on
  2026-11-28 the copy's first 28-layer step did not end in 300 s (issue 53: its sizes were symbols).
- train: 3 steps of the Qwen2.5-1.5B GSM8K recipe (configs/qwen2.5-1.5b_gsm8k_grpo.yaml on the
  built-in running_sum task and bench/gpu_run.py's model; 8 prompts × 8, 256-token budget, FSDP
  world 1, bf16) with --engine hf, then fast, each step's rollout and update seconds printed as it
  ends; the run is stopped after its last step, before its end-of-run checkpoint (~21 GB). Per
  step: seconds, of which compiling (train.py's cumulative time/engine_compile, told apart),
  rollout and update, engine/compiles and engine/moves so far; each phase's peak
  (memory/rollout_peak_gib, memory/update_peak_gib) against the plan's (extras.plan.estimate);
  then the table that decides `--engine auto` on CUDA: both engines step by step, and fast's step
  over hf's, compiling left out, over steps 2-3.
- pack: the update alone (train.update) with the recipe's settings at the shape, padded against
  --pack (issue 70), on 8 prompts × 8 of a math run's lengths (bench/pack.py's long tail: 8 +
  248·u⁴ response tokens): per layout the median seconds of 3 interleaved updates after an untimed
  one (--pack's first compiles flex attention), the forwards' tensor tokens, padding share and peak
  GiB, and packed over padded. (The train part's random model writes every row to the budget, so its
  rollouts hold no padding to save.)
- decode: bench/decode_bound.py's bound regime (the bare bf16 model, every row writes every token)
  on the whole shape, batch 64 and 256, prompt 128, 64 new tokens: each engine's tokens/s as a
  fraction of the roofline and of the memory-bandwidth bound; the engine's calls that found the slab
  at a new address (Engine.moves: CUDA graphs recorded anew) out of its calls; at each batch the
  host's seconds issuing a step (Engine.issue_seconds / Engine.steps over one call) and a
  torch.profiler histogram of a step's kernels (a call of 64 tokens less one of 1, per step: the
  same prefill): how many, their time, the most run and the longest (on CPU, the outermost ops).
  --quick runs both regimes (decode_bound's training regime too).
- agree: on 4 of the shape's layers, 16 rows × 64 tokens. Greedy rows by the engine and by
  `generate` in fp32, where a logit's rounding (~1e-6 of it) is far below the margin between the
  top two logits (a random model's are close: ~0.2 of the logits' spread, which bf16's rounding
  crosses every few dozen tokens; scaling the head or the init scales both alike): the rows written
  identically, the first token where a row diverges and the margin there, and the mean margin. Then
  as training holds the model (fp32 weights, FSDP2 world 1, generating inside full_weights and
  autocast: decode_bound.training_regime, bf16 on the GPU): |sampler log-prob − trainer log-prob|
  of each engine's greedy rows (model.ResponseLogProbs over the same tokens), max and mean.
- rng: the final norm's weight zeroed, so that every logit is 0 and every token equally likely;
  the engine draws 256 rows × 64 tokens (one CUDA graph, replayed), twice. Tokens are binned into
  8 id ranges of sizes ∝ 1..8, a known uneven distribution p: a χ² goodness-of-fit test of all
  draws; how often a row's token repeats its previous token's bin (disjoint pairs) and how often
  call 2 repeats call 1's bin at the same (row, step), each against Σp² (binomial z-test, two-sided
  p). A replay that reused its random numbers would repeat every time.
- lora: train's 3 steps with README's one-GPU LoRA flags (--lora-rank 32 --rollout-batch-size 256)
  and --engine fast: the same figures, the adapters merged into the engine's copy.
- vllm: train's 3 steps with --engine vllm (extras/vllm_engine.py): the same figures, the weight
  push's seconds, its step time over the train part's fast and hf. Where vllm is not importable it
  says so in a line and takes no time.

Each part runs in a process of its own (`--part NAME`) under a cap: part i must end by the sum of
the caps of parts 1..i, so that a part that ends early leaves its seconds to the next, and every
part by WINDOW, so that the table is printed before `timeout 420` stops the command; a part left
less than LEAST seconds is not started, and says so. A part still running at its cap prints every
thread's stack a few seconds before (faulthandler: the line it stalled on; train.py, run with
-X faulthandler, gets SIGABRT at its engine's cap), is stopped with its processes, and is recorded
as timed out with what it had kept (probe after each depth, train after each step, decode after
each batch); the next part runs. Writes one JSON (--out; rewritten after every part) and prints a
markdown table: part | measure | value. A part that fails or times out is recorded as such, and the
exit status is then 1.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import faulthandler
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
import traceback
from collections import Counter
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

START = time.monotonic()  # the caps count from here: torch's import can take seconds on a cold machine
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

SHAPE = "Qwen2.5-1.5B-Instruct"
RECIPE = ["--config", str(ROOT / "configs" / "qwen2.5-1.5b_gsm8k_grpo.yaml"), "--data", "running_sum",
          "--eval-data", "", "--prompt-template", "", "--save-every", "0"]  # its data files are not shipped
BINS = 8
WINDOW = 405  # seconds from the start by which every part has ended and the table is printed: `timeout 420`
LEAST = 30  # seconds a part needs at the least: its process, imports and model
HF_CAP = 115  # train's hf pass: 3 steps in 77 s on an H200 (2026-11-28), its process and load ~15 s
END = math.inf  # this process's part must end by then (time.monotonic()): run_part sets it
COMPILED = "Torch-Compiled Region"  # the profiler's event around a compiled function's ops
ATTENTION = re.compile(r"(?<!log_)softmax|flex|attention|fmha|sdpa", re.I)  # an attention kernel's name
# Each part imports the project (transformers and all) itself: without CUDA the script stops first.


def widths(quick: bool) -> dict:
    """HF config overrides: --quick's narrow model (decode_bound's CPU smoke size), else none."""
    from decode_bound import QUICK
    return QUICK["widths"] if quick else {}


# ----------------------------------------------------------------------------- probe

def probe(device, quick: bool, out: Path, keep):
    data, lines = {}, []
    for layers in (2, 8):
        data[layers] = figures = compile_probe(layers, device, quick)
        attention = ", ".join(f"{name[:60]} ×{count:g} ({us:.0f} µs)" for name, count, us in figures["attention"])
        lines += [(f"probe, {layers} layers: compile s, graphs; recompiles, s of a second call (other buckets)",
                   f"{figures['compile_s']:.1f}, {figures['graphs']}; {figures['recompiles']}, "
                   f"{figures['second_s']:.1f}"),
                  (f"probe, {layers} layers: attention's kernels a step (µs a step)", attention or "none found")]
        keep(data, lines)
    return data, lines


def compile_probe(layers: int, device, quick: bool) -> dict:
    """The engine's compile on the inference copy of `layers` of the shape's layers, fp32 under bf16
    autocast (probe): seconds and graphs of the first call's, graphs a second call in other buckets
    compiled (recompiles) and its seconds, and the attention kernels of a step: [(name, a step, µs)]."""
    from decode_bound import build_model, random_prompts, sync
    from engine import Engine, Fast
    from rollout import Sampling, sample
    lm, config = build_model(SHAPE, layers, device, **widths(quick))
    tok = SimpleNamespace(eos_token_id=config.vocab_size, pad_token_id=0)  # no row stops
    mode = "auto" if device.type == "cuda" else "eager"  # auto: inductor with CUDA graphs; eager: dynamo alone
    prompt, longest = 120, 16  # the second call's context crosses BLOCK = 128 columns: two column buckets
    Engine.of(lm, mode).reserve(8, prompt + longest)  # both calls fit: the slab never grows (a recompile)

    def call(rows: int, new: int) -> float:  # greedy: a sampled draw's softmax would count as attention's
        t0 = sync(device)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            sample(lm, tok, random_prompts(rows, prompt, config.vocab_size),
                   Sampling(0.0, max_new_tokens=new, sampler=Fast(mode)))
        return sync(device) - t0
    graphs, seconds = Engine.compiles, Engine.compile_seconds
    call(8, 8)
    first, compile_s = Engine.compiles, Engine.compile_seconds
    second_s = call(3, longest)  # rows bucket 4, views of 128 and 256 columns
    kernels = step_kernels(lambda n: call(8, n), 8, device, top=0)
    return dict(compile_s=compile_s - seconds, graphs=first - graphs, recompiles=Engine.compiles - first,
                second_s=second_s, attention=[(name, count, kernels["micros"][name])
                                              for name, count in kernels["counts"] if ATTENTION.search(name)])


# ----------------------------------------------------------------------------- train, lora

def train_run(name: str, extra: list[str], quick: bool, out: Path, cap: float, kept) -> tuple[dict, list]:
    """3 steps of the recipe with `extra` train.py flags, measured against the plan (summary), each
    step's rollout and update seconds printed, and its (data, lines) so far handed to kept(), as it
    ends; stopped past `cap` seconds, recorded with what it measured and the error."""
    import gpu_run
    flags = gpu_run.recipe_flags(shape_model(out, quick), 3, 16 if quick else 256, 2 if quick else 8) + RECIPE + extra
    run, rows, error, plan = out.parent / f"{out.stem}-{name}", [], None, gpu_run.plan_peaks(flags)
    shutil.rmtree(run, ignore_errors=True)

    def ended(row):
        rows.append(row)
        kept(summary(rows, plan), summary_lines(name, summary(rows, plan)))
        compiled = row.get("time/engine_compile")
        print(f"gpu_check train {name}, step {row['step']}: rollout {row['time/rollout']:.1f} s, update "
              f"{row['time/update']:.1f} s{'' if compiled is None else f', compiling so far {compiled:.1f} s'}",
              flush=True)
    try:
        gpu_run.train(flags, run, 3, on_step=ended, cap=max(cap, 1))
    except (TimeoutError, subprocess.CalledProcessError) as e:
        error = f"{type(e).__name__}: {e}"
    shutil.rmtree(run, ignore_errors=True)
    data = summary(rows, plan) if rows else {}
    lines = summary_lines(name, data) if rows else []
    if error:
        data["error"] = error
        lines.append((f"{name}: failed after {len(rows)} steps", error.splitlines()[0]))
    return data, lines


def shape_model(out: Path, quick: bool) -> Path:
    """The folder of the shape's random model (bench/gpu_run.build), built once for every part that trains."""
    import gpu_run
    model_dir = out.parent / f"{out.stem}-{SHAPE}{'-quick' if quick else ''}"
    if not (model_dir / "tokenizer_config.json").is_file():  # written last: a build cut short is built again
        gpu_run.build(SHAPE, model_dir, 2 if quick else 0, **widths(quick))
    return model_dir


def summary(steps: list[dict], plan: dict) -> dict:
    """A run's metrics.jsonl rows -> per step: seconds, of them compiling (time/engine_compile is cumulative),
    rollout and update seconds, the rollout's share, engine/compiles and engine/moves so far (None where
    train.py does not log them); the mean step less its compiling over the steps after the first; each
    phase's peak over the steps (None on CPU, which has no counter) and the plan's."""
    step_s, compiled = [r["time/step"] for r in steps], [r.get("time/engine_compile") for r in steps]
    compile_s = [None if c is None else c - b for c, b in zip(compiled, [0.0, *compiled])]
    less = [s - (c or 0.0) for s, c in zip(step_s, compile_s)]
    peak = {p: max((r[f"memory/{p}_peak_gib"] for r in steps if f"memory/{p}_peak_gib" in r), default=None)
            for p in ("rollout", "update")}
    return dict(step_s=step_s, compile_s=compile_s, steady_s=statistics.mean(less[1:] or less),
                rollout_s=[r["time/rollout"] for r in steps],
                update_s=[r["time/step"] - r["time/rollout"] for r in steps],  # train.py's time/update
                push_s=[r.get("time/weight_push") for r in steps],
                compiles=[r.get("engine/compiles") for r in steps], moves=[r.get("engine/moves") for r in steps],
                rollout_share=[r["time/rollout"] / r["time/step"] for r in steps], peak_gib=peak, plan_gib=plan)


def summary_lines(name: str, s: dict) -> list[tuple[str, str]]:
    def listed(values):
        return ", ".join("n/a" if v is None else f"{v:g}" for v in values)
    shown = {p: "n/a" if s["peak_gib"][p] is None else f"{s['peak_gib'][p]:.2f}" for p in ("rollout", "update")}
    return [(f"{name}: step s (compiling s, rollout share)",
             ", ".join(f"{t:.1f} ({'n/a' if c is None else f'{c:.1f}'}, {r:.0%})"
                       for t, c, r in zip(s["step_s"], s["compile_s"], s["rollout_share"]))),
            (f"{name}: engine/compiles; engine/moves after each step",
             f"{listed(s['compiles'])}; {listed(s['moves'])}"),
            (f"{name}: peak GiB rollout, update (plan)",
             ", ".join(f"{shown[p]} ({s['plan_gib'][p]:.2f})" for p in ("rollout", "update")))]


def train(device, quick: bool, out: Path, keep):
    data, lines = {}, []
    for name in ("hf", "fast"):  # hf first: the baseline, had fast's steps stalled as on 2026-11-28
        cap = END - time.monotonic() - 5  # fast: the rest of the part
        data[name], more = train_run(name, ["--engine", name], quick, out, min(HF_CAP, cap) if name == "hf" else cap,
                                     lambda d, ls: keep({**data, name: d}, lines + ls))
        lines += more
        keep(data, lines)
    lines += decision(data["hf"], data["fast"])
    failed = [name for name in ("hf", "fast") if "error" in data[name]]
    if failed:
        keep(data, lines)
        raise RuntimeError(f"train {', '.join(failed)} stopped: {'; '.join(data[n]['error'] for n in failed)}")
    data["fast_over_hf"] = data["fast"]["steady_s"] / data["hf"]["steady_s"]
    return data, lines


def decision(hf: dict, fast: dict) -> list[tuple[str, str]]:
    """The table that decides `--engine auto` on CUDA: each step of both engines, and fast's step less
    compiling over hf's, steps 2-3 (train's FSDP, bf16, the 1.5B shape)."""
    lines = []
    for i in range(max(len(hf.get("step_s", [])), len(fast.get("step_s", [])))):
        cells = []
        for name, s in (("hf", hf), ("fast", fast)):
            if i < len(s.get("step_s", [])):
                compiling = "" if s["compile_s"][i] is None else f", compiling {s['compile_s'][i]:.1f}"
                cells.append(f"{name} {s['step_s'][i]:.1f} (rollout {s['rollout_s'][i]:.1f}, update "
                             f"{s['update_s'][i]:.1f}{compiling})")
        lines.append((f"step {i + 1}: s (rollout, update)", "; ".join(cells)))
    if len(hf.get("step_s", [])) == len(fast.get("step_s", [])) == 3:
        ratio = fast["steady_s"] / hf["steady_s"]
        lines += [("fast / hf: step s less compiling, mean of steps 2-3",
                   f"{fast['steady_s']:.1f} / {hf['steady_s']:.1f} = {ratio:.2f}"),
                  ("--engine auto on CUDA, by these steps", "fast (the engine)" if ratio < 1 else "hf (generate)")]
    return lines


def vllm(device, quick: bool, out: Path, keep):
    """train's 3 steps with --engine vllm, against the train part's engines; skipped, saying so, without vllm."""
    import importlib.util
    if importlib.util.find_spec("vllm") is None:
        return dict(skipped=True), [("skipped", "vllm is not importable here (pip install vllm)")]
    data, lines = train_run("vllm", ["--engine", "vllm"], quick, out, END - time.monotonic() - 5,
                            lambda d, ls: keep(dict(vllm=d), ls))
    if "push_s" in data:
        lines.append(("vllm: weight push s, each step", ", ".join(f"{t:.2f}" for t in data["push_s"])))
    earlier = json.loads(out.read_text())["parts"].get("train", {}) if out.is_file() else {}
    for name in ("fast", "hf"):
        if "steady_s" in earlier.get(name, {}) and "steady_s" in data:
            lines.append((f"vllm / {name}: step s less compiling, mean of steps 2-3",
                          f"{data['steady_s']:.1f} / {earlier[name]['steady_s']:.1f} = "
                          f"{data['steady_s'] / earlier[name]['steady_s']:.2f}"))
    return finished(dict(vllm=data), lines, data, keep)


def lora(device, quick: bool, out: Path, keep):
    flags = ["--lora-rank", "32", "--rollout-batch-size", "256", "--engine", "fast"]
    data, lines = train_run("lora", flags, quick, out, END - time.monotonic() - 5, lambda d, ls: keep(dict(lora=d), ls))
    return finished(dict(lora=data), lines, data, keep)


def finished(data: dict, lines: list, run: dict, keep) -> tuple[dict, list]:
    """A part's (data, lines), or, when its train.py run stopped, kept and raised (the part failed)."""
    if "error" in run:
        keep(data, lines)
        raise RuntimeError(run["error"])
    return data, lines


# ----------------------------------------------------------------------------- pack

def pack(device, quick: bool, out: Path, keep):
    """The update alone (train.update: forwards, backwards, AdamW), padded against --pack, with the
    recipe's settings at the shape (FSDP world 1, bf16, gradient checkpointing, micro-batches of 8) on 8
    prompts × 8 of a math run's lengths (bench/pack.py's long tail, to the recipe's 256-token budget):
    per layout the median seconds of 3 updates after one untimed (--pack's first compiles flex
    attention), the tokens of the forwards' tensors, the padding share and the peak GiB."""
    import gpu_run
    from pack import long_tail
    from config import parse_config
    from data import load
    from decode_bound import sync
    from model import load_tokenizer
    from parallel import setup_distributed
    from rollout import encode_prompts
    from train import learner_for, update
    budget = 16 if quick else 256
    cfg = parse_config(gpu_run.recipe_flags(shape_model(out, quick), 1, budget, 2 if quick else 8) + RECIPE)
    setup_distributed(cfg)  # FSDP needs a process group, even of one
    tokenizer = load_tokenizer(cfg.model)
    task, problems, _ = load(cfg)
    batch = task.stream(problems, cfg.seed).get(0, cfg.prompts_per_step)
    prompts = [SimpleNamespace(prompt_ids=ids, group=g, problem=problem) for g, (problem, ids)
               in enumerate(zip(batch, encode_prompts(tokenizer, batch, cfg.chat_template))) for _ in range(cfg.group_size)]
    episodes = long_tail(prompts, budget=budget)
    learner = learner_for(cfg, None, tokenizer, batch, 0, 1, device)[0]
    layouts = {"padded": False, "packed": True}
    runs = {name: [] for name in layouts}

    def timed(name: str) -> tuple[float, dict, float | None]:
        learner.cfg, learner.scorer.pack = replace(cfg, pack=layouts[name]), layouts[name]  # one model, both layouts
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        t0 = sync(device)
        metrics = update(learner, copy.deepcopy(episodes))
        seconds = sync(device) - t0
        return seconds, metrics, torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else None
    data, lines = {}, []
    for name in layouts:  # the untimed update: AdamW's state, --pack's compiles
        data[f"{name}_first_s"] = timed(name)[0]
    for _ in range(3):
        for name in layouts:  # interleaved: a drift of the machine falls on both
            runs[name].append(timed(name))
    for name, got in runs.items():
        seconds, metrics, peak = statistics.median(s for s, _, _ in got), got[-1][1], got[-1][2]
        data[name] = dict(seconds=seconds, all_s=[s for s, _, _ in got], real_tokens=metrics["layout/real_tokens"],
                          tensor_tokens=metrics["layout/tensor_tokens"], padding_share=metrics["layout/padding_share"],
                          peak_gib=peak)  # tokens per optimizer step (train.py's layout/ metrics)
        lines.append((f"pack: {name} update s (first), tokens, padding share, peak GiB",
                      f"{seconds:.2f} ({data[f'{name}_first_s']:.1f}), {metrics['layout/tensor_tokens']:.0f}, "
                      f"{metrics['layout/padding_share']:.3f}, {'n/a' if peak is None else f'{peak:.2f}'}"))
    data["packed_over_padded"] = data["packed"]["seconds"] / data["padded"]["seconds"]
    lines.append(("pack: packed / padded update s, median of 3",
                  f"{data['packed']['seconds']:.2f} / {data['padded']['seconds']:.2f} = {data['packed_over_padded']:.2f}"))
    return data, lines


# ----------------------------------------------------------------------------- decode

def decode(device, quick: bool, out: Path, keep):
    from decode_bound import ENGINES, build_model, cell, parse_args, run
    sizes = "--quick" if quick else "--regime bound --batch 64 256 --prompt 128 --new 64 --repeats 1"
    args = parse_args(["--device", device.type, *sizes.split()])
    if device.type == "cpu":
        torch.set_num_threads(1)  # as decode_bound.py runs on CPU
    lm, config = build_model(args.shape, args.layers, device, **args.widths)
    data, lines = dict(rows=[], engines={}), []

    def measured(regime, rows):  # a batch's rows, kept at once: a part cut at its cap keeps them
        data["rows"] = rows
        lines.extend((f"{r['regime']}, batch {r['batch']}, {r['engine']}",
                      f"too short to time (mean length {r['length_mean']:.1f})" if r["decode_s"] is None else
                      f"{r['roofline']:.1%} of the roofline, {r['fraction']:.1%} of the bandwidth bound, "
                      f"{r['tokens_s']:,.0f} tok/s, ×{cell(r['vs_hf'], '.2f')} hf, "
                      f"mean length {r['length_mean']:.0f}, compiles {r['compiles']}") for r in rows[-len(ENGINES):])
        keep(data, lines)

    def after(regime, rows):  # the regime's engine is still the one compiled
        figures = data["engines"][regime.name] = engine_figures(regime, args, config.vocab_size, device)
        lines.append((f"{regime.name}: engine calls that found the slab at a new address",
                      f"{figures['moves']} of {figures['calls']}"))
        for batch, b in figures["batches"].items():
            issue = b["issue_s_per_step"]
            lines.append((f"{regime.name}, batch {batch}: host µs issuing a step",
                          "n/a (no step without a compile)" if issue is None else f"{issue * 1e6:.0f}"))
            if "kernels_per_step" in b:
                lines.append((f"{regime.name}, batch {batch}: kernels a step, their ms; the most run; the longest",
                              f"{b['kernels_per_step']:.0f}, {b['kernel_ms_per_step']:.3f}; "
                              + ", ".join(f"{n[:40]} ×{c:g}" for n, c in b["most_run"]) + "; "
                              + ", ".join(f"{n[:40]} {us:.0f} µs" for n, us in b["longest"])))
        keep(data, lines)

    run(lm, config, device, args, after=after, measured=measured)  # prints its own table as it goes
    return data, lines


def engine_figures(regime, args, vocab: int, device) -> dict:
    """The regime's engine: moves out of calls so far; at the smallest and largest batch, host seconds
    issuing a step over one call (Engine.issue_seconds / Engine.steps; None if every step compiled)
    and, in the bound regime, a step's kernels (step_kernels)."""
    from decode_bound import random_prompts, timed
    from engine import Engine, Fast
    engine = Engine.of(regime.lm)
    figures = dict(moves=engine.moves, calls=regime.calls, batches={})
    for batch in (min(args.batch), max(args.batch)):
        prompts = random_prompts(batch, args.prompt, vocab, regime.group)

        def call(n):
            return timed(regime, prompts, replace(regime.sampling, max_new_tokens=n, sampler=Fast()), device)
        steps, seconds = engine.steps, engine.issue_seconds
        call(args.new)
        issue = None if engine.steps == steps else (engine.issue_seconds - seconds) / (engine.steps - steps)
        b = figures["batches"][str(batch)] = dict(issue_s_per_step=issue)
        if regime.name == "bound":  # every row writes every token: args.new − 1 steps at this batch
            b.update(step_kernels(call, args.new, device))
    return figures


def step_kernels(call, new: int, device, top: int = 5) -> dict:
    """A decode step's kernels: profiles of call(new) and call(1) (the same prefill and first draw),
    subtracted, over the new − 1 steps. On CUDA the device's kernels (a CUDA graph's replay shows each
    of its kernels), on CPU the outermost ops (a compiled step's: those its region runs). -> kernels
    and kernel ms a step, the `top` most run [(name, count a step)] and the `top` longest [(name, µs a
    step)], and every kernel's count (most run first) and µs a step (counts, micros)."""
    from torch.profiler import ProfilerActivity, profile
    count, micros = Counter(), Counter()
    for n, sign in ((new, 1), (1, -1)):
        with profile(activities=[ProfilerActivity.CUDA if device.type == "cuda" else ProfilerActivity.CPU]) as prof:
            call(n)
        for e in prof.events():
            outermost = e.cpu_parent is None or e.cpu_parent.name.startswith(COMPILED)
            kernel = (e.device_type == torch.autograd.DeviceType.CUDA and not e.is_user_annotation
                      if device.type == "cuda" else outermost and not e.name.startswith(COMPILED))
            if kernel:
                count[e.name] += sign
                micros[e.name] += sign * e.time_range.elapsed_us()
    steps = new - 1
    return dict(kernels_per_step=sum(count.values()) / steps, kernel_ms_per_step=sum(micros.values()) / steps / 1e3,
                most_run=[(k, c / steps) for k, c in count.most_common(top)],
                longest=[(k, us / steps) for k, us in micros.most_common(top)],
                counts=[(k, c / steps) for k, c in count.most_common() if c > 0],
                micros={k: us / steps for k, us in micros.items()})


# ----------------------------------------------------------------------------- agree

def agree(device, quick: bool, out: Path, keep):
    from decode_bound import build_model, random_prompts, training_regime
    from engine import Fast
    from rollout import Chunk, Generate, Sampling, collate, sample
    lm, config = build_model(SHAPE, 2 if quick else 4, device, **widths(quick))
    rows, new = (4, 12) if quick else (16, 64)
    prompts = random_prompts(rows, 32, config.vocab_size)
    tok = SimpleNamespace(eos_token_id=config.vocab_size, pad_token_id=0)  # an unwritable stop: full rows

    def greedy(model, engine):
        return sample(model, tok, prompts, Sampling(0.0, max_new_tokens=new,
                                                    sampler=Fast() if engine == "fast" else Generate()))

    bare = copy.deepcopy(lm).eval()  # fp32: the engine runs it itself
    written = {e: greedy(bare, e) for e in ("hf", "fast")}
    with torch.no_grad():  # the logits that chose hf's tokens
        logits = bare(input_ids=torch.tensor([p + t for p, (t, _) in zip(prompts, written["hf"])], device=device)
                      ).logits[:, len(prompts[0]) - 1:-1].float()
    top = logits.topk(2, -1).values
    margin = top[..., 0] - top[..., 1]  # [rows, new]
    firsts = {r: next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
              for r, ((a, _), (b, _)) in enumerate(zip(written["hf"], written["fast"])) if a != b}
    data = dict(rows=rows, new_tokens=new, layers=config.num_hidden_layers, identical=(rows - len(firsts)) / rows,
                first_divergence=min(firsts.values(), default=None),
                median_divergence=statistics.median(firsts.values()) if firsts else None,
                margin_mean=float(margin.mean()),
                margins_at_divergence=[float(margin[r, i]) for r, i in firsts.items()])
    where = (f"; first divergence at token {data['first_divergence']} (median {data['median_divergence']:g}), "
             f"top-two margins there {', '.join(f'{m:.2g}' for m in data['margins_at_divergence'])}" if firsts else "")
    lines = [("greedy rows written identically, fast vs hf, fp32", f"{rows - len(firsts)}/{rows}{where}"),
             ("mean margin of the top logit over the next, hf's rows", f"{data['margin_mean']:.3f}")]
    keep(data, lines)

    regime = training_regime(lm, device, range(config.vocab_size, config.vocab_size + 1), {})
    data["logp_gap"] = {}
    for engine in ("hf", "fast"):
        with regime.rollout():
            written = greedy(lm, engine)
        batch = collate([Chunk(p, t, lp) for p, (t, lp) in zip(prompts, written)], 0, device)
        with torch.no_grad(), regime.autocast():  # as train.fixed_passes scores π_old
            logp = regime.scorer(batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask,
                                 1.0)["logp"]
        gap = (logp - batch.sampler_logp)[batch.response_mask > 0].abs()
        g = data["logp_gap"][engine] = dict(max=float(gap.max()), mean=float(gap.mean()))
        lines.append((f"log-prob gap to the trainer's, {engine} (FSDP, autocast)",
                      f"max {g['max']:.2e}, mean {g['mean']:.2e} (abs)"))
    return data, lines


# ----------------------------------------------------------------------------- rng

def bin_edges(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the first id of bins 1..7, each bin's probability) for bins of sizes ∝ 1..8 over the vocabulary."""
    sizes = [vocab * b // 36 for b in range(1, BINS)]
    sizes.append(vocab - sum(sizes))
    return torch.tensor(sizes).cumsum(0)[:-1], torch.tensor(sizes, dtype=torch.float64) / vocab


def repeats(a: torch.Tensor, b: torch.Tensor, expected: float) -> dict:
    """How often a == b, against `expected` a pair under independence: rate and the two-sided p of a z-test."""
    n, hits = a.numel(), int((a == b).sum())
    z = (hits - n * expected) / math.sqrt(n * expected * (1 - expected))
    return dict(pairs=n, rate=hits / n, expected=expected, p_value=math.erfc(abs(z) / math.sqrt(2)))


def rng(device, quick: bool, out: Path, keep):
    from decode_bound import build_model, random_prompts
    from engine import Fast
    from rollout import Sampling, sample
    lm, config = build_model(SHAPE, 2, device, **widths(quick))
    lm = lm.to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()  # bare: the engine runs lm itself
    with torch.no_grad():
        lm.get_decoder().norm.weight.zero_()  # the last hidden state is 0, so is every logit
    rows, new = (64, 16) if quick else (256, 64)
    prompts = random_prompts(rows, 8, config.vocab_size)
    tok = SimpleNamespace(eos_token_id=config.vocab_size, pad_token_id=0)  # no row stops
    draws = [torch.tensor([t for t, _ in sample(lm, tok, prompts, Sampling(1.0, max_new_tokens=new, sampler=Fast()))])
             for _ in range(2)]
    edges, p = bin_edges(config.vocab_size)
    bins = [torch.bucketize(d, edges, right=True) for d in draws]
    counts = torch.bincount(torch.cat(bins).flatten(), minlength=BINS).double()
    expected = counts.sum() * p
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    chi2_p = float(torch.special.gammaincc(torch.tensor((BINS - 1) / 2, dtype=torch.float64), torch.tensor(chi2 / 2)))
    square = float((p ** 2).sum())
    pairs = [(b[:, 1::2], b[:, 0:b.shape[1] - 1:2]) for b in bins]  # (1, 0), (3, 2), ...: disjoint pairs
    successive = repeats(torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs]), square)
    across = repeats(bins[1], bins[0], square)
    same_token = int((draws[0] == draws[1]).sum())
    data = dict(draws=int(counts.sum()), chi2=chi2, chi2_p=chi2_p, successive=successive, across_calls=across,
                same_token_across_calls=same_token, same_token_expected=draws[0].numel() / config.vocab_size)

    def rate(r):
        return f"{r['rate']:.4f} vs Σp² {square:.4f}, p = {r['p_value']:.3f}"
    lines = [(f"χ² of {data['draws']:,} draws in {BINS} bins ∝ 1..{BINS} ({BINS - 1} dof)",
              f"{chi2:.1f}, p = {chi2_p:.3f}"),
             ("a token repeats its row's previous bin", rate(successive)),
             ("call 2 repeats call 1's bin (same row, step)", rate(across)),
             ("call 2 repeats call 1's token", f"{same_token} (expected {data['same_token_expected']:.2f})")]
    return data, lines




# ----------------------------------------------------------------------------- the parts, each in a process

# name: (part, its cap in seconds, from what an H200 took (docs/measured.md) with margin). A part's
# process, its imports and a model build take 10-20 s before anything is measured (rng alone: 37 s wall
# on 2026-11-28, against a cap of 20 then). The parts after train get what WINDOW leaves.
PARTS = {
    "probe": (probe, 90),  # start 15; compiles of 2 and 8 layers: 28 took 90 s in train on 2026-11-26
    "train": (train, 300),  # build 15; hf 115 (HF_CAP); fast: start 15, 3 steps in 141 s on 2026-11-26, 90 compiling
    "pack": (pack, 100),  # unmeasured on a GPU: build 15, 8 updates of 64 rows, flex attention's first compile
    "decode": (decode, 120),  # both regimes at 3 batches took 233 s (2026-11-26); one regime at 2 batches
    "agree": (agree, 60),  # 41 s (2026-11-26)
    "rng": (rng, 50),  # 37 s alone (2026-11-28)
    "lora": (lora, 200),  # 133 s with generate (2026-11-26), plus the engine's compile
    "vllm": (vllm, 150),  # where vllm is installed (else a line, at once): start 15, vLLM's start 60, 3 steps
}
DEFAULT = ("probe", "train", "pack", "decode", "agree")  # what a window is for, most valuable first


def part_file(out: Path, name: str) -> Path:
    """Where a part's process keeps what it has measured, for the parent to read."""
    return out.with_name(f"{out.stem}-{name}.part.json")


def run_part(name: str, device, quick: bool, out: Path, cap: float) -> None:
    """The child's side: one part, within `cap` seconds of this process's start (END), whose (data,
    lines) are written to part_file each time it keeps them and at its end; on an error, with the
    error, and the status is 1. A few seconds before its cap, every thread's stack goes to stderr."""
    global END
    from parallel import teardown
    END = START + cap
    if END < math.inf:  # a part run alone (--part, no --cap) has none
        faulthandler.dump_traceback_later(max(END - time.monotonic() - 3, 1), exit=False)
    path, kept = part_file(out, name), [{}, []]

    def keep(data: dict, lines: list) -> None:
        kept[:] = data, lines
        path.with_suffix(".tmp").write_text(json.dumps(dict(data=data, lines=lines)))
        path.with_suffix(".tmp").replace(path)  # whole, even when the part is stopped while writing
    try:
        keep(*PARTS[name][0](device, quick, out, keep))
    except Exception as e:  # noqa: BLE001 - the parent records it and runs the next part
        traceback.print_exc()
        error = f"{type(e).__name__}: {e}"
        keep(dict(kept[0], error=error), kept[1] + [("failed", error.splitlines()[0])])
        sys.exit(1)
    finally:
        faulthandler.cancel_dump_traceback_later()
        teardown()  # the process group the FSDP parts started


def run_child(name: str, args, cap: float) -> tuple[dict, list, int | None]:
    """Run one part in a child process for at most `cap` seconds. -> what it kept (data, lines) and its
    exit status, None when it was stopped at its cap."""
    argv = [sys.executable, __file__, "--part", name, "--cap", f"{cap:.1f}", "--device", args.device, "--out", args.out]
    path = part_file(Path(args.out), name)
    path.unlink(missing_ok=True)
    child = subprocess.Popen(argv + ["--quick"] * args.quick, start_new_session=True)  # a process group of its own
    try:
        status = child.wait(timeout=max(cap, 1))
    except subprocess.TimeoutExpired:
        status = None
    finally:  # past the cap, or on our own way out: the part's processes (train.py's too) go with it
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
    got = json.loads(path.read_text()) if path.is_file() else dict(data={}, lines=[])
    path.unlink(missing_ok=True)
    return got["data"], [tuple(line) for line in got["lines"]], status


def names(text: str, option: str) -> list[str]:
    """Part names from a comma-separated --parts or --skip, checked."""
    chosen = [n for n in text.split(",") if n]
    if set(chosen) - set(PARTS):
        sys.exit(f"gpu_check: {option} {','.join(sorted(set(chosen) - set(PARTS)))}: the parts are {', '.join(PARTS)}")
    return chosen


def parse_caps(text: str) -> dict:
    try:
        caps = {name: float(seconds) for name, seconds in (pair.split("=") for pair in text.split(",") if pair)}
    except ValueError:
        sys.exit(f"gpu_check: --caps {text}: give NAME=SECONDS pairs separated by commas, e.g. decode=300")
    names(",".join(caps), "--caps")
    return caps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gpu_check.json")
    parser.add_argument("--parts", default=",".join(DEFAULT), help=f"comma-separated, of: {', '.join(PARTS)}")
    parser.add_argument("--skip", default="", help="comma-separated parts to leave out of --parts")
    parser.add_argument("--caps", default="", help="NAME=SECONDS,...: parts' caps other than PARTS' (decode=300)")
    parser.add_argument("--window", type=float, default=WINDOW, help="seconds by which every part has ended")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a child process's one part
    parser.add_argument("--cap", type=float, default=math.inf, help=argparse.SUPPRESS)  # ... and its seconds
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): run it on a machine with one")
    out = Path(args.out)
    if args.part:
        return run_part(args.part, device, args.quick, out, args.cap)
    chosen, skip, caps = set(names(args.parts, "--parts")), set(names(args.skip, "--skip")), parse_caps(args.caps)
    # a SIGTERM (`timeout`'s) leaves through run_child's `finally`, which stops the running part's processes
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    out.parent.mkdir(parents=True, exist_ok=True)
    report = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
                  torch=torch.__version__, quick=args.quick, parts={})
    table, failed, end = [], False, START
    for name, (_, estimate) in PARTS.items():
        if name not in chosen - skip:
            continue
        end += caps.get(name, estimate)  # this part's end: what earlier parts left, and its own cap
        t0 = time.monotonic()
        left = START + args.window - t0
        if left < LEAST:
            report["parts"][name] = dict(not_run=True, window_left_s=left)
            table.append((name, "not run", f"{max(left, 0):.0f} s of the window left, under {LEAST}"))
            continue
        cap = min(end - t0, left)
        data, lines, status = run_child(name, args, cap)
        if status is None:
            data["timed_out"] = True
            lines.append(("timed out", f"stopped after {cap:.0f} s; above, what it had kept"))
        elif status and "error" not in data:
            data["error"] = f"exit status {status}"
            lines.append(("failed", data["error"]))
        failed |= status != 0
        seconds = time.monotonic() - t0
        report["parts"][name] = dict(data, seconds=seconds, estimate_s=estimate, cap_s=cap)
        table += [(name, what, value) for what, value in lines]
        table.append((name, "seconds (estimate, cap)", f"{seconds:.0f} ({estimate:g}, {cap:.0f})"))
        out.write_text(json.dumps(report, indent=1))
    print(f"\n{report['device']}, torch {report['torch']}{' (--quick)' if args.quick else ''}; wrote {out}")
    print("| part | measure | value |\n|---|---|---|")
    print("\n".join(f"| {p} | {w} | {v} |" for p, w, v in table))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
