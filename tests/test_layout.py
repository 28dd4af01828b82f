"""The layout DESIGN.md promises: the root holds the core, the optional features sit in folders that a
run imports only when its flag asks for them, and the imports between modules run one way."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_train import SMALL  # a small batch, short responses

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ("grading", "environments", "extras")  # the folders of optional features
PROJECT = ("algos", *OPTIONAL)  # packages of the project, beside the root's modules


@pytest.fixture(scope="module")
def loaded(tmp_path_factory) -> tuple[dict[str, list[str]], Path]:
    """({phase: the optional modules loaded after it}, the folder the runs wrote in), from one fresh
    interpreter (as a user runs train.py) that runs, in turn: a default step with its eval and its
    checkpoint ("train"); eval.py on the built-in held-out split, sampled and graded ("eval"); the
    rollout shapes of --env calculator's config ("flag"); the engine's slab for --engine fast ("fast").
    engine.py and packing.py count as optional here: only --engine fast and --pack read them. One
    interpreter for the three, since its start is seconds of imports: a phase finds nothing optional
    loaded before it while the phases before it load none, which the tests below check in order."""
    tmp = tmp_path_factory.mktemp("layout")
    script = f"""import json, sys
import config, eval, rollout, train
from model import load_model, load_tokenizer
seen = {{}}
def loaded(phase):
    seen[phase] = sorted(m for m in sys.modules if m.split('.')[0] in {OPTIONAL!r} or m in ("engine", "packing"))
train.main(["--max-steps", "1", "--eval-every", "1", "--eval-problems", "4", "--prompts-per-step", "4",
            "--out", {str(tmp / "run")!r}])
loaded("train")
eval.main(["--problems", "4", "-n", "2", "--k", "1", "--out", {str(tmp / "eval")!r}])
loaded("eval")
cfg = config.parse_config(["--env", "calculator"])
config.rollout_shapes(cfg, load_tokenizer(cfg.model))
loaded("flag")
cfg = config.parse_config(["--engine", "fast"])
config.sampler_class(cfg).start(cfg, load_model(cfg.model), 1)
loaded("fast")
print(json.dumps(seen))"""
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), tmp


HEALTH = ["extras", "extras.health"]  # the eval's verdict on the run so far (--health, on by default), loaded by the eval


@pytest.mark.slow
def test_the_default_run_imports_no_optional_module(loaded):
    """A default step and its checkpoint load nothing from grading/, environments/ or extras/, nor
    engine.py (HF generate samples: --engine auto), nor packing.py (--pack is off); its eval loads
    extras/health.py alone."""
    phases, tmp = loaded
    assert phases["train"] == HEALTH
    assert (tmp / "run" / "checkpoints" / "step-1" / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_plain_eval_imports_no_optional_module(loaded):
    """eval.py on the built-in held-out split, sampled and graded, loads nothing from the folders either."""
    phases, tmp = loaded
    assert phases["train"] == phases["eval"] == HEALTH
    assert (tmp / "eval" / "summary.json").is_file()


@pytest.mark.slow
def test_a_flag_imports_its_folder(loaded):
    """The checks above can fail: --env calculator does import environments/ (and only what it needs),
    and --engine fast engine.py."""
    phases, _ = loaded
    assert phases["train"] == phases["eval"] == HEALTH
    # the calculator evaluates with the countdown grader's arithmetic parser
    assert phases["flag"] == ["environments", "environments.rollout", "environments.tools", *HEALTH, "grading",
                              "grading.countdown"]
    assert phases["fast"] == ["engine", "environments", "environments.rollout", "environments.tools", *HEALTH,
                              "grading", "grading.countdown"]


def test_the_root_holds_the_core_only():
    root = sorted(p.name for p in ROOT.glob("*.py"))
    assert len(root) <= 13, root
    assert not set(root) & {f"{name}.py" for name in OPTIONAL}, root


def modules() -> dict[str, Path]:
    """Every module of the project: the root's files and the packages' (tests, bench, assets and
    examples are users of the project, not part of it)."""
    found = {p.stem: p for p in ROOT.glob("*.py")}
    for package in PROJECT:
        for p in (ROOT / package).glob("*.py"):
            found[package if p.stem == "__init__" else f"{package}.{p.stem}"] = p
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The project's modules that a file imports, at its top or inside a function (a deferred import
    is still an arrow between two modules): `from grading.pool import X` -> grading.pool;
    `from grading import pool` -> grading.pool; `import algos` -> algos."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in known}
            if node.module in known:
                found.add(node.module)
    return found


def test_the_imports_between_modules_have_no_cycle():
    """Data flows one way (DESIGN.md): the graph of imports, deferred ones included, has no cycle, so
    its modules can be drawn in floors with every arrow pointing down. A package's modules import
    their own __init__ (algos.grpo -> algos), which is not an arrow back up."""
    known = modules()
    graph = {name: imports(path, set(known)) - {name, name.split(".")[0]} for name, path in known.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(graph[name]):
            assert state.get(other) != 1, "import cycle: " + " -> ".join(path[path.index(other):] + [name, other]
                                                                          if other in path else path + [name, other])
            if other not in state:
                visit(other, path + [name])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [])
    assert graph["train"] >= {"rollout", "config", "algos"}  # the graph was read (the test can fail)



def core_modules() -> dict[str, Path]:
    """The core: every module of the project but the entry points (train.py, eval.py) and extras/."""
    return {name: path for name, path in modules().items()
            if name not in ("train", "eval") and name.split(".")[0] != "extras"}


def test_no_core_module_imports_extras():
    """extras/ stands on top of the core (DESIGN.md): train.py and eval.py may import it, no core module
    may, at its top or deferred inside a function, so that deleting an extra never breaks a run that does
    not ask for it. Read from the source: `from extras.lora import x`, `from extras import lora`, `import extras`."""
    core = core_modules()
    reaching = sorted(f"{name} -> {module}" for name, path in core.items()
                      for node in ast.walk(ast.parse(path.read_text()))
                      for module in ([a.name for a in node.names] if isinstance(node, ast.Import) else
                                     [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
                      if module and module.split(".")[0] == "extras")
    assert reaching == [], reaching
    assert {"config", "data", "checkpoint", "rollout", "grading.mixed", "environments.markovian"} <= set(core)


@pytest.mark.slow
def test_a_tree_without_extras_imports_its_core_and_runs_a_default_step(tmp_path):
    """What a fork that deletes extras/ keeps: in a copy of the tree without the folder, every core module
    and eval.py import, and a 1-step default run (its checkpoint included) exits 0."""
    tree = tmp_path / "tree"
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", "extras", "tests", "docs", "bench", "runs",
                                                              "__pycache__"))
    assert not (tree / "extras").exists() and (tree / "train.py").is_file()
    names = sorted(core_modules()) + ["eval", "train"]
    flags = [*SMALL, "--max-steps", "1", "--eval-every", "0", "--out", str(tmp_path / "run")]
    script = f"import importlib; modules = [importlib.import_module(m) for m in {names!r}]; modules[-1].main({flags!r})"
    done = subprocess.run([sys.executable, "-c", script], cwd=tree, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "run" / "checkpoints" / "step-1" / "model.safetensors").is_file()


# ----------------------------------------------------------------------------- one rollout seam

@pytest.mark.parametrize("chunks,eval_chunks,expected", [
    (1, 0, (1, 1)),  # plain in training and at eval
    (4, 0, (4, 4)),  # Markovian, eval as trained
    (1, 8, (1, 8)),  # plain training, Markovian eval (test-time scaling)
    (4, 8, (4, 8)),
])
def test_the_config_builds_the_training_and_eval_shapes(chunks, eval_chunks, expected):
    """config.rollout_shapes: I = 1 is rollout.PLAIN itself; I > 1 a Markovian with the config's m, h
    (carryover 0 -> C/2, chunk_head −1 -> min(100, m)) and its own I."""
    from config import Config, rollout_shapes
    from environments.markovian import Markovian
    from rollout import PLAIN

    cfg = Config(max_new_tokens=32, max_chunks=chunks, eval_max_chunks=eval_chunks)
    for shape, cap in zip(rollout_shapes(cfg, tokenizer=None), expected):
        assert shape == (PLAIN if cap == 1 else Markovian(carryover=16, head=16, max_chunks=cap))


def test_a_run_says_only_what_it_sets_apart_from_the_defaults():
    from config import Config, config_note

    assert config_note(Config(), Path("run/config.yaml")) == (
        "config: every field in run/config.yaml; this run keeps every default")
    assert config_note(Config(lr=1e-4, eval_k=[1, 2], max_chunks=3), Path("run/config.yaml")).splitlines() == [
        "config: every field in run/config.yaml; this run sets apart from the defaults:",
        "  lr: 0.0001", "  max_chunks: 3", "  eval_k:", "  - 1", "  - 2"]
