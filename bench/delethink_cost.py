"""Benchmark of Markovian chunked thinking (Delethink) vs plain long chain-of-thought (LongCoT):
peak memory and time per generated token at the same thinking length n = 2C, 4C, 8C.

    python bench/delethink_cost.py            # ~5 minutes on 2 CPU cores (tiny random Qwen2, fp32)
    python bench/delethink_cost.py --device cuda --dtype bf16 --preset qwen2.5-0.5b --chunk 512 --batch 64
                                              # for a GPU (not yet run: none was lent)

C is the chunk size (--chunk). Every trace writes exactly n tokens (the stub tokenizer's EOS is an
id the model cannot emit). LongCoT is one generate call of n tokens, so its KV cache grows to
|q| + n. Delethink (rollout.generate with an environments.markovian.Markovian shape) uses carryover m = C/2, head h = 0 and
I = 1 + 2(n − C)/C chunks, so its budget C + (I − 1)(C − m) is exactly n and no context exceeds
|q| + C; every chunk after the first reuses the query's KV cache and prefills only its m carried
tokens. Expected: Delethink's peak memory and time per token stay flat as n grows, LongCoT's grow.

Each mode is timed in one fresh process, and each (mode, n)'s memory in another, each process
after a few-token warm-up. Memory: the
growth of max RSS over one generate call on CPU (Linux ru_maxrss, its watermark first reset to the
current RSS through /proc/self/clear_refs, glibc's mmap threshold fixed at 64 KiB so that freed
tensors leave RSS), torch.cuda.max_memory_allocated over the allocated memory before on CUDA.
Time: the best call of each n, with the default allocator, from rounds that call every n in turn
(at least --repeats rounds, and more until --min-seconds are spent); per token = wall / n (one token of
every trace) and wall / (batch · n); on CPU also process CPU time / n, which leaves out the time the
child waits for a core. Children use one CPU thread unless --threads says otherwise.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

QUERY_LEN = 32
MULTIPLES = (2, 4, 8)  # n = 2C, 4C, 8C
FLAT = {"memory": 1.10, "time": 1.20}  # Delethink's largest-n / smallest-n ratios at most


def model_config(*, preset: str, max_len: int):
    from transformers import Qwen2Config
    if preset == "tiny":
        # 4 KV heads of 64 (no GQA): 8 KiB of fp32 cache per token over 4 layers against ~14 MiB of
        # weights, so at the default batch 16 and C 128 LongCoT's cache at 8C (16 × 1056 tokens,
        # ~130 MiB) dominates the RSS peak, while one decode step stays a few ms on one core.
        return Qwen2Config(vocab_size=1000, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=max_len,
                           tie_word_embeddings=True)
    return Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                       num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=max_len,
                       tie_word_embeddings=True, rope_theta=1e6)


class StubTokenizer:
    """What rollout.generate needs. EOS lies past the vocabulary, so no trace ever stops early."""

    def __init__(self, vocab_size: int):
        self.eos_token_id = vocab_size + 7
        self.pad_token_id = 0

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return ""


def chunking_for(*, mode: str, n: int, c: int):
    from environments.markovian import Markovian
    if mode == "longcot":
        return Markovian(), n
    chunking = Markovian(carryover=c // 2, head=0, max_chunks=1 + 2 * (n - c) // c)
    assert chunking.max_tokens(c) == n
    return chunking, c


def build(args):
    import torch
    from transformers import Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = model_config(preset=args.preset, max_len=QUERY_LEN + max(MULTIPLES) * args.chunk + 64)
    with torch.device(args.device):
        lm = Qwen2ForCausalLM(cfg)
    lm.to(dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]).eval()
    return lm, StubTokenizer(cfg.vocab_size)


def run_once(*, lm, tok, mode: str, n: int, c: int, batch: int):
    from rewards import Problem
    from rollout import Sampling, generate
    chunking, max_new = chunking_for(mode=mode, n=n, c=c)
    query = [list(range(1, QUERY_LEN + 1))]
    episodes = generate(lm, tok, [Problem("q", "a")], query, group_size=batch,
                        sampling=Sampling(max_new_tokens=max_new), shape=chunking)
    bad = [len(e.response_ids) for e in episodes if len(e.response_ids) != n]
    if bad or any(len(e.chunks) != chunking.max_chunks for e in episodes):
        raise RuntimeError(f"{mode} n={n}: traces of {bad} tokens, expected {n} in {chunking.max_chunks} chunks")


class Peak:
    """Extra memory at the peak since construction, in bytes."""

    def __init__(self, device: str):
        import resource
        import torch
        self.device, self.torch, self.resource = device, torch, resource
        if device == "cuda":
            torch.cuda.synchronize()
            self.base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
        elif reset_rss_peak():
            self.base = current_rss()
        else:  # the watermark left by start-up and warm-up hides part of the growth
            self.base = self.rss()

    def rss(self) -> int:
        return self.resource.getrusage(self.resource.RUSAGE_SELF).ru_maxrss * 1024

    def extra(self) -> int:
        if self.device == "cuda":
            return self.torch.cuda.max_memory_allocated() - self.base
        return self.rss() - self.base


def reset_rss_peak() -> bool:
    """Lower the kernel's max-RSS watermark (what ru_maxrss reports) to the current RSS, so the
    warm-up's transient peak does not mask the measured call's first MiBs (Linux ≥ 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def current_rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def child(args) -> None:
    import torch
    # One thread by default: with 2 cores and a neighbour process, 2 OpenMP threads wait on each
    # other and a step gets ~10x slower and erratic; pass --threads 2 on an idle machine.
    torch.set_num_threads(args.threads)
    lm, tok = build(args)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    # Warm-up through both code paths (one chunk, then a carried-over chunk) on 4-token chunks.
    run_once(lm=lm, tok=tok, mode="delethink", n=8, c=4, batch=args.batch)
    if args.child == "memory":
        peak = Peak(args.device)
        run_once(lm=lm, tok=tok, mode=args.mode, n=args.n, c=args.chunk, batch=args.batch)
        print(json.dumps({"peak": peak.extra()}))
        return
    # Every n in turn, round after round: this machine has slow spells of several seconds, which
    # then fall on all n alike. On CPU the first call of a growing cache is also ~3x slower (glibc
    # raises its mmap threshold one freed block at a time, so every ever-larger block is a fresh
    # mmap that page-faults): the best call is the steady state a training loop sees.
    ns = [k * args.chunk for k in MULTIPLES]
    walls, cpus = {n: [] for n in ns}, {n: [] for n in ns}
    while len(walls[ns[0]]) < args.repeats or sum(map(sum, walls.values())) < args.min_seconds:
        for n in ns:
            sync()
            t0, c0 = time.perf_counter(), time.process_time()
            run_once(lm=lm, tok=tok, mode=args.mode, n=n, c=args.chunk, batch=args.batch)
            sync()
            walls[n].append(time.perf_counter() - t0)
            cpus[n].append(time.process_time() - c0)
    print(json.dumps({"walls": walls, "cpus": cpus}))


def spawn(args, *, what: str, mode: str, n: int = 0) -> dict:
    cmd = [sys.executable, __file__, "--child", what, "--mode", mode, "--n", str(n)]
    for key in ("chunk", "batch", "device", "dtype", "preset", "repeats", "min_seconds", "threads"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    env = dict(os.environ)
    if what == "memory":
        # glibc's dynamic mmap threshold keeps freed KV tensors in a fragmenting brk heap, so max
        # RSS drifts with the allocation history (LongCoT at 4C: 118-141 MiB run to run, 77 here)
        # instead of following the live peak; a fixed threshold maps every block ≥ 64 KiB and
        # unmaps it on free. It also makes every step page-fault its new cache (2-3x slower),
        # hence timing in a separate process with the default allocator.
        env["MALLOC_MMAP_THRESHOLD_"] = "65536"
    out = subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(args, *, mode: str) -> list[dict]:
    timed, rows = spawn(args, what="time", mode=mode), []
    for k in MULTIPLES:
        n = k * args.chunk
        memory = spawn(args, what="memory", mode=mode, n=n)["peak"]
        walls, cpus = timed["walls"][str(n)], timed["cpus"][str(n)]
        print(f"  {mode:9} n={n:5}: {memory / 2**20:7.1f} MiB, calls of "
              f"{', '.join(f'{w:.1f}' for w in walls)} s wall, "
              f"{', '.join(f'{c:.1f}' for c in cpus)} s CPU", file=sys.stderr, flush=True)
        rows.append({"mode": mode, "n": n, "peak": memory, "wall": min(walls), "cpu": min(cpus)})
    return rows


def table(rows: list[dict], *, c: int, batch: int, cpu: bool) -> None:
    print("| mode | n (tokens) | chunks I | max context | peak memory MiB | ms per token (per trace) "
          "| µs per token (batch) |" + (" CPU ms per token (per trace) |" if cpu else ""))
    print("|---" * (7 + cpu) + "|")
    for r in rows:
        chunking, max_new = chunking_for(mode=r["mode"], n=r["n"], c=c)
        print(f"| {r['mode']} | {r['n']} ({r['n'] // c}C) | {chunking.max_chunks} | {QUERY_LEN + max_new} "
              f"| {r['peak'] / 2**20:.1f} | {1e3 * r['wall'] / r['n']:.2f} "
              f"| {1e6 * r['wall'] / (r['n'] * batch):.0f} |" + (f" {1e3 * r['cpu'] / r['n']:.2f} |" if cpu else ""))


def growth(rows: list[dict], *, mode: str, key: str) -> float:
    """rows[key] at the largest n over the smallest n; times are taken per token first."""
    mine = [r for r in rows if r["mode"] == mode]
    per_token = (lambda r: r[key]) if key == "peak" else (lambda r: r[key] / r["n"])
    return per_token(mine[-1]) / per_token(mine[0])


def summary(rows: list[dict], *, cpu: bool) -> None:
    d = {k: growth(rows, mode="delethink", key=k) for k in ("peak", "wall", "cpu")}
    lc = {k: growth(rows, mode="longcot", key=k) for k in ("peak", "wall", "cpu")}
    lo, hi = min(MULTIPLES), max(MULTIPLES)
    print(f"\nDelethink: memory x{d['peak']:.2f}, time/token x{d['wall']:.2f} from n={lo}C to {hi}C; "
          f"LongCoT: memory x{lc['peak']:.2f}, time/token x{lc['wall']:.2f}")
    # Wall time also counts the time a child waits for a core behind other processes; its CPU time
    # does not, so it is the cross-check when wall times look noisy.
    if cpu:
        print(f"(CPU time/token: Delethink x{d['cpu']:.2f}, LongCoT x{lc['cpu']:.2f})")
    for key, limit, what in (("peak", FLAT["memory"], "flat memory"), ("wall", FLAT["time"], "flat time/token")):
        verdict = "holds" if d[key] <= limit else "does NOT hold"
        print(f"Delethink {what} (x{d[key]:.2f} <= {limit:.2f}): {verdict}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chunk", type=int, default=128, help="chunk size C (even); n = 2C, 4C, 8C")
    p.add_argument("--batch", type=int, default=16, help="traces per generate call")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--preset", choices=("tiny", "qwen2.5-0.5b"), default="tiny")
    p.add_argument("--repeats", type=int, default=2, help="timed calls per (mode, n) at least; the best counts")
    p.add_argument("--min-seconds", type=float, default=60.0,
                   help="...and more rounds over every n until a mode's calls took this long")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads in each child")
    p.add_argument("--child", choices=("memory", "time"), help=argparse.SUPPRESS)
    p.add_argument("--mode", choices=("longcot", "delethink"), help=argparse.SUPPRESS)
    p.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.chunk % 2:
        p.error("--chunk must be even (carryover m = C/2)")
    if args.child:
        return child(args)
    print(f"preset {args.preset}, {args.device} {args.dtype}, C={args.chunk}, batch {args.batch}, "
          f"query {QUERY_LEN} tokens, Delethink m=C/2 h=0, best call of each n "
          f"in ≥ {args.repeats} rounds and ≥ {args.min_seconds:g} s per mode")
    rows = measure(args, mode="delethink") + measure(args, mode="longcot")
    table(rows, c=args.chunk, batch=args.batch, cpu=args.device == "cpu")
    summary(rows, cpu=args.device == "cpu")


if __name__ == "__main__":
    main()
