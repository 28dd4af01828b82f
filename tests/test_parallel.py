"""FSDP2, DDP and one process give the same update; activation checkpointing and dropout-off
really hold on the training path; FSDP rollouts generate from the full weights and leave the
sharded parameters in place.

Every 2-rank check runs in the session's one spawn of two gloo processes (helpers.share_two_ranks):
starting a rank costs seconds of imports on a 2-core machine, the checks themselves a fraction of
that. The LoRA checks (peft is optional) are shared only where peft is installed.
"""
import importlib.util
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, GPTBigCodeConfig, GPTBigCodeForCausalLM,
                          OPTConfig, OPTForCausalLM)

import algos
from config import Config
from extras.lora import AdaptersOff
from model import ResponseLogProbs, load_model, load_tokenizer
from parallel import autocast_context, full_weights, load_train_state, save_train_state, weights_dtype, wrap
from rewards import Problem
from rollout import Sampling, collate, encode_prompts, generate
from test_invariance import METRIC_ABS, METRIC_REL, config, make_episodes, one_update, policy
from train import Learner, update
from helpers import qwen2, sampler_for, save_random, share_two_ranks

CPU = torch.device("cpu")

# K > 1 for ROVER and PACS: they differ from policy gradient only from the 2nd mini-batch on
# (π_old ≠ π_θ). PACS with K = 3 has one group per mini-batch, so under 2 ranks rank 1 runs
# only dummy micro-batches, which must still join FSDP's reduce-scatters; β = 0.2 keeps its
# unclipped lr-1 steps small enough for 1e-5 (see test_invariance.CASES). GRPO with β > 0 also
# runs the frozen reference model, sharded like the policy under FSDP.
UPDATE_CASES = [("grpo", {"beta": 0.04}), ("rover", {"mini_batches": 2}),
                ("pacs", {"mini_batches": 3, "pacs_beta": 0.2})]
# LoRA (extras/lora.py) on a random Qwen2: only the adapters train, sharded with the frozen base in one
# FSDP group per layer; with beta > 0 the reference is the same sharded scorer with adapters off.
# α = r (scale 1): adapter gradients up to 0.08 and gaps of 3e-8 between the runs (measured); at
# α/r = 8 and lr-1 SGD the first step moves the adapters so far that the gaps reached 1.7e-6.
LORA = {"lora_rank": 4, "lora_alpha": 4.0}
LORA_CASES = [("grpo", {"beta": 0.04, **LORA}), ("rover", {"mini_batches": 2, **LORA})]

# Rollouts: the shipped tiny model (a random one writes one token over and over, whatever the
# prompt), rank r generating for PROBLEMS[r::2], G = 2 greedy samples each.
SHIPPED = str(Path(__file__).resolve().parent.parent / "assets" / "tiny-running-sum")
PROBLEMS = [Problem(f"Add {p}", "0") for p in ("12+7+30", "5+61+8", "40+3+17+2", "9+9+9", "23+45+6", "71+2+14")]
GREEDY = Sampling(temperature=0, max_new_tokens=12)
GROUP = 2


# ============================================================================ the 2-rank worker

def fsdp_update(model_dir, cfg, rank, world, gradient_checkpointing=False):
    """test_invariance.one_update with the policy (and reference) sharded by FSDP2, as train.main
    builds them. Returns (full fp32 weights, metrics, whether every parameter was a DTensor)."""
    torch.manual_seed(0)
    lm, adapters = policy(model_dir, cfg, gradient_checkpointing)
    scorer = wrap(ResponseLogProbs(lm), mode="fsdp", world=world, device=CPU, dtype=torch.float32)
    sharded = all(isinstance(p, DTensor) for p in lm.parameters())  # else the test proves nothing
    # SGD with lr 1: the parameter change is the gradient itself (Adam's first step would hide
    # a wrong gradient scale, e.g. a missing or doubled division by the world size, behind its
    # sign-like normalisation).
    opt = torch.optim.SGD([p for p in lm.parameters() if p.requires_grad], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ref = None
    if cfg.beta > 0 and adapters:  # LoRA: the sharded policy itself, adapters off
        ref = AdaptersOff(scorer, adapters)
    elif cfg.beta > 0:
        ref = wrap(ResponseLogProbs(load_model(model_dir, trainable=False)), mode="fsdp", world=world,
                   device=CPU, dtype=torch.float32, trainable=False)
    learner = Learner(scorer=scorer, lm=lm, ref_scorer=ref, optimizer=opt, scheduler=sched, algo=algos.get(cfg.algo),
                      cfg=cfg, autocast=nullcontext, pad_id=0, rank=rank, world=world, device=CPU)
    metrics = update(learner, make_episodes(chunked=cfg.max_chunks > 1))
    # full_tensor is a collective: every rank gathers, rank 0 keeps the result
    full = {k: (v.full_tensor() if isinstance(v, DTensor) else v).detach().clone()
            for k, v in lm.state_dict().items()}
    return full, metrics, sharded


def greedy_tokens(lm, tok, problems, batch_size=0, engine="hf", compile="auto") -> list[list[int]]:
    eps = generate(lm, tok, problems, encode_prompts(tok, problems, chat_template=True), group_size=GROUP,
                   sampling=replace(GREEDY, sampler=sampler_for(engine, compile)), batch_size=batch_size)
    return [e.response_ids for e in eps]


def fsdp_rollouts(model_dir, rank, world) -> dict:
    """Greedy tokens of the plain model, then of the FSDP-sharded one inside full_weights: every
    rank at once, in batches of one group (fewer sequences than the rank has), and rank 0 alone."""
    tok = load_tokenizer(model_dir)
    mine = PROBLEMS[rank::world]
    plain = load_model(model_dir)
    out = {"plain": greedy_tokens(plain, tok, mine)}
    lm = load_model(model_dir)
    scorer = wrap(ResponseLogProbs(lm), mode="fsdp", world=world, device=CPU, dtype=torch.float32)
    opt = torch.optim.SGD(lm.parameters(), lr=1.0)
    shards = list(lm.parameters())
    with full_weights(scorer):
        out["together"] = greedy_tokens(lm, tok, mine)
        out["batched"] = greedy_tokens(lm, tok, mine, batch_size=GROUP)
        # Rank 1 goes on to the engine and waits in the next collective (full_tensor below). Were
        # rank 0's generate to wait for it (HF's synced_gpus, or a layer all-gathering per forward),
        # that collective times out or aborts and the fixture fails.
        if rank == 0:
            out["alone"] = greedy_tokens(lm, tok, mine)
        # last in the block: the engine copies the gathered layers and reshards them (Engine.runner)
        out["engine"] = greedy_tokens(lm, tok, mine, engine="fast")
    params = list(lm.parameters())
    out["same_objects"] = len(params) == len(shards) and all(a is b for a, b in zip(params, shards))
    out["optimizer_holds_them"] = all(a is b for a, b in zip(opt.param_groups[0]["params"], params))
    out["sharded"] = all(isinstance(p, DTensor) and p.to_local().numel() < p.numel() for p in params)
    out["weights_kept"] = all(torch.equal(p.full_tensor(), q) for p, q in zip(params, plain.parameters()))
    return out


def lora_rollouts(model_dir, rank, world) -> dict:
    """Greedy tokens of the base model, of a LoRA policy (test_invariance.policy: B drawn at random,
    so the adapters change what it writes) as one process, and of that policy sharded by FSDP inside
    full_weights, with HF generate and with the engine."""
    tok, mine, cfg = load_tokenizer(model_dir), PROBLEMS[rank::world], Config(lora_rank=4)
    out = {"base": greedy_tokens(load_model(model_dir), tok, mine),
           "plain": greedy_tokens(policy(model_dir, cfg)[0], tok, mine)}
    lm, _ = policy(model_dir, cfg)
    scorer = wrap(ResponseLogProbs(lm), mode="fsdp", world=world, device=CPU, dtype=torch.float32)
    with full_weights(scorer):
        out["hf"], out["fast"] = greedy_tokens(lm, tok, mine), greedy_tokens(lm, tok, mine, engine="fast")
    return out


def compiled_rounds(model_dir, rank, world, mode: str, lora: bool) -> dict:
    """3 rounds of (greedy rollout by HF generate, the same by the engine with its step traced as on
    CUDA: fullgraph=True, the eager backend; one optimizer step) on the policy wrapped as train.main
    wraps it (DDP or FSDP2, LoRA or not), each rollout inside full_weights. Per round: both token
    lists and the engine's cumulative compile count."""
    import engine
    tok, mine = load_tokenizer(model_dir), PROBLEMS[rank::world]
    lm, _ = policy(model_dir, Config(lora_rank=4 if lora else 0))
    scorer = wrap(ResponseLogProbs(lm), mode=mode, world=world, device=CPU, dtype=torch.float32)
    opt = torch.optim.SGD([p for p in lm.parameters() if p.requires_grad], lr=0.05)
    batch = collate(make_episodes()[:4], 0, CPU)
    before, rounds = engine.compile_count(), []
    for _ in range(3):
        with full_weights(scorer):
            hf = greedy_tokens(lm, tok, mine)
            fast = greedy_tokens(lm, tok, mine, engine="fast", compile="eager")
        rounds.append({"hf": hf, "fast": fast, "compiles": engine.compile_count() - before})
        logp = scorer(batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 1.0)["logp"]
        logp.sum().backward()  # make the likelier tokens likelier still: the weights move every round
        opt.step()
        opt.zero_grad()
    return {"rounds": rounds, "engine": engine.Engine.of(lm, "eager")}


def every_mode(model_dir, cfg, rank, world) -> dict:
    """One update of cfg under DDP, FSDP2 and FSDP2 with gradient checkpointing."""
    got = {"ddp": one_update(model_dir, cfg, rank, world)}
    for mode, ckpt in (("fsdp", False), ("fsdp+checkpointing", True)):
        weights, metrics, sharded = fsdp_update(model_dir, cfg, rank, world, gradient_checkpointing=ckpt)
        got[mode] = (weights, metrics)
        got[f"{mode} sharded"] = sharded
    return got


def on_two_ranks(rank, world, dirs, lora=False) -> dict:
    """The checks without LoRA on the random Llama, or (lora) those with it on the random Qwen2."""
    model_dir = dirs["qwen2" if lora else "random_model"]
    if lora:
        result = {"lora": [every_mode(model_dir, config(algo, over, micro=3), rank, world) for algo, over in LORA_CASES]}
    else:
        result = {"updates": {algo: every_mode(model_dir, config(algo, over, micro=3), rank, world)
                              for algo, over in UPDATE_CASES}}
    name, rollouts = ("lora_rollouts", lora_rollouts) if lora else ("rollouts", fsdp_rollouts)
    result[name] = [None] * world
    dist.all_gather_object(result[name], rollouts(SHIPPED, rank, world))
    for mode in (mode for mode, with_lora in COMPILED_CASES if with_lora == lora):
        got = compiled_rounds(SHIPPED, rank, world, mode, lora)
        eng = got.pop("engine")
        got.update(copy=eng._twin is not None, moves=eng.moves)
        result[f"compiled {mode}{' lora' * lora}"] = [None] * world
        dist.all_gather_object(result[f"compiled {mode}{' lora' * lora}"], got)
    return result


def lora_on_two_ranks(rank, world, dirs) -> dict:
    return on_two_ranks(rank, world, dirs, lora=True)


share_two_ranks("parallel", on_two_ranks)
if importlib.util.find_spec("peft"):  # optional: without it the LoRA tests skip (needs), and nothing is computed
    share_two_ranks("parallel lora", lora_on_two_ranks)


@pytest.fixture(scope="module")
def two_ranks(spawned_ranks):
    return spawned_ranks["parallel"]


@pytest.fixture(scope="module")
def two_ranks_lora(spawned_ranks):
    return spawned_ranks["parallel lora"]


# ============================================================================ 1. same update

@pytest.mark.parametrize("algo,over", UPDATE_CASES, ids=[a for a, _ in UPDATE_CASES])
@pytest.mark.slow
def test_fsdp_ddp_and_one_process_agree(algo, over, random_model_dir, two_ranks):
    """One mini-batch: 1 process, micro-batch 12 vs 2 ranks, micro-batch 3, under DDP and FSDP2
    (also with HF's gradient checkpointing inside the sharded layers: the real-model setting)."""
    base, base_metrics = one_update(random_model_dir, config(algo, over, micro=12))
    start = load_model(random_model_dir).state_dict()
    assert any((base[k] - start[k]).abs().max() > 1e-4 for k in base)  # the step did something
    got = two_ranks["updates"][algo]
    for mode in ("ddp", "fsdp", "fsdp+checkpointing"):
        assert mode == "ddp" or got[f"{mode} sharded"], f"{mode}: some parameter left unsharded"
        weights, metrics = got[mode]
        assert weights.keys() == base.keys()
        for k in base:
            assert torch.allclose(base[k], weights[k], atol=1e-5), f"{mode} differs at {k}"
        assert metrics.keys() == base_metrics.keys()
        for k in base_metrics:  # loss, entropy, grad norm (global over shards) and the algorithm's own
            if k.startswith("layout/"):  # the tensors' shapes follow the ranks' split by design
                continue
            assert metrics[k] == pytest.approx(base_metrics[k], rel=METRIC_REL, abs=METRIC_ABS), (mode, k)


@pytest.mark.parametrize("case", range(len(LORA_CASES)), ids=[a for a, _ in LORA_CASES])
@pytest.mark.slow
@pytest.mark.needs("peft")
def test_lora_gradients_agree_on_one_process_ddp_and_fsdp(case, two_ranks_lora, qwen2_dir):
    """LoRA on a random Qwen2, one mini-batch under SGD with lr 1 (the change of a weight is its
    gradient): 1 process with micro-batch 12 against 2 ranks with micro-batch 3 under DDP, FSDP2
    and FSDP2 with gradient checkpointing; the adapters agree to 1e-6, every base weight is
    bitwise what was loaded (and no base weight changed on 1 process either)."""
    algo, over = LORA_CASES[case]
    base, base_metrics = one_update(qwen2_dir, config(algo, over, micro=12))
    start = load_model(qwen2_dir).state_dict()
    adapters = [k for k in base if ".lora_" in k]
    assert len(adapters) == 2 * 7 * 2  # A and B of 7 linear layers in 2 decoder layers
    frozen = {k.replace(".base_layer.", "."): k for k in base if ".lora_" not in k}
    assert frozen.keys() == start.keys()
    assert all(torch.equal(start[k], base[f]) for k, f in frozen.items())
    for mode in ("ddp", "fsdp", "fsdp+checkpointing"):
        assert mode == "ddp" or two_ranks_lora["lora"][case][f"{mode} sharded"], mode
        weights, metrics = two_ranks_lora["lora"][case][mode]
        assert all(torch.equal(start[k], weights[f]) for k, f in frozen.items()), f"{mode}: a base weight changed"
        for k in adapters:
            gap = (weights[k] - base[k]).abs().max()
            assert gap <= 1e-6, f"{mode} differs at {k} by {gap:.2e}"
        for k in base_metrics:
            if k.startswith("layout/"):  # the tensors' shapes follow the ranks' split by design
                continue
            assert metrics[k] == pytest.approx(base_metrics[k], abs=1e-5), (mode, k)


@pytest.mark.slow
@pytest.mark.needs("peft")
def test_lora_rollouts_see_the_adapters_with_both_engines_under_fsdp(two_ranks_lora):
    """Greedy tokens of a LoRA policy sharded by FSDP, inside full_weights: HF generate and the
    engine both write what the one-process adapted model writes, which is not what the base writes."""
    for rank, r in enumerate(two_ranks_lora["lora_rollouts"]):
        assert r["hf"] == r["plain"] and r["fast"] == r["plain"], rank
    assert any(r["plain"] != r["base"] for r in two_ranks_lora["lora_rollouts"])


# ============================================================================ 4. FSDP rollouts

@pytest.mark.slow
def test_fsdp_rollouts_use_full_weights_and_leave_shards(two_ranks):
    """Inside full_weights the sharded model greedily writes exactly what the plain one does (all
    ranks, in batches, with the fast engine, rank 0 alone); after it the optimizer's sharded parameters are back."""
    for rank, r in enumerate(two_ranks["rollouts"]):
        assert len(r["plain"]) == len(PROBLEMS[rank::2]) * GROUP
        assert len({tuple(t) for t in r["plain"]}) == len(r["plain"]) // GROUP  # each prompt its own answer
        assert r["together"] == r["plain"], rank
        assert r["batched"] == r["plain"], rank
        assert r["engine"] == r["plain"], rank  # engine.Fast on the unsharded FSDP model
        assert r["same_objects"] and r["optimizer_holds_them"], "full_weights replaced the parameters"
        assert r["sharded"], "parameters not resharded after full_weights"
        assert r["weights_kept"]
    assert two_ranks["rollouts"][0]["alone"] == two_ranks["rollouts"][0]["plain"]
    assert two_ranks["rollouts"][0]["plain"] != two_ranks["rollouts"][1]["plain"]  # ranks had different prompts


COMPILED_CASES = [("fsdp", False), ("ddp", False), ("fsdp", True)]


@pytest.mark.parametrize("mode,lora", [pytest.param(m, lora, id=f"{m}{'-lora' * lora}",
                                                    marks=pytest.mark.needs("peft") if lora else ())
                                       for m, lora in COMPILED_CASES])
@pytest.mark.slow
def test_the_traced_engine_runs_on_wrapped_policies(mode, lora, request):
    """The engine's step traced as CUDA traces it (fullgraph=True; FSDP2's hooks are marked
    untraceable, so the step must run on the hook-free inference copy) on a policy under DDP or
    FSDP2, with LoRA or not: greedy, it writes HF generate's tokens in each of 3 rounds with an
    optimizer step between; the step compiles once (one sampling mode) and never again, although
    FSDP gathers the weights anew at every rollout. DDP in fp32 needs no copy (the model itself is hook-free); FSDP and
    LoRA decode from the copy. No call after the first finds the slab or a weight at a new address
    (the slab is kept between calls; the copy is refreshed in place), so on CUDA no graph is
    recorded again."""
    two_ranks = request.getfixturevalue("two_ranks_lora" if lora else "two_ranks")
    for rank, got in enumerate(two_ranks[f"compiled {mode}{' lora' * lora}"]):
        for r in got["rounds"]:
            assert r["fast"] == r["hf"], rank
        assert [r["compiles"] for r in got["rounds"]] == [1, 1, 1], rank
        assert got["copy"] == (mode == "fsdp" or lora), rank
        assert got["moves"] == 0, rank
    rounds = two_ranks[f"compiled {mode}{' lora' * lora}"][0]["rounds"]
    assert rounds[0]["hf"] != rounds[-1]["hf"]  # the optimizer steps changed what the policy writes


# ============================================================================ 2. activation checkpointing

@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A random 8-layer Qwen2: activations of 8 layers against those of the embeddings and head."""
    return qwen2(tmp_path_factory.mktemp("qwen2-8"), hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                 max_position_embeddings=128, attention_dropout=0.0)


def saved_activation_bytes(scorer, batch) -> tuple[int, dict]:
    """Bytes of the tensors autograd saves for backward in one grad-enabled forward, each storage
    counted once. A checkpointed layer's inputs are among them (torch saves them through autograd
    before it recomputes, so our hook sees them); parameters do not count: they are held anyway."""
    params = {p.untyped_storage().data_ptr() for p in scorer.parameters()}
    seen = {}

    def pack(t):  # a tensor kept alive by the graph, so its storage address is not reused meanwhile
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = scorer(batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 1.0)
    return sum(seen.values()), out


def test_gradient_checkpointing_cuts_saved_activations(qwen_dir):
    """Through load_model (train mode: HF checkpoints only then), 8 checkpointed layers keep only
    their inputs: ~14× fewer saved bytes here. It falls to 1× if the model is in eval mode."""
    batch = collate(make_episodes(), 0, CPU)
    saved, grads = {}, {}
    for flag in (False, True):
        lm = load_model(qwen_dir, gradient_checkpointing=flag)  # the training path: train mode
        scorer = ResponseLogProbs(lm)
        saved[flag], out = saved_activation_bytes(scorer, batch)
        (out["logp"] * batch.response_mask).sum().backward()
        grads[flag] = {n: p.grad for n, p in lm.named_parameters()}
    assert saved[False] >= 5 * saved[True], f"saved bytes off/on: {saved}"
    for n, g in grads[False].items():  # recomputation gives the same gradients
        assert torch.allclose(g, grads[True][n], atol=1e-5), n


# ============================================================================ 3. dropout off

def gpt2(path) -> str:
    torch.manual_seed(0)
    cfg = GPT2Config(vocab_size=128, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                     resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5)
    return save_random(GPT2LMHeadModel(cfg), path)


def two_forwards(lm, batch):
    """π_old (no grad) and π_θ (with grad) log-probs of the same weights, as train.update runs them."""
    scorer = ResponseLogProbs(lm)
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 1.0)
    with torch.no_grad():
        old = scorer(*args)["logp"]
    return old, scorer(*args)["logp"].detach()


def opt(path) -> str:
    torch.manual_seed(0)
    cfg = OPTConfig(vocab_size=128, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=4,
                    word_embed_proj_dim=32, max_position_embeddings=64, dropout=0.5, attention_dropout=0.5)
    return save_random(OPTForCausalLM(cfg), path)


def gpt_bigcode(path) -> str:
    torch.manual_seed(0)
    cfg = GPTBigCodeConfig(vocab_size=128, n_embd=32, n_layer=2, n_head=4, n_positions=64,
                           attn_pdrop=0.5, resid_pdrop=0.5, embd_pdrop=0.5)
    return save_random(GPTBigCodeForCausalLM(cfg), path)


@pytest.mark.parametrize("build", [qwen2, gpt2, opt, gpt_bigcode])
def test_dropout_is_off_in_train_mode(build, tmp_path):
    """π_old and π_θ must be the same function of the weights: a dropout kept on in train mode
    (needed for checkpointing) would make every ratio noise. Qwen2 passes its dropout to the
    attention kernel as a float; GPT-2 has nn.Dropout modules (embeddings, residual, attention);
    OPT applies F.dropout with a float of its own; GPTBigCode passes attn_pdrop to the kernel."""
    path = build(tmp_path)
    batch = collate(make_episodes(), 0, CPU)
    torch.manual_seed(1)
    # the config's dropout is live in plain HF train mode, so the check below is not vacuous
    old, new = two_forwards(AutoModelForCausalLM.from_pretrained(path).train(), batch)
    assert not torch.equal(old, new)
    lm = load_model(path)
    assert lm.training
    old, new = two_forwards(lm, batch)
    assert torch.equal(old, new)


# ============================================================================ 5. train state

def test_train_state_saved_before_any_step_gives_adamw_no_step(random_model_dir, tmp_path):
    """A checkpoint before the first optimizer step (PSR with nothing correct, say) must not
    change the run: DCP would give a fresh AdamW a zero-gradient step to have a state to save,
    and the first real step would then be bias-corrected as the second."""
    lm = load_model(random_model_dir)
    optimizer = torch.optim.AdamW(lm.parameters(), lr=0.1)
    save_train_state(tmp_path / "ts", lm, optimizer)
    assert not optimizer.state
    fresh = load_model(random_model_dir)
    reloaded = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    load_train_state(tmp_path / "ts", fresh, reloaded)
    assert not reloaded.state
    assert all(torch.equal(p, q) for p, q in zip(lm.parameters(), fresh.parameters()))


def test_reference_equals_the_policy_at_step_0_under_ddp_and_bf16_autocast(random_model_dir):
    """Under DDP the policy keeps fp32 weights and bf16 autocast casts only matmul inputs, so the
    frozen reference must keep fp32 weights too: a bf16 copy differs by ~0.05 nats a token, and
    the KL term would push the policy away from itself at step 0."""
    cfg = Config(precision="bf16", parallel="ddp")
    batch = collate(make_episodes(), 0, CPU)
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 1.0)
    policy = ResponseLogProbs(load_model(random_model_dir))
    ref = ResponseLogProbs(load_model(random_model_dir, dtype=weights_dtype(cfg, CPU), trainable=False))
    with torch.no_grad(), autocast_context(cfg, CPU)():
        assert torch.equal(policy(*args)["logp"], ref(*args)["logp"])
