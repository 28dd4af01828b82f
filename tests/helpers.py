"""Helpers the test files share, each defined once: random models and model folders, train.py runs
(in this process, in the background, under torchrun), starting two ranks (and the work of the
session's one spawn of them), the code-problem fixture.

Fixtures live in conftest.py (the random Llama folder, the random Qwen2 folder, one thread, the
session's torchrun launch and spawn of two ranks); this module holds plain functions, imported by name:
`from helpers import random_lm`. transformers is imported inside the functions that build models,
so that a test file that needs only a string helper does not pay for it.
"""
import importlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
CODE_PROBLEMS = FIXTURES / "code_problems.jsonl"  # right and wrong programs for each problem
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


# ============================================================================ random models

PAD = 0
# model type -> the transformers class prefix (LlamaConfig, LlamaForCausalLM, ...)
ARCHS = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3", "gemma2": "Gemma2", "granite": "Granite",
         "cohere": "Cohere"}
SIZES = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, max_position_embeddings=128)


def random_lm(arch: str, init: float = 0.3, **config):
    """A random small causal LM of `arch` (seed 0, eval mode): SIZES, with `config` over them. init
    0.3 gives sharp logits (no greedy near-ties), 0.02 is the usual scale of a real model's activations."""
    import transformers
    name = ARCHS[arch]
    torch.manual_seed(0)
    cfg = getattr(transformers, f"{name}Config")(**{**SIZES, "initializer_range": init, **config})
    return getattr(transformers, f"{name}ForCausalLM")(cfg).eval()


def save_random(model, path) -> str:
    model.save_pretrained(path)  # safetensors, as load_model requires
    return str(path)


def qwen2(path, **config) -> str:
    """A random Qwen2 (seed 0) saved in `path`: 2 layers of width 32 and attention dropout 0.5 (which
    load_model must turn off), `config` over that; no tokenizer."""
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(**{**dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, attention_dropout=0.5), **config})
    return save_random(Qwen2ForCausalLM(cfg), path)


def prompts(lengths, seed=0) -> list[list[int]]:
    """Random token rows of the given lengths (ids 2..63)."""
    rng = random.Random(seed)
    return [[rng.randrange(2, 64) for _ in range(n)] for n in lengths]


def frequent_token(rows: list[list[int]], skip=(), after: int = 3) -> int:
    """A token that several rows write after their first `after` (and not in `skip`): as EOS, rows end
    at different steps."""
    counts = {}
    for r in rows:
        for t in set(r[after:]) - set(skip):
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=counts.get)


# ============================================================================ train.py runs

def run_main(argv) -> str:
    """train.main(argv) that must stop with an error: what its SystemExit says."""
    import train
    with pytest.raises(SystemExit) as e:
        train.main(argv)
    return str(e.value)


def metrics(run: Path) -> list[dict]:
    """A run folder's metrics.jsonl rows."""
    return [json.loads(x) for x in (Path(run) / "metrics.jsonl").read_text().splitlines()]


def same_run(a: list[dict], b: list[dict]) -> bool:
    """Every logged value but the timings and the sampler/trainer mismatch is equal, step by step.
    (The mismatch is fp32 rounding, ~1e-5, and rounding follows the thread count: a one-rank
    "node" runs 2 threads where torchrun gives each of 2 local ranks 1.)"""
    untimed = [{k: v for k, v in row.items() if not k.startswith(("time/", "mismatch/"))} for row in a + b]
    return untimed[:len(a)] == untimed[len(a):]


def start_train(flags, out: Path) -> subprocess.Popen:
    """`python train.py FLAGS --out OUT` in the background, on one thread (as the one_thread fixture
    runs this process, so that their numbers agree bit for bit), in a session of its own so that
    `kill_9` ends it and its grading workers; its output is dropped."""
    return subprocess.Popen([sys.executable, "train.py", *flags, "--out", str(out)], cwd=ROOT,
                            env={**os.environ, "OMP_NUM_THREADS": "1"}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_9(proc: subprocess.Popen) -> None:
    """SIGKILL a `start_train` run and every process of its session, and reap it."""
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def wait_until(proc: subprocess.Popen, ready, what: str) -> None:
    """Poll every ~1 ms until ready(); fail if the run ends or 2 minutes pass first."""
    deadline = time.monotonic() + 120
    while not ready():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} after 2 minutes"
        time.sleep(0.001)


# ============================================================================ two ranks

def torchrun(*args: str, nproc: int = 2, cwd=ROOT, timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node NPROC ARGS` (ARGS: a script and its flags) in `cwd`, its output captured."""
    return subprocess.run([*TORCHRUN, "--nproc_per_node", str(nproc), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=env)


def spawn_ranks(worker, folder: Path, *args, world: int = 2, timeout: float = 300) -> None:
    """worker(rank, world, init_file, *args) in `world` spawned processes, which meet in a gloo group
    through init_file (in `folder`); returns when all exit, raises if a rank fails, and kills them all
    and fails the test after `timeout` seconds (a rank waiting for one that never comes). The worker
    is a module-level function of a test file (spawn imports it by name) and hands back what it
    computed through a file."""
    import torch.multiprocessing as mp
    ctx = mp.start_processes(worker, args=(world, str(Path(folder) / "init"), *args), nprocs=world,
                             start_method="spawn", join=False)
    deadline = time.monotonic() + timeout
    while not ctx.join(timeout=5):  # raises if a rank failed
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"the {world}-rank worker hung")


def join_ranks(rank: int, world: int, init_file: str, timeout: float) -> None:
    """A `spawn_ranks` worker's first line: one thread, and the gloo group. A short collective
    `timeout` (seconds) turns a hang (a rank waiting for one that never comes) into an error."""
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout))


# (name, module, function): what the session's one spawn of 2 ranks computes, in order (spawned_ranks)
SPAWNED = []


def share_two_ranks(name: str, function) -> None:
    """Have the session's one spawn of 2 gloo ranks (conftest's `spawned_ranks`, started by the first test
    that asks for it) compute function(rank, world, dirs); rank 0's return value is spawned_ranks[name].
    A spawn is ~4 s of imports on 2 cores, the work of a test file's 2-rank checks seconds: the files
    share one. `function` is a module-level function of a test file (a spawned rank imports it by name);
    dirs: {"random_model": conftest's random Llama folder, "qwen2": its random Qwen2 folder}. Both ranks
    run every function in turn in one gloo group, with a 120 s timeout on a collective: a function that
    fails on one rank is an error on the other, not a hang."""
    assert name not in {n for n, _, _ in SPAWNED}, f"{name} shared twice"
    SPAWNED.append((name, function.__module__, function.__name__))


def spawned_work(rank: int, world: int, init_file: str, work: list, dirs: dict, out_file: str) -> None:
    """The spawned ranks' side of share_two_ranks: each function in turn; rank 0 saves their results."""
    join_ranks(rank, world, init_file, timeout=120)
    results = {name: getattr(importlib.import_module(module), function)(rank, world, dirs)
               for name, module, function in work}
    if rank == 0:
        torch.save(results, out_file)
    leave_ranks()


def leave_ranks() -> None:
    """A `spawn_ranks` worker's last line: wait for every rank (none tears gloo down while another
    still uses it), end the group and exit at once. Skipping interpreter teardown: a gloo thread still
    alive there once aborted rank 1 after its work was done ("terminate called without an active
    exception", SIGABRT; cf. pytorch/pytorch#179291), failing a test for a reason outside it."""
    import torch.distributed as dist
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


# ============================================================================ code problems

def fenced(program: str) -> str:
    """A response that gives `program` in a python code block."""
    return f"Here is my solution.\n```python\n{program}\n```\nDone."


def fixture_problems() -> list[dict]:
    """The rows of tests/fixtures/code_problems.jsonl."""
    return [json.loads(line) for line in CODE_PROBLEMS.read_text().splitlines()]


def sampler_for(engine: str = "hf", compile: str = "auto"):
    """Who samples, by --engine's name, as a test builds it outside a run (no slab reserved): "fast" ->
    engine.Fast with that compile mode, else HF generate (rollout.Generate)."""
    from engine import Fast
    from rollout import Generate

    return Fast(compile) if engine == "fast" else Generate()
