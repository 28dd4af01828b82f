"""The engine (engine.py): its step compiles whole (fullgraph=True, so it is capturable as one CUDA
graph) and computes what the eager step computes; greedy it writes token for token what HF
generate writes; sampled, it records the trainer's log-probs and draws from HF's distribution."""
import math
import random
import warnings
from types import SimpleNamespace

import pytest
import torch
from transformers import (Gemma2Config, Gemma2ForCausalLM, LlamaConfig, LlamaForCausalLM, Qwen2Config,
                          Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM)
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from engine import Engine, Mode, draw, truncated
from model import ResponseLogProbs
from rollout import Chunk, Sampling, collate, sample

PAD = 0
ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
         "qwen3": (Qwen3Config, Qwen3ForCausalLM), "gemma2": (Gemma2Config, Gemma2ForCausalLM)}
# Gemma2: every other layer attends to the last 6 positions only (prompts here reach 12 + 24),
# with attention and final-logit soft-capping; 4 layers so both kinds come twice. It scales its
# embeddings by sqrt(hidden): at init 0.3 every row repeats one token, at 0.05 rows vary and
# greedy tokens change with the window.
EXTRA = {"gemma2": dict(num_hidden_layers=4, sliding_window=6, attn_logit_softcapping=5.0,
                        final_logit_softcapping=3.0, query_pre_attn_scalar=16, initializer_range=0.05)}


def random_lm(arch: str, init: float = 0.3):
    """A random small model; init 0.3 gives sharp logits (no greedy near-ties), 0.02 is the usual
    scale of a real model's activations."""
    config, cls = ARCHS[arch]
    torch.manual_seed(0)
    kwargs = dict(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, max_position_embeddings=128, initializer_range=init)
    return cls(config(**{**kwargs, **EXTRA.get(arch, {})})).eval()


def prompts(lengths, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(2, 64) for _ in range(n)] for n in lengths]


def tokenizer(eos):
    return SimpleNamespace(eos_token_id=eos, pad_token_id=PAD)


def frequent_token(rows: list[list[int]]) -> int:
    """A token that several rows write after their first few: as EOS, rows end at different steps."""
    counts = {}
    for r in rows:
        for t in set(r[3:]):
            counts[t] = counts.get(t, 0) + 1
    return max(counts, key=counts.get)


def engine_decode(engine, rows, sampling, eos) -> list[tuple[list[int], list[float]]]:
    """Each row's tokens up to its first eos, with their log-probs (what follows is not written
    for a row that left the batch)."""
    ids = torch.tensor([[PAD] * (12 - len(r)) + r for r in rows])
    tokens, logps = engine.decode(ids, (ids != PAD).long(), sampling=sampling, budget=sampling.max_new_tokens,
                                  stops=[eos])
    cut = [t[:t.index(eos) + 1] if eos in t else t for t in tokens]
    return [(t, lp[:len(t)]) for t, lp in zip(cut, logps)]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_hf_generate(arch):
    """Left-padded prompts of 3 to 12 tokens, each twice (a group: one prefill, then copied), and
    an EOS that rows write at different steps, so finished rows leave the batch mid-way."""
    lm = random_lm(arch)
    rows = [p for p in prompts([3, 9, 5, 12, 7]) for _ in range(2)]
    greedy = Sampling(temperature=0, max_new_tokens=24, engine="fast")
    eos = frequent_token([t for t, _ in sample(lm, tokenizer(10_000), rows, greedy)])
    hf = sample(lm, tokenizer(eos), rows, Sampling(temperature=0, max_new_tokens=24, engine="hf"))
    fast = sample(lm, tokenizer(eos), rows, greedy)
    assert [t for t, _ in fast] == [t for t, _ in hf]
    assert len({len(t) for t, _ in hf}) > 1  # some rows ended before others


@pytest.mark.parametrize("arch", ARCHS)
def test_step_compiles_whole_and_equals_eager(arch):
    """torch.compile(fullgraph=True, dynamic=False) of the step succeeds (a graph break would raise),
    and the traced step writes exactly the untraced step's tokens and log-probs, greedy and sampled
    (backend "eager" runs the traced ops as they are, so the same seed draws the same tokens).
    Rows stop at different steps, so the traced steps run in several row buckets."""
    lm = random_lm(arch)
    rows = [p for p in prompts([3, 9, 12]) for _ in range(2)]  # 6 rows: buckets of 8, 4, 2
    eager, traced = Engine(lm, compile="untraced"), Engine(lm, compile="eager")
    for sampling in (Sampling(temperature=0, max_new_tokens=16), Sampling(0.8, 0.9, 20, max_new_tokens=16)):
        torch.manual_seed(3)
        eos = frequent_token([t for t, _ in engine_decode(Engine(lm), rows, sampling, -1)])
        torch.manual_seed(3)
        expected = engine_decode(eager, rows, sampling, eos)
        torch.manual_seed(3)
        got = engine_decode(traced, rows, sampling, eos)
        assert [t for t, _ in got] == [t for t, _ in expected]
        assert got == expected
        assert len({len(t) for t, _ in expected}) > 1  # rows stopped at different steps: buckets shrank
    assert traced.resets == 1  # traced once; the second call found the same weights and slab


def test_new_weights_are_seen_and_moved_weights_recompile():
    """An optimizer step writes the weights in place: the compiled steps keep their traces and see
    the new values. A weight put in new storage (as FSDP's gather or a resume can) starts the
    compiled steps afresh. Either way the greedy tokens are HF generate's on the current weights."""
    lm = random_lm("qwen2")
    rows = prompts([4, 11, 7, 9])
    engine = Engine(lm, compile="eager")
    greedy = Sampling(temperature=0, max_new_tokens=16)

    def agrees_with_hf() -> list:
        hf = sample(lm, tokenizer(-1), rows, replace_engine(greedy, "hf"))
        tokens = [t for t, _ in engine_decode(engine, rows, greedy, -1)]
        assert tokens == [t for t, _ in hf]
        return tokens

    before = agrees_with_hf()
    opt = torch.optim.SGD(lm.parameters(), lr=5.0)
    lm.train()
    lm(torch.tensor(rows[0])[None], labels=torch.tensor(rows[0])[None]).loss.backward()
    opt.step()
    lm.eval()
    after = agrees_with_hf()
    assert after != before and engine.resets == 1  # new values, same addresses
    lm.model.norm.weight.data = lm.model.norm.weight.data.clone() * 0.5
    agrees_with_hf()
    assert engine.resets == 2  # a moved weight: compiled afresh


def replace_engine(sampling: Sampling, engine: str) -> Sampling:
    return Sampling(sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_new_tokens, engine=engine)


@pytest.mark.parametrize("engine", ["fast", "hf"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9)])
def test_recorded_log_probs_are_the_trainers(engine, temperature, top_k, top_p):
    """What either engine records per sampled token equals ResponseLogProbs on the same rows (fp32):
    log-softmax of z/τ over the whole vocabulary, truncation by top-k/top-p not applied. (At
    init 0.3 the activations are ~15x larger and fp32 rounding alone differs by up to 2e-5.)"""
    lm = random_lm("qwen2", init=0.02)
    rows = [p for p in prompts([4, 10, 6]) for _ in range(3)]
    sampling = Sampling(temperature, top_p, top_k, max_new_tokens=16, engine=engine)
    torch.manual_seed(1)
    eos = frequent_token([t for t, _ in sample(lm, tokenizer(-1), rows, sampling)])
    torch.manual_seed(1)
    out = sample(lm, tokenizer(eos), rows, sampling)
    assert len({len(t) for t, _ in out}) > 1  # some rows stopped early: their padding is not recorded
    batch = collate([Chunk(r, tokens) for r, (tokens, _) in zip(rows, out)], PAD, "cpu")
    with torch.no_grad():
        logp = ResponseLogProbs(lm)(batch.input_ids, batch.attention_mask, batch.position_ids,
                                    batch.response_mask, temperature)["logp"]
    for i, (tokens, recorded) in enumerate(out):
        assert len(recorded) == len(tokens)
        # absolute: |log p| ≤ 4.8 here (near-uniform at init 0.02), where fp32 rounds to 4.8e-7 (1 ulp, the
        # largest difference seen); 1e-5 leaves 20 ulps for another CPU's kernels and summation order
        assert torch.allclose(torch.tensor(recorded), logp[i, :len(tokens)], atol=1e-5, rtol=0)


def test_truncation_is_hf_top_k_then_top_p():
    """The logits the engine samples from are exactly what HF's warpers leave, -inf where they cut."""
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    for k, p in [(5, 1.0), (0, 0.9), (0, 0.5), (8, 0.7), (0, 0.01), (0, 1.0)]:
        expected = logits.clone()
        if k:
            expected = TopKLogitsWarper(k)(None, expected)
        if p < 1:
            expected = TopPLogitsWarper(p)(None, expected)
        assert torch.equal(truncated(logits, top_k=k, top_p=p if p < 1 else None), expected), (k, p)
    assert (draw(logits, Mode(greedy=True))[0] == logits.argmax(-1)).all()


@pytest.mark.parametrize("temperature,top_k,top_p,kept", [(1.0, 0, 1.0, 6), (0.7, 4, 1.0, 4),
                                                          (1.3, 0, 0.8, 3)])  # p at τ 1.3: .437 .298 .118 ...
def test_draws_follow_hf_sampler_distribution(temperature, top_k, top_p, kept):
    """On a 6-token vocabulary, 200,000 draws of the engine (`draw`) and of HF's sampler (its
    temperature, top-k and top-p warpers, softmax, torch.multinomial) each land on every token at
    its exact truncated probability p_i within 5 standard errors, 5·sqrt(p_i(1 − p_i)/n) ≤ 0.0056
    (a false alarm at 5σ has probability < 1e-5 per token); tokens the warpers cut are never drawn."""
    n = 200_000
    logits = torch.tensor([[2.0, 1.5, 0.3, 0.0, -1.0, -3.0]])
    z = logits / temperature
    expected = truncated(z, top_k=top_k, top_p=top_p if top_p < 1 else None).softmax(-1)[0]
    torch.manual_seed(0)
    ours = draw(logits.expand(n, -1), Mode.of(Sampling(temperature, top_p, top_k)), torch.tensor([temperature]),
                torch.tensor([top_p]))[0]
    hf_z = z.expand(n, -1).clone()
    if top_k:
        hf_z = TopKLogitsWarper(top_k)(None, hf_z)
    if top_p < 1:
        hf_z = TopPLogitsWarper(top_p)(None, hf_z)
    theirs = torch.multinomial(hf_z.softmax(-1), 1)[:, 0]
    assert (expected > 0).sum() == kept
    for tokens in (ours, theirs):
        freq = torch.bincount(tokens, minlength=6).double() / n
        tolerance = 5 * torch.sqrt(expected.double() * (1 - expected.double()) / n)
        assert ((freq - expected.double()).abs() <= tolerance).all(), (freq, expected)


def test_a_group_is_prefilled_once():
    """4 prompts × G = 3: the first forward (the prefill) sees 4 rows, every later one ≤ 12."""
    lm = random_lm("llama")
    seen = []
    hook = lm.model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape),
                                              with_kwargs=True)
    rows = [p for p in prompts([5, 8, 3, 6]) for _ in range(3)]
    sample(lm, tokenizer(10_000), rows, Sampling(temperature=1.0, max_new_tokens=6, engine="fast"))
    hook.remove()
    assert seen[0] == (4, 8) and all(s == (12, 1) for s in seen[1:]) and len(seen) == 6


def test_a_model_the_engine_cannot_run_is_named_and_generated_by_hf():
    """A model class whose attention does not go through HF's AttentionInterface: one warning
    naming it, and HF generate's tokens."""
    class Opaque(LlamaForCausalLM):
        _supports_attention_backend = False

    lm = random_lm("llama")
    opaque = Opaque(lm.config).eval()
    opaque.load_state_dict(lm.state_dict())
    rows = prompts([3, 7])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = sample(opaque, tokenizer(-1), rows, Sampling(temperature=0, max_new_tokens=8, engine="fast"))
    assert [str(w.message) for w in caught if "engine" in str(w.message)] == [
        "--engine fast: Opaque does not route attention through HF's AttentionInterface; rollouts use HF generate"]
    assert fast == sample(lm, tokenizer(-1), rows, Sampling(temperature=0, max_new_tokens=8, engine="hf"))
    assert not math.isnan(fast[0][1][0])
