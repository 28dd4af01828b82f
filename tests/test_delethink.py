"""docs/math.md §5: the Markovian (Delethink) environment and its trace-normalised loss."""
import random
from contextlib import nullcontext
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from transformers import DynamicCache

import algos
from model import load_model, load_tokenizer
from rewards import Problem
from environments.markovian import Markovian
from rollout import Chunk, Episode, Sampling, collate, generate
from config import DEFAULT_MODEL, Config
from train import Learner, split_minibatches, update
from helpers import sampler_for

EOS, PAD = 1, 0


class ScriptedLM(torch.nn.Module):
    """Stands in for a causal LM: continues the count g1, g2, ... (ids 101, 102, ...) from the
    last g-token of its prompt (or from g1 after a bare query) and writes EOS as token number
    `length` of the trace. Records every prompt it is fed, every budget, whether a prefix cache
    came with it, and every prefix environments.markovian.prefill computes (their caches are empty stand-ins)."""

    def __init__(self, length: int):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.length, self.calls, self.prefills = length, [], []

    def forward(self, input_ids, attention_mask, **_):
        self.prefills.append([[t for t, m in zip(ids, mask) if m]
                              for ids, mask in zip(input_ids.tolist(), attention_mask.tolist())])
        return SimpleNamespace(past_key_values=DynamicCache(), logits=torch.zeros(len(input_ids), 1, 1))

    def generate(self, input_ids, attention_mask, generation_config, past_key_values=None, **_):
        budget = generation_config.max_new_tokens
        rows = []
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist()):
            prompt = [t for t, m in zip(ids, mask) if m]
            self.calls.append((prompt, budget, past_key_values is not None))
            nxt = prompt[-1] + 1 if prompt[-1] > 100 else 101
            new = []
            while len(new) < budget:
                new.append(EOS if nxt - 100 == self.length else nxt)
                if new[-1] == EOS:
                    break
                nxt += 1
            rows.append(ids + new + [PAD] * (budget - len(new)))
        return torch.tensor(rows)


TOKENIZER = SimpleNamespace(eos_token_id=EOS, pad_token_id=PAD,
                            decode=lambda ids, skip_special_tokens: " ".join(map(str, ids)))
Q = [10, 11, 12, 13, 14]  # q1..q5


def g(*numbers):
    return [100 + n for n in numbers]


def rollout(lm, c, m, h, cap, queries=(Q,), group_size=1):
    return generate(lm, TOKENIZER, [Problem("p", "0")] * len(queries), list(queries),
                    group_size=group_size, sampling=Sampling(max_new_tokens=c),  # it scripts generate
                    shape=Markovian(carryover=m, head=h, max_chunks=cap))


def test_spec_worked_example():
    """C = 8, m = 4, h = 0, I = 3, a trace that needs 20 tokens (EOS is the 20th)."""
    lm = ScriptedLM(length=20)
    (e,) = rollout(lm, c=8, m=4, h=0, cap=3)
    assert [(ch.prompt_ids, ch.response_ids) for ch in e.chunks] == [
        (Q, g(*range(1, 9))), (Q + g(5, 6, 7, 8), g(9, 10, 11, 12)), (Q + g(9, 10, 11, 12), g(13, 14, 15, 16))]
    assert [(budget, cached) for _, budget, cached in lm.calls] == [(8, False), (4, True), (4, True)]
    assert lm.prefills == [[Q]]  # the q ⧺ head block (h = 0), prefilled once, after chunk 1
    assert e.response_ids == g(*range(1, 17)) and e.truncated  # cut at the budget, 8 + 2·4 = 16
    assert Markovian(4, 0, 3).max_tokens(8) == 16
    assert e.text == " ".join(map(str, g(*range(9, 17))))  # the carried tokens ⧺ the last chunk

    (e4,) = rollout(ScriptedLM(length=20), c=8, m=4, h=0, cap=4)  # I = 4 reaches the EOS
    assert e4.chunks[-1] == Chunk(Q + g(13, 14, 15, 16), g(17, 18, 19) + [EOS])
    assert not e4.truncated and len(e4.response_ids) == 20


def test_markovian_sft_rows_are_the_chunks_a_rollout_of_the_reference_writes():
    """assets/build_tiny_model.py --chunk trains on markov_rows; a Delethink rollout whose model
    writes exactly the reference (the scripted count g1..g19, EOS) produces the same rows."""
    from build_tiny_model import markov_rows
    reference = g(*range(1, 20)) + [EOS]
    (e,) = rollout(ScriptedLM(length=20), c=8, m=3, h=0, cap=10)
    assert markov_rows(Q, reference, 8, 3) == e.chunks
    assert [len(ch.response_ids) for ch in e.chunks] == [8, 5, 5, 2]
    assert markov_rows([1], [1, 2, 3, 4, 5, 6, 7], 4, 2) == [  # the docstring example
        Chunk([1], [1, 2, 3, 4]), Chunk([1, 3, 4], [5, 6]), Chunk([1, 5, 6], [7])]


def test_head_of_chunk_one_is_kept():
    """h = 2: every later prompt is q ⧺ g1 g2 ⧺ the trace's last m − h = 2 tokens."""
    lm = ScriptedLM(length=30)
    (e,) = rollout(lm, c=8, m=4, h=2, cap=3)
    assert [ch.prompt_ids for ch in e.chunks] == [Q, Q + g(1, 2, 7, 8), Q + g(1, 2, 11, 12)]
    assert lm.prefills == [[Q + g(1, 2)]]


@pytest.mark.parametrize("arch,prefill_chunk,batch_size,engine", [("qwen2", 0, 0, "hf"), ("llama", 0, 0, "hf"),
                                                                   ("qwen2", 4, 2, "hf"), ("qwen2", 0, 0, "fast"),
                                                                   ("llama", 4, 2, "fast")])
def test_query_cache_changes_no_token(arch, prefill_chunk, batch_size, engine):
    """Later chunks reuse the q ⧺ head KV cache computed after chunk 1 (left-padded queries of
    several lengths, traces leaving the batch in different rounds): greedy, every chunk is exactly
    what a plain generate call writes from that chunk's prompt alone, with no padding and no cache.
    So do prompts prefilled 4 tokens a forward, in generate calls of 2 traces, and so does the
    fast engine (rollout.decode), which copies the cache into its own."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM
    config, cls = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "llama": (LlamaConfig, LlamaForCausalLM)}[arch]
    torch.manual_seed(0)
    lm = cls(config(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                    initializer_range=0.3)).eval()  # sharp logits: no near-ties, few repeats
    rng = random.Random(0)
    queries = [[rng.randrange(2, 64) for _ in range(n)] for n in (3, 9, 5, 12, 7, 4)]
    c, m, h, cap = 10, 6, 2, 4

    def chunked(eos):
        tok = SimpleNamespace(eos_token_id=eos, pad_token_id=PAD, decode=lambda ids, skip_special_tokens: "")
        return generate(lm, tok, [Problem("p", "0")] * len(queries), queries, group_size=1,
                        sampling=Sampling(temperature=0, max_new_tokens=c, prefill_chunk=prefill_chunk,
                                          sampler=sampler_for(engine)),
                        shape=Markovian(carryover=m, head=h, max_chunks=cap), batch_size=batch_size)

    # EOS = a token trace 0 first writes in its third chunk, so traces stop in different rounds.
    trace = chunked(eos=10_000)[0].response_ids
    eos = next(t for t in trace[c + (c - m):] if t not in trace[:c + (c - m)])
    eps = chunked(eos)
    assert len({len(e.chunks) for e in eps}) > 1 and len(eps[0].chunks) == 3
    for e in eps:
        for k, ch in enumerate(e.chunks):
            ids = torch.tensor([ch.prompt_ids])  # (it may hold the pad id: the model writes it too)
            out = lm.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              eos_token_id=eos, pad_token_id=PAD, max_new_tokens=c if k == 0 else c - m)
            alone = out[0, len(ch.prompt_ids):].tolist()
            assert ch.response_ids == (alone[:alone.index(eos) + 1] if eos in alone else alone)


def test_plain_rollout_is_one_chunk():
    (e,) = rollout(ScriptedLM(length=5), c=8, m=4, h=0, cap=1)
    assert e.chunks == [Chunk(Q, g(1, 2, 3, 4) + [EOS])] and not e.truncated


def test_one_chunk_is_the_plain_rollout_even_without_eos():
    """I = 1 writes what rollout.PLAIN writes and prefills no prefix for a second chunk it will never
    write, even when the chunk ends without EOS."""
    lm, plain_lm = ScriptedLM(length=20), ScriptedLM(length=20)
    (e,) = rollout(lm, c=8, m=4, h=0, cap=1)
    (p,) = generate(plain_lm, TOKENIZER, [Problem("p", "0")], [Q], group_size=1,
                    sampling=Sampling(max_new_tokens=8))
    assert e.chunks == p.chunks == [Chunk(Q, g(1, 2, 3, 4, 5, 6, 7, 8))] and e.truncated
    assert lm.prefills == plain_lm.prefills == []


@pytest.mark.parametrize("seed", range(3))
def test_random_budgets_on_the_tiny_model(seed):
    """Any C, m, h, I: no context exceeds |q| + C; each chunk's prompt is q ⧺ head ⧺ tail of the
    trace so far; EOS only ends the last chunk; a trace without EOS used all I chunks; and the
    training rows hold every generated token exactly once, behind its chunk's exact prompt."""
    rng = random.Random(seed)
    c = rng.randint(6, 24)
    m = rng.randint(1, c - 1)
    h = rng.randint(0, m)
    cap = rng.randint(1, 5)
    tok = load_tokenizer(DEFAULT_MODEL)
    lm = load_model(DEFAULT_MODEL)
    torch.manual_seed(seed)
    queries = [tok(f"<|user|>Add {rng.randint(1, 99)}+{rng.randint(1, 99)}+{rng.randint(1, 99)}"
                   f"<|assistant|>", add_special_tokens=False)["input_ids"] for _ in range(3)]
    eps = rollout(lm, c, m, h, cap, queries=queries, group_size=4)
    for e in eps:
        done = []
        for k, ch in enumerate(e.chunks):
            assert len(ch.prompt_ids) + len(ch.response_ids) <= len(e.prompt_ids) + c
            expected = e.prompt_ids + (done[:h] + done[len(done) - (m - h):] if k else [])
            assert ch.prompt_ids == expected
            assert len(ch.response_ids) <= (c if k == 0 else c - m)
            assert EOS not in ch.response_ids[:-1] and (k == len(e.chunks) - 1 or EOS not in ch.response_ids)
            done += ch.response_ids
        assert done == e.response_ids
        assert e.truncated == (EOS not in e.response_ids)
        if e.truncated:
            assert len(e.chunks) == cap and len(e.response_ids) == Markovian(m, h, cap).max_tokens(c)

    cfg = Config(group_size=4, prompts_per_step=3, micro_batch_size=5)
    for rank in range(2):
        rows = [row for _, micro in split_minibatches(eps, cfg, rank, 2) for mb in micro for row in mb]
        for e, ch in rows:
            assert ch in e.chunks
    rows = [row for _, micro in split_minibatches(eps, cfg, 0, 1) for mb in micro for row in mb]
    trained = {}
    for e, ch in rows:
        trained.setdefault(id(e), []).append(ch)
    assert all(trained[id(e)] == e.chunks for e in eps)  # each chunk once, in order
    batch = collate([ch for _, ch in rows], PAD, "cpu")
    assert batch.response_mask.sum() == sum(len(e.response_ids) for e in eps)
    starts = batch.attention_mask.argmax(1)
    assert (batch.position_ids[torch.arange(len(rows)), starts] == 0).all()  # positions restart


def clipped(a, ratio, low=0.2, high=0.26, dual=3.0):
    """Delethink's per-token loss by hand: PPO clip 0.2/0.26, dual clip 3 for A < 0."""
    loss = max(-a * ratio, -a * min(max(ratio, 1 - low), 1 + high))
    return min(loss, -dual * a) if a < 0 else loss


def delethink_cfg(**over):
    return SimpleNamespace(**{**vars(Config()), **algos.get("delethink").preset, **over})


def test_one_chunk_traces_give_seq_mean_token_mean():
    """I = 1 (LongCoT): the Delethink loss is GRPO's seq-mean-token-mean of the clipped loss."""
    logp = torch.tensor([[-1.0, -0.2, 0.0], [-0.5, -2.0, -1.0], [-0.3, -0.3, -0.3]], requires_grad=True)
    old = torch.tensor([[-1.5, -0.1, 0.0], [-1.9, -0.9, -1.0], [-0.2, -0.4, -0.3]])
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([1.2, -0.7, -0.5])
    mb = algos.LossInputs(logp=logp, old_logp=old, mask=mask, adv=adv, ref_logp=None, seq_tokens=mask.sum(1))
    loss, _ = algos.get("delethink").loss(mb, delethink_cfg(), {"seqs": 3, "tokens": 6, "max_len": 8})
    ratio = torch.exp(logp - old).tolist()
    hand = sum(sum(clipped(adv[i].item(), ratio[i][t]) for t in range(n)) / n
               for i, n in enumerate([3, 2, 1])) / 3
    assert loss.item() == pytest.approx(hand, abs=1e-6)
    # the ratios above hit the upper clip (A > 0, r = e^0.5) and the dual clip (A < 0, r = e^1.4)
    assert ratio[0][0] > 1.26 and clipped(-0.7, ratio[1][0]) == pytest.approx(2.1)


class TableScorer(torch.nn.Module):
    """log π(token) = W[token]: one free parameter per token id, so the update's gradient on a
    generated token can be read off W (a stand-in for ResponseLogProbs)."""

    def __init__(self, vocab):
        super().__init__()
        self.W = torch.nn.Parameter(torch.full((vocab,), -1.0))

    def forward(self, input_ids, attention_mask, position_ids, response_mask, temperature, **_):
        resp = input_ids[:, input_ids.shape[1] - response_mask.shape[1]:]
        logp = self.W[resp] * response_mask
        return {"logp": logp, "entropy": torch.zeros_like(logp)}


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_trace_normalisation_by_hand(micro):
    """Two traces of one prompt: A in 1 chunk of 3 tokens (reward 1), B in 3 chunks of 2, 4 and
    1 tokens (reward 0). On-policy the loss gradient on each token of a trace is −A_τ/(L_τ · 2):
    every token of B weighs 1/7, not 1/len(its chunk). Any micro-batch split gives the same."""
    a_tokens, b_chunks = [20, 21, 22], [[30, 31], [32, 33, 34, 35], [36]]
    trace_a = Episode(prompt_ids=[5, 6], response_ids=a_tokens, text="", truncated=False, group=0,
                      problem=Problem("p", "0"), reward=1.0, score=1.0)
    b_prompts = [[5, 6], [5, 6, 30, 31], [5, 6, 34, 35]]
    trace_b = Episode(prompt_ids=[5, 6], response_ids=sum(b_chunks, []), text="", truncated=False, group=0,
                      problem=Problem("p", "0"), reward=0.0, score=0.0,
                      chunks=[Chunk(p, r) for p, r in zip(b_prompts, b_chunks)])
    cfg = replace(Config(algo="delethink"), **{**algos.get("delethink").preset, "prompts_per_step": 1,
                  "group_size": 2, "mini_batches": 1, "micro_batch_size": micro, "grad_clip": 0.0})
    scorer = TableScorer(64)
    opt = torch.optim.SGD(scorer.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    learner = Learner(scorer=scorer, lm=scorer, ref_scorer=None, optimizer=opt, scheduler=sched,
                      algo=algos.get("delethink"), cfg=cfg, autocast=nullcontext, pad_id=PAD, rank=0, world=1,
                      device=torch.device("cpu"))
    metrics = update(learner, [trace_a, trace_b])
    adv = 2 ** -0.5  # group z-score of [1, 0] with the unbiased std
    step = scorer.W.detach() + 1.0  # SGD at lr 1: −gradient
    for t in a_tokens:
        assert step[t].item() == pytest.approx(adv / (3 * 2), abs=1e-6)
    for t in sum(b_chunks, []):
        assert step[t].item() == pytest.approx(-adv / (7 * 2), abs=1e-6)
    assert step[5].item() == 0 and step[6].item() == 0  # carried/prompt tokens are not trained
    assert metrics["update/responses"] == 2 and metrics["tokens/forward"] == (2 + 3) + (2 + 2) + (4 + 4) + (4 + 1)
