"""Issue 15: what surrounds the loss matches the model and the recipes — log-probs are the model's
own for every logit transform, generation stops at every EOS id, prompt templates, the answer gate,
sampler-vs-trainer mismatch and its importance-sampling corrections."""
import pytest
import torch
from transformers import CohereConfig, Gemma2Config, GraniteConfig, GraniteForCausalLM, LlamaConfig

import model
from model import LogitTransform, ModelError, check_logprobs
from helpers import frequent_token, random_lm, sampler_for

SIZES = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, head_dim=8, max_position_embeddings=64)
ARCHS = {  # random_lm's, each transform at a value far from 1, so that leaving it out shows
    "llama": {},
    "qwen2": {},
    "qwen3": {},
    "gemma2": {"final_logit_softcapping": 0.5},
    "granite": {"logits_scaling": 8.0},
    "cohere": {"logit_scale": 0.0625},
}


IDS = [3, 17, 42, 5, 60, 8, 23, 11, 9, 30]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_logprobs_are_the_models_own(arch, temperature):
    # log-probs of a 64-token vocabulary, |log p| of a few units: fp32 rounds them to ~5e-7, the
    # largest difference seen on every architecture; 1e-5 leaves 20 ulps for another CPU's kernels
    assert check_logprobs(random_lm(arch, **SIZES, **ARCHS[arch]), IDS, temperature) < 1e-5


@pytest.mark.parametrize("arch", ["granite", "cohere", "gemma2"])
def test_an_unknown_logit_transform_stops_with_the_model_type(arch, monkeypatch):
    """Simulate a model type whose transform the code does not know: drop it from the table
    (Gemma-2's soft-cap: pretend the config field is not read)."""
    monkeypatch.setattr(model, "LOGIT_SCALES", {k: v for k, v in model.LOGIT_SCALES.items() if k != arch})
    if arch == "gemma2":
        monkeypatch.setattr(LogitTransform, "__call__", lambda self, z: z)
    with pytest.raises(ModelError, match=f"model type '{arch}'"):
        check_logprobs(random_lm(arch, **SIZES, **ARCHS[arch]), IDS, 1.0)


def test_transform_table_reads_the_config():
    assert LogitTransform.of(GraniteConfig(logits_scaling=4.0)) == LogitTransform(0.25, None)
    assert LogitTransform.of(CohereConfig(logit_scale=0.5)) == LogitTransform(0.5, None)
    assert LogitTransform.of(Gemma2Config(final_logit_softcapping=30.0)) == LogitTransform(1.0, 30.0)
    assert LogitTransform.of(LlamaConfig()) == LogitTransform()


@pytest.mark.parametrize("engine", ["hf", "fast"])
def test_generation_stops_at_every_eos_of_the_generation_config(engine, random_model_dir, tmp_path):
    """A checkpoint whose generation_config lists an end-of-turn id besides the tokenizer's EOS
    (as Qwen and Gemma chat checkpoints do): responses end at either, and one that ends at the
    end-of-turn id is not truncated."""
    import shutil
    from transformers import GenerationConfig
    from model import load_model, load_tokenizer
    from rewards import Problem
    from rollout import Sampling, generate, sample
    shutil.copytree(random_model_dir, tmp_path, dirs_exist_ok=True)
    tok, lm = load_tokenizer(str(tmp_path)), load_model(str(tmp_path))
    assert tok.stop_ids == [tok.eos_token_id]
    sampling = Sampling(temperature=1.0, max_new_tokens=12, sampler=sampler_for(engine))
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]]
    torch.manual_seed(0)
    end_of_turn = frequent_token([t for t, _ in sample(lm, tok, prompts * 4, sampling)], tok.stop_ids, after=2)
    GenerationConfig(eos_token_id=[tok.eos_token_id, end_of_turn], top_k=50).save_pretrained(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert tok.stop_ids == [tok.eos_token_id, end_of_turn]
    torch.manual_seed(0)
    episodes = generate(lm, tok, [Problem("p", "0")] * 3, prompts, group_size=4, sampling=sampling)
    ended = [e for e in episodes if e.response_ids[-1] == end_of_turn]
    assert ended and not any(e.truncated for e in ended)
    for e in episodes:  # cut at the first stop id of either kind, nothing after it
        stops = [i for i, t in enumerate(e.response_ids) if t in tok.stop_ids]
        assert stops == ([len(e.response_ids) - 1] if not e.truncated else [])


# ----------------------------------------------------------------------------- prompts and grading

def test_answer_gate_grades_only_what_follows_it():
    """The issue's case: a trace cut at the chunk cap, whose last number is right, scored 1 by the
    fallback; behind the gate it scores 0 without reaching the grader."""
    from rewards import Problem, Verdict, grade_batch
    from tasks import Task
    seen = []

    class EndsIn42(Task):
        def grade(self, p, r):
            return seen.append(r) or Verdict(float(r.strip().endswith("42")))

    task = EndsIn42()
    p = Problem("area?", "42")
    cut = "…6 times 7 is 42, so the area is 42. Wait, but"
    done = "x is 41</think> so the area is 42"
    assert [v.reward for v in grade_batch(task, [(p, cut), (p, done)])] == [0.0, 1.0]
    seen.clear()
    twice = "a</think>b</think> 42"
    verdicts = grade_batch(task, [(p, cut), (p, done), (p, twice)], answer_after="</think>")
    assert [v.reward for v in verdicts] == [0.0, 1.0, 1.0]
    assert seen == [" so the area is 42", "b</think> 42"]  # after the first gate, as the official split(tag, 1)


def test_answer_gate_with_the_math_grader(tmp_path, math_grader):
    """The same through the math-verify worker of a file task: the fallback reads the last number."""
    from rewards import Problem, grade_batch
    from grading.files import FileTask
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "area?", "answer": "42"}\n')
    task = FileTask(str(data), 10.0, 1, 60.0)
    task.grader = math_grader
    p = Problem("area?", "42")
    cut = "6 times 7 is 42, so the area is 42. Wait, but"
    assert grade_batch(task, [(p, cut)])[0].reward == 1.0
    gated = grade_batch(task, [(p, cut), (p, "hmm</think> The area is \\boxed{42}.")], answer_after="</think>")
    assert [v.reward for v in gated] == [0.0, 1.0]


def test_prompt_templates(tmp_path):
    from config import parse_config, validate
    from data import load
    from rewards import DataError
    from tasks import PROMPT_TEMPLATES, with_template
    from rewards import Problem
    assert with_template([Problem("2+2?", "4")], "Q: {problem} (use \\boxed{})")[0].prompt == "Q: 2+2? (use \\boxed{})"
    assert with_template([Problem("2+2?", "4")], "pacs")[0].prompt == (
        "2+2? Please reason step by step, and put your final answer within \\boxed{}.")
    assert all(t.count("{problem}") == 1 for t in PROMPT_TEMPLATES.values())
    with pytest.raises(DataError, match="containing {problem} exactly once"):
        with_template([Problem("2+2?", "4")], "no slot")
    data = tmp_path / "d.jsonl"
    data.write_text('{"problem": "2+2?", "answer": "4"}\n')
    cfg = parse_config(["--data", str(data), "--eval-data", str(data), "--prompt-template", "rover"])
    _, train, heldout = load(cfg)
    assert train[0].prompt == heldout[0].prompt == ("2+2? Let's think step by step and output the final "
                                                    "answer within \\boxed{}.")
    with pytest.raises(DataError, match="already in the chat format: set chat_template false"):
        validate(parse_config(["--prompt-template", "nsr"]), 1)
    validate(parse_config(["--prompt-template", "nsr", "--chat-template", "false"]), 1)


def test_every_registered_algorithm_runs_bare(tmp_path):
    """`train.py --algo X` with no other flag passes validation for every name (Delethink's h = 100
    used to exceed the tiny model's m = 40: h is now min(100, m) unless given); OPD with its teacher, which
    has no default (here the student itself), SFT with its demonstrations (a file of one)."""
    import algos
    from config import DEFAULT_MODEL, parse_config, validate
    from environments.markovian import chunking
    demos = tmp_path / "demos.jsonl"
    demos.write_text('{"prompt": "Add 1+2", "response": "1+2=3 <answer>3</answer>"}\n')
    needs = {"opd": ["--teacher", DEFAULT_MODEL], "sft": ["--sft-data", str(demos)]}
    for name in algos.ALGORITHMS:
        cfg = parse_config(["--algo", name, *needs.get(name, [])])
        validate(cfg, 2)
    assert chunking(parse_config(["--algo", "delethink"])).head == 40
    assert chunking(parse_config(["--algo", "delethink", "--max-new-tokens", "8192", "--carryover", "4096"])).head == 100


def test_shaping_zero_truncated_and_overlong_buffer_scale_with_the_budget():
    from types import SimpleNamespace
    from config import parse_config
    from train import shaped_score
    e = SimpleNamespace(reward=1.0, truncated=False, response_ids=[0] * 72, turn_rewards=[])
    assert shaped_score(e, parse_config(["--algo", "dapo"])) == pytest.approx(1 - 8 / 16)  # budget 80: buffer 16
    assert shaped_score(e, parse_config(["--algo", "dapo", "--max-new-tokens", "160"])) == 1.0  # buffer 32 from 128
    e.response_ids = [0] * 144
    assert shaped_score(e, parse_config(["--algo", "dapo", "--max-new-tokens", "160"])) == pytest.approx(1 - 16 / 32)
    cut = SimpleNamespace(reward=1.0, truncated=True, response_ids=[0] * 80, turn_rewards=[])
    assert shaped_score(cut, parse_config(["--algo", "dr_grpo"])) == 0.0
    assert shaped_score(cut, parse_config(["--algo", "grpo"])) == 1.0


# ----------------------------------------------------------------------------- sampler vs trainer

def test_sampler_correction_worked_example():
    from rollout import sampler_correction
    trainer, sampler, mask = torch.tensor([[-1.0, -2.0, -0.5]]), torch.tensor([[-1.5, -2.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    assert torch.allclose(sampler_correction(trainer, sampler, mask, tis_cap=1.5), torch.tensor([[1.5, 1.0, 1.0]]))
    assert torch.allclose(sampler_correction(trainer, sampler, mask, tis_cap=2.0),
                          torch.tensor([[1.6487212707, 1.0, 1.0]]))
    assert torch.equal(sampler_correction(trainer, sampler, mask, mis_cap=1.5), torch.tensor([[0.0, 1.0, 1.0]]))


def test_mismatch_stats_worked_example():
    import math
    from rollout import mismatch_stats
    s = mismatch_stats([torch.tensor([0.0]).numpy(), torch.tensor([math.log(2)]).numpy()])
    assert s["mismatch/kl"] == pytest.approx((2 - math.log(2) - 1) / 2, abs=1e-7)
    assert s["mismatch/max_abs"] == pytest.approx(math.log(2), abs=1e-7)
    assert s["mismatch/ratio_p50"] == pytest.approx(1.5) and s["mismatch/ratio_p99"] == pytest.approx(1.99)


def test_tis_scales_the_grpo_loss_as_by_hand():
    """docs/math.md §1's worked example (grpo preset, seq-mean-token-mean) with sampler log-probs, TIS cap 1.1:
    each token's clipped term times min(exp(old − sampler), 1.1), by hand in plain Python."""
    import math
    from types import SimpleNamespace
    from algos import ALGORITHMS, LossInputs
    from config import Config
    from rollout import sampler_correction
    logp = [[-0.5, -1.2, -0.3], [-0.9, -0.4, -2.0], [-1.1, -0.7, -0.2], [-0.2, -1.5, -0.6]]
    old = [[-0.6, -1.0, -0.35], [-0.8, -0.5, -1.7], [-1.0, -0.9, -0.25], [-0.3, -1.4, -0.65]]
    sampler = [[-0.6, -1.2, -0.30], [-0.7, -0.5, -1.9], [-1.0, -0.8, -0.25], [-0.5, -1.4, -0.60]]
    adv = [0.8660239038, -0.8660239038, -0.8660239038, 0.8660239038]
    expected = 0.0
    for i in range(4):
        row = 0.0
        for t in range(3):
            r = math.exp(logp[i][t] - old[i][t])
            loss = max(-adv[i] * r, -adv[i] * min(max(r, 0.8), 1.2))
            row += loss * min(math.exp(old[i][t] - sampler[i][t]), 1.1)
        expected += row / 3 / 4
    cfg = SimpleNamespace(**{**vars(Config()), **ALGORITHMS["grpo"].preset})
    mask = torch.ones(4, 3)
    mb = LossInputs(logp=torch.tensor(logp), old_logp=torch.tensor(old), mask=mask, adv=torch.tensor(adv),
                    is_weight=sampler_correction(torch.tensor(old), torch.tensor(sampler), mask, tis_cap=1.1))
    loss, _ = ALGORITHMS["grpo"].loss(mb, cfg, {"seqs": 4, "tokens": 12, "max_len": 3})
    assert loss.item() == pytest.approx(expected, abs=1e-7)
    mb.is_weight = None
    assert ALGORITHMS["grpo"].loss(mb, cfg, {"seqs": 4, "tokens": 12, "max_len": 3})[0].item() == pytest.approx(
        -0.0035313995, abs=1e-7)  # docs/math.md §1 without the weight (float32)


def test_train_stops_at_start_up_on_an_unknown_transform(random_model_dir, tmp_path, monkeypatch, capsys):
    """train.py end to end: a Granite checkpoint whose logits_scaling the table does not know (we
    drop it) stops before any step with one error line naming the model type; nothing trained."""
    import train
    from model import load_tokenizer
    load_tokenizer(random_model_dir).save_pretrained(tmp_path / "granite")
    torch.manual_seed(0)
    GraniteForCausalLM(GraniteConfig(**{**SIZES, "vocab_size": 100, "max_position_embeddings": 256}, logits_scaling=8.0)).save_pretrained(tmp_path / "granite")
    monkeypatch.setattr(model, "LOGIT_SCALES", {k: v for k, v in model.LOGIT_SCALES.items() if k != "granite"})
    with pytest.raises(SystemExit) as e:
        train.main(["--model", str(tmp_path / "granite"), "--out", str(tmp_path / "run"), "--max-steps", "1",
                    "--eval-every", "0"])
    assert e.value.code == 1
    assert "error: model type 'granite': our log-probs differ from the model's own" in capsys.readouterr().err
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()
