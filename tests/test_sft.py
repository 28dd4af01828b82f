"""docs/math.md §12: supervised fine-tuning (--algo sft) on demonstrations, through train.update.

The worked example is test_opd.py's TableLM (logits at position j are row j of a parameter table; SGD lr 1 moves
the table by minus the loss's gradient), its expectation computed here in plain Python. Then the demonstrations
as the run encodes them (the shipped tokenizer: the template's tokens are prompt, never loss), one step equal on
1 rank, 2 ranks and any micro-batch split, kill -9 and --resume, LoRA and FSDP runs, and every refusal.
"""
import json
import math
from contextlib import nullcontext
from dataclasses import replace

import pytest
import torch

import algos
import pair
import train
from algos import sft
from config import Config, parse_config, validate
from helpers import kill_9, metrics, same_run, share_two_ranks, start_train, wait_until
from model import ResponseLogProbs, load_model, load_tokenizer
from parallel import wrap
from rewards import DataError
from test_opd import STUDENT, TableLM, log_softmax
from train import Learner, update

CPU = torch.device("cpu")
# two demonstrations after the one-token prompt [2]: y = (0, 1), and y = (2,) (padded to 2 in the batch)
DEMOS = [[0, 1], [2]]


def expected() -> dict:
    """L = −(log p_0(0) + log p_1(1) + log p_0(2)) / 3 and ∂L/∂z_t = −Σ (onehot(y_t) − p_t) / 3, by hand."""
    terms = [(t, y) for ys in DEMOS for t, y in enumerate(ys)]
    loss = -sum(log_softmax(STUDENT[t])[y] for t, y in terms) / len(terms)
    grad = [[0.0] * 3 for _ in STUDENT]
    for t, y in terms:
        p = [math.exp(x) for x in log_softmax(STUDENT[t])]
        for k in range(3):
            grad[t][k] -= ((k == y) - p[k]) / len(terms)
    return {"loss": loss, "grad": grad}


def test_expected_numbers_are_spec_11s():
    """The plain-Python expectation is docs/math.md §12's printed numbers (7 digits)."""
    want = expected()
    assert want["loss"] == pytest.approx(1.2031962, abs=1e-7)
    assert want["grad"] == [pytest.approx([0.1101606, 0.1631523, -0.2733130], abs=1e-7),
                            pytest.approx([0.0913562, -0.1827124, 0.0913562], abs=1e-7)]


def episodes_of(rows_of_demos) -> list:
    from rollout import Chunk, Episode
    from rewards import Problem
    return [Episode(prompt_ids=rows[0][0], response_ids=[t for _, r in rows for t in r], text="", truncated=False,
                    group=g, problem=Problem("p", ""), chunks=[Chunk(p, r) for p, r in rows])
            for g, rows in enumerate(rows_of_demos)]


def learner(lm, cfg, rank=0, world=1, mode="ddp"):
    scorer = wrap(ResponseLogProbs(lm), mode=mode, world=world, device=CPU, dtype=torch.float32)
    opt = torch.optim.SGD([p for p in lm.parameters() if p.requires_grad], lr=1.0)
    return Learner(scorer=scorer, lm=lm, ref_scorer=None, optimizer=opt,
                   scheduler=torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0), algo=algos.get("sft"), cfg=cfg,
                   autocast=nullcontext, pad_id=0, rank=rank, world=world, device=CPU)


def sft_config(**over) -> Config:
    return replace(Config(algo="sft"), **{**algos.get("sft").preset, "grad_clip": 0.0, **over})


@pytest.mark.parametrize("micro", [2, 1])
def test_worked_example_through_the_update(micro):
    """One micro-batch of both demonstrations (the second padded: its pad position carries no loss) or two."""
    table = TableLM(STUDENT + [[0.0, 0.0, 0.0]])
    got = update(learner(table, sft_config(prompts_per_step=2, micro_batch_size=micro)),
                 episodes_of([[([2], ys)] for ys in DEMOS]))
    want = expected()
    assert got["loss/total"] == pytest.approx(want["loss"], abs=1e-6)
    assert got["sft/nll"] == pytest.approx(want["loss"], abs=1e-6)
    step = (table.table.detach()[:2] - torch.tensor(STUDENT)).tolist()
    for g, w in zip(step, want["grad"]):
        assert [-x for x in g] == pytest.approx(w, abs=1e-6)


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


CHAT = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Add 1+2"},
                     {"role": "assistant", "content": "3"}, {"role": "user", "content": "Add 4+5"},
                     {"role": "assistant", "content": "9"}]}


def test_demonstrations_are_encoded_as_rl_prompts_are(tmp_path):
    """A prompt/response row: its prompt as the rollout encodes it (the template, --system-prompt), its response
    the text's ids and EOS. A chat: one row per assistant turn, the chat before it the prompt. Template tokens are
    prompt only: every loss token is an answer's character or EOS."""
    path = write(tmp_path / "d.jsonl", [{"prompt": "Add 1+2", "response": "1+2=3 <answer>3</answer>"}, CHAT])
    tok = load_tokenizer(Config().model)
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    [plain, chat] = sft.demonstrations(Config(algo="sft", sft_data=path))
    assert [(c.prompt_ids, c.response_ids) for c in plain.rows] == [
        (ids("<|user|>Add 1+2<|assistant|>"), ids("1+2=3 <answer>3</answer>") + [tok.eos_token_id])]
    assert [(c.prompt_ids, c.response_ids) for c in chat.rows] == [
        (ids("<|system|>Be brief.<|user|>Add 1+2<|assistant|>"), ids("3") + [tok.eos_token_id]),
        (ids("<|system|>Be brief.<|user|>Add 1+2<|assistant|>3<eos><|user|>Add 4+5<|assistant|>"),
         ids("9") + [tok.eos_token_id])]
    [system] = sft.demonstrations(Config(algo="sft", sft_data=write(tmp_path / "p.jsonl", [
        {"prompt": "Add 1+2", "response": "3"}]), system_prompt="Be brief."))
    assert system.rows[0].prompt_ids == ids("<|system|>Be brief.<|user|>Add 1+2<|assistant|>")


def the_batch(path: str, model: str, **over):
    """The run's first batch of the demonstrations (algos/sft.source), and the config."""
    cfg = sft_config(sft_data=path, model=model, prompts_per_step=4, **over)
    episodes, _, data_pos, stats = sft.source(None, None, None, None, 0, cfg, 0, 1, None, None)
    assert data_pos == 4 and stats["sft/epoch"] == 1.0
    return episodes, cfg


DATA = [{"prompt": "Add 12+7+35", "response": "12+7=19 19+35=54 <answer>54</answer>"},
        {"prompt": "Add 1+2", "response": "<answer>3</answer>"}, CHAT,
        {"prompt": [{"role": "user", "content": "Add 40+2+9"}], "completion": "40+2=42 42+9=51 <answer>51</answer>"}]


def one_step(model: str, path: str, micro: int, rank: int = 0, world: int = 1) -> torch.Tensor:
    """The weights' change in one SGD step (lr 1) of the 4 demonstrations (5 rows, ragged): minus the gradient."""
    torch.manual_seed(0)
    episodes, cfg = the_batch(path, model, micro_batch_size=micro)
    lm = load_model(model)
    before = torch.cat([p.detach().flatten().clone() for p in lm.parameters()])
    update(learner(lm, cfg, rank, world), episodes)
    return torch.cat([p.detach().flatten() for p in lm.parameters()]) - before


def on_two_ranks(rank, world, dirs):
    import tempfile
    from pathlib import Path
    with tempfile.TemporaryDirectory() as tmp:
        path = write(Path(tmp) / "d.jsonl", DATA)
        return [one_step(dirs["random_model"], path, micro, rank, world) for micro in (4, 1)]


share_two_ranks("sft", on_two_ranks)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    return write(tmp_path_factory.mktemp("sft") / "d.jsonl", DATA)


def test_one_step_any_micro_batch_split_and_two_ranks(random_model_dir, data_file, spawned_ranks):
    whole = one_step(random_model_dir, data_file, 5)
    assert whole.abs().max() > 1e-4  # the step moves the weights
    for micro in (1, 2, 3):
        assert torch.allclose(one_step(random_model_dir, data_file, micro), whole, atol=1e-6, rtol=0)
    for got in spawned_ranks["sft"]:
        assert torch.allclose(got, whole, atol=1e-6, rtol=0)


def test_a_batch_is_the_demonstrations_in_the_streams_order(random_model_dir, data_file):
    """Every rank builds the same batch; a pass over the file is a permutation of its rows, reshuffled by the seed;
    a chat is one episode of as many rows as assistant turns."""
    episodes, cfg = the_batch(data_file, random_model_dir)
    assert sorted(len(e.rows()) for e in episodes) == [1, 1, 1, 2]
    assert [e.group for e in episodes] == [0, 1, 2, 3]
    second, *_ = sft.source(None, None, None, None, 4, cfg, 0, 1, None, None)
    assert sorted(e.text for e in second) == sorted(e.text for e in episodes)


# ---------------------------------------------------------------- whole runs

TINY = ["--algo", "sft", "--prompts-per-step", "4", "--eval-every", "0", "--save-every", "1", "--max-steps", "4",
        "--report-to", "none"]


@pytest.mark.slow
@pytest.mark.extended  # a run of its own process, killed and resumed
def test_kill_9_then_resume_gives_the_uninterrupted_weights(tmp_path, data_file, one_thread):
    from safetensors.torch import load_file
    flags = [*TINY, "--sft-data", data_file]
    train.main([*flags, "--out", str(tmp_path / "reference")])
    run = tmp_path / "run"
    proc = start_train(flags, run)
    try:
        wait_until(proc, lambda: (run / "checkpoints" / "step-2" / "model.safetensors").is_file(), "step-2's checkpoint")
    finally:
        kill_9(proc)
    assert len(metrics(run)) < 4  # killed before its end
    train.main(["--resume", str(run)])
    for name in ("model.safetensors",):
        a, b = (load_file(str(r / "checkpoints" / "step-4" / name)) for r in (tmp_path / "reference", run))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert [r["step"] for r in metrics(run)] == [1, 2, 3, 4]
    assert same_run(metrics(tmp_path / "reference"), metrics(run))


def fsdp_flags(root):
    return [*TINY[:-4], "--max-steps", "2", "--sft-data", write(root / "sft.jsonl", DATA), "--parallel", "fsdp"]


pair.register("sft-fsdp", fsdp_flags)


def two_steps(run) -> list[dict]:
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["sft/nll"] > 0 and r["grad/norm"] > 0 and r["update/responses"] == 4 for r in rows)
    assert (run / "checkpoints" / "step-2").is_dir()
    return rows


def test_fsdp_runs_two_steps_on_two_ranks(two_rank_runs):
    two_steps(pair.folder(two_rank_runs, "sft-fsdp"))


@pytest.mark.needs("peft")
def test_lora_runs_two_steps(tmp_path, data_file):
    """Two steps of LoRA adapters on 1 rank: B starts at 0 (peft), so a B that is not 0 is the steps' doing."""
    from safetensors.torch import load_file
    train.main([*TINY[:-4], "--max-steps", "2", "--sft-data", data_file, "--lora-rank", "4", "--out", str(tmp_path)])
    two_steps(tmp_path)
    adapters = load_file(str(tmp_path / "checkpoints" / "step-2" / "adapter_model.safetensors"))
    assert any("lora_B" in k and v.abs().max() > 0 for k, v in adapters.items())


# ---------------------------------------------------------------- bad input, one line before any load

def refusal(argv) -> str:
    with pytest.raises(DataError) as e:
        validate(parse_config(argv), 1)
    return str(e.value)


def test_bad_input_is_one_line_before_any_load(tmp_path, random_model_dir):
    assert refusal(["--algo", "sft"]).startswith("--algo sft learns from demonstrations: give --sft-data FILE")
    nothing = write(tmp_path / "empty.jsonl", [])
    assert refusal(["--algo", "sft", "--sft-data", nothing]) == f"{nothing}: the dataset is empty (no rows)"
    no_response = write(tmp_path / "golds.jsonl", [{"prompt": "Add 1+2", "response": "3"}, {"prompt": "x", "answer": "3"}])
    assert refusal(["--algo", "sft", "--sft-data", no_response]).startswith(
        f"--sft-data {no_response}:2: missing field: expected one of response, completion")
    long = write(tmp_path / "long.jsonl", [{"prompt": "Add 1+2", "response": "9" * 2000}])
    message = refusal(["--algo", "sft", "--sft-data", long])
    assert message.startswith(f"--sft-data {long}:1: prompt and response are 2010 tokens, over the model's context of")
    ok = write(tmp_path / "ok.jsonl", DATA)
    assert refusal(["--algo", "sft", "--sft-data", ok, "--group-size", "8"]).startswith(
        "group_size=8: --algo sft trains on demonstrations, samples nothing in training and reads no reward")
    assert refusal(["--algo", "sft", "--sft-data", ok, "--reward-terms", "correct=1"]).startswith("reward_terms=")
    assert refusal(["--algo", "sft", "--sft-data", ok, "--clip-high", "0.28"]).startswith(
        "clip_high=0.28: --algo sft does not read clip_high")
    assert refusal(["--algo", "grpo", "--sft-data", ok]).startswith("sft_data=")
    chat = write(tmp_path / "chat.jsonl", [{"messages": [{"role": "assistant", "content": "hi"}]}])
    assert "follows no user turn" in refusal(["--algo", "sft", "--sft-data", chat])


def test_a_run_without_data_says_so_and_loads_nothing(capsys):
    with pytest.raises(SystemExit) as e:
        train.main(["--algo", "sft"])
    assert str(e.value).startswith("error: --algo sft learns from demonstrations")


# ---------------------------------------------------------------- extras/traces.py

def test_traces_of_an_eval_all_or_the_correct_ones():
    from extras.traces import rows_of
    records = [{"id": "7", "prompt": "Add 1+2", "gold": "3", "samples": [
        {"response": "<answer>3</answer>", "correct": True, "reward": 1.0},
        {"response": "<answer>4</answer>", "correct": False, "reward": 0.0}]}]
    assert [r["response"] for r in rows_of(records, correct_only=False)] == ["<answer>3</answer>", "<answer>4</answer>"]
    assert rows_of(records, correct_only=True) == [{"id": "7", "prompt": "Add 1+2", "response": "<answer>3</answer>",
                                                    "answer": "3", "reward": 1.0, "correct": True}]
