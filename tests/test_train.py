"""The loop end to end: CLI errors, a 2-process torchrun smoke run, checkpoints, resume, Qwen2."""
import json
import math
import re
import socket
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

import eval as evaluation
import config
import pair
from helpers import TORCHRUN, metrics, run_main, same_run, torchrun
import train
from model import load_model
from parallel import load_train_state

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "24",
         "--eval-problems", "8", "--eval-samples", "2", "--eval-k", "1,2"]


@pytest.mark.parametrize("rows,expected", [
    ('{"prompt": "a", "answer": "1"}\nnot json\n', r"bad.jsonl:2: not valid JSON"),
    ('{"prompt": "a", "label": "1"}\n', r"bad.jsonl:1: missing field: expected one of answer"),
    ('\n', r"bad.jsonl: the dataset is empty"),
    ('{"prompt": "a", "answer": "1"}\n{"prompt": "caf\xe9", "answer": "1"}\n', r"bad.jsonl:2: not valid UTF-8 \(byte 0xe9"),
])
def test_bad_data_file_errors_before_loading_a_model(tmp_path, rows, expected):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(rows.encode("latin-1"))  # latin-1: one byte per character, so \xe9 is invalid UTF-8
    msg = run_main(["--data", str(path), "--eval-every", "0", "--model", "/nonexistent"])
    assert msg.startswith("error: ") and __import__("re").search(expected, msg)


def test_config_errors(tmp_path, monkeypatch):
    assert "unknown; choose one of grpo" in run_main(["--algo", "ppo"])
    cfg = tmp_path / "x.yaml"
    cfg.write_text("lr: 1e-6\ngroup_sise: 4\n")
    assert "unknown field(s) group_sise" in run_main(["--config", str(cfg)])
    cfg.write_text("lr: fast\n")
    assert "field lr: 'fast' is not a float" in run_main(["--config", str(cfg)])
    assert "--eval-data" in run_main(["--data", str(cfg)])  # a file needs a held-out file
    assert "--data running_sum is built in" in run_main(["--eval-data", str(cfg)])  # not its grader
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert "prompts_per_step=16 must be divisible by the 3 ranks" in run_main([])
    monkeypatch.delenv("WORLD_SIZE")
    assert "eval_k=[1, 8]" in run_main(["--eval-k", "1,8"])
    assert "no complete checkpoint in" in run_main(["--resume", str(tmp_path)])
    assert "--resume auto continues the run in --out" in run_main(["--resume", "auto"])
    assert "dynamic_sampling keeps only groups whose rewards differ" in run_main(["--algo", "dapo", "--group-size", "1"])
    assert "train_on='some'" in run_main(["--train-on", "some"])
    assert "rover_adv='z'" in run_main(["--algo", "rover", "--rover-adv", "z"])
    assert "micro_batch_size=4 must be ≥ group_size=8" in run_main(["--algo", "pacs", "--micro-batch-size", "4"])
    assert "needs train_on=all and mask_truncated=false" in run_main(["--algo", "pacs", "--mask-truncated", "true"])
    assert "0 ≤ chunk_head (100) ≤ carryover (40) < max_new_tokens" in run_main(["--algo", "delethink", "--chunk-head", "100"])
    assert "carryover (24) < max_new_tokens (the chunk size, 24)" in run_main(
        ["--max-chunks", "2", "--carryover", "24", "--max-new-tokens", "24", "--chunk-head", "0"])
    assert "with max_chunks > 1 a response is split" in run_main(["--algo", "pacs", "--max-chunks", "2", "--chunk-head", "0"])


def test_model_folder_errors_name_the_folder_and_write_nothing(tmp_path):
    """Checked before any weight is read and before the run folder exists: no orphan run."""
    out = tmp_path / "run"
    args = ["--out", str(out), "--eval-every", "0"]
    assert "no such folder" in run_main([*args, "--model", str(tmp_path / "missing")])
    bare = tmp_path / "bare"
    bare.mkdir()
    assert "no config.json there" in run_main([*args, "--model", str(bare)])
    no_tokenizer = tmp_path / "no-tokenizer"
    no_tokenizer.mkdir()
    for name in ("config.json", "model.safetensors"):
        (no_tokenizer / name).write_bytes((Path(config.DEFAULT_MODEL) / name).read_bytes())
    assert "cannot load its config or tokenizer" in run_main([*args, "--model", str(no_tokenizer)])
    (no_tokenizer / "model.safetensors").unlink()
    assert "no .safetensors weights there" in run_main([*args, "--model", str(no_tokenizer)])
    assert not out.exists()


def test_prompts_longer_than_the_context_are_refused(tmp_path):
    """The shipped model has 512 positions and one token per character: a 500-character prompt
    plus 80 new tokens cannot fit; a 100-character one can (it gets as far as the run folder)."""
    data = tmp_path / "long.jsonl"
    data.write_text(json.dumps({"prompt": "1+" * 250, "answer": "1"}) + "\n"
                    + json.dumps({"prompt": "short", "answer": "1"}) + "\n")
    msg = run_main(["--data", str(data), "--eval-every", "0", "--out", str(tmp_path / "run")])
    assert "1 prompt(s) do not fit the model's context of 512 tokens with 80 new tokens" in msg
    assert "number 1 ('1+1+" in msg and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_resume_carries_the_run_config_and_logs_each_step_once(tmp_path):
    """Interrupted after step 2 (with a half-written row of step 3 in the logs, as a kill leaves
    it), `--resume RUN --max-steps 3` continues with the run's own flags and equals a 3-step run."""
    # constant: a linear schedule ends at max_steps, so a 2-step run extended to 3 differs by design
    flags = [*SMALL, "--eval-every", "0", "--save-every", "1", "--lr", "1e-3", "--lr-schedule", "constant"]
    train.main([*flags, "--max-steps", "3", "--out", str(tmp_path / "whole")])
    run = tmp_path / "cut"
    train.main([*flags, "--max-steps", "2", "--out", str(run)])
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "reward/mean": 0.5}\n{"step": 4, "rew')
    (run / "checkpoints" / ".step-3.partial").mkdir()  # what a kill during a save leaves
    assert "holds a run already" in run_main([*flags, "--max-steps", "3", "--out", str(run)])
    train.main(["--resume", str(run), "--max-steps", "3"])
    assert [x["step"] for x in metrics(run)] == [1, 2, 3] and same_run(metrics(tmp_path / "whole"), metrics(run))
    saved = config.parse_config(["--resume", str(run)])
    assert (saved.prompts_per_step, saved.max_new_tokens, saved.max_steps, saved.lr) == (4, 24, 3, 1e-3)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1", "step-2", "step-3"]

    # a damaged newest checkpoint: the error names it and the one to resume from instead, and
    # following that advice replays step 3 and sets the damaged one aside (nothing is deleted)
    state = run / "checkpoints" / "step-3" / "trainer_state.pt"
    state.write_bytes(state.read_bytes()[:100])
    msg = run_main(["--resume", str(run)])
    assert "step-3: trainer_state.pt is truncated or corrupt" in msg
    advice = msg.split("--resume ")[-1].split(" ")[0]
    assert advice == str(run / "checkpoints" / "step-2")
    train.main(["--resume", advice, "--max-steps", "3"])  # step-2 was saved by the 2-step launch
    assert [x["step"] for x in metrics(run)] == [1, 2, 3] and same_run(metrics(tmp_path / "whole"), metrics(run))
    assert (run / "checkpoints" / "discarded" / "step-3" / "trainer_state.pt").stat().st_size == 100


@pytest.mark.slow
def test_keep_checkpoints_keeps_the_newest(tmp_path):
    train.main([*SMALL, "--eval-every", "0", "--max-steps", "3", "--save-every", "1", "--keep-checkpoints", "2",
                "--out", str(tmp_path / "run")])
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir()) == ["step-2", "step-3"]


@pytest.mark.slow
def test_torchrun_config_error_is_said_once_and_nothing_hangs(tmp_path):
    r = torchrun("train.py", "--out", str(tmp_path / "run"), "--group-size", "0", timeout=120)
    assert r.returncode != 0 and r.stderr.count("error: group_size=0: must be ≥ 1") == 1
    assert 'File "' + str(ROOT / "train.py") not in r.stderr  # no traceback of ours
    assert not (tmp_path / "run").exists()


def test_config_precedence(tmp_path):
    cfg = tmp_path / "x.yaml"
    cfg.write_text("algo: dapo\nclip_high: 0.3\nlr: 1e-6\n")
    c = config.parse_config(["--config", str(cfg), "--clip-high", "0.25"])
    assert (c.algo, c.loss_agg, c.dynamic_sampling) == ("dapo", "token-mean", True)  # preset
    assert (c.lr, c.clip_high) == (1e-6, 0.25)  # YAML, then the command line wins


def on_two_ranks(name, *args) -> None:
    """train.py on 2 gloo ranks for 2 steps, in the session's shared launch (tests/pair.py)."""
    pair.register(name, ["--max-steps", "2", *SMALL, *args])


def metrics_of(runs, name) -> list[dict]:
    return metrics(pair.folder(runs, name))


def two_nodes(out, *args) -> list[dict]:
    """train.py as two one-rank "nodes" on this machine (two torchrun launchers meeting at a c10d
    rendezvous), 2 steps; the metrics.jsonl rows."""
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([*TORCHRUN, "--nnodes", "2", "--nproc_per_node", "1",
                               "--node_rank", str(n), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"localhost:{port}",
                               "train.py", "--max-steps", "2", "--out", str(out), *SMALL, *args],
                              cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for n in (0, 1)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()[-3000:]
    return metrics(out)


on_two_ranks("smoke", "--algo", "grpo", "--eval-every", "2")


def test_torchrun_two_processes_smoke(two_rank_runs, tmp_path):
    """The README's main command, shortened: default model and task, 2 gloo ranks, 2 steps."""
    out = pair.folder(two_rank_runs, "smoke")
    lines = metrics(out)
    assert [x["step"] for x in lines] == [0, 1, 2]
    for key in ("reward/mean", "length/mean", "entropy/mean", "grad/norm", "time/rollout", "lr"):
        assert key in lines[1]
    # the sampler's own log-probs against the trainer's (issue 15): fp32 on CPU, KV-cached decode
    # vs one full forward, the same weights: equal to rounding
    for x in lines[1:]:
        assert 0 <= x["mismatch/kl"] <= 1e-5 and x["mismatch/max_abs"] <= 1e-3
        assert x["mismatch/ratio_p01"] <= 1 <= x["mismatch/ratio_p99"] and abs(x["mismatch/ratio_p50"] - 1) < 1e-5
    assert 0 <= lines[2]["eval/accuracy"] <= lines[2]["eval/pass@2"] <= 1
    ckpt = out / "checkpoints" / "step-2"
    lm = AutoModelForCausalLM.from_pretrained(ckpt)  # a plain HF checkpoint
    tok = AutoTokenizer.from_pretrained(ckpt)
    assert lm(**tok("Add 1+2", return_tensors="pt")).logits.shape[-1] == len(tok)
    assert (out / "config.yaml").is_file() and list(out.glob("events.out.tfevents.*"))
    # eval.py on the checkpoint with the run's config: the numbers the periodic eval logged at step 2,
    # from 1 process where training ran 2 ranks
    evaluation.main(["--config", str(out / "config.yaml"), "--model", str(ckpt), "--no-greedy",
                     "--out", str(tmp_path / "eval")])
    alone = json.loads((tmp_path / "eval" / "summary.json").read_text())["metrics"]
    logged = {k: v for k, v in lines[2].items() if k.startswith("eval/")}
    assert set(logged) == set(alone)
    assert all(alone[k] == pytest.approx(logged[k], abs=1e-6) for k in logged), (alone, logged)
    # each eval's problems as eval.py writes them: the logged SE is the spread of their accuracies (§6.1),
    # recomputed here by numpy; and eval.py --compare pairs the run's two evals over the same problems
    rows = [json.loads(x) for x in (out / "evals" / "step-2.jsonl").read_text().splitlines()]
    per = np.array([r["correct"] / len(r["samples"]) for r in rows])
    assert logged["eval/accuracy_se"] == pytest.approx(per.std(ddof=1) / np.sqrt(len(per)), abs=1e-6)
    assert logged["eval/accuracy"] == pytest.approx(per.mean(), abs=1e-6)
    _, pairs = evaluation.compared(str(out / "evals" / "step-0.jsonl"), str(out / "evals" / "step-2.jsonl"))
    assert pairs["accuracy"]["diff"] == pytest.approx(lines[2]["eval/accuracy"] - lines[0]["eval/accuracy"], abs=1e-6)
    # the gold and what the grader read, under the same keys in samples.jsonl and in an eval's problems
    logged_samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    evaluated = [dict(s, gold=r["gold"]) for r in rows for s in r["samples"]]
    for sample in logged_samples + evaluated:
        assert {"gold", "extracted", "response", "reward"} <= set(sample) and "answer" not in sample, sample
        # the built-in grader reads the last <answer> tag's content, and pays it when it is the sum
        assert (sample["extracted"] is None) == (re.search(r"<answer>.*</answer>", sample["response"], re.S) is None)
        assert sample["extracted"] is None or sample["extracted"] in sample["response"]
        assert sample["reward"] == float(sample["extracted"] == sample["gold"])
    assert all(0 <= x["reward/format_failures"] <= 1 for x in lines[1:])


SMOKES = [("rover", "rover/q_abs_err"), ("pacs", "pacs/psi_abs"), ("psr", "pg/loss"), ("nsr", "pg/loss"),
          ("w_reinforce", "pg/loss")]
for _algo, _ in SMOKES:
    # 80 tokens: the shipped model's answers need ~50, so some are right and groups have a spread
    on_two_ranks(f"smoke-{_algo}", "--algo", _algo, "--eval-every", "0", "--max-new-tokens", "80")


@pytest.mark.parametrize("algo,key", SMOKES)
def test_torchrun_smoke_of_each_algorithm(algo, key, two_rank_runs):
    lines = metrics_of(two_rank_runs, f"smoke-{algo}")
    assert [x["step"] for x in lines] == [1, 2]
    for x in lines:
        assert x["update/skipped"] == 0 and 0 < x["update/responses"] <= 16
        assert math.isfinite(x[key]) and math.isfinite(x["loss/total"]) and x["grad/norm"] > 0
    k = config.parse_config(["--algo", algo]).mini_batches
    assert lines[0]["update/optimizer_steps"] == k  # rover, pacs: K = 4 mini-batches of one group


for _algo in ("delethink", "rover"):
    on_two_ranks(f"markovian-{_algo}", "--algo", _algo, "--max-new-tokens", "32", "--max-chunks", "4",
                 "--carryover", "16", "--chunk-head", "4", "--eval-every", "2", "--eval-max-chunks", "6")


@pytest.mark.parametrize("algo", ["delethink", "rover"])
def test_torchrun_markovian_thinking(algo, two_rank_runs):
    """Chunks of C = 32 (the shipped model's answers need ~50 tokens), m = 16, h = 4: traces
    run over several chunks; every chunk is a training row; eval may use more chunks."""
    lines = metrics_of(two_rank_runs, f"markovian-{algo}")
    assert [x["step"] for x in lines] == [0, 1, 2]
    for x in lines[1:]:
        assert 1 < x["length/chunks"] <= 4 and x["length/max"] <= 32 + 3 * 16
        assert x["update/skipped"] == 0 and math.isfinite(x["loss/total"])
        assert x["grad/norm"] > 0 or x["reward/zero_std_groups"] == 1  # no spread, no signal
        # each chunk row is trained behind its own prompt: more than one prompt per trace
        assert x["tokens/forward"] > x["tokens/generated"] + x["update/responses"] * 20
    assert lines[2]["eval/length"] <= 32 + 5 * 16 and "eval/pass@2" in lines[2]
    samples = [json.loads(x) for x in (pair.folder(two_rank_runs, f"markovian-{algo}") / "samples.jsonl").read_text()
               .splitlines()]
    traces = [s["chunks"] for s in samples if "chunks" in s]  # what each chunk of a trace wrote
    assert traces and all(2 <= len(t) <= 4 for t in traces)
    assert all(s["response"].endswith(s["chunks"][-1]) for s in samples if "chunks" in s)


on_two_ranks("skipped", "--algo", "psr", "--model", "{random_model}", "--eval-every", "0")


def test_a_step_that_keeps_no_row_is_skipped_on_every_rank(random_model_dir, two_rank_runs):
    """A random model is never right, so PSR keeps nothing: both ranks skip both updates (a rank
    that did not would hang in DDP's all-reduce) and the weights stay as they were."""
    out = pair.folder(two_rank_runs, "skipped")
    lines = metrics(out)
    assert [x["update/skipped"] for x in lines] == [1, 1] and all(x["reward/mean"] == 0 for x in lines)
    start = load_file(str(Path(random_model_dir) / "model.safetensors"))
    end = load_file(str(out / "checkpoints" / "step-2" / "model.safetensors"))
    assert all(torch.equal(start[k], end[k]) for k in start)


def final_weights(run):
    return load_file(str(run / "checkpoints" / "step-4" / "model.safetensors"))


@pytest.mark.slow
def test_resume_continues_the_same_trajectory(random_model_dir, tmp_path):
    # A random model never earns the reward; the length penalty gives its groups some spread.
    common = ["--model", random_model_dir, "--max-steps", "4", "--eval-every", "0", "--lr", "1e-2",
              "--overlong-penalty", "true", "--overlong-cache", "24", *SMALL]
    train.main([*common, "--out", str(tmp_path / "a"), "--save-every", "2"])
    train.main([*common, "--out", str(tmp_path / "b"),
                "--resume", str(tmp_path / "a" / "checkpoints" / "step-2")])
    a, b = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    start = load_file(str(Path(random_model_dir) / "model.safetensors"))
    assert any(not torch.allclose(a[k], start[k]) for k in a)
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k
    steps_b = [json.loads(x)["step"] for x in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert steps_b == [3, 4]

    def prompts(run, step):
        return [json.loads(x)["prompt"] for x in (run / "samples.jsonl").read_text().splitlines()
                if json.loads(x)["step"] == step]
    for step in (3, 4):
        assert prompts(tmp_path / "a", step) == prompts(tmp_path / "b", step)


FSDP = ["--parallel", "fsdp", "--eval-every", "0", "--max-new-tokens", "60", "--save-every", "1"]
on_two_ranks("fsdp", *FSDP)
on_two_ranks("fsdp-resumed", *FSDP, "--resume", "{root}/fsdp/checkpoints/step-1")  # runs after "fsdp"


def fsdp_checkpoints_load_and_resume(run: Path, resumed: list[dict], tmp_path: Path) -> None:
    """A 2-step FSDP run with a checkpoint a step: they load with from_pretrained; resumed from step 1
    on 2 ranks (`resumed`, its rows), step 2 is replayed exactly; the train state written by 2 ranks
    loads into 1 (resharded) and a 1-rank resume runs on."""
    rows = metrics(run)
    assert any(x["grad/norm"] > 0 for x in rows)  # the shipped model learns something in 2 steps
    step1, step2 = (run / "checkpoints" / f"step-{n}" for n in (1, 2))
    lm = AutoModelForCausalLM.from_pretrained(step2)  # a plain HF checkpoint, fp32 on CPU
    saved = load_file(str(step2 / "model.safetensors"))
    assert all(torch.equal(p, saved[n]) for n, p in lm.state_dict().items() if n in saved)

    assert [x["step"] for x in resumed] == [2] and same_run(rows[1:], resumed)

    # 2 ranks' shards -> 1 process: the exact fp32 weights and AdamW state after 2 steps (a fresh
    # AdamW that DCP initialises before loading would say step 1 and zero moments)
    lm = load_model(str(step1))
    optimizer = torch.optim.AdamW(lm.parameters())
    load_train_state(step2 / "train_state", lm, optimizer)
    assert all(torch.equal(p, saved[n]) for n, p in lm.named_parameters() if n in saved)
    assert all(float(optimizer.state[p]["step"]) == 2 for p in lm.parameters())
    assert any(optimizer.state[p]["exp_avg_sq"].sum() > 0 for p in lm.parameters())
    train.main([*SMALL, *FSDP, "--max-steps", "2", "--resume", str(step1), "--out", str(tmp_path / "alone")])
    assert [x["step"] for x in metrics(tmp_path / "alone")] == [2]


def test_fsdp_saves_hf_weights_and_resumes_on_one_or_two_ranks(two_rank_runs, tmp_path):
    fsdp_checkpoints_load_and_resume(pair.folder(two_rank_runs, "fsdp"), metrics_of(two_rank_runs, "fsdp-resumed"),
                                     tmp_path)


@pytest.mark.slow
@pytest.mark.extended  # two torchrun launchers of their own, meeting at a c10d rendezvous
def test_fsdp_on_two_nodes_saves_hf_weights_and_resumes_on_one_or_two_ranks(two_rank_runs, tmp_path):
    """FSDP over two one-rank "nodes" equals FSDP over 2 ranks of one node, and its checkpoints (each
    node's rank is its local rank 0) load and resume as the test above has the one node's do."""
    nodes = two_nodes(tmp_path / "nodes", *FSDP)
    assert same_run(metrics_of(two_rank_runs, "fsdp"), nodes)
    fsdp_checkpoints_load_and_resume(tmp_path / "nodes", metrics_of(two_rank_runs, "fsdp-resumed"), tmp_path)


def test_random_qwen2_with_chat_template_runs_one_step(tmp_path):
    from build_tiny_model import build_tokenizer
    tok = build_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.eos_token = "<|im_end|>"
    tok.chat_template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                         "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
                         "{% endif %}")
    path = tmp_path / "qwen2"
    tok.save_pretrained(path)
    torch.manual_seed(0)
    Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 max_position_embeddings=256, tie_word_embeddings=False,
                                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
                     ).save_pretrained(path)
    out = tmp_path / "run"
    train.main(["--model", str(path), "--max-steps", "1", "--out", str(out), "--eval-every", "1",
                "--overlong-penalty", "true", "--overlong-cache", "24", *SMALL])  # a reward spread
    step = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert step["step"] == 1 and step["grad/norm"] > 0
    assert AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step-1").config.model_type == "qwen2"


def test_every_config_parses_and_tiny_grpo_is_the_default():
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        config.parse_config(["--config", str(path)])
    tiny = config.parse_config(["--config", str(ROOT / "configs" / "tiny_grpo.yaml")])
    assert replace(tiny, config="") == config.parse_config([]), "tiny_grpo.yaml drifted from the defaults"


def test_dapo_dynamic_sampling_fills_the_batch_with_informative_groups(tmp_path):
    out = tmp_path / "dapo"
    # the preset's K = 16 needs ≥ 16 prompts a step
    train.main(["--algo", "dapo", "--max-steps", "2", "--eval-every", "0", "--out", str(out), *SMALL,
                "--mini-batches", "2"])
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert samples and all(-1 <= s["reward"] <= 1 for s in samples)
    for r in rows:
        rounds = r["dynamic/extra_rounds"]
        assert 0 <= rounds <= 3
        # every round samples 4 prompts; what was not dropped was kept (up to B = 4)
        assert r["dynamic/kept_groups"] == min(4, 4 * (rounds + 1) - r["dynamic/dropped_groups"])
        assert r["dynamic/kept_groups"] == 4 or rounds == 3


def test_lr_schedule_warms_up_then_falls_linearly_to_zero():
    """2 warm-up steps, then (by hand) 6 optimizer steps of 1 rollout batch each: 1 at the end of
    warm-up, falling by 1/4 a step to 0 just past the last; constant stays at 1."""
    linear = config.Config(warmup_steps=2, max_steps=6, mini_batches=1, epochs=1, lr_schedule="linear")
    assert [config.lr_factor(s, linear) for s in range(7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]
    constant = replace(linear, lr_schedule="constant")
    assert [config.lr_factor(s, constant) for s in range(7)] == [0.5] + [1.0] * 6
    two = replace(linear, mini_batches=2, max_steps=3)  # K = 2 optimizer steps per batch: the same 6 steps
    assert [config.lr_factor(s, two) for s in range(7)] == [0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0]


def test_format_failures_are_the_share_of_zeros_without_an_answer():
    """Four responses: one right, one wrong answer, one without an answer, one the grader failed on
    (a timeout is not a format failure): of the three zeros, one had no answer -> 1/3."""
    from rewards import Problem
    from rollout import Episode
    episodes = [Episode([1], [2, 3], "", False, 0, Problem("q", "5"), reward=reward, extracted=extracted,
                        grader_failed=failed)
                for reward, extracted, failed in ((1.0, "5", False), (0.0, "7", False), (0.0, None, False),
                                                  (0.0, None, True))]
    assert train.rollout_stats(episodes, 4)["reward/format_failures"] == pytest.approx(1 / 3)
    assert train.rollout_stats(episodes[:1] * 4, 4)["reward/format_failures"] == 0.0  # no zeros at all
