"""Turn-level credit, `--turn-credit`: how a multi-turn trace's rewards become the advantages of its
turns (docs/math.md §8, with a worked example that tests/test_credit.py checks through `update`).

Trace i of a group writes turns k = 1..K_i, each a training row. Its environment may give a reward
r_{i,k} with the observation that answers turn k (a turn reward, `Step(observation, reward)`; 0 where
it gives none), and the trace ends with its outcome O_i (the environment's reward or the task's
grade, shaped like any response's: Dr. GRPO's zero for a truncated trace, DAPO's overlong penalty).
Its return is R_i = O_i + Σ_k r_{i,k} (rollout.Episode.score). norm_S(x) is the algorithm's own group
normalisation (its Algorithm.norm: a z-score, centring, leave-one-out, or the group's mean over Lite
PPO's batch std) applied to a set S of rows as if S were a group:

  outcome (default)  every turn of trace i: norm over its group of R_i, the algorithm's own advantage
                     of the trace (train.set_advantages; without turn rewards the single-turn rule)
  return             turn (i, k): norm over the group's rows at turn k of the return-to-go
                       G_{i,k} = Σ_{l=k..K_i} γ^{l−k} r_{i,l} + γ^{K_i−k} O_i            (--turn-gamma γ)
  mt_grpo            turn (i, k): A^O_i + λ Σ_{l=k..K_i} A^I_{i,l}, where A^O = norm over the group of O
                     and A^I_{·,l} = norm over the group's rows at turn l of r_{·,l}   (--turn-adv-coef λ)

"The group's rows at turn k" are the k-th turns of the group's traces that have one; a trace that
ended earlier is not in the set, and one that ended at turn k is, with r = 0 there (its reward is
its outcome). A set of one row has no baseline: it keeps its value, as a group of one does.

mt_grpo is MT-GRPO's (Zeng et al. 2025, arXiv 2505.11821; SiliangZeng/Multi-Turn-RL-Agent,
verifiers/trainers/mt_grpo_env_trainer.py): there, two turns (a search call, then the answer); the
tokens of the first turn get A^O + λ·A^T and those of the second A^O, each advantage a z-score over
the group of G independent rollouts (std unbiased, + 1e-4: --adv-eps 1e-4 to match). Its turn
reward's baseline is exact only when every rollout of a group shares the turn's prefix, which a
rollout tree gives (G continuations sampled at each turn: G^(K−1) traces for K turns); like the
official code, this one samples G independent traces and compares their k-th turns. With K = 2 and
every trace calling the tool it is the official rule; a trace there that never called gets the
merged return's advantage, here A^O + λ·A^I (its turn reward 0).
"""
from __future__ import annotations

import torch

from algos.policy_gradient import advantages


def set_turn_advantages(episodes: list, norm: dict, cfg) -> None:
    """e.turn_advantages (one per row) of every trace of the global batch under cfg.turn_credit,
    return or mt_grpo; e.advantage, its first turn's. norm: the algorithm's Algorithm.norm(cfg)."""
    turns = [e.turn_rewards or [0.0] * len(e.rows()) for e in episodes]
    outcomes = [e.score - sum(r) for e, r in zip(episodes, turns)]
    at = [(e.group, k) for e, r in zip(episodes, turns) for k in range(len(r))]  # a row's set: its group's turn k
    if cfg.turn_credit == "return":
        rows = normalised([g for r, o in zip(turns, outcomes) for g in to_go(r, o, cfg.turn_gamma)], at, norm)
    elif cfg.turn_credit == "mt_grpo":
        whole = normalised(outcomes, [e.group for e in episodes], norm)
        each = iter(normalised([x for r in turns for x in r], at, norm))
        rows = [o + cfg.turn_adv_coef * a for r, o in zip(turns, whole)
                for a in to_go([next(each) for _ in r], 0.0, 1.0)]
    else:
        raise ValueError(f"turn_credit={cfg.turn_credit!r}: set_turn_advantages gives return or mt_grpo")
    rows = torch.tensor(rows).float().tolist()  # as the trace-level advantages are: float32
    for e, r in zip(episodes, turns):
        e.turn_advantages, rows = rows[:len(r)], rows[len(r):]
        e.advantage = e.turn_advantages[0]


def to_go(rewards: list[float], last: float, gamma: float) -> list[float]:
    """Each turn's discounted sum of the rewards from it on, `last` added at the final turn.
    [1, 0, 0.5], last 1, γ 0.5 -> [1 + 0.5·0 + 0.25·1.5, 0 + 0.5·1.5, 1.5] = [1.375, 0.75, 1.5]."""
    out, running = [], 0.0
    for i, r in enumerate(reversed(rewards)):
        running = r + (last if i == 0 else gamma * running)
        out.append(running)
    return out[::-1]


def normalised(values: list[float], sets: list, norm: dict) -> list[float]:
    """policy_gradient.advantages with `norm`'s settings, applied to each set of values (rows with
    the same key in `sets`) as to a group, in float64. adv_norm "batch" (Lite PPO): each set's mean,
    the std of all the values. A set of one keeps its value (no baseline; leave-one-out has no other; MaxRL's
    mean rule gives it 0, as prime-rl gives a group of one).
    [1, 0, 1, 1] in sets [a, a, b, b], group z-score -> [0.707, −0.707, 0, 0]."""
    x = torch.tensor(values, dtype=torch.float64)
    out = torch.empty_like(x)
    batch = norm["adv_norm"] == "batch"
    members: dict = {}
    for i, key in enumerate(sets):
        members.setdefault(key, []).append(i)
    for idx in map(torch.tensor, members.values()):
        rule = "none" if batch or (len(idx) == 1 and norm["adv_norm"] == "rloo") else norm["adv_norm"]
        out[idx] = advantages(x[idx].view(1, -1), **{**norm, "adv_norm": rule}).flatten()
    if batch:
        std = x.std(unbiased=norm["std_estimator"] == "unbiased") if len(x) > 1 else x.new_ones(())
        out = out / (std + norm["eps"])
    return out.tolist()
