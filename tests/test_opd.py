"""docs/math.md §10: on-policy distillation (--algo opd) and its teacher.

The worked example runs through train.update itself: a "model" whose logits at position j are row j of a
parameter table (TableLM), so the table's gradient is the loss's gradient with respect to the logits, and
SGD with lr 1 moves the table by exactly minus that gradient. Every expected number is computed here in
plain Python from the hand-set logits, and held to docs/math.md §10's printed values; on 1 rank with one or
two micro-batches, and on 2 gloo ranks (the session's spawn, helpers.share_two_ranks).
"""
import math
from contextlib import nullcontext
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig

import algos
import pair
from algos import opd
from config import Config, parse_config, validate
from helpers import share_two_ranks
from model import ResponseLogProbs, load_model
from parallel import wrap
from rewards import DataError, Problem
from rollout import Chunk, Episode, collate
from train import Learner, update

# docs/math.md §10: a vocabulary of 3, one response y = (0, 1) after a one-token prompt
Y = [0, 1]
STUDENT = [[1.0, 0.0, -1.0], [0.0, 0.5, 0.0]]
TEACHER = [[0.0, 1.0, 0.0], [2.0, 0.0, 0.0]]


def log_softmax(z):
    top = max(z)
    lse = top + math.log(sum(math.exp(x - top) for x in z))
    return [x - lse for x in z]


OLD = [log_softmax(z)[y] for z, y in zip(STUDENT, Y)]
GAP = [log_softmax(z)[y] - old for z, y, old in zip(TEACHER, Y, OLD)]  # λ·(log π_T − log π_old), λ = 1


def expected(alpha: float, group_adv: list[float]) -> dict:
    """Loss, reverse KL and ∂loss/∂logits [position][token] of a group of responses that all write Y, token-mean
    over all their tokens at θ = old: loss = −Σ A_t / N, and ∂/∂z_t of −A_t·log π(y_t) is
    −A_t·(onehot(y_t) − p_t)."""
    n = len(group_adv) * len(Y)
    adv = [[alpha * a + g for g in GAP] for a in group_adv]
    grad = [[0.0] * 3 for _ in Y]
    for row in adv:
        for t, (z, y) in enumerate(zip(STUDENT, Y)):
            p = [math.exp(x) for x in log_softmax(z)]
            for k in range(3):
                grad[t][k] += -row[t] * ((k == y) - p[k]) / n
    return {"adv": adv, "loss": -sum(map(sum, adv)) / n, "reverse_kl": -sum(GAP) / len(Y), "grad": grad}


def test_expected_numbers_are_spec_9s():
    """The plain-Python expectations are docs/math.md §10's printed numbers (7 digits)."""
    assert OLD == pytest.approx([-0.4076060, -0.7943768], abs=1e-7)
    assert [g + o for g, o in zip(GAP, OLD)] == pytest.approx([-1.5514447, -2.2395448], abs=1e-7)
    one = expected(0.0, [0.0])
    assert one["adv"][0] == pytest.approx([-1.1438387, -1.4451680], abs=1e-7)
    assert one["loss"] == pytest.approx(1.2945034, abs=1e-7) and one["reverse_kl"] == pytest.approx(1.2945034, abs=1e-7)
    assert one["grad"] == [pytest.approx([0.1914552, -0.1399650, -0.0514902], abs=1e-7),
                           pytest.approx([-0.1980376, 0.3960752, -0.1980376], abs=1e-7)]
    assert expected(1.0, [0.5])["adv"][0] == pytest.approx([-0.6438387, -0.9451680], abs=1e-7)


class TableLM(torch.nn.Module):
    """A causal "LM" for model.ResponseLogProbs whose hidden state at position j is row j of `table` and whose
    LM head is the identity: the logits at position j are table[j], whatever the tokens."""

    def __init__(self, table):
        super().__init__()
        self.table = torch.nn.Parameter(torch.tensor(table))
        self.head = torch.nn.Linear(3, 3, bias=False)
        self.head.weight = torch.nn.Parameter(torch.eye(3), requires_grad=False)
        self.config = LlamaConfig(vocab_size=3)  # a Llama's logits: no scale, no soft-cap

    def get_output_embeddings(self):
        return self.head

    def get_decoder(self):
        return self

    def forward(self, input_ids, attention_mask, position_ids, use_cache=False):
        return SimpleNamespace(last_hidden_state=self.table[position_ids])


def group(rewards):
    """One prompt's responses, each the prompt token 2 then Y, with these rewards."""
    episodes = [Episode(prompt_ids=[2], response_ids=list(Y), text="", truncated=False, group=0,
                        problem=Problem("p", "0"), reward=r, chunks=[Chunk([2], list(Y))]) for r in rewards]
    for e in episodes:
        e.score = e.reward
    return episodes


def table_update(alpha: float, micro: int, rank: int = 0, world: int = 1) -> dict:
    """train.update of --algo opd on a group of two responses (rewards 1 and 0: A_group = ±0.5 with adv_norm none),
    student and teacher TableLMs; SGD lr 1, so the table moves by minus the loss's gradient."""
    cfg = replace(Config(algo="opd"), **{**algos.get("opd").preset, "group_size": 2, "prompts_per_step": 1,
                                         "adv_norm": "none", "opd_alpha": alpha, "micro_batch_size": micro,
                                         "grad_clip": 0.0})
    student = TableLM(STUDENT + [[0.0, 0.0, 0.0]])  # the last row is position 2's, which predicts nothing
    scorer = wrap(ResponseLogProbs(student), mode="ddp", world=world, device=torch.device("cpu"), dtype=torch.float32)
    opt = torch.optim.SGD([student.table], lr=1.0)
    learner = Learner(scorer=scorer, lm=student, ref_scorer=ResponseLogProbs(TableLM(TEACHER + [[0.0, 0.0, 0.0]])),
                      optimizer=opt, scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0),
                      algo=algos.get("opd"), cfg=cfg, autocast=nullcontext, pad_id=0, rank=rank, world=world,
                      device=torch.device("cpu"))
    metrics = update(learner, group([1.0, 0.0]))
    step = (student.table.detach()[:2] - torch.tensor(STUDENT)).tolist()  # = −∂loss/∂logits
    return {"grad": [[-x for x in row] for row in step], "loss": metrics["loss/total"],
            "reverse_kl": metrics["opd/reverse_kl"]}


CASES = [(alpha, micro) for alpha in (0.0, 1.0) for micro in (2, 1)]  # one micro-batch of both rows, or two


def on_two_ranks(rank, world, dirs) -> list[dict]:
    """CASES on 2 ranks: each rank holds one of the two rows."""
    return [table_update(alpha, micro, rank, world) for alpha, micro in CASES]


share_two_ranks("opd", on_two_ranks)


def assert_matches(got: dict, alpha: float) -> None:
    want = expected(alpha, [0.5, -0.5])
    assert got["loss"] == pytest.approx(want["loss"], abs=1e-6)
    assert got["reverse_kl"] == pytest.approx(want["reverse_kl"], abs=1e-6)
    for g, w in zip(got["grad"], want["grad"]):
        assert g == pytest.approx(w, abs=1e-6)


@pytest.mark.parametrize("alpha,micro", CASES)
def test_worked_example_through_the_update(alpha, micro):
    got = table_update(alpha, micro)
    assert_matches(got, alpha)
    if alpha == 0:  # both rows alike: the mini-batch is docs/math.md §10's one response, its numbers exactly
        assert got["loss"] == pytest.approx(1.2945034, abs=1e-6)
        assert got["grad"][0] == pytest.approx([0.1914552, -0.1399650, -0.0514902], abs=1e-6)
        assert got["grad"][1] == pytest.approx([-0.1980376, 0.3960752, -0.1980376], abs=1e-6)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"alpha{a:g}-micro{m}" for a, m in CASES])
def test_worked_example_on_two_ranks(case, spawned_ranks):
    assert_matches(spawned_ranks["opd"][case], CASES[case][0])


def test_token_advantages_alpha_and_discount():
    """α·A_group on every token, and γ's discounted sum of the later gaps, by hand on the worked example's gaps."""
    mb = SimpleNamespace(old_logp=torch.tensor([OLD]), ref_logp=torch.tensor([[g + o for g, o in zip(GAP, OLD)]]),
                         mask=torch.ones(1, 2), adv=torch.tensor([0.5]))
    cfg = SimpleNamespace(opd_alpha=1.0, opd_lambda=2.0, opd_gamma=0.5)
    adv = opd.token_advantages(mb, cfg)[0].tolist()
    assert adv == pytest.approx([0.5 + 2 * GAP[0] + 0.5 * 2 * GAP[1], 0.5 + 2 * GAP[1]], abs=1e-6)
    cfg.opd_gamma = 0.0
    assert opd.token_advantages(mb, cfg)[0].tolist() == pytest.approx([0.5 + 2 * g for g in GAP], abs=1e-6)


def test_teacher_equal_to_student_gives_zero_advantages_and_no_step(random_model_dir):
    """The teacher loaded as train.models loads it, from the student's own folder: every advantage is exactly 0,
    and a step of AdamW (the run's optimizer) leaves every weight as it was."""
    torch.manual_seed(0)
    lm = load_model(random_model_dir)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    teacher = ResponseLogProbs(load_model(random_model_dir, trainable=False))
    cfg = replace(Config(algo="opd"), **{**algos.get("opd").preset, "group_size": 4, "prompts_per_step": 1})
    episodes = group([1.0, 0.0, 1.0, 0.0])
    for e, extra in zip(episodes, ([5, 9], [7], [11, 12, 13], [])):  # ragged responses
        e.response_ids = e.chunks[0].response_ids = list(Y) + extra
    batch = collate([e.chunks[0] for e in episodes], 0, torch.device("cpu"))
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 1.0)
    old = ResponseLogProbs(lm)(*args)["logp"]
    with torch.no_grad():
        taught = teacher(*args)["logp"]
    mb = SimpleNamespace(old_logp=old.detach(), ref_logp=taught, mask=batch.response_mask, adv=torch.zeros(4))
    assert torch.equal(opd.token_advantages(mb, cfg), torch.zeros_like(old))
    opt = torch.optim.AdamW(lm.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)  # as train.learner_for
    learner = Learner(scorer=ResponseLogProbs(lm), lm=lm, ref_scorer=teacher, optimizer=opt,
                      scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), algo=algos.get("opd"), cfg=cfg,
                      autocast=nullcontext, pad_id=0, rank=0, world=1, device=torch.device("cpu"))
    metrics = update(learner, episodes)
    assert metrics["opd/reverse_kl"] == 0.0 and metrics["loss/total"] == 0.0
    assert all(torch.equal(before[k], v) for k, v in lm.state_dict().items())


# ---------------------------------------------------------------- train.py on 2 ranks

# the shipped model as the student, conftest's random Llama (the same tokenizer) as a teacher it disagrees with
pair.register("opd", ["--algo", "opd", "--teacher", "{random_model}", *pair.SMALL])


def test_torchrun_two_ranks_distil_from_a_teacher(two_rank_runs):
    import json
    run = pair.folder(two_rank_runs, "opd")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:  # a random teacher finds the student's tokens far less likely than the student does
        assert r["opd/reverse_kl"] > 1 and r["loss/total"] == pytest.approx(r["opd/reverse_kl"], rel=1e-5)
        assert r["grad/norm"] > 0


# ---------------------------------------------------------------- bad input, one line before any load

def refusal(argv) -> str:
    with pytest.raises(DataError) as e:
        validate(parse_config(argv), 1)
    return str(e.value)


def test_teacher_without_opd_is_refused(random_model_dir):
    message = refusal(["--algo", "grpo", "--teacher", random_model_dir])
    assert message.startswith(f"teacher={random_model_dir!r}: --algo grpo does not read teacher") and "(opd)" in message


def test_opd_refuses_no_teacher_a_folder_that_is_no_model_and_beta(tmp_path, random_model_dir):
    assert "give --teacher PATH" in refusal(["--algo", "opd"])
    assert refusal(["--algo", "opd", "--teacher", str(tmp_path)]).startswith(
        f"--teacher {tmp_path}: no config.json there")
    assert refusal(["--algo", "opd", "--teacher", str(tmp_path / "absent")]).startswith(
        f"--teacher {tmp_path / 'absent'}: no such folder")
    assert refusal(["--algo", "opd", "--teacher", random_model_dir, "--beta", "0.1"]).startswith(
        "beta=0.1: --algo opd does not read beta (the teacher takes the reference's place")
    assert refusal(["--algo", "opd", "--teacher", random_model_dir, "--temperature", "0.7"]).startswith(
        "temperature=0.7: --algo opd compares")
    assert refusal(["--algo", "opd", "--teacher", random_model_dir, "--opd-alpha", "1", "--group-size", "1"]).startswith(
        "opd_alpha=1.0 adds the reward's group advantage, which a group of one does not have")
    assert refusal(["--algo", "opd", "--teacher", random_model_dir, "--opd-gamma", "0.5", "--env", "calculator"]
                   ).startswith("opd_gamma=0.5 sums a response's later log-ratios")


def test_a_teacher_of_another_tokenizer_is_refused(tmp_path, random_model_dir):
    """The shipped tokenizer with one more token, and one with another eos id: each said in one line."""
    from build_tiny_model import build_model, build_tokenizer
    tok = build_tokenizer()
    tok.add_tokens(["<extra>"])
    tok.save_pretrained(tmp_path / "wider")
    build_model(len(tok), seed=0, hidden=32, layers=2).save_pretrained(tmp_path / "wider")
    message = refusal(["--algo", "opd", "--teacher", str(tmp_path / "wider"), "--model", random_model_dir])
    size = len(build_tokenizer())
    assert message == (f"--teacher {tmp_path / 'wider'}: its tokenizer is not the student's ({size + 1} tokens, the "
                       f"student's {size}); the teacher scores the student's token ids, so give a teacher of the same "
                       f"tokenizer as --model {random_model_dir}")
    other = build_tokenizer()
    other.eos_token = other.pad_token  # the same vocabulary, another end of sequence
    assert opd.tokenizer_difference(build_tokenizer(), other) == (
        f"eos_token_id {other.pad_token_id}, the student's {build_tokenizer().eos_token_id}")
    assert opd.tokenizer_difference(build_tokenizer(), build_tokenizer()) == ""
