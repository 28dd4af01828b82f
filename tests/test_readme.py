"""The README is a map (issue 38): short, every docs/ page linked, every link and anchor resolving,
its set-up commands the ones CI runs, and no hand-kept number that goes stale (a test count, a
line-count column) outside docs/measured.md, which keeps the dated history."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 250
TRAIN = "pip install torch==2.13.0 -r requirements.txt && torchrun --nproc_per_node 2 train.py --algo grpo"
HISTORY = "measured.md"  # the one page that may keep dated counts as they were measured

LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^ {0,3}(`{3,}[^`]*|~{3,}.*)$")  # CommonMark: a backtick fence's info string has no backtick
TEST_COUNT = re.compile(r"(?<![\d.])\b\d[\d,]* (tests|passed)\b")  # "973 tests", "970 passed"; not "5.17.0 tests"
LINE_COUNT_HEADER = re.compile(r"wc -l|\blines of the file\b|\bline count", re.I)
FILE_CELL = re.compile(r"^`[^`]*\.[A-Za-z0-9]+`$|^`[^`]*/`$")  # a cell that is one file (or folder) name
NUMBER_CELL = re.compile(r"^\d[\d,]*$")


def readme() -> Path:
    return ROOT / "README.md"


def pages() -> list[Path]:
    """README.md and every Markdown page of docs/."""
    return [readme(), *sorted((ROOT / "docs").rglob("*.md"))]


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code spans blanked."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, re.sub(r"(`+)(?:(?!\1).)+?\1", lambda m: " " * len(m.group(0)), line)))
    return out


def code_blocks(text: str) -> list[list[str]]:
    blocks, current = [], None
    for line in text.splitlines():
        if FENCE.match(line):
            if current is None:
                current = []
            else:
                blocks.append(current)
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: its text lowercased, punctuation but - and _ dropped, spaces -> -.
    "## `bench/gpu_check.py`: the engine's first GPU run" -> "benchgpu_checkpy-the-engines-first-gpu-run"."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def prose_with_code(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks, inline code kept (headings keep their words)."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out.append((n, line))
    return out


def anchors(path: Path) -> set[str]:
    seen, out = {}, set()
    for _, line in prose_with_code(path.read_text()):
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every Markdown link of the page, code excluded."""
    return [(n, m.group(1)) for n, line in prose(path.read_text()) for m in LINK.finditer(line)]


def relative(target: str) -> bool:
    return not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I)  # http:, https:, mailto: ...


def resolve(page: Path, target: str) -> tuple[Path, str]:
    path, _, anchor = target.partition("#")
    return (page if not path else (page.parent / path).resolve()), anchor


def test_the_readme_is_short():
    lines = readme().read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; a map keeps ≤ {MAX_LINES}: move detail into docs/"


def test_every_docs_page_is_linked_from_the_readme():
    linked = {resolve(readme(), t)[0] for _, t in links(readme()) if relative(t)}
    docs = sorted(p.resolve() for p in (ROOT / "docs").rglob("*") if p.is_file())
    assert docs
    missing = [p.relative_to(ROOT).as_posix() for p in docs if p not in linked]
    assert not missing, f"docs pages the README's index does not link: {missing}"


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for page in pages():
        for n, target in links(page):
            if not relative(target):
                continue
            path, anchor = resolve(page, target)
            where = f"{page.relative_to(ROOT).as_posix()}:{n}: {target}"
            if not path.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{where} (no heading with that anchor)")
    assert not broken, "\n".join(broken)


def ci_pytest_lines() -> list[str]:
    """.ci/run's commands that run pytest, in order."""
    lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
             if "python -m pytest" in line and not line.strip().startswith("#")]
    assert lines, ".ci/run runs no `python -m pytest`"
    return lines


def installs(command: str) -> set[str]:
    """What a `pip install` command line installs: `python -m pip install -q a -r b && ...` -> {a, -r, b}."""
    head = command.split("&&")[0].split()
    return {w for w in head[head.index("install") + 1:] if w not in ("-q", "--quiet", "-U", "--upgrade")}


def test_the_first_code_block_holds_the_set_up_commands_and_the_test_command_is_ci_s():
    first = [line.strip() for line in code_blocks(readme().read_text())[0] if line.strip()]
    assert first[0] == TRAIN, f"the README's first command must stay {TRAIN!r}"
    assert first[1] == ci_pytest_lines()[0], \
        f"the README's test command {first[1]!r} must be .ci/run's first, to the letter: {ci_pytest_lines()[0]!r}"
    assert installs(first[1]) == {"torch==2.13.0", "-r", "requirements.txt", "pytest"}, \
        f"the README's test command installs {sorted(installs(first[1]))}: an optional package goes in .ci/run's second"


OWN_VENV = {"vllm": "bash bench/vllm_venv.sh"}  # packages whose pins cannot share CI's environment: a venv each


def test_ci_then_installs_every_optional_package_a_test_needs_and_runs_those_tests():
    """What the README's line skips (tests/conftest.py's `needs` and `extended` markers) CI runs next, with the
    packages."""
    needed = {m for path in (ROOT / "tests").glob("*.py")
              for m in re.findall(r"mark\.needs\(\"([\w.-]+)\"\)", path.read_text())}
    assert needed, "no test is marked needs(package)"
    rest = ci_pytest_lines()[1:]
    assert [line[line.index("python -m pytest"):] for line in rest] == ['python -m pytest -q --extended -m "needs or extended" tests'], rest
    assert needed - OWN_VENV.keys() <= installs(rest[0]), \
        f".ci/run's second line installs none of {sorted(needed - OWN_VENV.keys() - installs(rest[0]))}"
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert all(command in lines for command in OWN_VENV.values()), f".ci/run must run {list(OWN_VENV.values())}"


def test_no_hand_kept_test_count_or_line_count_column():
    stale = []
    for page in pages():
        if page.name == HISTORY and page.parent.name == "docs":
            continue
        rel = page.relative_to(ROOT).as_posix()
        for n, line in enumerate(page.read_text().splitlines(), 1):
            if TEST_COUNT.search(line):
                stale.append(f"{rel}:{n}: a test count ({TEST_COUNT.search(line).group(0)!r}); "
                             "give `python -m pytest --collect-only -q tests | tail -1` instead")
            if line.lstrip().startswith("|"):
                cells = [c.strip() for c in line.strip().strip("|").split("|")]
                if any(LINE_COUNT_HEADER.search(c) for c in cells):
                    stale.append(f"{rel}:{n}: a line-count column; give `wc -l *.py */*.py` instead")
                if any(FILE_CELL.match(a) and NUMBER_CELL.match(b) for a, b in zip(cells, cells[1:])):
                    stale.append(f"{rel}:{n}: a file's line count in a table; give `wc -l` instead")
    assert not stale, "\n".join(stale)
