import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "assets"))


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
def two_rank_runs(random_model_dir, tmp_path_factory):
    """The folder of the session's one 2-rank torchrun launch, every registered run done (tests/pair.py)."""
    import pair
    return pair.launch(tmp_path_factory.mktemp("two-ranks"), random_model_dir)
