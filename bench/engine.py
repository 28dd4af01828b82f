"""Rollout time of the two engines, side by side: HF `generate` (--engine hf) against
the engine of engine.py (--engine fast), on the shipped tiny model and the running-sum task.

    python bench/engine.py                 # 8 and 16 prompts × 8 samples, ≤ 80 new tokens, 1 thread

Interleaved repeats (hf, fast, hf, fast, ...) so that both see the same machine load; prints the
median seconds per rollout of each and their ratio. The draws differ between engines only where
the logits differ by rounding (one prefill per group), so both write about as many tokens: the
mean response length is printed to check it.
"""
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from config import DEFAULT_MODEL  # noqa: E402
from model import load_model, load_tokenizer  # noqa: E402
from tasks import RunningSumTask, builtin_splits  # noqa: E402
from engine import Fast  # noqa: E402
from rollout import Generate, Sampling, encode_prompts, generate  # noqa: E402

REPEATS, GROUP, NEW_TOKENS = 5, 8, 80


def main() -> None:
    torch.set_num_threads(1)  # what each of the default run's 2 ranks has
    tokenizer, lm = load_tokenizer(DEFAULT_MODEL), load_model(DEFAULT_MODEL)
    problems = builtin_splits(RunningSumTask())[0]
    print("| prompts × G | hf s | fast s | fast / hf | mean length hf, fast |\n|---|---|---|---|---|")
    for n in (8, 16):
        ids = encode_prompts(tokenizer, problems[:n], chat_template=True)
        times, lengths = {"hf": [], "fast": []}, {"hf": [], "fast": []}
        samplers = {"hf": Generate(), "fast": Fast()}
        for r in range(REPEATS + 1):  # the first round warms up
            for engine in ("hf", "fast"):
                torch.manual_seed(r)
                start = time.perf_counter()
                episodes = generate(lm, tokenizer, problems[:n], ids, group_size=GROUP,
                                    sampling=Sampling(1.0, 1.0, 0, NEW_TOKENS, sampler=samplers[engine]))
                if r:
                    times[engine].append(time.perf_counter() - start)
                    lengths[engine].append(statistics.mean(len(e.response_ids) for e in episodes))
        hf, fast = (statistics.median(times[e]) for e in ("hf", "fast"))
        print(f"| {n} × {GROUP} | {hf:.3f} | {fast:.3f} | {fast / hf:.2f} | "
              f"{statistics.mean(lengths['hf']):.1f}, {statistics.mean(lengths['fast']):.1f} |")


if __name__ == "__main__":
    main()
