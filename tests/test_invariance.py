"""docs/math.md §0: one mini-batch gives the same update on 1 or 2 ranks, with 1 or 3 micro-batches."""
import random
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch

import algos
from extras.lora import AdaptersOff, add_lora
from model import ResponseLogProbs, load_model
from parallel import wrap
from rewards import Problem
from rollout import Chunk, Episode
from config import Config
from train import Learner, pack, padded_tokens, split_minibatches, update
from helpers import share_two_ranks


def make_episodes(seed=0, groups=3, g=4, chunked=False, turns=False):
    """3 groups of 4 with ragged prompts/responses, one truncated response, mixed rewards.
    chunked: Markovian traces, written in chunks of 3 then 2 tokens (C = 3, m = 1, h = 0).
    turns: multi-turn traces, turns of 3 then 2 tokens, each next turn prompted with all before
    it and 1 to 3 observation tokens, and turn rewards (docs/math.md §8)."""
    rng = random.Random(seed)
    eps = []
    for gi in range(groups):
        for i in range(g):
            n = rng.randint(1, 7)
            q = [rng.randint(4, 90) for _ in range(rng.randint(3, 6))]
            resp = [rng.randint(4, 90) for _ in range(n - 1)] + [1]
            cuts = [0, 3, 5, 7] if chunked or turns else [0, 7]
            chunks = [Chunk(q + resp[lo - 1:lo] if lo else q, resp[lo:hi])
                      for lo, hi in zip(cuts, cuts[1:]) if resp[lo:hi]]
            if turns:
                context, chunks = list(q), []
                for lo, hi in zip(cuts, cuts[1:]):
                    if resp[lo:hi]:
                        chunks.append(Chunk(list(context), resp[lo:hi]))
                        context += resp[lo:hi] + [rng.randint(4, 90) for _ in range(rng.randint(1, 3))]
            eps.append(Episode(prompt_ids=q, response_ids=resp, text="", truncated=(gi, i) == (1, 2),
                               group=gi, problem=Problem("p", "0"), reward=float(rng.random() < 0.5),
                               chunks=chunks))
    draw = random.Random(seed + 1)  # turn rewards, drawn apart so that the traces are those of before
    for e in eps:
        e.turn_rewards = [draw.choice([0.0, 0.0, 0.5, 1.0]) for _ in e.chunks] if turns else []
        e.score = e.reward + sum(e.turn_rewards)
    return eps


def policy(model_dir, cfg, gradient_checkpointing=False):
    """(lm, peft model or None) as train.main builds them; with cfg.lora_rank the adapters' B is
    drawn at random (peft starts it at 0), so that A gets a gradient too and the policy differs
    from its reference, the base."""
    lm = load_model(model_dir, gradient_checkpointing=gradient_checkpointing)
    if not cfg.lora_rank:
        return lm, None
    adapters = add_lora(lm, rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=cfg.lora_targets, base=model_dir,
                        dtype=torch.float32, seed=cfg.seed)
    draw = torch.Generator().manual_seed(1)
    for name, p in lm.named_parameters():
        if ".lora_B." in name:
            p.data.copy_(0.01 * torch.randn(p.shape, generator=draw))
    return lm, adapters


def one_update(model_dir, cfg, rank=0, world=1):
    torch.manual_seed(0)
    lm, adapters = policy(model_dir, cfg)
    # as train.py wraps it: under DDP on 2 ranks, the ranks' gradients summed (parallel.sum_in_rank_order)
    scorer = wrap(ResponseLogProbs(lm), mode="ddp", world=world, device=torch.device("cpu"), dtype=torch.float32)
    # SGD with lr 1: the parameter change is the gradient itself (Adam's first step would hide
    # a wrong gradient scale behind its sign-like normalisation).
    opt = torch.optim.SGD([p for p in lm.parameters() if p.requires_grad], lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    ref = None
    if cfg.beta > 0:  # LoRA: the base is the reference (the scorer with the adapters off)
        ref = AdaptersOff(scorer, adapters) if adapters else ResponseLogProbs(load_model(model_dir, trainable=False))
    if cfg.teacher:  # OPD: the random model with its weights moved by a seeded draw, so that it disagrees
        teacher, draw = load_model(model_dir, trainable=False), torch.Generator().manual_seed(2)
        for p in teacher.parameters():
            p.data.add_(0.05 * torch.randn(p.shape, generator=draw))
        ref = ResponseLogProbs(teacher)
    episodes = make_episodes(chunked=cfg.max_chunks > 1, turns=bool(cfg.env))
    learner = Learner(scorer=scorer, lm=lm, ref_scorer=ref, optimizer=opt, scheduler=sched, algo=algos.get(cfg.algo),
                      cfg=cfg, autocast=nullcontext, pad_id=0, rank=rank, world=world, device=torch.device("cpu"))
    metrics = update(learner, episodes)
    return {k: v.detach().clone() for k, v in lm.state_dict().items()}, metrics


def on_two_ranks(rank, world, dirs) -> list[dict]:
    """Each case's update on this rank, with micro-batch 3: [{"params", "metrics"} or {"error"}, ...], in
    CASES order (a case that fails on one rank only is an error on the other, after the collective
    timeout of helpers.share_two_ranks)."""
    results = []
    for algo, over in CASES:
        try:
            params, metrics = one_update(dirs["random_model"], config(algo, over, micro=3), rank, world)
            results.append({"params": params, "metrics": metrics})
        except Exception as e:  # reported by that case's test; the next cases still run
            results.append({"error": f"{type(e).__name__}: {e}"})
    return results


CASES = [("grpo", {}), ("dapo", {"mask_truncated": True}), ("dr_grpo", {}), ("rloo", {"mini_batches": 2}),
         # PSR/NSR drop rows first; ROVER and PACS differ from policy gradient only from the 2nd
         # mini-batch on, so they run K = 2 (and W-REINFORCE, two epochs)
         # (and W-REINFORCE, two epochs). NSR keeps 7 rows: 4 + 3 over 2 ranks, so with micro-batch
         # 3 rank 1 runs a dummy, which must also work with a reference model (beta > 0). PACS with
         # K = 3 has one group per mini-batch, so rank 1 only ever runs dummies; β = 0.2 keeps its
         # unclipped lr-1 steps small (at β = 1 weights move by ~70 and rounding grows past 1e-5).
         ("psr", {}), ("nsr", {"beta": 0.04}), ("w_reinforce", {"epochs": 2}),
         ("rover", {"mini_batches": 2}), ("pacs", {"mini_batches": 3, "pacs_beta": 0.2}),
         # Markovian traces: up to 3 chunk rows each, split anywhere over micro-batches and
         # ranks, normalised per trace (and ROVER on the same chunked traces)
         ("delethink", {}), ("rover", {"mini_batches": 2, "max_chunks": 3}),
         # rows sorted by length and cut by a budget of padded tokens instead of a row count
         ("delethink", {"max_tokens_per_micro_batch": 30}),
         # docs/math.md §7. GSPO and Clip-Cov as preset (K = 4: 3 mini-batches of one group here); CISPO,
         # SAPO and KL-Cov barely clip, so K = 2: three unclipped lr-1 steps grow rounding past
         # 1e-5. REINFORCE++ whitens over the batch's trained tokens.
         ("gspo", {}), ("cispo", {"mini_batches": 2}), ("sapo", {"mini_batches": 2}),
         ("reinforce_pp", {"mask_truncated": True}),
         # Token choices over the whole mini-batch, at the current weights: windows and ratios wide
         # enough that Clip-Cov draws some of many candidates and KL-Cov picks a fifth of the
         # tokens, also from chunk rows split over micro-batches and ranks; the 80/20 mask
         ("clip_cov", {"clip_cov_ratio": 0.2, "clip_cov_lb": 0.0, "clip_cov_ub": 2.0}),
         ("kl_cov", {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0, "mini_batches": 2}),
         ("kl_cov", {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0, "mini_batches": 2, "max_chunks": 3}),
         ("grpo", {"top_entropy_quantile": 0.2}), ("rover", {"mini_batches": 2, "top_entropy_quantile": 0.2}),
         # multi-turn traces (docs/math.md §8): turn rows with observations in their prompts, split
         # anywhere over micro-batches and ranks, normalised by written tokens only
         ("grpo", {"env": "calculator"}), ("dapo", {"env": "calculator", "mask_truncated": True}),
         ("dr_grpo", {"env": "calculator"}), ("cispo", {"env": "calculator", "mini_batches": 2}),
         ("kl_cov", {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0, "mini_batches": 2, "env": "calculator"}),
         # each turn row its own advantage (--turn-credit), also in a batch-wide token choice
         ("grpo", {"env": "calculator", "turn_credit": "return", "turn_gamma": 0.5}),
         ("lite_ppo", {"env": "calculator", "turn_credit": "mt_grpo"}),
         ("rover", {"mini_batches": 2, "env": "calculator", "turn_credit": "return"}),
         ("kl_cov", {"kl_cov_ratio": 0.2, "kl_cov_coef": 1.0, "mini_batches": 2, "env": "calculator",
                     "turn_credit": "mt_grpo", "turn_adv_coef": 0.5}),
         # docs/math.md §10: per-token advantages from a teacher, scored on every rank's share; with the reward's
         # group advantage and a discount, over K = 2 mini-batches (the teacher scored before the first step)
         ("opd", {"teacher": "moved"}),
         ("opd", {"teacher": "moved", "opd_alpha": 1.0, "opd_gamma": 0.5, "mini_batches": 2}),
         # docs/math.md §11: DPPO's probability masks, with the squared log-ratio penalty, also on chunk rows; MaxRL's
         # advantage; GMPO's geometric mean; the off-policy sequence mask with the unbiased KL to a reference. K = 2
         # (their masks barely act on lr-1 steps of a random model: more steps grow rounding past 1e-5)
         ("dppo_tv", {"mini_batches": 2, "kl_tau": 0.1}), ("dppo_kl", {"mini_batches": 2}),
         ("dppo_tv", {"mini_batches": 2, "max_chunks": 3}), ("maxrl", {}), ("maxrl", {"max_chunks": 3}),
         ("gmpo", {"mini_batches": 2}), ("opsm", {"mini_batches": 2, "off_policy_mask": 0.05})]


def config(algo, over, micro):
    cfg = Config(algo=algo, group_size=4, prompts_per_step=3, micro_batch_size=micro, max_new_tokens=8)
    if algos.get(algo).whole_groups:  # PACS: a micro-batch holds one or more whole groups
        micro = max(micro, cfg.group_size)
    return replace(cfg, **{**algos.get(algo).preset, **over, "dynamic_sampling": False,
                           "overlong_penalty": False, "micro_batch_size": micro, "grad_clip": 0.0})


share_two_ranks("invariance", on_two_ranks)


@pytest.fixture(scope="module")
def two_ranks(spawned_ranks):
    """Each case's update on 2 ranks with micro-batch 3, in CASES order. Each rank holds 6 of the
    12 rows, in 2 micro-batches (PACS: whole groups of 4, so rank 0 gets 2 groups and rank 1 one
    group plus an empty micro-batch that must still join DDP's all-reduce; PSR/NSR: the kept
    rows, rebalanced)."""
    return spawned_ranks["invariance"]


# A metric is an fp32 sum over the mini-batch's tokens or the model's parameters, taken in another
# order on 2 ranks or in other micro-batches: pairwise summation of n terms is off by ~log2(n)·ε
# relative (ε = 6e-8; n ≈ 1e5 parameters for the grad norm: ~1e-6, and 3.8e-6 was seen on a Zen 2
# CPU for a norm of 9.4). So 1e-5 relative, with 1e-5 absolute for metrics near 0 (means of O(1)
# per-token terms whose rounding does not shrink with their difference, e.g. a loss of ±A·r terms).
METRIC_REL, METRIC_ABS = 1e-5, 1e-5


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
@pytest.mark.slow
def test_micro_batches_and_ranks_agree(case, random_model_dir, two_ranks):
    algo, over = CASES[case]
    base, base_metrics = one_update(random_model_dir, config(algo, over, micro=12))
    start = load_model(random_model_dir).state_dict()
    assert any((base[k] - start[k]).abs().max() > 1e-4 for k in base)  # the step did something

    split, _ = one_update(random_model_dir, config(algo, over, micro=4))  # 3 micro-batches
    for k in base:
        assert torch.allclose(base[k], split[k], atol=1e-5), f"micro-batches differ at {k}"

    two = two_ranks[case]  # 2 ranks, micro-batch 3
    assert "error" not in two, two.get("error")
    for k in base:
        assert torch.allclose(base[k], two["params"][k], atol=1e-5), f"2 ranks differ at {k}"
    assert two["metrics"].keys() == base_metrics.keys()
    for k in base_metrics:  # loss, entropy, grad norm and each algorithm's own quantities
        if k.startswith("layout/"):  # the tensors' shapes (padding, the ranks' spread) follow the split by design
            continue
        assert two["metrics"][k] == pytest.approx(base_metrics[k], rel=METRIC_REL, abs=METRIC_ABS), k


def test_token_budget_micro_batches_sort_rows_and_pad_little():
    """Markovian traces (3 chunk rows of 4-9 prompt tokens + 1-3 response tokens each), budget
    30 padded tokens: every micro-batch holds at most 30 (a row alone may not fit), every row is
    trained once, and sorting by length pads less than the rows in rollout order."""
    episodes = make_episodes(chunked=True)
    rows = [(e, c) for e in episodes for c in e.rows()]
    cfg = replace(config("delethink", {}, micro=64), max_tokens_per_micro_batch=30)
    micro = [m for rank in (0, 1) for _, mine in split_minibatches(episodes, cfg, rank, world=2) for m in mine if m]
    assert all(padded_tokens(m) <= 30 or len(m) == 1 for m in micro)
    assert sorted(id(c) for m in micro for _, c in m) == sorted(id(c) for _, c in rows)
    real = sum(len(c.prompt_ids) + len(c.response_ids) for _, c in rows)
    in_order = pack([[r] for r in rows], 64, 30)
    assert sum(map(padded_tokens, micro)) - real < sum(map(padded_tokens, in_order)) - real


def test_an_entropy_penalty_is_the_bonus_with_its_sign_turned(random_model_dir):
    """loss − c·H: one SGD step (lr 1) moves the weights by c·∇H beside c = 0, so c = −0.5 moves them
    exactly opposite to c = 0.5 (a negative c was once ignored, the run silently without it)."""
    cfg = config("grpo", {}, 4)
    base = one_update(random_model_dir, cfg)[0]
    up, down = (one_update(random_model_dir, replace(cfg, entropy_coef=c))[0] for c in (0.5, -0.5))
    step = torch.cat([(up[k] - base[k]).flatten() for k in base])
    back = torch.cat([(down[k] - base[k]).flatten() for k in base])
    assert step.abs().max() > 1e-4
    # the weights' own fp32 rounding (θ ~ 1, so ~1e-7 a difference), ~1e-3 of the step
    torch.testing.assert_close(back, -step, atol=1e-6, rtol=0)
