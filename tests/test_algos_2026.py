"""docs/math.md §11: DPPO (Binary-TV, Binary-KL) with Kimi K2.5's squared log-ratio penalty, MaxRL, GMPO,
DeepSeek-V3.2's off-policy sequence mask and unbiased KL.

Each worked example twice over: the expected number is computed here in plain Python from the formula,
and it equals the number the adopting framework's own code printed on the same inputs (REFERENCE, below:
the frameworks' loss functions, their source taken from the commits named, run on docs/math.md §1's
example in float64 with their trainers stubbed). Every new name trains 2 steps on 2 ranks in the
session's shared launch (tests/pair.py); the update's independence of ranks and micro-batches, and LoRA,
are tests/test_invariance.py's and tests/test_lora.py's CASES, FSDP tests/test_parallel.py's.
"""
import math

import pytest
import torch

import algos
from algos import LossInputs, policy_gradient
from config import validate
from rewards import DataError
from test_algos_2025 import A, LOGP, OLD, cfg_for, register_smoke, run_loss, trained_two_steps

# What the frameworks' own functions returned on §1's example (logp LOGP, logp_old OLD, A, every token
# valid; a reference 0.1 below OLD where a KL is asked): loss values and ∂loss/∂logp, row after row.
REFERENCE = {
    # prime-rl src/prime_rl/trainer/rl/loss.py @ 559b447, default_loss_fn summed over the 4 samples / 12 tokens
    "prime-rl tv 0.05 tau 1e-3": (0.1517347280, [1.66667e-05, -0.0591200336, -0.0758604916, 0.0652842361,
                                                0.0797753694, 0.0534138573, 0.0652842361, 0.0881803321,
                                                0.0758771582, 1.66667e-05, -0.0653175694, -0.0758604916]),
    "prime-rl tv 0.2 tau 1e-3": (-0.0077826774, None),
    # verl verl/trainer/ppo/core_algos.py @ 1dda039 (verl-project/verl), token-mean: its value is
    # −A·sg(r)·logp, not ours; its gradient is
    "verl dppo_tv 0.05": (None, [0.0, -0.0590867002, -0.0758688249, 0.0653009028, 0.0797587027, 0.0534638573,
                                 0.0653009028, 0.0881469987, 0.0758688249, 0.0, -0.0653009028, -0.0758688249]),
    "verl dppo_kl 0.01": (None, [-0.0797587027, -0.0590867002, -0.0758688249, 0.0653009028, 0.0797587027,
                                 0.0534638573, 0.0653009028, 0.0881469987, 0.0758688249, 0.0, -0.0653009028,
                                 -0.0758688249]),
    # TRL trl/experimental/gmpo/gmpo_trainer.py @ f2cd577, GMPOTrainer._compute_loss (verl's geo_mean: the same
    # to 1e-9: 0.0039424466 and -0.0095629108)
    # (at ε = 0.1 several log-ratios sit on the bound, where float32 and float64 round to opposite sides)
    "trl gmpo 0.1": (0.0039424467, None),
    "trl gmpo 0.15": (0.0004812358, [-0.0709758156, -0.0709758156, -0.0709758156, 0.0686489516, 0.0686489516,
                                     0.0, 0.0758688249, 0.0758688249, 0.0758688249, -0.073381549, -0.073381549,
                                     -0.073381549]),
    "trl gmpo 0.4": (-0.0095629109, None),
    "trl gmpo 0.1 beta 0.04": (0.0044614736, None),
    # TRL trl/trainer/grpo_trainer.py @ f2cd577, GRPOTrainer._compute_loss, loss_type "dapo" (token-mean)
    "trl opsm 0.05": (-0.2063259319, [-0.0797587027, -0.0590867002, -0.0758688249, 0.0, 0.0, 0.0, 0.0653009028,
                                      0.0881469987, 0.0758688249, -0.0797587027, -0.0653009028, -0.0758688249]),
    "trl opsm 0.05 beta 0.04 unbiased": (-0.2057732064, [-0.0790219221, -0.0593596105, -0.0753431894, 0.0,
                                                         0.0007367806, -0.0004938788, 0.0653009028, 0.0893684015,
                                                         0.0763944605, -0.0790219221, -0.0653009028, -0.0753431894]),
    "trl opsm 0.5 beta 1e-3 unbiased": (-0.0035175813, None),
    # prime-rl src/prime_rl/orchestrator/algo/max_rl.py @ 559b447, MaxRLAlgorithm.score_group, group by group
    "prime-rl max_rl": [[3.0, -1.0, -1.0, -1.0], [1 / 3, 1 / 3, 1 / 3, -1.0], [0.0] * 4, [-0.5, -1.0, 1.0, 0.5],
                        [0.0] * 4],
}
REF_LOGP = [[x - 0.1 for x in row] for row in OLD]


def grad_of(logp):
    return logp.grad.flatten().tolist()


def close(got, want, tol=1e-6):
    return all(abs(g - w) <= tol for g, w in zip(got, want, strict=True))


def p(x):
    return math.exp(x)


def tokens():
    return [(i, t) for i in range(4) for t in range(3)]


# ---------------------------------------------------------------- DPPO

def hand_dppo(masked, *, delta, tau):
    """(loss, masked tokens): token-mean of −keep·A·r + τ·(logp − logp_old)², by hand."""
    total, n = 0.0, 0
    for i, t in tokens():
        drop = masked(p(LOGP[i][t]), p(OLD[i][t]), A[i], delta)
        n += drop
        d = LOGP[i][t] - OLD[i][t]
        total += (0.0 if drop else -A[i] * math.exp(d)) + tau * d * d
    return total / 12, n


def tv(pi, po, a, delta):
    return pi - po > delta if a > 0 else pi - po < -delta


def binary_kl(pi, po, a, delta):
    d = po * math.log(po / pi) + (1 - po) * math.log((1 - po + 1e-8) / (1 - pi + 1e-8))
    return (d > delta and pi > po) if a > 0 else (d > delta and pi < po)


def test_dppo_tv_equals_prime_rl_default_loss():
    for delta, key in [(0.05, "prime-rl tv 0.05 tau 1e-3"), (0.2, "prime-rl tv 0.2 tau 1e-3")]:
        expected, n = hand_dppo(tv, delta=delta, tau=1e-3)
        loss, metrics, logp = run_loss("dppo_tv", dppo_mask_low=delta, dppo_mask_high=delta)
        assert loss == pytest.approx(expected, abs=1e-6) and expected == pytest.approx(REFERENCE[key][0], abs=1e-9)
        assert metrics["pg/clipfrac"].item() == pytest.approx(n / 12)
        if delta == 0.05:  # responses 0 and 3 (A > 0) lose their 1st token: p rose by 0.058 and 0.078
            assert n == 2 and close(grad_of(logp), REFERENCE[key][1])
    assert cfg_for("dppo_tv").kl_tau == 1e-3 and cfg_for("dppo_tv").dppo_mask_high == 0.2


def test_dppo_gradients_equal_verl():
    """verl's value differs (−A·sg(r)·logp) but, below its ratio cap, its gradient is ours (τ = 0)."""
    _, _, logp = run_loss("dppo_tv", dppo_mask_low=0.05, dppo_mask_high=0.05, kl_tau=0.0)
    assert close(grad_of(logp), REFERENCE["verl dppo_tv 0.05"][1])
    expected, n = hand_dppo(binary_kl, delta=0.01, tau=0.0)
    loss, metrics, logp = run_loss("dppo_kl", dppo_mask_low=0.01, dppo_mask_high=0.01)
    assert loss == pytest.approx(expected, abs=1e-6) and n == 1  # response 3's 1st token: p 0.741 -> 0.819
    assert close(grad_of(logp), REFERENCE["verl dppo_kl 0.01"][1])
    assert metrics["pg/clipfrac"].item() == pytest.approx(1 / 12)


def test_dppo_on_policy_is_grpo_token_mean_and_penalty_pulls_back():
    loss, metrics, logp = run_loss("dppo_tv", old=LOGP)
    assert loss == pytest.approx(-sum(A) * 3 / 12, abs=1e-7) and metrics["pg/clipfrac"].item() == 0
    assert torch.allclose(logp.grad, torch.tensor([[-a / 12] * 3 for a in A]), atol=1e-7)
    # the penalty alone (A = 0): gradient 2τ·(logp − logp_old)/12 on every token, masked or not
    _, _, logp = run_loss("dppo_tv", adv=[0.0] * 4, dppo_mask_low=1e-3, kl_tau=0.5)
    want = [[2 * 0.5 * (LOGP[i][t] - OLD[i][t]) / 12 for t in range(3)] for i in range(4)]
    assert torch.allclose(logp.grad, torch.tensor(want), atol=1e-7)


def test_dppo_masks_are_one_sided():
    a_pos, a_neg = torch.tensor([[1.0]]), torch.tensor([[-1.0]])
    rise = (torch.tensor([[0.9]]), torch.tensor([[0.6]]))
    from algos.dppo import kl_masked, tv_masked
    assert tv_masked(*rise, a_pos, low=0.2, high=0.2).item() and not tv_masked(*rise, a_neg, low=0.2, high=0.2).item()
    assert kl_masked(*rise, a_pos, low=0.05, high=0.05).item()
    assert not kl_masked(*rise, a_neg, low=0.05, high=0.05).item()  # the probability rose: a negative token keeps it
    d = 0.6 * math.log(0.6 / 0.9) + 0.4 * math.log(0.4 / 0.1)
    assert d == pytest.approx(0.3113, abs=1e-4)
    assert not kl_masked(*rise, a_pos, low=0.05, high=d + 1e-3).item()


def test_dppo_never_nan_where_a_ratio_would_overflow():
    logp = [[-0.1, -0.2, -0.3]] * 4
    old = [[-200.0, -0.2, -0.3]] * 4  # log r = 199.9 on the 1st tokens: masked (A > 0) or kept (A < 0) alike
    loss, _, grad = run_loss("dppo_tv", logp=logp, old=old)
    assert math.isfinite(loss) and torch.isfinite(grad).all()


# ---------------------------------------------------------------- MaxRL

def test_maxrl_divides_by_the_group_mean():
    scores = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [0.5, 0.0, 2.0, 1.5],
                           [-1.0, 0.0, 0.0, 0.0]])
    adv = policy_gradient.batch_advantages(scores, cfg_for("maxrl"))
    expected = []
    for row in scores.tolist():
        m = sum(row) / 4
        expected.append([(r - m) / m if m > 0 else 0.0 for r in row])
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-7)
    assert torch.allclose(adv, torch.tensor(REFERENCE["prime-rl max_rl"]), atol=1e-6)
    assert adv[0].tolist() == [3.0, -1.0, -1.0, -1.0]  # a hard prompt (1 of 4): ×4 GRPO-Dr's centred advantage
    assert adv[2].tolist() == [0.0] * 4  # a group that never scores carries no gradient (prime-rl's rule)
    assert adv[4].tolist() == [0.0] * 4 and not adv.isnan().any()  # a mean < 0 (shaped rewards): no signal, no NaN
    cfg = cfg_for("maxrl")
    assert (cfg.adv_norm, cfg.clip_low, cfg.clip_high, cfg.loss_agg) == ("mean", 0.2, 0.2, "token-mean")


# ---------------------------------------------------------------- GMPO

def hand_gmpo(eps, beta=0.0):
    total = 0.0
    for i in range(4):
        logs = []
        for t in range(3):
            d = LOGP[i][t] - OLD[i][t]
            c = min(max(d, -eps), eps)
            logs.append(min(d, c) if A[i] > 0 else max(d, c))
        kl = sum(math.exp(REF_LOGP[i][t] - LOGP[i][t]) - (REF_LOGP[i][t] - LOGP[i][t]) - 1 for t in range(3)) / 3
        total += (-math.exp(sum(logs) / 3) * A[i] + beta * kl) / 4
    return total


def test_gmpo_equals_trl():
    for eps, key in [(0.1, "trl gmpo 0.1"), (0.15, "trl gmpo 0.15"), (0.4, "trl gmpo 0.4")]:
        loss, _, logp = run_loss("gmpo", log_clip_low=eps, log_clip_high=eps)
        assert loss == pytest.approx(hand_gmpo(eps), abs=1e-6) and hand_gmpo(eps) == pytest.approx(REFERENCE[key][0],
                                                                                                  abs=1e-9)
        if REFERENCE[key][1]:  # response 1 (A < 0): its 3rd token (log r = −0.3) clipped, no gradient
            assert close(grad_of(logp), REFERENCE[key][1])
    cfg = cfg_for("gmpo", log_clip_low=0.1, log_clip_high=0.1, beta=0.04)
    mb = LossInputs(logp=torch.tensor(LOGP), old_logp=torch.tensor(OLD), mask=torch.ones(4, 3), adv=torch.tensor(A),
                    ref_logp=torch.tensor(REF_LOGP), seq_tokens=torch.full((4,), 3))
    loss, _ = algos.get("gmpo").loss(mb, cfg, {"seqs": 4, "tokens": 12, "max_len": 8})
    assert loss.item() == pytest.approx(hand_gmpo(0.1, 0.04), abs=1e-6)
    assert hand_gmpo(0.1, 0.04) == pytest.approx(REFERENCE["trl gmpo 0.1 beta 0.04"][0], abs=1e-9)


def test_gmpo_entropy_mask_leaves_tokens_out_of_the_mean_and_is_weight_is_geometric():
    cfg = cfg_for("gmpo")
    keep = torch.tensor([[True, False, True]] * 4)
    w = torch.tensor([[0.5, 2.0, 8.0]] * 4)
    mb = LossInputs(logp=torch.tensor(LOGP), old_logp=torch.tensor(OLD), mask=torch.ones(4, 3), adv=torch.tensor(A),
                    seq_tokens=torch.full((4,), 3), high_entropy=keep, is_weight=w)
    loss, _ = algos.get("gmpo").loss(mb, cfg, {"seqs": 4, "tokens": 12, "max_len": 8})
    expected = 0.0
    for i in range(4):  # ε = 0.4 clips nothing here; tokens 0 and 2 only, weights' geometric mean 2
        s = math.exp((LOGP[i][0] - OLD[i][0] + LOGP[i][2] - OLD[i][2]) / 2)
        expected += -s * A[i] * 2.0 / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)


# ---------------------------------------------------------------- DeepSeek-V3.2: off-policy mask, unbiased KL

def hand_opsm(delta, beta=0.0, unbiased=False):
    total = 0.0
    for i in range(4):
        drift = sum(OLD[i][t] - LOGP[i][t] for t in range(3)) / 3
        keep = A[i] >= 0 or drift <= delta
        for t in range(3):
            r = math.exp(LOGP[i][t] - OLD[i][t])
            pg = max(-A[i] * r, -A[i] * min(max(r, 0.8), 1.2)) * keep
            d = REF_LOGP[i][t] - LOGP[i][t]
            total += (pg + beta * (math.exp(d) - d - 1) * (r if unbiased else 1.0)) / 12
    return total


def opsm_loss(**over):
    cfg = cfg_for("opsm", **over)
    logp = torch.tensor(LOGP, requires_grad=True)
    mb = LossInputs(logp=logp, old_logp=torch.tensor(OLD), mask=torch.ones(4, 3), adv=torch.tensor(A),
                    ref_logp=torch.tensor(REF_LOGP) if cfg.beta > 0 else None, seq_tokens=torch.full((4,), 3))
    loss, metrics = algos.get("opsm").loss(mb, cfg, {"seqs": 4, "tokens": 12, "max_len": 8})
    loss.backward()
    return loss.item(), metrics, logp


def test_opsm_equals_trl():
    for over, key, hand in [
            (dict(off_policy_mask=0.05, beta=0.0, unbiased_kl=False), "trl opsm 0.05", hand_opsm(0.05)),
            (dict(off_policy_mask=0.05, beta=0.04), "trl opsm 0.05 beta 0.04 unbiased", hand_opsm(0.05, 0.04, True)),
            ({}, "trl opsm 0.5 beta 1e-3 unbiased", hand_opsm(0.5, 1e-3, True))]:
        loss, metrics, logp = opsm_loss(**over)
        assert loss == pytest.approx(hand, abs=1e-6) and hand == pytest.approx(REFERENCE[key][0], abs=1e-9), key
        if REFERENCE[key][1]:
            assert close(grad_of(logp), REFERENCE[key][1]), key
        # response 1 (A < 0) drifted by (0.1 − 0.1 + 0.3)/3 = 0.1 nats a token: masked at δ 0.05, not at 0.5
        assert metrics["opsm/masked_frac"].item() == pytest.approx(3 / 12 if over else 0.0)


# ---------------------------------------------------------------- settings a run refuses

@pytest.mark.parametrize("name,over,message", [
    ("dppo_tv", {"dppo_mask_low": 0.0}, "dppo_mask_low=0.0: must be > 0"),
    ("dppo_kl", {"dppo_mask_high": -0.1}, "dppo_mask_high=-0.1: must be > 0"),
    ("dppo_tv", {"kl_tau": -1e-3}, "kl_tau=-0.001: must be ≥ 0"),
    ("dppo_tv", {"clip_high": 0.28}, "its trust region is the probability mask"),
    ("gmpo", {"log_clip_low": -0.1}, "log_clip_low=-0.1: must be ≥ 0"),
    ("gmpo", {"max_chunks": 2, "chunk_head": 0}, "set max_chunks 1"),
    ("gmpo", {"loss_agg": "token-mean"}, "plain mean over responses"),
    ("opsm", {"off_policy_mask": 0.0}, "off_policy_mask=0.0: must be > 0"),
    ("opsm", {"beta": 0.0}, "unbiased_kl=True corrects the β KL term"),
    ("opsm", {"max_chunks": 2, "chunk_head": 0}, "set max_chunks 1"),
    ("grpo", {"kl_tau": 1e-3}, "--algo grpo does not read kl_tau")])
def test_bad_settings_are_one_clear_line(name, over, message):
    with pytest.raises(DataError, match=message.replace("(", r"\(").replace(")", r"\)")):
        validate(cfg_for(name, **over), 1)


def test_new_presets_validate_and_chunks_run_where_they_can():
    for name in ("dppo_tv", "dppo_kl", "maxrl", "gmpo", "opsm"):
        validate(cfg_for(name), 2)
    for name in ("dppo_tv", "dppo_kl", "maxrl"):  # Delethink's chunk rows: a per-token loss needs no whole response
        validate(cfg_for(name, max_chunks=2, chunk_head=0), 1)


# ---------------------------------------------------------------- 2 ranks, every new name

SMOKE = [("--algo dppo_tv", "dppo/log_ratio_sq"), ("--algo dppo_kl", "pg/clipfrac"), ("--algo maxrl", "pg/clipfrac"),
         ("--algo gmpo", "pg/clipfrac"), ("--algo opsm", "opsm/masked_frac")]
register_smoke("2026", SMOKE)


def test_torchrun_two_ranks_train_each_new_name(two_rank_runs):
    assert len(list(trained_two_steps(two_rank_runs, "2026", SMOKE))) == len(SMOKE)
