"""docs/walkthrough.md follows one default GRPO step through the code with anchors such as
[`train.py:update`](../train.py#L153-L184): each names a function or class and the lines it spans.
These tests keep the page true: every anchor's name still exists in its file and its range is exactly
the definition's lines (decorators included), so an edit that moves code fails here, with the range to
write instead, and the map cannot go stale silently.

    python tests/test_walkthrough.py     # the reading path: lines per file and in all
"""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "walkthrough.md"
ANCHOR = re.compile(r"\[`([\w/.]+\.py):([\w.]+)`\]\(\.\./([\w/.]+\.py)#L(\d+)-L(\d+)\)")
READING_PATH_GOAL = 1300  # lines: a default step read in an evening (issue 38)


def anchors() -> list[tuple[str, str, int, int]]:
    """(file, name, first line, last line) of each anchor on the page, in order."""
    found = []
    for file, name, target, first, last in ANCHOR.findall(PAGE.read_text()):
        assert file == target, f"[{file}:{name}] links to {target}"
        found.append((file, name, int(first), int(last)))
    return found


@functools.cache
def parsed(file: str) -> ast.Module:
    return ast.parse((ROOT / file).read_text())


def span(file: str, name: str) -> tuple[int, int] | None:
    """(first, last) line of the definition `name` in `file` ("Class.method" for a method), decorators
    included; None when there is none."""
    scope = parsed(file).body
    node = None
    for part in name.split("."):
        node = next((n for n in scope if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        scope = node.body
    return min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno


def reading_path() -> dict[str, int]:
    """Lines the page asks a reader to read, per file (a range listed twice counts once)."""
    lines: dict[str, set[int]] = {}
    for file, _, first, last in anchors():
        lines.setdefault(file, set()).update(range(first, last + 1))
    return {file: len(seen) for file, seen in lines.items()}


def test_every_anchor_names_a_definition_and_its_exact_lines():
    found = anchors()
    assert len(found) >= 40, "the page lost its anchors (or their form changed)"
    wrong = []
    for file, name, first, last in found:
        where = span(file, name)
        if where is None:
            wrong.append(f"{file}:{name}: no such function or class any more")
        elif where != (first, last):
            wrong.append(f"{file}:{name}: the page says L{first}-L{last}, the code is L{where[0]}-L{where[1]}")
    assert not wrong, "docs/walkthrough.md is stale:\n" + "\n".join(wrong)


def test_the_reading_path_of_a_default_step_stays_short():
    assert sum(reading_path().values()) <= READING_PATH_GOAL, reading_path()


def test_every_function_of_the_default_loss_is_on_the_page():
    """What a default step's update computes is all on the page: the loop, the update, the GRPO loss."""
    named = {(file, name) for file, name, _, _ in anchors()}
    for needed in [("train.py", "train"), ("train.py", "collect_rollouts"), ("train.py", "update"),
                   ("train.py", "micro_step"), ("algos/grpo.py", "loss"), ("algos/policy_gradient.py", "aggregate"),
                   ("rollout.py", "generate"), ("model.py", "ResponseLogProbs")]:
        assert needed in named, needed


if __name__ == "__main__":
    path = reading_path()
    for file, n in path.items():
        print(f"{n:5d}  {file}")
    print(f"{sum(path.values()):5d}  lines in {len(path)} files: the reading path of one default step "
          f"(docs/walkthrough.md; goal ≤ {READING_PATH_GOAL})")
