import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "assets"))

# Fixtures whose set-up alone is slow: every test that asks for one is marked slow (a test that is
# not would pay for the whole set-up in the fast tier).
SLOW_FIXTURES = {"two_rank_runs"}


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "slow: seconds or more on 2 CPU cores (torchrun launches, subprocess training runs, "
                   "compiles, many training steps, time limits); `python -m pytest -m \"not slow\" tests` "
                   "leaves them out, CI runs them all")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


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
