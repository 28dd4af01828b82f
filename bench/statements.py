"""What one default step executes: statements coverage marks as run, per file, and their total.

    python bench/statements.py             # ~1 minute on 2 CPU cores
    python bench/statements.py --engine hf # any train.py flags are added to the run

Runs, in a temporary folder, `python -m coverage run --branch --source=. train.py --max-steps 1
--eval-every 0 --save-every 0` (1 rank, no torchrun) and sums coverage's covered_lines over the
project's files. Coverage counts every statement it marks as run, module-level definitions and
dataclass fields included: code a default step never needs costs here even if it is only imported.
A feature that is off should cost the reader nothing, so this figure is what that promise weighs
(DESIGN.md); docs/measured.md keeps its history.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def executed(extra: list[str]) -> dict[str, int]:
    """Executed statements per file (paths relative to the root) of the 1-rank, 1-step default run."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / ".coverage"
        run = [sys.executable, "-m", "coverage", "run", f"--data-file={data}", "--branch", f"--source={ROOT}",
               "train.py", "--max-steps", "1", "--eval-every", "0", "--save-every", "0", "--out", f"{tmp}/run", *extra]
        subprocess.run(run, cwd=ROOT, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "coverage", "json", f"--data-file={data}", "-o", f"{tmp}/cov.json"],
                       cwd=ROOT, check=True, capture_output=True)
        files = json.loads(Path(f"{tmp}/cov.json").read_text())["files"]
    counts = {str(Path(name).resolve().relative_to(ROOT)): v["summary"]["covered_lines"] for name, v in files.items()}
    return {name: n for name, n in counts.items() if n}


def main(argv: list[str]) -> None:
    counts = executed(argv)
    for name, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{n:6d}  {name}")
    print(f"{sum(counts.values()):6d}  total, {len(counts)} files")


if __name__ == "__main__":
    main(sys.argv[1:])
