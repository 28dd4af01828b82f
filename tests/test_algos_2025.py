"""docs/math.md §7: GSPO, CISPO, SAPO, REINFORCE++-baseline, Clip-Cov, KL-Cov and the 80/20 entropy mask.

Worked examples to 1e-6, each expected number computed here in plain Python from the formula, not
by the code under test; every new name trained for 2 steps on 2 ranks (in the session's shared
launch, tests/pair.py). The update's independence of ranks and micro-batches is in
tests/test_invariance.py (CASES).
"""
import json
import math
from dataclasses import replace

import pytest
import torch

import algos
import pair
from algos import LossInputs, cov, high_entropy, policy_gradient, reinforce_pp, sapo, select
from config import Config, validate
from rewards import DataError, Problem
from rollout import Chunk, Episode

# docs/math.md §1's example: one group, R = [1, 0, 0, 1], three tokens each
R = [1.0, 0.0, 0.0, 1.0]
LOGP = [[-0.5, -1.2, -0.3], [-0.9, -0.4, -2.0], [-1.1, -0.7, -0.2], [-0.2, -1.5, -0.6]]
OLD = [[-0.6, -1.0, -0.35], [-0.8, -0.5, -1.7], [-1.0, -0.9, -0.25], [-0.3, -1.4, -0.65]]
MEAN = sum(R) / 4
A = [(r - MEAN) / (math.sqrt(sum((x - MEAN) ** 2 for x in R) / 3) + 1e-6) for r in R]  # ±0.8660239


def cfg_for(name, **over):
    return replace(Config(algo=name), **{**algos.get(name).preset, **over})


def run_loss(name, logp=LOGP, old=OLD, mask=None, adv=None, **over):
    """(loss, metrics, logp tensor with .grad) of `name`'s loss on one micro-batch that is the
    whole mini-batch."""
    cfg = cfg_for(name, **over)
    logp = torch.tensor(logp, requires_grad=True)
    mask = torch.ones_like(logp) if mask is None else torch.tensor(mask)
    adv = torch.tensor(A if adv is None else adv)
    mb = LossInputs(logp=logp, old_logp=torch.tensor(old), mask=mask, adv=adv, ref_logp=None,
                    seq_tokens=mask.sum(1))
    loss, metrics = algos.get(name).loss(mb, cfg, {"seqs": len(adv), "tokens": int(mask.sum()), "max_len": 8})
    loss.backward()
    return loss.item(), metrics, logp


def ratio(i, t):
    return math.exp(LOGP[i][t] - OLD[i][t])


# ---------------------------------------------------------------- GSPO

def test_gspo_worked_example():
    expected, clipped = 0.0, 0
    for i in range(4):
        s = math.exp(sum(LOGP[i][t] - OLD[i][t] for t in range(3)) / 3)  # the geometric mean of r_t
        unclipped, capped = -A[i] * s, -A[i] * min(max(s, 1 - 3e-4), 1 + 4e-4)
        expected += max(unclipped, capped) / 4  # every token carries its response's value: seq-mean
        clipped += 3 * (capped > unclipped)
    loss, metrics, logp = run_loss("gspo")
    assert loss == pytest.approx(expected, abs=1e-6) and expected == pytest.approx(0.0145274736, abs=1e-9)
    assert clipped == 6 and metrics["pg/clipfrac"].item() == pytest.approx(6 / 12)
    # responses 1 and 3 are clipped as a whole; 0 and 2 pass −A·s / (N·L) to every token
    for i in range(4):
        s = math.exp(sum(LOGP[i][t] - OLD[i][t] for t in range(3)) / 3)
        grad = 0.0 if i in (1, 3) else -A[i] * s / 12
        assert torch.allclose(logp.grad[i], torch.full((3,), grad), atol=1e-7), i


def test_gspo_on_policy_is_minus_mean_advantage_with_grpo_gradient():
    mask = [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]
    loss, _, logp = run_loss("gspo", old=LOGP, mask=mask)
    assert loss == pytest.approx(-sum(A) / 4, abs=1e-6)
    for i, row in enumerate(mask):
        n = sum(row)
        assert torch.allclose(logp.grad[i], torch.tensor([-A[i] / (4 * n) * m for m in row]), atol=1e-7)


# ---------------------------------------------------------------- CISPO

def test_cispo_worked_example_and_gradient():
    w = [[min(max(ratio(i, t), 1 - 10.0), 1 + 0.2) for t in range(3)] for i in range(4)]
    expected = sum(-w[i][t] * A[i] * LOGP[i][t] for i in range(4) for t in range(3)) / 12
    loss, metrics, logp = run_loss("cispo")
    assert loss == pytest.approx(expected, abs=1e-6) and expected == pytest.approx(-0.0522600107, abs=1e-9)
    assert w[2][1] == 1.2 and metrics["pg/clipfrac"].item() == pytest.approx(1 / 12)  # only r = e^0.2
    # every token keeps a gradient, scaled by its clipped weight: −w·A / N_tok
    assert torch.allclose(logp.grad, torch.tensor([[-w[i][t] * A[i] / 12 for t in range(3)] for i in range(4)]),
                          atol=1e-7)


# ---------------------------------------------------------------- SAPO

def test_sapo_worked_example():
    expected = 0.0
    for i in range(4):
        tau = 1.0 if A[i] > 0 else 1.05
        for t in range(3):
            gate = 4 / tau / (1 + math.exp(-tau * (ratio(i, t) - 1)))
            expected += -gate * A[i] / (4 * 3)
    loss, _, _ = run_loss("sapo")
    assert loss == pytest.approx(expected, abs=1e-6) and expected == pytest.approx(-0.0490211493, abs=1e-9)


def test_sapo_on_policy_value_is_2_over_tau_and_gradient_is_grpo():
    loss, _, logp = run_loss("sapo", old=LOGP)
    taus = [1.0 if a > 0 else 1.05 for a in A]
    assert loss == pytest.approx(sum(-2 / tau * a for tau, a in zip(taus, A)) / 4, abs=1e-6)
    assert torch.allclose(logp.grad, torch.tensor([[-a / 12] * 3 for a in A]), atol=1e-7)
    assert sapo.gate(torch.tensor(1.0), torch.tensor(1.05)).item() == pytest.approx(2 / 1.05)


# ---------------------------------------------------------------- REINFORCE++-baseline

def test_reinforce_pp_whitens_over_the_batch_tokens():
    scores, lengths = [[1, 0, 0, 1], [0, 0, 0, 1]], [[3, 5, 2, 4], [6, 1, 2, 5]]
    centred = [[r - sum(g) / 4 for r in g] for g in scores]
    pairs = [(c, n) for cg, lg in zip(centred, lengths) for c, n in zip(cg, lg)]
    n = sum(L for _, L in pairs)
    mu = sum(L * c for c, L in pairs) / n
    var = sum(L * (c - mu) ** 2 for c, L in pairs) / n * n / (n - 1)
    expected = [[(c - mu) / math.sqrt(var + 1e-8) for c in cg] for cg in centred]
    assert (n, mu, var) == (28, pytest.approx(0.0535714286), pytest.approx(0.2516534392))
    adv = reinforce_pp.advantages(torch.tensor(scores, dtype=torch.float64), cfg_for("reinforce_pp"),
                                  torch.tensor(lengths, dtype=torch.float64))
    assert torch.allclose(adv, torch.tensor(expected, dtype=torch.float64), atol=1e-6)
    assert expected[0][0] == pytest.approx(0.8899191, abs=1e-6) and expected[1][3] == pytest.approx(1.3882738, abs=1e-6)
    # on-policy, token-mean: Σ_i L_i·A_i / n = 0 by construction, so the first loss is 0
    assert sum(L * a for cg, ag, lg in zip(centred, expected, lengths) for _, a, L in zip(cg, ag, lg)) == \
        pytest.approx(0, abs=1e-9)


def test_reinforce_pp_group_of_one_and_preset():
    # a group of one keeps its reward as ã; one token each: plain unbiased whitening of [1, 0, 1]
    adv = reinforce_pp.advantages(torch.tensor([[1.0], [0.0], [1.0]]), cfg_for("reinforce_pp"), torch.ones(3, 1))
    mu, var = 2 / 3, ((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2
    assert torch.allclose(adv.flatten(), torch.tensor([(x - mu) / math.sqrt(var + 1e-8) for x in (1, 0, 1)]))
    cfg = cfg_for("reinforce_pp")
    assert (cfg.clip_low, cfg.clip_high, cfg.dual_clip, cfg.loss_agg, cfg.beta) == (0.2, 0.2, 3.0, "token-mean", 0.001)
    assert algos.get("reinforce_pp").response_tokens and not algos.get("grpo").response_tokens


# ---------------------------------------------------------------- Clip-Cov and KL-Cov

# Response 0 (A = +1, 3 tokens) and response 1 (A = −1, 2 tokens and a pad), current and old logp.
COV_ADV = [1.0, -1.0]
COV_LOGP = [[-0.1, -3.0, -0.5], [-0.2, -4.0, 0.0]]
COV_OLD = [[-0.2, -2.9, -0.5], [-0.3, -3.5, 0.0]]
COV_MASK = [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]
FLAT = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]  # the valid tokens, response after response


def cov_tokens():
    return {"logp": torch.tensor([COV_LOGP[i][t] for i, t in FLAT]),
            "old_logp": torch.tensor([COV_OLD[i][t] for i, t in FLAT]),
            "adv": torch.tensor([COV_ADV[i] for i, _ in FLAT]), "mask": torch.ones(5), "entropy": torch.zeros(5)}


def hand_cov():
    adv, lp = [COV_ADV[i] for i, _ in FLAT], [COV_LOGP[i][t] for i, t in FLAT]
    ma, ml = sum(adv) / 5, sum(lp) / 5
    return [(a - ma) * (x - ml) for a, x in zip(adv, lp)]


def cov_loss(name, selected_flat, **over):
    selected = torch.zeros(2, 3, dtype=torch.bool)
    for (i, t), s in zip(FLAT, selected_flat.tolist()):
        selected[i, t] = s
    cfg = cfg_for(name, **over)
    logp = torch.tensor(COV_LOGP, requires_grad=True)
    mb = LossInputs(logp=logp, old_logp=torch.tensor(COV_OLD), mask=torch.tensor(COV_MASK),
                    adv=torch.tensor(COV_ADV), ref_logp=None, selected=selected)
    loss, metrics = algos.get(name).loss(mb, cfg, {"seqs": 2, "tokens": 5, "max_len": 8})
    loss.backward()
    return loss.item(), metrics, logp


def test_clip_cov_worked_example():
    c = hand_cov()
    assert c == pytest.approx([1.168, -1.152, 0.848, -1.632, 2.928])
    cfg = cfg_for("clip_cov")
    picked = cov.select_clip_cov(cov_tokens(), cfg, torch.Generator().manual_seed(0))
    # the last token (A < 0, r = e^−0.5 < 0.8) is clipped by PPO, so the only candidate in (1, 5)
    # is token 0; k = max(⌊2e-4 · 5⌋, 1) = 1 ≥ |C|: no randomness
    assert picked.tolist() == [True, False, False, False, False]
    expected = 0.0
    for i, t in FLAT[1:]:  # token 0's loss is 0, but it still counts in the token-mean
        r = math.exp(COV_LOGP[i][t] - COV_OLD[i][t])
        expected += max(-COV_ADV[i] * r, -COV_ADV[i] * min(max(r, 0.8), 1.2)) / 5
    loss, metrics, logp = cov_loss("clip_cov", picked)
    assert loss == pytest.approx(expected, abs=1e-6) and expected == pytest.approx(0.0000667000, abs=1e-9)
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0  # the picked token passes no gradient
    assert metrics["cov/selected_frac"].item() == pytest.approx(1 / 5)
    assert metrics["pg/clipfrac"].item() == pytest.approx(1 / 5)


def test_clip_cov_draws_k_of_many_candidates_from_its_generator():
    tokens = cov_tokens()
    tokens["old_logp"] = tokens["logp"].clone()  # on-policy: nothing clipped
    cfg = cfg_for("clip_cov", clip_cov_lb=-10.0, clip_cov_ub=10.0, clip_cov_ratio=0.4)  # |C| = 5, k = 2
    draws = [cov.select_clip_cov(tokens, cfg, torch.Generator().manual_seed(s)) for s in range(6)]
    assert all(d.sum() == 2 for d in draws)
    assert torch.equal(draws[0], cov.select_clip_cov(tokens, cfg, torch.Generator().manual_seed(0)))
    assert len({tuple(d.tolist()) for d in draws}) > 1  # the seed, not the order, decides


def test_kl_cov_worked_example():
    base = sum(-COV_ADV[i] * math.exp(COV_LOGP[i][t] - COV_OLD[i][t]) for i, t in FLAT)
    for ratio, top, expected in [(2e-4, [4], -0.2496613517), (0.4, [4, 0], -0.2476613517)]:
        picked = cov.select_kl_cov(cov_tokens(), cfg_for("kl_cov", kl_cov_ratio=ratio))
        assert picked.nonzero().flatten().tolist() == sorted(top)  # the largest cov: 2.928, then 1.168
        hand = (base + sum(0.1 * abs(COV_LOGP[i][t] - COV_OLD[i][t]) for i, t in (FLAT[j] for j in top))) / 5
        loss, metrics, _ = cov_loss("kl_cov", picked, kl_cov_ratio=ratio)
        assert loss == pytest.approx(hand, abs=1e-6) and hand == pytest.approx(expected, abs=1e-9)
        assert metrics["cov/selected_frac"].item() == pytest.approx(len(top) / 5)


def test_covariance_ignores_padding_and_empty_batches():
    valid = torch.tensor([True, True, True, False])
    got = cov.covariance(torch.tensor([1.0, 1.0, -1.0, 9.0]), torch.tensor([-1.0, -2.0, -3.0, 9.0]), valid)
    assert torch.allclose(got[:3], torch.tensor([2 / 3, 0.0, 4 / 3]))
    none = {"logp": torch.zeros(2), "old_logp": torch.zeros(2), "adv": torch.ones(2), "mask": torch.zeros(2)}
    assert not cov.select_kl_cov(none, cfg_for("kl_cov")).any()
    assert not cov.select_clip_cov(none, cfg_for("clip_cov"), torch.Generator()).any()


# ---------------------------------------------------------------- 80/20 entropy mask and the shared tail

@pytest.mark.parametrize("n,rho", [(10, 0.3), (10, 0.2), (7, 0.5), (5, 1.0), (100, 0.2)])
def test_high_entropy_keeps_the_top_rho(n, rho):
    entropy = torch.randperm(n).float() / n  # distinct values
    kept = high_entropy.high_entropy(entropy, torch.ones(n), rho)
    assert int(kept.sum()) == n - math.ceil((1 - rho) * (n - 1) - 1e-9)
    assert entropy[kept].min() > entropy[~kept].max() if (~kept).any() else kept.all()
    if (n, rho) == (10, 0.3):
        assert int(kept.sum()) == 3


def test_high_entropy_docstring_example_never_keeps_padding():
    kept = high_entropy.high_entropy(torch.tensor([0.1, 0.5, 0.3, 0.9, 7.0]), torch.tensor([1.0, 1, 1, 1, 0]), 0.5)
    assert kept.tolist() == [False, True, False, True, False]


# entropies of §1's 12 tokens, all distinct: ρ = 0.2 keeps 12 − ⌈0.8 · 11⌉ = 3, the three largest
ENTROPY = [[0.3, 1.1, 0.2], [0.9, 0.1, 1.4], [0.5, 0.7, 0.4], [1.2, 0.6, 0.8]]
KEPT = [(0, 1), (1, 2), (3, 0)]
M_THETA = [[-5.0, -5.2, -4.9], [-6.0, -6.1, -5.8], [-4.5, -4.4, -4.7], [-5.5, -5.3, -5.6]]  # docs/math.md §3
M_OLD = [[-5.1, -5.0, -5.0], [-6.0, -6.3, -5.7], [-4.6, -4.6, -4.6], [-5.4, -5.5, -5.5]]


def entropy_mask_loss(name, *, high_entropy=None, detached=None, **over):
    """(loss, metrics, ∂loss/∂logp) of `name`'s loss on §1's example, every LossInputs field filled;
    `detached`: the tokens whose logp passes no gradient (what the entropy mask did before issue 22)."""
    leaf = torch.tensor(LOGP, requires_grad=True)
    logp = leaf if detached is None else torch.where(detached, leaf.detach(), leaf)
    mb = LossInputs(logp=logp, old_logp=torch.tensor(OLD), mask=torch.ones(4, 3), adv=torch.tensor(A),
                    labels=torch.tensor(R), group=torch.zeros(4, dtype=torch.long), seq_tokens=torch.full((4,), 3),
                    ref_logp=torch.tensor(OLD) - 0.1, vocab_mean=torch.tensor(M_THETA),
                    old_vocab_mean=torch.tensor(M_OLD), selected=torch.eye(4, 3, dtype=torch.bool),
                    high_entropy=high_entropy)
    loss, metrics = algos.get(name).loss(mb, cfg_for(name, **over), {"seqs": 4, "tokens": 12, "max_len": 8})
    (grad,) = torch.autograd.grad(loss, leaf)
    return loss.item(), metrics, grad


def top_entropy_mask():
    return high_entropy.high_entropy(torch.tensor(ENTROPY).flatten(), torch.ones(12), 0.2).view(4, 3)


def test_top_entropy_quantile_logs_the_masked_loss_of_the_worked_example():
    """ρ = 0.2: the logged loss (pg/loss, the loss) is the per-token loss times the mask, masked
    tokens still counted in the denominator, by hand in plain Python for GRPO and ROVER."""
    kept = top_entropy_mask()
    assert sorted(map(tuple, kept.nonzero().tolist())) == KEPT
    ppo = sum(max(-A[i] * ratio(i, t), -A[i] * min(max(ratio(i, t), 0.8), 1.2)) for i, t in KEPT) / 12
    loss, metrics, _ = entropy_mask_loss("grpo", high_entropy=kept)
    assert loss == pytest.approx(ppo, abs=1e-7) and metrics["pg/loss"].item() == pytest.approx(ppo, abs=1e-7)
    unmasked, _, _ = entropy_mask_loss("grpo")
    assert unmasked == pytest.approx(-0.0035313995, abs=1e-6) and abs(unmasked - ppo) > 1e-3

    def rover_term(i, t):  # (Q − target)², ρ = 1, the next state's value read at t + 1
        nxt = M_THETA[i][t + 1] - M_OLD[i][t + 1] if t < 2 else 0.0
        return (LOGP[i][t] - OLD[i][t] - (A[i] + nxt)) ** 2
    loss, _, _ = entropy_mask_loss("rover", high_entropy=kept)
    assert loss == pytest.approx(sum(rover_term(i, t) for i, t in KEPT) / 12, abs=1e-6)


@pytest.mark.parametrize("name,beta", [("grpo", 0.0), ("dapo", 0.0), ("gspo", 0.0), ("cispo", 0.0), ("sapo", 0.0),
                                       ("reinforce_pp", 0.0), ("clip_cov", 0.0), ("kl_cov", 0.0), ("rover", None),
                                       ("pacs", None), ("grpo", 0.1), ("reinforce_pp", 0.001)])
def test_top_entropy_quantile_keeps_the_policy_gradient_of_detaching(name, beta):
    """The policy term's gradient is what detaching the masked tokens' logp gave before the mask
    multiplied the loss; the reference KL's is now kept on every token: β·(1 − e^(ref − logp))/12
    (each token weighs 1/12 here, whatever the aggregation)."""
    kl = {} if beta is None else {"beta": beta}
    kept = top_entropy_mask()
    _, _, grad = entropy_mask_loss(name, high_entropy=kept, **kl)
    _, _, before = entropy_mask_loss(name, detached=~kept, **({} if beta is None else {"beta": 0.0}))
    kl_grad = (beta or 0.0) * (1 - torch.exp(torch.tensor(OLD) - 0.1 - torch.tensor(LOGP))) / 12
    assert torch.allclose(grad, before + kl_grad, atol=1e-7), (grad, before)
    assert (before[~kept] == 0).all() and (before[kept] != 0).any()


def test_is_weight_scales_the_policy_term_but_not_the_reference_kl():
    cfg = cfg_for("cispo", beta=0.5)
    logp = torch.tensor([[-1.0, -2.0]])
    mb = LossInputs(logp=logp, old_logp=logp, mask=torch.ones(1, 2), adv=torch.tensor([1.0]),
                    ref_logp=logp - 0.1, is_weight=torch.tensor([[0.5, 2.0]]))
    loss, metrics = policy_gradient.aggregate(-logp, mb, cfg, {"seqs": 1, "tokens": 2, "max_len": 2},
                                              loss_agg="token-mean", metrics={})
    k3 = math.exp(-0.1) + 0.1 - 1
    assert metrics["pg/loss"].item() == pytest.approx((1.0 * 0.5 + 2.0 * 2.0) / 2)
    assert loss.item() == pytest.approx((0.5 + 4.0) / 2 + 0.5 * k3, abs=1e-6)


def test_config_refuses_what_the_losses_cannot_do():
    with pytest.raises(DataError, match="always aggregates seq-mean-token-mean"):
        validate(cfg_for("gspo", loss_agg="token-mean"), 1)
    with pytest.raises(DataError, match="always aggregates seq-mean-token-mean"):
        validate(cfg_for("sapo", loss_agg="token-mean"), 1)
    with pytest.raises(DataError, match="set max_chunks 1"):
        validate(cfg_for("gspo", max_chunks=2, chunk_head=0), 1)
    with pytest.raises(DataError, match="top_entropy_quantile=0"):
        validate(cfg_for("grpo", top_entropy_quantile=0.0), 1)
    for name in ("gspo", "cispo", "sapo", "reinforce_pp", "clip_cov", "kl_cov"):
        validate(cfg_for(name), 2)


def test_chunk_start_places_each_chunk_row_in_its_trace():
    chunks = [Chunk([5], [1, 2, 3]), Chunk([5, 3], [4, 5]), Chunk([5, 5], [6, 7, 8, 9])]
    e = Episode(prompt_ids=[5], response_ids=list(range(1, 10)), text="", truncated=False, group=0,
                problem=Problem("p", "0"), chunks=chunks)
    assert [select.chunk_start(e, c) for c in chunks] == [0, 3, 5]
    assert select.chunk_start(replace(e, chunks=[]), Chunk([5], [1])) == 0  # a one-row episode


# ---------------------------------------------------------------- 2 ranks, every new name

SMOKE = [("--algo gspo", "pg/clipfrac"), ("--algo cispo", "pg/clipfrac"), ("--algo sapo", "sapo/grad_scale"),
         ("--algo reinforce_pp", "kl/k3"), ("--algo clip_cov", "cov/selected_frac"),
         ("--algo kl_cov", "cov/selected_frac"), ("--algo grpo --top-entropy-quantile 0.2", "entropy/high_frac"),
         ("--algo rover --top-entropy-quantile 0.2", "entropy/high_frac")]


def register_smoke(prefix: str, smoke: list) -> None:
    """Each (flags, metric) of `smoke` a 2-step run in the shared launch, named prefix-i. 80 tokens: the
    shipped model's answers need ~50, so some are right and groups have a spread."""
    for i, (flags, _) in enumerate(smoke):
        pair.register(f"{prefix}-{i}", [*flags.split(), *pair.SMALL, "--max-new-tokens", "80"])


def trained_two_steps(two_rank_runs, prefix: str, smoke: list):
    """(flags, metric, its metrics.jsonl rows) of each run register_smoke made, once checked: 2 steps, none
    skipped, K optimizer steps each, the metric and the loss finite, a gradient wherever a group has a spread."""
    for i, (flags, key) in enumerate(smoke):
        lines = [json.loads(x) for x in (pair.folder(two_rank_runs, f"{prefix}-{i}") / "metrics.jsonl").read_text()
                 .splitlines()]
        assert [x["step"] for x in lines] == [1, 2], flags
        k = cfg_for(flags.split()[1]).mini_batches
        for x in lines:
            assert x["update/skipped"] == 0 and x["update/optimizer_steps"] == k, flags
            assert math.isfinite(x[key]) and math.isfinite(x["loss/total"]), flags
            assert x["grad/norm"] > 0 or x["reward/zero_std_groups"] == 1, flags  # no spread, no signal
        yield flags, key, lines


register_smoke("2025", SMOKE)


def test_torchrun_two_ranks_train_each_new_name(two_rank_runs):
    for flags, key, lines in trained_two_steps(two_rank_runs, "2025", SMOKE):
        if "entropy" in key:
            assert all(0.15 < x[key] < 0.3 for x in lines), (flags, [x[key] for x in lines])

