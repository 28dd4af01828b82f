"""What one default step executes: statements coverage marks as run, per file, and their total.

    python bench/statements.py             # ~10 s on 2 CPU cores
    python bench/statements.py --engine hf # any train.py flags are added to the run

Runs, in a temporary folder, `python -m coverage run --branch --source=. train.py --max-steps 1
--eval-every 0 --save-every 0` (1 rank, no torchrun) and sums coverage's covered_lines over the
project's files. Coverage counts every statement it marks as run, module-level definitions and
dataclass fields included: code a default step never needs costs here even if it is only imported.
A feature that is off should cost the reader nothing, so this figure is what that promise weighs
(DESIGN.md); docs/measured.md keeps its history.

Its last line splits the total by what a statement is: inside a function that ran (body); the
`def` line and decorators of a function whose body ran (called) or never did (uncalled, what an
import alone costs); a class's annotated field; an import; anything else at module or class level.
Body and called together are what the step itself runs, a floor that moving code between files
cannot lower.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def executed(extra: list[str]) -> dict[str, set[int]]:
    """Executed statements' lines per file (paths relative to the root) of the 1-rank, 1-step default run."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / ".coverage"
        run = [sys.executable, "-m", "coverage", "run", f"--data-file={data}", "--branch", f"--source={ROOT}",
               "train.py", "--max-steps", "1", "--eval-every", "0", "--save-every", "0", "--out", f"{tmp}/run", *extra]
        subprocess.run(run, cwd=ROOT, check=True, capture_output=True)
        subprocess.run([sys.executable, "-m", "coverage", "json", f"--data-file={data}", "-o", f"{tmp}/cov.json"],
                       cwd=ROOT, check=True, capture_output=True)
        files = json.loads(Path(f"{tmp}/cov.json").read_text())["files"]
    lines = {str(Path(name).resolve().relative_to(ROOT)): set(v["executed_lines"]) for name, v in files.items()}
    return {name: ran for name, ran in lines.items() if ran}


def kinds(source: str, ran: set[int]) -> Counter:
    """A file's executed statements (their lines) by what each is: body, called, uncalled, field, import, other."""
    tree = ast.parse(source)
    body, called, uncalled = set(), set(), set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inside = set(range(node.body[0].lineno, node.end_lineno + 1))
            body |= inside
            (called if ran & inside else uncalled).update({node.lineno, *(d.lineno for d in node.decorator_list)})
    imports = {n.lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))}
    fields = {n.lineno for n in ast.walk(tree) if isinstance(n, ast.AnnAssign)}
    groups = (("body", body), ("called", called), ("uncalled", uncalled), ("import", imports), ("field", fields))
    return Counter(next((name for name, group in groups if line in group), "other") for line in ran)


def main(argv: list[str]) -> None:
    lines = executed(argv)
    for name, ran in sorted(lines.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"{len(ran):6d}  {name}")
    print(f"{sum(map(len, lines.values())):6d}  total, {len(lines)} files")
    by_kind = sum((kinds((ROOT / name).read_text(), ran) for name, ran in lines.items()), Counter())
    print("by kind: " + ", ".join(f"{kind} {by_kind[kind]}" for kind in
                                  ("body", "called", "uncalled", "field", "import", "other")))


if __name__ == "__main__":
    main(sys.argv[1:])
