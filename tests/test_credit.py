"""Turn rewards and turn-level credit (--turn-credit, algos/credit.py, docs/math.md §8): the
worked example's advantages by hand, and the gradient of one update from them on 1 and 2 ranks."""
import math
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch

import algos
from config import Config, validate
from environments import Environment, Observations, Session, Step, Turns
from algos.credit import normalised, to_go
from environments.rollout import MultiTurn
from model import ResponseLogProbs, load_model, load_tokenizer
from parallel import wrap
from rewards import DataError, Problem
from rollout import Chunk, Episode, Sampling, collate, generate
from helpers import share_two_ranks
from train import Learner, set_advantages, shaped_score, update

EPS = 1e-6  # GRPO's adv_eps: each z-score below is (x − mean) / (std + EPS)


def worked_example():
    """docs/math.md §8's group of 4 traces: (turn lengths, turn rewards, outcome). τ1 is rewarded at
    turn 1 (with its observation) and at turn 3 (its outcome); τ2 at turn 1; τ3 answers at once."""
    spec = [([2, 1, 3], [1, 0, 0], 1.0), ([2, 2], [1, 0], 0.0), ([3], [0], 1.0), ([1, 1, 1], [0, 0, 0], 0.0)]
    out, token = [], iter(range(10, 90))
    for lengths, rewards, outcome in spec:
        query, context, chunks = [4, 5, 6], [4, 5, 6], []
        for n in lengths:
            turn = [next(token) for _ in range(n - 1)] + [1]  # each turn ends with <eos> (1)
            chunks.append(Chunk(list(context), turn))
            context += turn + [next(token)]  # an observation token, context only
        out.append(Episode(prompt_ids=query, response_ids=[t for c in chunks for t in c.response_ids], text="",
                           truncated=False, group=0, problem=Problem("p", "0"), reward=outcome, chunks=chunks,
                           turn_rewards=[float(r) for r in rewards]))
    return out


def z(x, mean, std):
    return (x - mean) / (std + EPS)


S23, S13, S12 = math.sqrt(2 / 3), math.sqrt(1 / 3), math.sqrt(1 / 2)  # unbiased stds of the sets below
HAND = {
    # returns R = O + Σ r = (2, 1, 1, 0): mean 1, std √(2/3); every turn of a trace carries its trace's
    "outcome": [[z(2, 1, S23)] * 3, [0.0] * 2, [0.0], [z(0, 1, S23)] * 3],
    # γ = 1, return-to-go per turn: turn 1 (2, 1, 1, 0) as above; turn 2 (τ1, τ2, τ4) = (1, 0, 0): mean 1/3,
    # std √(1/3); turn 3 (τ1, τ4) = (1, 0): mean 1/2, std √(1/2)
    "return": [[z(2, 1, S23), z(1, 1 / 3, S13), z(1, .5, S12)], [0.0, z(0, 1 / 3, S13)], [0.0],
               [z(0, 1, S23), z(0, 1 / 3, S13), z(0, .5, S12)]],
    # λ = 1: A^O over outcomes (1, 0, 1, 0), mean 1/2, std √(1/3); A^I at turn 1 over (1, 1, 0, 0), the same
    # statistics; turns 2 and 3 have no turn reward (all 0: A^I = 0). Turn k: A^O + Σ_{l ≥ k} A^I_l
    "mt_grpo": [[2 * z(1, .5, S13), z(1, .5, S13), z(1, .5, S13)], [0.0, z(0, .5, S13)], [0.0],
                [2 * z(0, .5, S13), z(0, .5, S13), z(0, .5, S13)]],
}


def config(credit, algo="grpo", **over):
    return replace(Config(algo=algo, group_size=4, prompts_per_step=1, max_new_tokens=4, env="calculator",
                          max_turns=3, turn_credit=credit, grad_clip=0.0),
                   **{**algos.get(algo).preset, "dynamic_sampling": False, "overlong_penalty": False,
                      "mini_batches": 1, "epochs": 1, **over})


def credited(cfg):
    episodes = worked_example()
    for e in episodes:
        e.score = shaped_score(e, cfg)
    set_advantages(episodes, algo=algos.get(cfg.algo), cfg=cfg)
    return episodes


@pytest.mark.parametrize("credit", HAND)
def test_the_worked_example_by_hand(credit):
    episodes = credited(config(credit))
    assert [e.score for e in episodes] == [2.0, 1.0, 1.0, 0.0]  # the return: outcome + turn rewards
    got = [[e.row_advantage(c) for c in e.chunks] for e in episodes]
    for row, hand in zip(got, HAND[credit]):
        assert row == pytest.approx(hand, abs=1e-6)


def test_a_discounted_return_to_go():
    """γ = 0.5: G_k = Σ_{l ≥ k} γ^{l−k} r_l + γ^{K−k} O. τ1 (r 1, 0, 0; O 1): 1.25, 0.5, 1; τ2 (1, 0; 0): 1, 0;
    τ3: 1; τ4: 0, 0, 0; each set z-scored at its turn."""
    assert to_go([1, 0, 0], 1.0, 0.5) == [1.25, 0.5, 1.0]
    episodes = credited(config("return", turn_gamma=0.5))
    turn1 = torch.tensor([1.25, 1, 1, 0], dtype=torch.float64)
    m, s = turn1.mean().item(), turn1.std().item()  # 0.8125, √(0.921875 / 3)
    first = [e.turn_advantages[0] for e in episodes]
    assert first == pytest.approx([z(x, m, s) for x in turn1.tolist()], abs=1e-6)
    assert episodes[0].turn_advantages[1:] == pytest.approx([z(.5, 1 / 6, math.sqrt(1 / 12)), z(1, .5, S12)], abs=1e-6)


def test_sets_of_one_and_the_batch_std():
    """A set of one keeps its value (a group of one's convention; leave-one-out has no other); Lite PPO's
    "batch" divides each set's centred values by the std of all of them."""
    norm = dict(adv_norm="rloo", std_estimator="unbiased", eps=0.0)
    assert normalised([3.0, 1.0, 0.0, 5.0], ["a", "a", "a", "b"], norm) == pytest.approx([2.5, -0.5, -2.0, 5.0])
    batch = normalised([1.0, 0.0, 2.0, 2.0], ["a", "a", "b", "b"], {**norm, "adv_norm": "batch"})
    assert batch == pytest.approx([0.5 / 0.9574271, -0.5 / 0.9574271, 0.0, 0.0])


def test_outcome_credit_without_turn_rewards_is_the_single_turn_rule():
    """The default: every row carries its trace's advantage, the group z-score of its reward."""
    episodes = worked_example()
    for e in episodes:
        e.turn_rewards = []
    cfg = config("outcome")
    for e in episodes:
        e.score = shaped_score(e, cfg)
    set_advantages(episodes, algo=algos.get("grpo"), cfg=cfg)
    hand = [z(1, .5, S13), z(0, .5, S13)] * 2
    assert [[e.row_advantage(c) for c in e.chunks] for e in episodes] == \
        [pytest.approx([a] * len(e.chunks), abs=1e-6) for a, e in zip(hand, episodes)]


# ----------------------------------------------------------------------------- through update

def hand_gradient(model_dir, credit):
    """The gradient of GRPO's loss at ratio 1 written out: Σ_τ Σ_{rows k} −A_{τ,k} / (n L_τ) Σ_t logp_t,
    L_τ the tokens τ wrote (6, 4, 3, 3), n = 4 traces, each row scored alone with its own prompt."""
    lm = load_model(model_dir)
    episodes = worked_example()
    rows = [(e, c) for e in episodes for c in e.chunks]
    batch = collate([c for _, c in rows], 0, "cpu")
    logp = ResponseLogProbs(lm)(batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask,
                                1.0)["logp"]
    flat = [a for trace in HAND[credit] for a in trace]
    weight = torch.tensor([-a / (len(episodes) * len(e.response_ids)) for a, (e, _) in zip(flat, rows)])
    (weight[:, None] * batch.response_mask * logp).sum().backward()
    return {name: p.grad.clone() for name, p in lm.named_parameters()}


def one_update(model_dir, credit, rank=0, world=1):
    """The change of one SGD step at lr 1 (minus the gradient) of `update` on the worked example."""
    torch.manual_seed(0)
    lm = load_model(model_dir)
    start = {name: p.detach().clone() for name, p in lm.named_parameters()}
    # as train.py wraps it: under DDP on 2 ranks, the ranks' gradients summed (parallel.sum_in_rank_order)
    scorer = wrap(ResponseLogProbs(lm), mode="ddp", world=world, device=torch.device("cpu"), dtype=torch.float32)
    opt = torch.optim.SGD(lm.parameters(), lr=1.0)
    cfg = config(credit, micro_batch_size=2)
    learner = Learner(scorer=scorer, lm=lm, ref_scorer=None, optimizer=opt,
                      scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), algo=algos.get("grpo"),
                      cfg=cfg, autocast=nullcontext, pad_id=0, rank=rank, world=world, device=torch.device("cpu"))
    episodes = worked_example()
    for e in episodes:
        e.score = shaped_score(e, cfg)
    update(learner, episodes)
    return {name: start[name] - p.detach() for name, p in lm.named_parameters()}


def on_two_ranks(rank, world, dirs) -> dict:
    return {credit: one_update(dirs["random_model"], credit, rank, world) for credit in HAND}


share_two_ranks("credit", on_two_ranks)


@pytest.mark.slow
def test_update_takes_each_rows_advantage_on_1_and_2_ranks(random_model_dir, spawned_ranks):
    """The worked example's 11 turn rows in micro-batches of 2, on 1 rank and split over 2: the step
    is the hand-written gradient of each rule's advantages (and the rules differ)."""
    two = spawned_ranks["credit"]
    hands = {credit: hand_gradient(random_model_dir, credit) for credit in HAND}
    for credit, hand in hands.items():
        one = one_update(random_model_dir, credit)
        for name in hand:
            assert torch.allclose(one[name], hand[name], atol=1e-6), (credit, name)
            assert torch.allclose(two[credit][name], hand[name], atol=1e-6), (credit, name, "2 ranks")
    assert any(not torch.allclose(hands["outcome"][n], hands["mt_grpo"][n], atol=1e-4) for n in hands["outcome"])


# ----------------------------------------------------------------------------- from the environment

class Rewarding(Environment):
    """Rewards turn 1 with 0.5 and its observation, then ends the trace at turn 2 with reward 1."""

    def step(self, turn):
        self.turns = getattr(self, "turns", 0) + 1
        return Step("ok", reward=0.5) if self.turns == 1 else Step(reward=1.0)


def test_a_reward_given_with_an_observation_is_its_turns(monkeypatch):
    """Step(observation, reward) on turn 1: Episode.turn_rewards [0.5, 0], the outcome 1, the return 1.5,
    and turns/reward logs the 0.5."""
    import rollout
    tok = load_tokenizer("assets/tiny-running-sum")
    eos = tok.eos_token_id
    monkeypatch.setattr(rollout, "sample", lambda lm, t, rows, sampling, **_: [([7, eos], [0.0, 0.0])] * len(rows))
    render = Observations(tok, chat_template=True)
    [e] = generate(None, tok, [Problem("p", "1")], [[4, 5]], group_size=1, sampling=Sampling(max_new_tokens=4),
                   shape=MultiTurn(lambda p: Session(Rewarding(p), render, 8), Turns(max_turns=3)))
    assert len(e.chunks) == 2 and e.turn_rewards == [0.5, 0.0] and e.env_reward == 1.0
    assert e.details["turns/reward"] == 0.5
    e.reward = e.env_reward
    assert shaped_score(e, config("outcome", group_size=1)) == 1.5


def test_the_algorithms_that_read_turn_credit_are_those_with_a_group_normalisation():
    """Algorithm.norm and the TURN_CREDIT_KNOBS are declared apart: an algorithm that read the knob
    without a norm would fail in set_advantages, one with a norm that did not read it would refuse
    a rule it can take."""
    readers = {name for name, a in algos.ALGORITHMS.items() if "turn_credit" in {k.name for k in a.knobs}}
    assert readers == {name for name, a in algos.ALGORITHMS.items() if a.norm is not None}
    assert readers.isdisjoint({"psr", "nsr", "w_reinforce", "reinforce_pp", "pacs", "gspo"})


@pytest.mark.parametrize("over,message", [
    (dict(algo="nsr", env="calculator", turn_credit="return"), "--algo nsr does not read turn_credit"),
    (dict(algo="grpo", turn_credit="mt_grpo"), "credits the turns of multi-turn traces: give --env"),
    (dict(algo="grpo", env="calculator", turn_gamma=0.9), "discount of --turn-credit return, not outcome"),
    (dict(algo="grpo", env="calculator", turn_credit="return", turn_adv_coef=2.0), "mt_grpo, not return"),
])
def test_credit_settings_that_cannot_apply_are_named(over, message):
    cfg = replace(Config(algo=over["algo"]), **algos.get(over["algo"]).preset, **over)
    with pytest.raises(DataError, match=message):
        validate(cfg, world=1)


def test_an_environment_may_not_log_its_own_turns_reward():
    """turns/reward is the rollout's sum of the turn rewards: a Step's details may not set it."""
    class Forging(Environment):
        def step(self, turn):
            return Step("ok", reward=0.0, details={"turns/reward": 5.0})
    session = Session(Forging(Problem("p", "1")), Observations(load_tokenizer("assets/tiny-running-sum"), True), 8)
    assert session.answer("turn") is None and session.stop == "failed"
    assert "turns/reward" in session.error and session.details["env/failures"] == 1
