"""rollout.decode, the generation engine: token for token what HF generate writes (greedy), the
log-probs the trainer computes (sampled), HF's top-k / top-p rules, one prefill per group."""
import random
from types import SimpleNamespace

import pytest
import torch
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config,
                          Qwen3ForCausalLM)
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from model import ResponseLogProbs
from rollout import Chunk, Sampling, collate, decode, pick, sample, truncated

PAD = 0
ARCHS = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
         "qwen3": (Qwen3Config, Qwen3ForCausalLM)}


def random_lm(arch: str, init: float = 0.3):
    """A random 2-layer model; init 0.3 gives sharp logits (no greedy near-ties), 0.02 is the
    usual scale of a real model's activations."""
    config, cls = ARCHS[arch]
    torch.manual_seed(0)
    return cls(config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=128,
                      initializer_range=init)).eval()


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
    assert len({len(t) for t, _ in hf}) > 2  # rows ended at several steps


@pytest.mark.parametrize("engine", ["fast", "hf"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9)])
def test_recorded_log_probs_are_the_trainers(engine, temperature, top_k, top_p):
    """What either engine records per sampled token equals ResponseLogProbs on the same rows (fp32):
    log-softmax of z/τ over the whole vocabulary, truncation by top-k/top-p not applied. (At
    init 0.3 the activations are ~15x larger and fp32 rounding alone differs by up to 2e-5.)"""
    lm = random_lm("qwen2", init=0.02)
    rows = [p for p in prompts([4, 10, 6]) for _ in range(3)]
    torch.manual_seed(1)
    out = sample(lm, tokenizer(7), rows, Sampling(temperature, top_p, top_k, max_new_tokens=16, engine=engine))
    assert len({len(t) for t, _ in out}) > 1  # some rows stopped early: their padding is not recorded
    batch = collate([Chunk(r, tokens) for r, (tokens, _) in zip(rows, out)], PAD, "cpu")
    with torch.no_grad():
        logp = ResponseLogProbs(lm)(batch.input_ids, batch.attention_mask, batch.position_ids,
                                    batch.response_mask, temperature)["logp"]
    for i, (tokens, recorded) in enumerate(out):
        assert len(recorded) == len(tokens)
        assert torch.allclose(torch.tensor(recorded), logp[i, :len(tokens)], atol=1e-5, rtol=0)


def test_truncation_is_hf_top_k_then_top_p():
    """The logits pick samples from are exactly what HF's warpers leave, -inf where they cut."""
    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 3
    for k, p in [(5, 1.0), (0, 0.9), (0, 0.5), (8, 0.7), (0, 0.01), (0, 1.0)]:
        expected = logits.clone()
        if k:
            expected = TopKLogitsWarper(k)(None, expected)
        if p < 1:
            expected = TopPLogitsWarper(p)(None, expected)
        assert torch.equal(truncated(logits, Sampling(1.0, p, k)), expected), (k, p)
    assert (pick(logits, Sampling(temperature=0)) == logits.argmax(-1)).all()


def test_a_group_is_prefilled_once():
    """4 prompts × G = 3: the first forward (the prefill) sees 4 rows, every later one ≤ 12."""
    lm = random_lm("llama")
    seen = []
    hook = lm.model.register_forward_pre_hook(lambda _, args, kwargs: seen.append(kwargs["input_ids"].shape),
                                              with_kwargs=True)
    rows = [p for p in prompts([5, 8, 3, 6]) for _ in range(3)]
    decode(lm, tokenizer(10_000), rows, Sampling(temperature=1.0, max_new_tokens=6))
    hook.remove()
    assert seen[0] == (4, 8) and all(s == (12, 1) for s in seen[1:]) and len(seen) == 6
