"""What re-prefilling a multi-turn trace's context costs against the turn's decode (environments/rollout.py's interact).

    python bench/multi_turn.py                                  # the shipped tiny model, CPU, 1 thread
    python bench/multi_turn.py --shape Qwen2.5-1.5B-Instruct --device cuda --rows 64

Each turn after the first is one `sample` call over every trace still going, prompted with the
whole context so far (the query, every earlier turn and observation): it prefills all of it again.
A cache kept from the last turn would prefill only the last turn and its observation (C + O
tokens). For turn k (context L = P + (k − 1)(C + O)) this prints, per engine: the turn's seconds
(prefill + C decode steps: every row writes C tokens, no stop id), the prefill's seconds (the
same call with one new token), its share of the turn, and the prefill of C + O tokens alone
(what a kept cache would leave): the difference is the most a cache could save. Median of 5,
interleaved. Random token ids: the cost does not depend on them.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]
from config import DEFAULT_MODEL  # noqa: E402
from engine import Fast  # noqa: E402
from rollout import Generate, Sampling, sample  # noqa: E402
from types import SimpleNamespace  # noqa: E402


def timed(lm, tok, rows, sampling, device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    sample(lm, tok, rows, sampling)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="", help="a folder of assets/shapes (random weights); default: the tiny model")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", type=int, default=32)
    ap.add_argument("--prompt", type=int, default=24, help="P: query tokens")
    ap.add_argument("--turn", type=int, default=80, help="C: tokens a turn writes")
    ap.add_argument("--observation", type=int, default=16, help="O: tokens of an observation, framed")
    ap.add_argument("--turns", default="2,3,4")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cpu":
        torch.set_num_threads(1)  # what each of the default run's 2 ranks has
    if args.shape:
        from decode_bound import build_model
        lm, config = build_model(args.shape, 0, device)
        vocab = config.vocab_size
    else:
        from model import load_model
        lm, vocab = load_model(DEFAULT_MODEL).to(device), 100
    lm.eval()
    stop = vocab + 1  # never written: every row decodes the whole turn
    tok = SimpleNamespace(eos_token_id=stop, pad_token_id=0, stop_ids=[stop])
    gen = torch.Generator().manual_seed(0)
    print(f"{args.shape or 'tiny model'} on {device}, {args.rows} rows, P {args.prompt}, C {args.turn}, "
          f"O {args.observation}")
    print("| turn | context L | engine | turn s | prefill of L s (share) | prefill of C + O s | most a cache saves |")
    print("|---|---|---|---|---|---|---|")
    for k in map(int, args.turns.split(",")):
        context = args.prompt + (k - 1) * (args.turn + args.observation)
        rows = torch.randint(4, min(vocab, 90), (args.rows, context), generator=gen).tolist()
        recent = [r[-(args.turn + args.observation):] for r in rows]
        for engine in ("hf", "fast"):
            sampler = Fast() if engine == "fast" else Generate()
            whole = Sampling(1.0, max_new_tokens=args.turn, sampler=sampler)
            one = Sampling(1.0, max_new_tokens=1, sampler=sampler)
            t = {"turn": [], "prefill": [], "recent": []}
            for rep in range(6):  # the first round warms up (and compiles, on CUDA)
                for name, r, s in (("turn", rows, whole), ("prefill", rows, one), ("recent", recent, one)):
                    torch.manual_seed(rep)
                    seconds = timed(lm, tok, r, s, device)
                    if rep:
                        t[name].append(seconds)
            turn, prefill, kept = (statistics.median(t[n]) for n in ("turn", "prefill", "recent"))
            print(f"| {k} | {context} | {engine} | {turn:.3f} | {prefill:.3f} ({prefill / turn:.0%}) | {kept:.3f} | "
                  f"{max(0.0, prefill - kept) / turn:.0%} |")


if __name__ == "__main__":
    with torch.no_grad():
        main()
