"""One command for a GPU's first minutes: does the engine (`--engine fast`) write what HF `generate`
writes and record the trainer's log-probs, do its CUDA graphs draw fresh random numbers at every
replay, how close does it decode to the memory-bandwidth bound, and what do training steps cost
against the memory plan.

    python bench/gpu_check.py                        # every part: ~8 min on one H100 (estimated, see PARTS)
    python bench/gpu_check.py --skip train,lora      # parts: agree, rng, decode, train, lora
    python bench/gpu_check.py --device cpu --quick   # every part tiny on CPU: the test suite's smoke run

Random-initialised models of a real shape and vocabulary (assets/shapes/Qwen2.5-1.5B-Instruct, no
download), bf16 on the GPU. Without CUDA it stops at once, saying so, with status 1.

- agree: greedy decoding by the engine and by `generate`, 16 rows × 64 tokens on 4 of the shape's
  layers, the model held as training holds it (fp32, FSDP2 world 1, generating inside
  full_weights and autocast: decode_bound.training_regime): the rows written identically and the
  first token where a row diverges; and |sampler log-prob − trainer log-prob| (what each engine
  recorded against model.ResponseLogProbs over the same tokens), max and mean.
- rng: the final norm's weight zeroed, so that every logit is 0 and every token equally likely;
  the engine draws 256 rows × 64 tokens (one CUDA graph, replayed), twice. Tokens are binned into
  8 id ranges of sizes ∝ 1..8, a known uneven distribution p: a χ² goodness-of-fit test of all
  draws; how often a row's token repeats its previous token's bin (disjoint pairs) and how often
  call 2 repeats call 1's bin at the same (row, step), each against Σp² (binomial z-test, two-sided
  p). A replay that reused its random numbers would repeat every time.
- decode: bench/decode_bound.py on the whole shape, batch 64/128/256, prompt 128, 128 new tokens,
  both regimes: the fraction of the bandwidth bound, per engine.
- train: 3 steps of the Qwen2.5-1.5B GSM8K recipe (configs/qwen2.5-1.5b_gsm8k_grpo.yaml on the
  built-in running_sum task and bench/gpu_run.py's model; 8 prompts × 8, 256-token budget) with
  --engine fast, then hf: engine/compiles, step time, the rollout's share,
  and each phase's peak (memory/rollout_peak_gib, memory/update_peak_gib) against the plan's
  (extras.plan.estimate).
- lora: the same with README's one-GPU LoRA flags (--lora-rank 32 --rollout-batch-size 256; --engine
  auto): peaks against the plan's.

Writes one JSON (--out; rewritten after every part, so a run cut short keeps what it measured) and
prints a markdown table: part | measure | value. A part that fails is recorded with its error and
the next one runs; the exit status is then 1.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import shutil
import statistics
import sys
import time
import traceback
from pathlib import Path
from types import SimpleNamespace

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from parallel import teardown  # noqa: E402 (torch alone)

SHAPE = "Qwen2.5-1.5B-Instruct"
RECIPE = ["--config", str(ROOT / "configs" / "qwen2.5-1.5b_gsm8k_grpo.yaml"), "--data", "running_sum",
          "--eval-data", "", "--prompt-template", "", "--save-every", "0"]  # its data files are not shipped
BINS = 8
# Each part imports the project (transformers and all) itself: without CUDA the script stops first.


def widths(quick: bool) -> dict:
    """HF config overrides: --quick's narrow model (decode_bound's CPU smoke size), else none."""
    from decode_bound import QUICK
    return QUICK["widths"] if quick else {}


def agree(device, quick: bool, out: Path):
    from decode_bound import build_model, random_prompts, training_regime
    from rollout import Chunk, Sampling, collate, sample
    lm, config = build_model(SHAPE, 2 if quick else 4, device, **widths(quick))
    regime = training_regime(lm, device, range(config.vocab_size, config.vocab_size + 1), {})  # unwritable: full rows
    rows, new = (4, 12) if quick else (16, 64)
    prompts = random_prompts(rows, 32, config.vocab_size)
    written, gaps = {}, {}
    for engine in ("hf", "fast"):
        with regime.rollout():
            written[engine] = sample(lm, regime.tok, prompts, Sampling(0.0, max_new_tokens=new, engine=engine))
        batch = collate([Chunk(p, t, lp) for p, (t, lp) in zip(prompts, written[engine])], 0, device)
        with torch.no_grad(), regime.autocast():  # as train.fixed_passes scores π_old
            logp = regime.scorer(batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask,
                                 1.0)["logp"]
        gap = (logp - batch.sampler_logp)[batch.response_mask > 0].abs()
        gaps[engine] = dict(max=float(gap.max()), mean=float(gap.mean()))
    firsts = [next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
              for (a, _), (b, _) in zip(written["hf"], written["fast"]) if a != b]
    data = dict(rows=rows, new_tokens=new, layers=config.num_hidden_layers, identical=(rows - len(firsts)) / rows,
                first_divergence=min(firsts, default=None),
                median_divergence=statistics.median(firsts) if firsts else None, logp_gap=gaps)
    where = f"; first divergence at token {min(firsts)} (median {data['median_divergence']:g})" if firsts else ""
    lines = [("greedy rows written identically, fast vs hf", f"{rows - len(firsts)}/{rows}{where}")]
    lines += [(f"log-prob gap to the trainer's, {e}", f"max {g['max']:.2e}, mean {g['mean']:.2e} (abs)")
              for e, g in gaps.items()]
    return data, lines


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


def rng(device, quick: bool, out: Path):
    from decode_bound import build_model, random_prompts
    from rollout import Sampling, sample
    lm, config = build_model(SHAPE, 2, device, **widths(quick))
    lm = lm.to(torch.bfloat16 if device.type == "cuda" else torch.float32).eval()  # bare: the engine runs lm itself
    with torch.no_grad():
        lm.get_decoder().norm.weight.zero_()  # the last hidden state is 0, so is every logit
    rows, new = (64, 16) if quick else (256, 64)
    prompts = random_prompts(rows, 8, config.vocab_size)
    tok = SimpleNamespace(eos_token_id=config.vocab_size, pad_token_id=0)  # no row stops
    draws = [torch.tensor([t for t, _ in sample(lm, tok, prompts, Sampling(1.0, max_new_tokens=new, engine="fast"))])
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


def decode(device, quick: bool, out: Path):
    from decode_bound import build_model, parse_args, run
    from engine import Engine
    sizes = "--quick" if quick else "--batch 64 128 256 --prompt 128 --new 128 --repeats 1"
    args = parse_args(["--device", device.type, *sizes.split()])
    lm, config = build_model(args.shape, args.layers, device, **args.widths)
    rows = run(lm, config, device, args)  # prints its own table as it goes
    moved = Engine.of(lm).moves  # calls that found the slab elsewhere: on CUDA, graphs recorded anew
    lines = [(f"{r['regime']}, batch {r['batch']}, {r['engine']}",
              f"{r['fraction']:.1%} of bound, {r['tokens_s']:,.0f} tok/s, ×{r['vs_hf']:.2f} hf, mean length "
              f"{r['length_mean']:.0f}, compiles {r['compiles']}") for r in rows]
    lines.append(("engine calls that found the slab at a new address (CUDA graphs recorded anew)", f"{moved}"))
    return dict(rows=rows, moved=moved), lines


def training(variants: dict):
    """A part: 3 steps of the recipe per variant (extra train.py flags), measured against the plan."""
    def part(device, quick: bool, out: Path):
        import gpu_run
        model_dir = out.parent / f"{out.stem}-{SHAPE}{'-quick' if quick else ''}"
        if not (model_dir / "config.json").is_file():
            gpu_run.build(SHAPE, model_dir, 2 if quick else 0, **widths(quick))
        base = gpu_run.recipe_flags(model_dir, 3, 16 if quick else 256, 2 if quick else 8) + RECIPE
        data, lines = {}, []
        for name, extra in variants.items():
            run = out.parent / f"{out.stem}-{name}"
            shutil.rmtree(run, ignore_errors=True)
            steps = gpu_run.train(base + extra, run)
            shutil.rmtree(run)  # its end-of-run checkpoint: ~21 GB for the full 1.5B (fp32 weights + AdamW)
            data[name] = summary(steps, gpu_run.plan_peaks(base + extra))
            lines += summary_lines(name, data[name])
        return data, lines
    return part


def summary(steps: list[dict], plan: dict) -> dict:
    """A run's metrics.jsonl rows -> per step: seconds, the rollout's share, engine/compiles; each
    phase's peak over the steps (None on CPU, which has no counter) and the plan's."""
    peak = {p: max((r[f"memory/{p}_peak_gib"] for r in steps if f"memory/{p}_peak_gib" in r), default=None)
            for p in ("rollout", "update")}
    return dict(step_s=[r["time/step"] for r in steps], compiles=[r.get("engine/compiles") for r in steps],
                rollout_share=[r["time/rollout"] / r["time/step"] for r in steps], peak_gib=peak, plan_gib=plan)


def summary_lines(name: str, s: dict) -> list[tuple[str, str]]:
    shown = {p: "n/a" if s["peak_gib"][p] is None else f"{s['peak_gib'][p]:.2f}" for p in ("rollout", "update")}
    return [(f"{name}: step s (rollout share)",
             ", ".join(f"{t:.1f} ({r:.0%})" for t, r in zip(s["step_s"], s["rollout_share"]))),
            (f"{name}: engine/compiles after each step",
             ", ".join("n/a" if c is None else f"{c:g}" for c in s["compiles"])),
            (f"{name}: peak GiB rollout, update (plan)",
             ", ".join(f"{shown[p]} ({s['plan_gib'][p]:.2f})" for p in ("rollout", "update")))]


# name: (part, estimated seconds on one H100). Not measured yet (no GPU was lent to the session that
# wrote this): from README's H100 numbers (HF generate 30-45 ms a decode step at 1.5B), with ~1 min
# assumed per inductor compile of a 28-layer step and ~20 s per 1.5B end-of-run checkpoint. The
# table gives each part's real time next to its estimate.
PARTS = {
    "agree": (agree, 45),  # a 4-layer compile; 2 × 64 greedy steps
    "rng": (rng, 35),  # a 2-layer compile; 2 × 64 steps
    "decode": (decode, 150),  # hf: 2 regimes × 3 batches × ~260 steps; fast: compiles, then as many steps, faster
    "train": (training({"fast": ["--engine", "fast"], "hf": ["--engine", "hf"]}), 180),  # 2 × (start, 3 steps, save)
    "lora": (training({"lora": ["--lora-rank", "32", "--rollout-batch-size", "256"]}), 50),  # a small save
}


def release(device) -> None:
    """Let go of a part's compiled steps, CUDA graphs and cached memory before the next part runs."""
    torch.compiler.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="runs/gpu_check.json")
    parser.add_argument("--skip", default="", help=f"comma-separated parts to leave out: {', '.join(PARTS)}")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): run it on a machine with one")
    skip = {s for s in args.skip.split(",") if s}
    if skip - set(PARTS):
        sys.exit(f"gpu_check: --skip {','.join(sorted(skip - set(PARTS)))}: the parts are {', '.join(PARTS)}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = dict(device=torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU",
                  torch=torch.__version__, quick=args.quick, parts={})
    table, failed = [], False
    for name, (part, estimate) in PARTS.items():
        if name in skip:
            continue
        t0 = time.perf_counter()
        try:
            data, lines = part(device, args.quick, out)
        except Exception as e:  # noqa: BLE001 - one part's failure must not lose the others' results
            traceback.print_exc()
            error = f"{type(e).__name__}: {e}"
            data, lines, failed = dict(error=error), [("failed", error.splitlines()[0])], True
        seconds = time.perf_counter() - t0
        report["parts"][name] = dict(data, seconds=seconds, estimate_s=estimate)
        table += [(name, what, value) for what, value in lines]
        table.append((name, "seconds (estimate)", f"{seconds:.0f} ({estimate})"))
        out.write_text(json.dumps(report, indent=1))
        release(device)
    print(f"\n{report['device']}, torch {report['torch']}{' (--quick)' if args.quick else ''}; wrote {out}")
    print("| part | measure | value |\n|---|---|---|")
    print("\n".join(f"| {p} | {w} | {v} |" for p, w, v in table))
    teardown()  # the process group the FSDP parts started
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
