"""Code-grading throughput: programs graded per second for a batch of 128 short solutions.

    python bench/sandbox.py              # ~1 minute on 2 CPU cores
    python bench/sandbox.py --workers 2 4 --modes bwrap unshare none
    python bench/sandbox.py --python /usr/bin/python3    # the same interpreter in every mode

The batch is the right solutions of tests/fixtures/code_problems.jsonl, repeated to 128 (stdin and
function problems, 2-3 tests each: 2.6 sandbox runs per solution), graded with CodeGrader.grade_all
in each isolation mode this machine has. The reference is the same runs without a sandbox: `python
-I -S main.py` in a plain subprocess, from the same number of threads; the ratio is the sandbox's cost.
As root without bwrap, programs run as another uid, which cannot read an interpreter under /root:
those modes use /usr/bin/python3 (and so does the reference, for them).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from grading.code import HARNESS, CodeGrader, parse_tests  # noqa: E402
from grading.sandbox import ISOLATIONS, Limits, Sandbox, SandboxError  # noqa: E402

BATCH = 128


def batch() -> list[tuple[str, object]]:
    problems = [json.loads(line) for line in (ROOT / "tests/fixtures/code_problems.jsonl").read_text().splitlines()]
    items = [(f"```python\n{p['right']}```", parse_tests(p["tests"], p["name"])) for p in problems]
    return [items[i % len(items)] for i in range(BATCH)]


def sandboxed(mode: str, workers: int, pythons: list[str]) -> tuple[float, str, int] | None:
    """(seconds for the batch, the interpreter, programs scored 1), or None when `mode` does not work here."""
    for python in pythons:
        try:
            box = Sandbox(mode, python=python, limits=Limits(timeout=10))
            break
        except SandboxError as e:
            why = e
    else:
        print(f"{mode:8s} unavailable here: {why}")
        return None
    items = batch()
    start = time.perf_counter()
    verdicts = CodeGrader(box, workers).grade_all(items)
    return time.perf_counter() - start, box.python, sum(v.reward == 1 for v in verdicts)


def unsandboxed(python: str, workers: int) -> float:
    """Seconds for the same runs as plain subprocesses (no namespaces, limits or uid switch)."""
    runs = []
    for response, tests in batch():
        program = response.split("\n", 1)[1].rsplit("```", 1)[0]
        if tests.fn_name:
            runs.append(({"main.py": HARNESS, "solution.py": program},
                         json.dumps({"fn_name": tests.fn_name, "inputs": tests.inputs})))
        else:
            runs += [({"main.py": program}, stdin) for stdin in tests.inputs]

    def run(files_stdin) -> None:
        files, stdin = files_stdin
        with tempfile.TemporaryDirectory() as tmp:
            for name, text in files.items():
                Path(tmp, name).write_text(text)
            subprocess.run([python, "-I", "-S", "main.py"], cwd=tmp, input=stdin.encode(), capture_output=True,
                           timeout=10, env={"PATH": "/usr/bin:/bin"})

    start = time.perf_counter()
    with ThreadPoolExecutor(workers) as threads:
        list(threads.map(run, runs))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--modes", nargs="+", default=list(ISOLATIONS), choices=ISOLATIONS)
    parser.add_argument("--python", help="the interpreter programs run with (default: ours, else /usr/bin/python3)")
    args = parser.parse_args()
    pythons = [args.python] if args.python else [sys.executable, "/usr/bin/python3"]
    warnings.simplefilter("ignore")  # the weaker modes warn; here they are asked for
    print(f"{BATCH} solutions, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    print(f"{'mode':8s} {'workers':>7s} {'programs/s':>10s} {'bare/s':>8s} {'ratio':>6s}  right  python")
    for mode in args.modes:
        for workers in args.workers:
            measured = sandboxed(mode, workers, pythons)
            if measured is None:
                break
            seconds, python, right = measured
            bare = unsandboxed(python, workers)
            print(f"{mode:8s} {workers:7d} {BATCH / seconds:10.1f} {BATCH / bare:8.1f} {bare / seconds:6.2f}"
                  f"  {right:3d}/{BATCH}  {python}")


if __name__ == "__main__":
    main()
