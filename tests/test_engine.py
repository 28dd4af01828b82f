"""The engine (engine.py): its step compiles whole (fullgraph=True, so it is capturable as one CUDA
graph) and computes what the eager step computes; greedy it writes token for token what HF
generate writes; sampled, it records the trainer's log-probs and draws from HF's distribution."""
import math
import warnings
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch.fx.experimental.symbolic_shapes import free_symbols
from transformers import LlamaForCausalLM
from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

from engine import Engine, Mode, draw, truncated
from model import ResponseLogProbs
from rewards import Problem
from environments.markovian import Markovian
from rollout import Chunk, Sampling, collate, generate, sample

from helpers import PAD, frequent_token, prompts, random_lm, sampler_for

ARCHS = ["llama", "qwen2", "qwen3", "gemma2"]  # random_lm's, each with EXTRA's fields
# Gemma2: every other layer attends to the last 6 positions only (prompts here reach 12 + 24),
# with attention and final-logit soft-capping; 4 layers so both kinds come twice. It scales its
# embeddings by sqrt(hidden): at init 0.3 every row repeats one token, at 0.05 rows vary and
# greedy tokens change with the window.
EXTRA = {"gemma2": dict(num_hidden_layers=4, sliding_window=6, attn_logit_softcapping=5.0,
                        final_logit_softcapping=3.0, query_pre_attn_scalar=16, initializer_range=0.05)}


def tokenizer(eos):
    return SimpleNamespace(eos_token_id=eos, pad_token_id=PAD)


def engine_decode(engine, rows, sampling, eos) -> list[tuple[list[int], list[float]]]:
    """Each row's tokens up to its first eos, with their log-probs (what follows is not written
    for a row that left the batch)."""
    ids = torch.tensor([[PAD] * (12 - len(r)) + r for r in rows])
    tokens, logps = engine.decode(ids, (ids != PAD).long(), sampling=sampling, new_tokens=sampling.max_new_tokens,
                                  stops=[eos])
    cut = [t[:t.index(eos) + 1] if eos in t else t for t in tokens]
    return [(t, lp[:len(t)]) for t, lp in zip(cut, logps)]


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_equals_hf_generate(arch):
    """Left-padded prompts of 3 to 12 tokens, each twice (a group: one prefill, then copied), and
    an EOS that rows write at different steps, so finished rows leave the batch mid-way."""
    lm = random_lm(arch, **EXTRA.get(arch, {}))
    rows = [p for p in prompts([3, 9, 5, 12, 7]) for _ in range(2)]
    greedy = Sampling(temperature=0, max_new_tokens=24, sampler=sampler_for("fast"))
    eos = frequent_token([t for t, _ in sample(lm, tokenizer(10_000), rows, greedy)])
    hf = sample(lm, tokenizer(eos), rows, Sampling(temperature=0, max_new_tokens=24, sampler=sampler_for()))
    fast = sample(lm, tokenizer(eos), rows, greedy)
    assert [t for t, _ in fast] == [t for t, _ in hf]
    assert len({len(t) for t, _ in hf}) > 1  # some rows ended before others


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.slow
def test_step_compiles_whole_and_equals_eager(arch):
    """torch.compile(fullgraph=True, dynamic=False) of the step succeeds (a graph break would raise),
    and the traced step writes exactly the untraced step's tokens and log-probs, greedy and sampled
    (backend "eager" runs the traced ops as they are, so the same seed draws the same tokens).
    Rows stop at different steps, so the traced steps run in several row buckets."""
    lm = random_lm(arch, **EXTRA.get(arch, {}))
    rows = [p for p in prompts([3, 9, 12]) for _ in range(2)]  # 6 rows: buckets of 8, 4, 2
    eager, traced = Engine(lm, compile="untraced"), Engine(lm, compile="eager")
    before = Engine.compiles
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
    assert Engine.compiles - before == 2  # one graph per sampling mode (greedy; top-k and top-p on)


@pytest.mark.slow
def test_new_and_moved_weights_are_seen_without_a_new_graph():
    """An optimizer step writes the weights in place, and a weight put in new storage (as a resume or
    a user's own code can) is another tensor at another address: either way the traced step reads
    the current weights (they are the graph's inputs; addresses are not among its guards), and the
    greedy tokens are HF generate's on them, with no graph compiled after the first."""
    lm = random_lm("qwen2")
    rows = prompts([4, 11, 7, 9])
    engine = Engine(lm, compile="eager")
    greedy = Sampling(temperature=0, max_new_tokens=16)

    def agrees_with_hf() -> list:
        hf = sample(lm, tokenizer(-1), rows, replace(greedy, sampler=sampler_for()))
        tokens = [t for t, _ in engine_decode(engine, rows, greedy, -1)]
        assert tokens == [t for t, _ in hf]
        return tokens

    before, compiles = agrees_with_hf(), Engine.compiles
    opt = torch.optim.SGD(lm.parameters(), lr=5.0)
    lm.train()
    lm(torch.tensor(rows[0])[None], labels=torch.tensor(rows[0])[None]).loss.backward()
    opt.step()
    lm.eval()
    after = agrees_with_hf()
    down = lm.model.layers[0].mlp.down_proj
    down.weight.data = -down.weight.data.clone()  # (the same Parameter, new storage)
    moved = agrees_with_hf()
    assert before != after != moved and Engine.compiles == compiles and engine.moves >= 1


@pytest.mark.parametrize("engine", ["fast", "hf"])
@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 5, 0.9)])
def test_recorded_log_probs_are_the_trainers(engine, temperature, top_k, top_p):
    """What either engine records per sampled token equals ResponseLogProbs on the same rows (fp32):
    log-softmax of z/τ over the whole vocabulary, truncation by top-k/top-p not applied. (At
    init 0.3 the activations are ~15x larger and fp32 rounding alone differs by up to 2e-5.)"""
    lm = random_lm("qwen2", init=0.02)
    rows = [p for p in prompts([4, 10, 6]) for _ in range(3)]
    sampling = Sampling(temperature, top_p, top_k, max_new_tokens=16, sampler=sampler_for(engine))
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
                                                          (1.3, 0, 0.8, 3),  # p at τ 1.3: .437 .298 .118 ...
                                                          (0.6, 0, 0.95, 3)])  # p at τ 0.6: .651 .283 .038 .023 ...
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
    """4 prompts × G = 3: the first forward (the prefill) embeds 4 rows, every later one (a step) ≤ 12."""
    lm = random_lm("llama")
    seen = []
    hook = lm.model.embed_tokens.register_forward_pre_hook(lambda _, args: seen.append(args[0].shape))
    rows = [p for p in prompts([5, 8, 3, 6]) for _ in range(3)]
    sample(lm, tokenizer(10_000), rows, Sampling(temperature=1.0, max_new_tokens=6, sampler=sampler_for("fast")))
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
        fast = sample(opaque, tokenizer(-1), rows, Sampling(0, max_new_tokens=8, sampler=sampler_for("fast")))
    assert [str(w.message) for w in caught if "engine" in str(w.message)] == [
        "--engine fast: Opaque does not route attention through HF's AttentionInterface; rollouts use HF generate"]
    assert fast == sample(lm, tokenizer(-1), rows, Sampling(temperature=0, max_new_tokens=8, sampler=sampler_for()))
    assert not math.isnan(fast[0][1][0])


# ============================================================================ the CUDA path, on a CPU

def slab_copies(graph, capacity: int) -> list[str]:
    """The nodes of a post-grad graph that write slab-sized values out of place: a functional
    index_put, or a copy_ whose destination spans the slab's `capacity` columns (what AOT makes of
    an in-place write through a slice of a graph input when it cannot prove the slice is the
    whole buffer). An in-place index_put_ into a graph input is not one."""
    out = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in (torch.ops.aten.index_put.default,
                                                             torch.ops.aten.copy_.default):
            continue
        value = node.args[0].meta.get("val")
        if node.target == torch.ops.aten.index_put.default or (value is not None and value.dim() == 4
                                                               and value.shape[2] == capacity):
            out.append(f"{node.target} into {tuple(value.shape) if value is not None else '?'}")
    return out


@pytest.mark.slow
@pytest.mark.extended  # inductor compiles C++ for tens of seconds on 2 cores; .ci/run runs it
def test_the_kv_write_stays_in_place_under_inductor():
    """Inductor (the CUDA path's compiler, here on the CPU) keeps the step's KV write an in-place
    index_put_ into the slab buffer in every graph, when the live rows fill the slab and when they are
    fewer (rows shrink as they stop; a later, smaller call): no functional index_put, no copy of the
    slab's columns. The step before this fix wrote through slab[:rows], which inductor turned into a
    copy of all `capacity` columns of those rows each step whenever rows < slab rows."""
    lm = random_lm("qwen2")
    graphs = []
    rows = [p for p in prompts([3, 9, 12, 5]) for _ in range(2)]
    engine = Engine(lm, compile="inductor")
    with torch._inductor.config.patch(post_grad_custom_post_pass=graphs.append):
        eos = frequent_token([t for t, _ in engine_decode(Engine(lm), rows, Sampling(temperature=0, max_new_tokens=8),
                                                          -1)])
        full = engine_decode(engine, rows, Sampling(temperature=0, max_new_tokens=8), eos)
        engine_decode(engine, rows[:3], Sampling(temperature=0, max_new_tokens=8), eos)  # 4 of 8 slab rows
    assert len({len(t) for t, _ in full}) > 1  # rows stopped mid-way
    # the step's graphs (not those of the prefill, HF's forward, which inductor does not compile here)
    steps = [g for g in graphs if any(n.target == torch.ops.aten.embedding.default for n in g.nodes)]
    assert steps, "inductor compiled nothing"
    capacity = engine.keys[0].shape[2]
    for graph in steps:
        assert not slab_copies(graph, capacity), slab_copies(graph, capacity)
        writes = [n for n in graph.nodes if n.target == torch.ops.aten.index_put_.default
                  and n.args[0].op == "placeholder" and n.args[0].meta["val"].dim() == 4]
        assert len(writes) == 2 * lm.config.num_hidden_layers  # keys and values of every layer, in place


def count_graphs(monkeypatch) -> list:
    """Make every engine created from now on record the graphs handed to its (eager) backend: a
    list of (graph module, example inputs)."""
    import engine as engine_module
    seen, counted = [], engine_module.counted_backend

    def recording(kind, device):
        inner = counted(kind, device)

        def compile_graph(gm, example_inputs):
            seen.append((gm, example_inputs))
            return inner(gm, example_inputs)
        return compile_graph
    monkeypatch.setattr(engine_module, "counted_backend", recording)
    return seen


class Words:
    """A tokenizer stand-in for rollout.generate: pads with PAD, decodes to nothing."""
    pad_token_id = PAD

    def __init__(self, eos):
        self.eos_token_id = eos

    def decode(self, ids, **kwargs):
        return ""


@pytest.mark.slow
@pytest.mark.extended  # inductor compiles C++ for tens of seconds on 2 cores; .ci/run runs it
def test_compiles_are_bounded_over_a_run(monkeypatch):
    """With the CUDA path's dynamo options (fullgraph=True, dynamic shapes, the same step; only the
    backend is eager), a run's sequence of calls compiles one graph per sampling mode and no more:
    rollouts whose rows stop at different steps (buckets of 16, 8, 4, 2 rows), Markovian rounds, an
    eval at τ 0.6 / top-p 0.95, a greedy eval that never stops (its rows' context passes 256
    columns, three column buckets), an optimizer step, and all of it again. The bound: rows and the
    columns attention reads are symbolic (one graph serves every bucket; a rows bucket is never 1
    row, the size dynamo would specialise, and no column bucket spans the whole slab), temperature and
    top-p are device tensors, so only Mode (greedy, top-k, top-p on) makes a graph: 3 here, under
    dynamo's recompile limit of 8 with margin, and the second round adds none. Before this, the
    same sequence compiled 9 graphs (the 9th raises under fullgraph=True)."""
    graphs = count_graphs(monkeypatch)
    lm = random_lm("qwen2")
    rows = [p for p in prompts([3, 9, 5, 12]) for _ in range(4)]  # 16 rows
    train = Sampling(1.0, max_new_tokens=270, sampler=sampler_for("fast", "eager"))  # 12 + 270 columns > 256
    evaluation = Sampling(0.6, 0.95, max_new_tokens=270, sampler=sampler_for("fast", "eager"))
    greedy = Sampling(0, max_new_tokens=270, sampler=sampler_for("fast", "eager"))
    # an EOS that rows write at different steps, from 40 tokens of HF generate: no engine call before the run's
    torch.manual_seed(0)
    eos = frequent_token([t for t, _ in sample(lm, tokenizer(-1), rows, replace(train, sampler=sampler_for(),
                                                                                max_new_tokens=40))])
    problems = [Problem("", "") for _ in range(4)]
    counts, lengths = [], set()
    opt = torch.optim.SGD(lm.parameters(), lr=0.1)
    for _ in range(2):
        lengths |= {len(t) for t, _ in sample(lm, tokenizer(eos), rows, train)}
        generate(lm, Words(eos), problems, rows[::4], group_size=4, sampling=replace(train, max_new_tokens=40),
                 shape=Markovian(carryover=8, head=4, max_chunks=3))
        lengths |= {len(t) for t, _ in sample(lm, tokenizer(eos), rows[:12], evaluation)}
        lengths |= {len(t) for t, _ in sample(lm, tokenizer(-1), rows[:8], greedy)}  # whole budgets: 512 columns
        lm(torch.tensor(rows[0])[None], labels=torch.tensor(rows[0])[None]).loss.backward()
        opt.step()
        counts.append(len(graphs))
    assert min(lengths) < 8 and max(lengths) > 256  # buckets shrank, and contexts passed 256 columns
    assert counts == [3, 3]
    assert counts[-1] <= torch._dynamo.config.recompile_limit - 4


@pytest.mark.slow
def test_no_sampling_knob_is_a_graph_constant(monkeypatch):
    """A second temperature and top-p reuse the graph of the first (they are device tensors, not
    Python floats), and no graph has a float64 0-d input: the form in which dynamo lifts a Python
    float that changed, which on CUDA lives on the CPU and turns CUDA graphs off for that graph."""
    graphs = count_graphs(monkeypatch)
    lm = random_lm("qwen2")
    rows = prompts([3, 9, 5, 12])
    for temperature, top_p in [(1.0, 0.9), (0.6, 0.95), (1.3, 0.5)]:
        sample(lm, tokenizer(-1), rows, Sampling(temperature, top_p, max_new_tokens=6, sampler=sampler_for("fast",
                                                  "eager")))
    assert len(graphs) == 1
    for _, inputs in graphs:
        lifted = [x for x in inputs if isinstance(x, torch.Tensor) and x.dim() == 0 and x.dtype == torch.float64]
        assert not lifted and not any(isinstance(x, (float, torch.SymFloat)) for x in inputs)


def traced_sizes(monkeypatch, layers: int, copy: bool) -> tuple[int, int]:
    """(free symbols, shape guards) of the engine's traced step (CUDA's dynamo options, eager backend)
    on a random Qwen2 of `layers` layers with Qwen2.5-1.5B's head ratio, 12:2: decoding from its
    inference copy (bf16 autocast over fp32 weights: q|k|v and gate|up Stacked) or from the model
    itself, held in bf16 (its own projections)."""
    graphs = count_graphs(monkeypatch)
    lm = random_lm("qwen2", num_hidden_layers=layers, num_attention_heads=12, num_key_value_heads=2)
    if not copy:
        lm = lm.to(torch.bfloat16)
    engine = Engine(lm, compile="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=copy):
        engine_decode(engine, prompts([4, 9, 7, 12]), Sampling(temperature=0, max_new_tokens=3), -1)
    assert (engine._twin is not None) == copy and len(graphs) == 1
    sizes = [x for x in graphs[0][1] if isinstance(x, torch.SymInt)]
    symbols = set().union(*(free_symbols(x) for x in graphs[0][1] if isinstance(x, (torch.Tensor, torch.SymInt))))
    return len(symbols), len(sizes[0].node.shape_env.guards)


@pytest.mark.slow  # four traces
def test_only_rows_and_view_are_symbolic_at_any_depth(monkeypatch):
    """The step's only sizes are its rows and view (the columns attention reads): 2 free symbols,
    from the inference copy as from the plain model, at 2 layers as at 8, and as many shape guards,
    so a trace grows with depth no faster than the model. With Stacked a plain Python object and the
    slab's shapes left to dynamo, the copy's trace had 11 symbols and 293 guards at 2 layers, 29 and
    1,121 at 8 (the plain model's 4 and 12 at both), which took a 28-layer trace minutes (issue 53)."""
    counts = {(layers, copy): traced_sizes(monkeypatch, layers, copy) for layers in (2, 8) for copy in (False, True)}
    assert len(set(counts.values())) == 1, counts
    assert counts[2, True][0] == 2


def test_a_weight_the_inference_copy_lacks_is_named():
    """Under bf16 autocast the engine decodes from a bf16 copy built from the model's config; a
    weight added to the model after loading (a bias on the LM head) has no place there, and the
    engine says so instead of decoding a model without it."""
    lm = random_lm("qwen2")
    head = torch.nn.Linear(64, 64, bias=True)
    head.weight = lm.lm_head.weight
    lm.lm_head = head
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match=r"lm_head\.bias"):
        sample(lm, tokenizer(-1), prompts([3, 5]), Sampling(0, max_new_tokens=4, sampler=sampler_for("fast")))


# ============================================================================ the layers it runs itself

@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.slow
@pytest.mark.needs("peft")
def test_stacked_projections_write_what_hf_generate_writes(arch):
    """With LoRA adapters (B drawn at random, so they change what the model writes) the engine decodes
    from its own fp32 copy, in which q|k|v and gate|up are each one weight (Stacked) and the
    projections' parameters views of it: greedy, eager and traced with CUDA's dynamo options, it writes
    what HF generate writes on the adapted model (peft's separate layers)."""
    from extras.lora import add_lora
    from engine import Stacked
    lm = random_lm(arch)
    add_lora(lm, rank=4, alpha=32, targets="", base=".", dtype=torch.float32, seed=0)
    draw = torch.Generator().manual_seed(1)
    for name, p in lm.named_parameters():
        if ".lora_B." in name:
            p.data.copy_(0.05 * torch.randn(p.shape, generator=draw))
    rows = [p for p in prompts([3, 9, 5, 12, 7]) for _ in range(2)]
    greedy = Sampling(temperature=0, max_new_tokens=24)
    hf = [t for t, _ in sample(lm, tokenizer(-1), rows, replace(greedy, sampler=sampler_for()))]
    for compile in ("off", "eager"):
        engine = Engine(lm, compile=compile)
        assert [t for t, _ in engine_decode(engine, rows, greedy, -1)] == hf, compile
        assert all(isinstance(part, Stacked) for pair in engine._layers for part in pair)
        twin = engine._twin.model.layers[0]
        assert twin.self_attn.k_proj.weight.untyped_storage().data_ptr() == engine._layers[0][0].weight.data_ptr()


@pytest.mark.slow  # compiles the step
def test_the_slab_stays_where_it_was_allocated():
    """Three calls with an allocation of the slab's size made and freed between them: the slab is
    kept (not given back to the allocator, which would hand its memory to that allocation and the
    next call a new address), so every call finds it at one address and Engine.moves stays 0. A
    reserve made before the first call sizes it for a later, larger call too."""
    lm = random_lm("qwen2")
    engine = Engine(lm, compile="eager")
    engine.reserve(16, 64)
    greedy = Sampling(temperature=0, max_new_tokens=12)
    rows = prompts([4, 11, 7, 9])
    addresses = []
    for n in (4, 4, 16):
        engine_decode(engine, (rows * 4)[:n], greedy, -1)
        addresses.append([t.data_ptr() for t in engine.keys + engine.values])
        nbytes = sum(t.numel() * t.element_size() for t in engine.keys + engine.values)
        hog = torch.ones(nbytes // 4)  # the size of the slab: were it freed, this would take its place
        del hog
    assert addresses[0] == addresses[1] == addresses[2] and engine.moves == 0


def test_a_released_slab_is_given_back_and_taken_again():
    """--engine-release: after each call the slab holds no memory (the update may use it); the next
    call takes it again, zeroed, and still writes what HF generate writes."""
    lm = random_lm("llama")
    engine = Engine(lm)
    engine.reserve(4, 32, release=True)
    rows, greedy = prompts([4, 11, 7, 9]), Sampling(temperature=0, max_new_tokens=12)
    hf = [t for t, _ in sample(lm, tokenizer(-1), rows, replace(greedy, sampler=sampler_for()))]
    for _ in range(2):
        assert [t for t, _ in engine_decode(engine, rows, greedy, -1)] == hf
        assert all(t.untyped_storage().nbytes() == 0 for t in engine.keys + engine.values)


def launches_per_layer(arch: str, **config) -> int:
    """Kernels the inductor-compiled step (here on the CPU) launches per decoder layer: those of a
    2-layer model less those of a 1-layer one, read off the wrapper inductor writes (each generated kernel, each
    extern GEMM). Under bf16 autocast the engine decodes from its copy (Stacked)."""
    import re
    from torch._inductor.utils import run_and_get_code
    counts = []
    for layers in (1, 2):
        lm = random_lm(arch, num_hidden_layers=layers, **config)  # held: an engine keeps its model weakly
        engine = Engine(lm, compile="inductor")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _, codes = run_and_get_code(lambda: engine_decode(engine, prompts([4, 9, 7, 12]),
                                                              Sampling(temperature=0, max_new_tokens=3), -1))
        body = max(codes, key=len).split("def call(")[1]
        counts.append(len(re.findall(r"^\s+(?:buf\w+ = )?(?:cpp_fused\w*|extern_kernels\.\w+)\(", body, re.M)))
    return counts[1] - counts[0]


@pytest.mark.slow
@pytest.mark.extended  # inductor compiles C++ for tens of seconds on 2 cores; .ci/run runs it
def test_a_compiled_layer_is_eleven_kernels():
    """A Qwen2 layer of the compiled step is 11 kernels on the CPU: RMSNorm (with the residual add
    before it), the q|k|v GEMM, q's and k's rotary with the KV write, attention as three (the scores'
    batched GEMM, the scale, mask and softmax fused, the values' batched GEMM), o_proj, RMSNorm, the
    gate|up GEMM, SiLU · up, down_proj. HF's layers with the same attention were 15-16 (separate q, k,
    v, gate and up GEMMs); flex_attention's one kernel made 9, at the price of a 64-128-row query tile
    for one row on CUDA (engine.py's docstring)."""
    assert launches_per_layer("qwen2") == 11
