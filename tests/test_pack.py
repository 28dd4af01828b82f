"""--pack (packing.py): packed rows give the padded rows' log-probs, losses, metrics, gradients and weights.

The padded update is the reference: every registered --algo (test_invariance's cases, which also hold
Delethink chunks, multi-turn traces and a teacher), one mini-batch each, in this process; then 2 ranks
under DDP and FSDP2, LoRA, and 3 optimizer steps; then train.py itself under torchrun. Only the
layout/ metrics, which say what the tensors held, may differ.
"""
from contextlib import contextmanager, nullcontext
from dataclasses import replace

import pytest
import torch

import algos
import packing
from config import Config
from helpers import random_lm, share_two_ranks
from model import ResponseLogProbs, load_model
from parallel import wrap
from rollout import Chunk, Episode, collate
from rewards import Problem
from test_invariance import CASES, METRIC_ABS, METRIC_REL, config, make_episodes, policy
from train import Learner, split_minibatches, update

CPU = torch.device("cpu")
# every registered method: test_invariance's cases, GDPO (its one term, correct, needs its reward in details) and SFT
ALL_CASES = [*CASES, ("gdpo", {}), ("sft", {})]


# ============================================================================ the layout

def test_plan_takes_few_rows_then_the_shortest_length():
    assert packing.first_fit([0, 1, 2, 3], [5, 3, 3, 2], 8) == [[0, 1], [2, 3]]
    assert packing.plan([5, 3, 3, 2], 8) == [[0, 3], [1, 2]]  # rows of 7 and 6, not 8 and 5
    assert packing.plan([4], 9) == [[0]]


@pytest.mark.parametrize("seed", range(20))
def test_plan_never_costs_more_than_the_padded_rows(seed):
    """Each sequence once, no row over the padded width W, no more rows than sequences: R·L ≤ N·W
    tokens and R·L² ≤ N·W² of attention (packing.py's reason for the row budget)."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 40, (1,), generator=g))
    lengths = (torch.randint(1, 60, (n,), generator=g) ** 2 // 60 + 1).tolist()  # long-tailed
    width = max(lengths) + int(torch.randint(0, 20, (1,), generator=g))
    rows = packing.plan(lengths, width)
    assert sorted(i for row in rows for i in row) == list(range(n))
    fill = [sum(lengths[i] for i in row) for row in rows]
    assert max(fill) <= width and len(rows) <= n
    assert len(rows) == len(packing.first_fit(sorted(range(n), key=lambda i: -lengths[i]), lengths, width))


def test_layout_lays_real_tokens_end_to_end_with_restarting_positions():
    source, positions = packing.layout(torch.tensor([[0, 1, 1], [1, 1, 1]]))
    assert source.tolist() == [[3, 4, 5], [1, 2, -1]]
    assert positions.tolist() == [[0, 1, 2], [0, 1, 0]]
    assert packing.packed_tokens(torch.tensor([[1] * 5 + [0] * 3, [1] * 3 + [0] * 5, [1] * 3 + [0] * 5,
                                               [1] * 2 + [0] * 6])) == 14


def unit(tokens: int) -> list:
    return [(None, Chunk([5] * (tokens - 1), [6]))]


def test_share_balances_ranks_by_tokens_and_caps_micro_batches():
    units = [unit(n) for n in (9, 5, 4, 2)]
    ranks = packing.share(units, 2, Config(micro_batch_size=8))
    assert [[packing.row_tokens(m) for m in micro] for micro in ranks] == [[11], [9]]
    assert [len(m) for m in packing.share(units, 1, Config(micro_batch_size=3))[0]] == [3, 1]  # rows ≤ the cap
    tokens = Config(micro_batch_size=8, max_tokens_per_micro_batch=10)
    assert [packing.row_tokens(m) for m in packing.share(units, 1, tokens)[0]] == [9, 9, 2]


def test_two_ranks_get_about_equal_tokens_from_long_tailed_rows():
    """Most responses short, a tail to the budget: the busiest rank holds at most 4/3 of the mean
    (LPT's bound), where cutting the rows in two runs of equal count leaves one rank most of the tail."""
    g = torch.Generator().manual_seed(0)
    lengths = (torch.rand(64, generator=g) ** 4 * 500 + 10).long().tolist()
    units = [unit(n) for n in lengths]
    per_rank = [sum(packing.row_tokens(m) for m in micro) for micro in packing.share(units, 2, Config())]
    assert max(per_rank) / (sum(per_rank) / 2) <= 4 / 3
    assert sum(per_rank) == sum(lengths)


@pytest.mark.parametrize("seed", range(3))
def test_a_long_tail_on_one_rank_packs_within_five_percent_of_its_real_tokens(seed):
    """128 rows (prompts of 20, responses of 8 + 392·u⁴), micro-batches of 64: in runs of consecutive
    rows one micro-batch holds the 64 shortest, whose narrow width leaves each its own packed row
    (7-13% more tokens than real on these seeds); spread, short rows fill the long rows' packed rows."""
    g = torch.Generator().manual_seed(seed)
    units = [[(None, Chunk([5] * 20, [6] * int(8 + 392 * u ** 4)))] for u in torch.rand(128, generator=g).tolist()]
    (micro,) = packing.share(units, 1, Config(micro_batch_size=64))
    assert sorted(map(id, (u[0] for u in units))) == sorted(id(row) for m in micro for row in m)
    assert max(len(m) for m in micro) <= 64
    assert sum(packing.micro_size(m) for m in micro) <= 1.05 * sum(packing.row_tokens(u) for u in units)


# ============================================================================ the scorer

@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma2"])
def test_scorer_gives_the_padded_log_probs_entropy_vocab_mean_and_gradients(arch):
    """Ragged prompts and responses, 4 rows of 2-11 + 1-9 tokens: per token, packed = padded to 1e-5
    (relative to the largest value), and so is the gradient of every parameter. gemma2: sliding windows
    (window 4 here, so that it bites) and soft-capped logits."""
    lm = random_lm(arch, **({"sliding_window": 4} if arch == "gemma2" else {})).train()
    g = torch.Generator().manual_seed(1)
    lengths = zip(torch.randint(2, 12, (4,), generator=g).tolist(), torch.randint(1, 10, (4,), generator=g).tolist())
    rows = [Chunk(torch.randint(2, 60, (p,), generator=g).tolist(), torch.randint(2, 60, (r,), generator=g).tolist())
            for p, r in lengths]
    batch = collate(rows, 0, CPU)
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 0.7)
    padded, packed = (ResponseLogProbs(lm, pack=p)(*args, vocab_mean=True, entropy_grad=True) for p in (False, True))
    assert packing.packed_tokens(batch.attention_mask) < batch.input_ids.numel()  # it packed something
    for name in ("logp", "entropy", "vocab_mean"):
        assert (padded[name] - packed[name]).abs().max() <= 1e-5 * padded[name].abs().max(), name
    params = [p for p in lm.parameters() if p.requires_grad]
    for a, b in zip(*(torch.autograd.grad((out["logp"] + out["entropy"]).sum(), params) for out in (padded, packed))):
        assert (a - b).abs().max() <= 1e-5 * a.abs().max()


# ============================================================================ the update

def learner(model_dir, cfg, rank=0, world=1, mode="ddp", lr=1.0):
    """As test_invariance.one_update builds it, under `mode` (ddp or fsdp), SGD at `lr`: the change of a
    weight is lr times its gradient."""
    torch.manual_seed(0)
    lm, adapters = policy(model_dir, cfg)
    scorer = wrap(ResponseLogProbs(lm, pack=cfg.pack), mode=mode, world=world, device=CPU, dtype=torch.float32)
    opt = torch.optim.SGD([p for p in lm.parameters() if p.requires_grad], lr=lr)
    ref = None
    if cfg.beta > 0:
        from extras.lora import AdaptersOff
        ref = AdaptersOff(scorer, adapters) if adapters else wrap(
            ResponseLogProbs(load_model(model_dir, trainable=False), pack=cfg.pack),
            mode=mode, world=world, device=CPU, dtype=torch.float32, trainable=False)
    if cfg.teacher:  # OPD: test_invariance's moved teacher
        teacher, draw = load_model(model_dir, trainable=False), torch.Generator().manual_seed(2)
        for p in teacher.parameters():
            p.data.add_(0.05 * torch.randn(p.shape, generator=draw))
        ref = ResponseLogProbs(teacher, pack=cfg.pack)
    return Learner(scorer=scorer, lm=lm, ref_scorer=ref, optimizer=opt,
                   scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), algo=algos.get(cfg.algo),
                   cfg=cfg, autocast=nullcontext, pad_id=0, rank=rank, world=world, device=CPU)


def episodes_for(cfg) -> list[Episode]:
    eps = make_episodes(chunked=cfg.max_chunks > 1, turns=bool(cfg.env))
    for e in eps:  # GDPO's one term
        e.details = {"reward/correct": e.reward}
    return eps


def run(model_dir, cfg, rank=0, world=1, mode="ddp", steps=1, lr=1.0) -> tuple[dict, dict]:
    """(full fp32 weights, the last update's metrics) after `steps` updates on the same episodes."""
    learn = learner(model_dir, cfg, rank, world, mode, lr)
    for _ in range(steps):
        metrics = update(learn, episodes_for(cfg))
    state = learn.lm.state_dict()
    return {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
            for k, v in state.items()}, metrics


# A gradient is an fp32 sum of terms of both signs (advantages above and below their group's mean), whose
# rounding scales with the terms, not with what is left of them. Regrouping those sums alone moves the
# weights: DAPO's one update (case dapo-1), padded, with the head's log-probs taken 3 tokens at a time
# instead of the automatic chunk (the same arithmetic in other groups, nothing else changed) lands 1.34e-5
# of a tensor's largest change away, and packed 1.07e-5 (an AMD EPYC family 25 model 17; under 1e-5 on a
# model 1). So twice that floor, rounded up: 3e-5. A packing bug is far above it: positions that run on
# across a row (attention across sequence boundaries) put dapo-1's weights 1.7 of their change away.
WEIGHT_REL = 3e-5


def weight_gap(a: dict, b: dict, start: dict) -> float:
    """The largest gap between two runs' weights over tensors, each relative to that tensor's largest change
    from `start` (lr × its gradients, at least 1e-3), less the 2 ulps of fp32 that storing a weight of that
    size rounds to (a weight near 1 holds a change only to 1.2e-7)."""
    gaps = []
    for k in a:
        change = max((a[k] - start[k]).abs().max(), 1e-3)
        ulps = 2 * torch.finfo(torch.float32).eps * a[k].abs().max()
        gaps.append(float(((a[k] - b[k]).abs().max() - ulps).clamp(min=0) / change))
    return max(gaps)


def assert_same(padded, packed, start) -> None:
    """Weights to WEIGHT_REL (weight_gap); metrics to test_invariance's tolerances, the layout/ ones excepted."""
    (wa, ma), (wb, mb) = padded, packed
    assert weight_gap(wa, wb, start) <= WEIGHT_REL
    assert ma.keys() == mb.keys()
    for k in ma:
        if not k.startswith("layout/"):
            assert mb[k] == pytest.approx(ma[k], rel=METRIC_REL, abs=METRIC_ABS), k


def case_config(case, micro, **over):
    algo, extra = ALL_CASES[case]
    return replace(config(algo, extra, micro=micro), **over)


def test_every_registered_method_is_a_case():
    assert {a for a, _ in ALL_CASES} == set(algos.ALGORITHMS)


@pytest.mark.parametrize("case", range(len(ALL_CASES)), ids=[f"{a}-{i}" for i, (a, _) in enumerate(ALL_CASES)])
@pytest.mark.slow
def test_packed_update_equals_padded(case, random_model_dir):
    """One update, micro-batches of 4 rows padded (split by rows) against packed (split by tokens), and
    the packed one takes fewer tensor tokens whenever the rows are ragged."""
    cfg = case_config(case, micro=4)
    start = policy(random_model_dir, cfg)[0].state_dict()
    padded = run(random_model_dir, cfg)
    packed = run(random_model_dir, replace(cfg, pack=True))
    assert_same(padded, packed, start)
    assert packed[1]["layout/tensor_tokens"] < padded[1]["layout/tensor_tokens"]
    assert packed[1]["layout/real_tokens"] == padded[1]["layout/real_tokens"]


# 2 ranks: plain, whole groups (PACS), a batch-wide token choice, Delethink chunks, multi-turn turns, a teacher;
# FSDP; LoRA (under DDP and FSDP); and three steps
TWO_RANK = [("grpo", {}, "ddp"), ("pacs", {"mini_batches": 3, "pacs_beta": 0.2}, "ddp"),
            ("kl_cov", {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0, "mini_batches": 2, "max_chunks": 3}, "ddp"),
            ("delethink", {}, "ddp"), ("grpo", {"env": "calculator"}, "ddp"), ("opd", {"teacher": "moved"}, "ddp"),
            ("dapo", {"mask_truncated": True}, "fsdp"), ("delethink", {}, "fsdp"),
            ("grpo", {"lora_rank": 4, "lora_alpha": 4.0, "beta": 0.04}, "ddp"),
            ("grpo", {"lora_rank": 4, "lora_alpha": 4.0}, "fsdp")]
STEPS = 3


def two_rank_config(algo, over, micro):
    lora = {"lora_targets": "q_proj,v_proj"} if "lora_rank" in over else {}
    return replace(config(algo, over, micro=micro), **lora)


def on_two_ranks(rank, world, dirs) -> list:
    """Each TWO_RANK case packed on 2 ranks, micro-batch 3: one update with SGD at lr 1, then 3 at lr 0.1."""
    out = []
    for algo, over, mode in TWO_RANK:
        cfg = replace(two_rank_config(algo, over, micro=3), pack=True)
        try:
            out.append({"one": run(dirs["random_model"], cfg, rank, world, mode),
                        "three": run(dirs["random_model"], cfg, rank, world, mode, steps=STEPS, lr=0.1)})
        except Exception as e:  # reported by that case's test
            out.append({"error": f"{type(e).__name__}: {e}"})
    return out


share_two_ranks("pack", on_two_ranks)


@pytest.mark.parametrize("case", [pytest.param(i, id=f"{a}-{m}-{i}", marks=[pytest.mark.needs("peft")] if "lora_rank" in o else [])
                                  for i, (a, o, m) in enumerate(TWO_RANK)])  # LoRA's cases need peft
@pytest.mark.slow
def test_packed_on_two_ranks_equals_padded_on_one(case, random_model_dir, spawned_ranks):
    """Packed on 2 ranks (DDP or FSDP2, LoRA too) against padded on 1 process with micro-batch 12: one
    update, and the weights after 3."""
    algo, over, _ = TWO_RANK[case]
    two = spawned_ranks["pack"][case]
    assert "error" not in two, two.get("error")
    cfg = two_rank_config(algo, over, micro=12)
    start = policy(random_model_dir, cfg)[0].state_dict()
    assert_same(run(random_model_dir, cfg), two["one"], start)
    assert_same(run(random_model_dir, cfg, steps=STEPS, lr=0.1), two["three"], start)
    assert two["one"][1]["layout/rank_spread"] >= 1.0


# ============================================================================ train.py, end to end

E2E = {"default": [], "lora, fsdp": ["--lora-rank", "4", "--parallel", "fsdp"],
       "delethink": ["--config", "configs/tiny_delethink.yaml", "--max-chunks", "3"],
       "tools": ["--config", "configs/tiny_grpo_tool.yaml", "--max-turns", "2"]}


# AdamW steps every element by about lr whatever its gradient's size, so an element whose gradient is mostly
# cancellation carries that sum's rounding into its step: over 3 steps the same padded run cut into micro-batches
# of 2 rows lands as far from itself as the packed one (LoRA + FSDP, 2026-12-04: 2.3e-4 of a tensor's largest
# entry, packed 1.8e-4; lora_A is small, its lr × 10), where SGD agrees to WEIGHT_REL
# (test_packed_on_two_ranks_equals_padded_on_one). That regrouped run is each case's floor.
@pytest.mark.parametrize("name", E2E)
@pytest.mark.extended  # twelve torchrun launches: CI's second part runs them (docs/testing.md)
def test_three_steps_of_train_py_packed_end_with_the_padded_weights(name, tmp_path):
    """torchrun, 2 ranks, 3 steps of 4 prompts × 4 (AdamW, sampled rollouts) with and without --pack:
    every logged value but the timings and the layout/ metrics agrees to 1e-5 relative, and each saved
    weight tensor to 1e-5 of its largest entry or to twice the floor, whichever is larger."""
    from safetensors.torch import load_file

    from helpers import ROOT, metrics, torchrun
    flags = [*E2E[name], "--max-steps", "3", "--prompts-per-step", "4", "--group-size", "4", "--eval-every", "0",
             "--save-every", "0"]
    runs = {}
    for run_name, extra in (("padded", ["--pack", "false"]), ("packed", ["--pack", "true"]),
                            ("regrouped", ["--pack", "false", "--micro-batch-size", "2"])):
        out = tmp_path / run_name
        done = torchrun(str(ROOT / "train.py"), *flags, *extra, "--out", str(out), timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        saved = out / "checkpoints" / "step-3"
        runs[run_name] = metrics(out), load_file(str(next(saved.glob("*model.safetensors"))))  # LoRA: the adapters
    (padded, wa), (packed, wb), (_, wr) = runs["padded"], runs["packed"], runs["regrouped"]
    assert [r["step"] for r in padded] == [r["step"] for r in packed] == [1, 2, 3]
    for a, b in zip(padded, packed):
        assert a.keys() == b.keys()
        for k in a:
            if not k.startswith(("time/", "layout/", "mismatch/")):
                assert b[k] == pytest.approx(a[k], rel=1e-5, abs=2e-6), (a["step"], k)  # abs: metrics.jsonl rounds to 6 decimals
    assert wa.keys() == wb.keys() == wr.keys()
    floor = max(float((wa[k] - wr[k]).abs().max() / wa[k].abs().max()) for k in wa)
    for k in wa:
        assert (wa[k] - wb[k]).abs().max() <= max(1e-5, 2 * floor) * wa[k].abs().max(), (k, floor)


@pytest.mark.slow
@pytest.mark.extended  # inductor compiles C++ for tens of seconds on 2 cores; .ci/run runs it
def test_the_cuda_kernel_flex_attention_gives_the_padded_log_probs_on_cpu(monkeypatch):
    """packing.kernel's CUDA choice, flex attention with the document mask, run on CPU (compiled; CPU
    flex attention has no backward, so a forward without gradients): the padded log-probs to 1e-5."""
    lm = random_lm("llama").train()
    rows = [Chunk([3 + i % 50 for i in range(p)], [7 + i % 40 for i in range(r)]) for p, r in ((5, 9), (2, 3), (8, 1))]
    batch = collate(rows, 0, CPU)
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 1.0)
    cuda_kernel, seen = packing.kernel, []

    @contextmanager
    def as_on_cuda(decoder, device):
        with cuda_kernel(decoder, torch.device("cuda")):
            seen.append(decoder.config._attn_implementation)
            yield

    monkeypatch.setattr(packing, "kernel", as_on_cuda)
    with torch.no_grad():
        padded = ResponseLogProbs(lm)(*args)
        packed = ResponseLogProbs(lm, pack=True)(*args)
    assert (padded["logp"] - packed["logp"]).abs().max() <= 1e-5 * padded["logp"].abs().max()
    assert seen == ["flex_attention"] and lm.config._attn_implementation == "sdpa"  # and back after it
