import importlib.util
import sys
from collections import Counter
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "assets"))

# Fixtures whose set-up alone is slow: every test that asks for one is marked slow (a test that is
# not would pay for the whole set-up in the fast tier).
SLOW_FIXTURES = {"two_rank_runs", "spawned_ranks"}
EXTENDED = "python -m pytest -q --extended -m extended tests"
SKIPPED: dict[str, str] = {}  # node id -> the command that would run it here (collection fills it)


@cache
def installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def pytest_addoption(parser):
    parser.addoption("--extended", action="store_true",
                     help="run the tests marked extended too (the README's line skips them; .ci/run runs them)")


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: seconds or more on 2 CPU cores (torchrun launches, subprocess training runs, "
                   "compiles, many training steps, time limits, worker start-ups); "
                   "`python -m pytest -m \"not slow\" tests` leaves them out, CI runs them all")
    config.addinivalue_line(
        "markers", "needs(package): the test uses an optional package (requirements.txt's comments) and skips "
                   "without it, naming the pip command; .ci/run installs them all and runs `-m needs` after the "
                   "README's line")
    config.addinivalue_line(
        "markers", "extended: an end-to-end run of processes of its own (a kill and resume, two launchers, a "
                   "benchmark's CPU path, measured memory peaks) that the README's line skips to stay within "
                   "minutes; `--extended` runs it, as .ci/run does after the README's line")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        missing = [p for mark in item.iter_markers("needs") for p in mark.args if not installed(p)]
        if missing:
            SKIPPED[item.nodeid] = f"pip install {' '.join(missing)}"
            item.add_marker(pytest.mark.skip(reason=f"needs {', '.join(missing)}: {SKIPPED[item.nodeid]}"))
        elif item.get_closest_marker("extended") and not config.getoption("--extended"):
            SKIPPED[item.nodeid] = EXTENDED
            item.add_marker(pytest.mark.skip(reason=f"extended: {EXTENDED} runs it, as .ci/run does"))


def pytest_terminal_summary(terminalreporter):
    """`-q` lists no skip reasons: one line counts what skipped for a package or as extended, and how to run it."""
    counts = Counter(SKIPPED[r.nodeid] for r in terminalreporter.stats.get("skipped", ()) if r.nodeid in SKIPPED)
    if counts:
        terminalreporter.write_line("skipped, and run by .ci/run: " +
                                    "; ".join(f"{n} by `{how}`" for how, n in sorted(counts.items())))


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory):
    """A random-initialised 2-layer Llama with the shipped character tokenizer (fast to run)."""
    from build_tiny_model import build_model, build_tokenizer
    path = tmp_path_factory.mktemp("random-llama")
    tok = build_tokenizer()
    tok.save_pretrained(path)
    build_model(len(tok), seed=0, hidden=32, layers=2).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory) -> str:
    """A random 2-layer Qwen2 with attention dropout 0.5, no tokenizer (helpers.qwen2)."""
    from helpers import qwen2
    return qwen2(tmp_path_factory.mktemp("qwen2"))


@pytest.fixture(scope="session")
def math_grader():
    """One math-verify worker at the defaults (--grade-timeout 10, --grade-cpu 4), shared by the tests that
    only read verdicts: a worker's start and warm-up cost seconds, a verdict on a warm one milliseconds."""
    from grading.pool import MathGraderPool
    pool = MathGraderPool(workers=1)
    yield pool
    pool.close()


@pytest.fixture(scope="module")
def one_thread():
    """This process on one thread for the module's tests, as a `helpers.start_train` run is: their
    numbers agree bit for bit whatever thread count earlier tests left."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def two_rank_runs(random_model_dir, tmp_path_factory):
    """The folder of the session's one 2-rank torchrun launch, every registered run done (tests/pair.py)."""
    import pair
    return pair.launch(tmp_path_factory.mktemp("two-ranks"), random_model_dir)


@pytest.fixture(scope="session")
def spawned_ranks(random_model_dir, qwen2_dir, tmp_path_factory) -> dict:
    """{name: rank 0's result} of every function shared with helpers.share_two_ranks, computed in the
    session's one spawn of 2 gloo ranks."""
    import torch

    from helpers import SPAWNED, spawn_ranks, spawned_work
    tmp = tmp_path_factory.mktemp("spawned")
    spawn_ranks(spawned_work, tmp, SPAWNED, {"random_model": random_model_dir, "qwen2": qwen2_dir},
                str(tmp / "rank0.pt"), timeout=600)
    return torch.load(tmp / "rank0.pt")
