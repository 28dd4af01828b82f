"""docs/math.md §1 worked examples, to 1e-6, for every GRPO-family preset."""
import math
from types import SimpleNamespace

import pytest
import torch

from algos import ALGORITHMS, LossInputs, policy_gradient
from config import Config

R = [1.0, 0.0, 0.0, 1.0]
LOGP = [[-0.5, -1.2, -0.3], [-0.9, -0.4, -2.0], [-1.1, -0.7, -0.2], [-0.2, -1.5, -0.6]]
OLD = [[-0.6, -1.0, -0.35], [-0.8, -0.5, -1.7], [-1.0, -0.9, -0.25], [-0.3, -1.4, -0.65]]


def preset_cfg(name, **over):
    return SimpleNamespace(**{**vars(Config()), **ALGORITHMS[name].preset, **over})


def spec_loss(name, **over):
    cfg = preset_cfg(name, **over)
    algo = ALGORITHMS[name]
    adv = algo.advantages(torch.tensor([R], dtype=torch.float64), cfg).flatten().float()
    logp = torch.tensor(LOGP, requires_grad=True)
    mb = LossInputs(logp=logp, old_logp=torch.tensor(OLD), mask=torch.ones(4, 3), adv=adv, ref_logp=None)
    loss, metrics = algo.loss(mb, cfg, {"seqs": 4, "tokens": 12, "max_len": cfg.max_new_tokens})
    return loss, metrics, logp


def test_group_and_rloo_advantages():
    s = torch.tensor([R], dtype=torch.float64)
    group = policy_gradient.advantages(s, adv_norm="group", std_estimator="unbiased", eps=1e-6)
    assert torch.allclose(group, torch.tensor([[1, -1, -1, 1]], dtype=torch.float64) * 0.8660239038, atol=1e-9)
    rloo = policy_gradient.advantages(s, adv_norm="rloo")
    assert torch.allclose(rloo, torch.tensor([[2, -2, -2, 2]], dtype=torch.float64) / 3, atol=1e-12)
    none = policy_gradient.advantages(s, adv_norm="none")
    assert torch.allclose(none, torch.tensor([[0.5, -0.5, -0.5, 0.5]], dtype=torch.float64))
    one = policy_gradient.advantages(torch.tensor([[3.0]]), adv_norm="group")  # mean 0, std 1
    assert torch.allclose(one, torch.tensor([[3.0]]) / (1 + 1e-6))


@pytest.mark.parametrize("name,expected", [
    ("grpo", -0.0035313995), ("dapo", -0.0035313995)])
def test_spec_values(name, expected):
    loss, metrics, _ = spec_loss(name)
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    # Only response 1's last token is clipped (r = e^-0.3 < 1 - 0.2 with A < 0): ε_high never
    # binds, which is why the dapo value equals the grpo one.
    assert metrics["pg/clipfrac"].item() == pytest.approx(1 / 12)


def test_dr_grpo_spec_value():
    loss, _, _ = spec_loss("dr_grpo", max_new_tokens=4)  # L_const = 4
    assert loss.item() == pytest.approx(-0.0015291435, abs=1e-6)


def hand_loss(adv, norm):
    """Plain-Python PPO-clip loss, ε = 0.2, summed over tokens and divided by norm."""
    total = 0.0
    for i in range(4):
        for t in range(3):
            r = math.exp(LOGP[i][t] - OLD[i][t])
            total += max(-adv[i] * r, -adv[i] * min(max(r, 0.8), 1.2))
    return total / norm


def test_lite_ppo_and_rloo_presets_match_hand_computation():
    mean, n = sum(R) / 4, 4
    std = math.sqrt(sum((r - mean) ** 2 for r in R) / (n - 1))  # one group: batch std = group std
    lite = [(r - mean) / (std + 1e-6) for r in R]
    loss, _, _ = spec_loss("lite_ppo")
    assert loss.item() == pytest.approx(hand_loss(lite, 12), abs=1e-6)
    rloo = [r - (sum(R) - r) / 3 for r in R]
    loss, _, _ = spec_loss("rloo")
    assert loss.item() == pytest.approx(hand_loss(rloo, 12), abs=1e-6)


def test_batch_std_spans_groups():
    s = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    adv = policy_gradient.advantages(s, adv_norm="batch", std_estimator="population", eps=0.0)
    assert torch.allclose(adv, torch.tensor([[0.5, -0.5], [0.0, 0.0]]) / s.flatten().std(unbiased=False))


def test_clipping_and_dual_clip():
    logp, old = torch.tensor([[0.0, 0.0]]), torch.log(torch.tensor([[1 / 1.5, 1 / 5.0]]))  # r = 1.5, 5
    loss, clipped = policy_gradient.clipped_surrogate(logp, old, torch.tensor([1.0]), clip_low=0.2, clip_high=0.28)
    assert torch.allclose(loss, torch.tensor([[-1.28, -1.28]]))  # positive A: capped at 1 + ε_high
    assert clipped.all()
    loss, _ = policy_gradient.clipped_surrogate(logp, old, torch.tensor([-1.0]), clip_low=0.2, clip_high=0.2,
                                                dual_clip=3.0)
    assert torch.allclose(loss, torch.tensor([[1.5, 3.0]]))  # ratio 5 with A = -1: capped at c·|A|


def test_token_weights_docstring_example():
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    w = policy_gradient.token_weights(mask, loss_agg="seq-mean-token-mean", n_seqs=2, n_tokens=5, max_len=4)
    assert torch.allclose(w, torch.tensor([[1 / 4, 1 / 4, 0], [1 / 6, 1 / 6, 1 / 6]]))
    w = policy_gradient.token_weights(mask, loss_agg="seq-mean-token-sum-norm", n_seqs=2, n_tokens=5, max_len=4)
    assert torch.allclose(w, mask / 8)


def test_kl_term_only_with_beta():
    loss0, m0, _ = spec_loss("grpo")
    cfg = preset_cfg("grpo", beta=0.1)
    ref = torch.tensor(OLD) - 0.1
    adv = ALGORITHMS["grpo"].advantages(torch.tensor([R]), cfg).flatten().float()
    logp = torch.tensor(LOGP)
    mb = LossInputs(logp=logp, old_logp=torch.tensor(OLD), mask=torch.ones(4, 3), adv=adv, ref_logp=ref)
    loss, m = ALGORITHMS["grpo"].loss(mb, cfg, {"seqs": 4, "tokens": 12, "max_len": cfg.max_new_tokens})
    d = ref - logp
    k3 = (torch.exp(d) - d - 1).mean()
    assert "kl/k3" not in m0 and m["kl/k3"].item() == pytest.approx(k3.item(), abs=1e-7)
    assert loss.item() == pytest.approx(loss0.item() + 0.1 * k3.item(), abs=1e-6)
