"""LoRA through peft (extras/lora.py, issue 24): only the adapters train, the reference is the base with
the adapters off, rollouts see the adapted policy, checkpoints load in peft and (merged) in
transformers, a killed run resumes exactly, and user mistakes are named before anything loads.
The 1 process / DDP / FSDP2 gradient agreement and FSDP rollouts are in test_parallel.py. peft is
optional: every test but the learning rate's is marked `needs("peft")` and skips without it."""
import copy
import json
import math
import shutil
import sys
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

import algos
import eval as evaluation
import train
from config import Config, learning_rate
from engine import Engine
from extras.lora import AdaptersOff, add_lora
from model import ResponseLogProbs, load_model, load_tokenizer
from parallel import load_train_state
from rewards import Problem
from rollout import Sampling, collate, encode_prompts, generate, sample
from helpers import (frequent_token, kill_9, metrics, prompts, random_lm, run_main, same_run, sampler_for, start_train,
                     wait_until)
from test_engine import engine_decode, tokenizer
from test_faults import complete, equal, hidden, train_state
from test_invariance import CASES, config, make_episodes, one_update, policy

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = str(ROOT / "assets" / "tiny-running-sum")
CPU = torch.device("cpu")
STEPS = 4
# The shipped model on 3-term sums (responses of ~35 tokens fit 48, so rewards vary), LoRA rank 8
# with a reference (beta > 0), a checkpoint every step.
RUN = ["--lora-rank", "8", "--beta", "0.04", "--sum-max-terms", "3", "--prompts-per-step", "4", "--group-size", "4",
       "--max-new-tokens", "48", "--eval-every", "0", "--log-samples", "2", "--save-every", "1",
       "--max-steps", str(STEPS)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, one_thread) -> Path:
    """An uninterrupted LoRA run of the shipped model: step-1 ... step-4."""
    run = tmp_path_factory.mktemp("lora") / "reference"
    train.main([*RUN, "--out", str(run)])
    return run


def logprobs(lm, episodes) -> torch.Tensor:
    batch = collate(episodes, 0, CPU)
    with torch.no_grad():
        return ResponseLogProbs(lm)(batch.input_ids, batch.attention_mask, batch.position_ids,
                                    batch.response_mask, 1.0)["logp"]


# ============================================================================ what trains

def learner(scorer, lm, ref_scorer, optimizer, scheduler, cfg) -> train.Learner:
    """One process on the CPU, fp32, as train.main builds it."""
    return train.Learner(scorer=scorer, lm=lm, ref_scorer=ref_scorer, optimizer=optimizer, scheduler=scheduler,
                         algo=algos.get(cfg.algo), cfg=cfg, autocast=nullcontext, pad_id=0, rank=0, world=1,
                         device=CPU)


@pytest.mark.slow
@pytest.mark.needs("peft")
def test_a_step_trains_the_adapters_only_and_adamw_holds_only_theirs(qwen2_dir):
    """A random Qwen2 with adapters on its 7 linear layers: one GRPO update with AdamW, built as
    train.main builds it; every base weight stays bitwise equal, every adapter tensor moves."""
    cfg = config("grpo", {"lora_rank": 4}, micro=4)
    lm, _ = policy(qwen2_dir, cfg)
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad], lr=1e-2)
    before = {k: v.clone() for k, v in lm.state_dict().items()}
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    train.update(learner(ResponseLogProbs(lm), lm, None, optimizer, scheduler, cfg), make_episodes())
    after = lm.state_dict()
    adapters = [k for k in after if ".lora_" in k]
    assert len(adapters) == 2 * 7 * 2  # A and B of q, k, v, o, gate, up, down in 2 layers
    assert all(torch.equal(before[k], after[k]) for k in after if k not in adapters)
    assert all(not torch.equal(before[k], after[k]) for k in adapters)
    held = {id(p) for p in optimizer.state}
    assert held == {id(p) for n, p in lm.named_parameters() if ".lora_" in n}


@pytest.fixture(scope="module")
def initial(qwen2_dir) -> dict:
    """The LoRA policy's weights before any step (every case below starts from them)."""
    return {k: v.clone() for k, v in policy(qwen2_dir, Config(lora_rank=4))[0].state_dict().items()}


@pytest.mark.parametrize("case", range(len(CASES)), ids=[f"{a}-{i}" for i, (a, _) in enumerate(CASES)])
@pytest.mark.slow
@pytest.mark.needs("peft")
def test_every_algorithm_trains_the_adapters_only(case, qwen2_dir, initial):
    """test_invariance's cases (every --algo, Markovian chunk rows, K > 1, epochs, token budgets)
    with LoRA: the update runs, moves every adapter, and leaves the base bitwise as loaded."""
    algo, over = CASES[case]
    weights, out = one_update(qwen2_dir, config(algo, {**over, "lora_rank": 4}, micro=4))
    assert weights.keys() == initial.keys()
    for k, v in initial.items():
        assert torch.equal(v, weights[k]) == (".lora_" not in k), k
    assert all(math.isfinite(v) for v in out.values())


def test_lora_learning_rate_is_ten_times_lr():
    assert learning_rate(Config(lr=1e-6, lora_rank=8)) == pytest.approx(1e-5)
    assert learning_rate(Config(lr=1e-6, lora_rank=8, lora_lr_scale=1.0)) == 1e-6
    assert learning_rate(Config(lr=1e-6)) == 1e-6


# ============================================================================ the reference

@pytest.mark.slow
@pytest.mark.needs("peft")
def test_the_reference_is_the_base_with_adapters_off(qwen2_dir):
    """AdaptersOff(scorer) gives the base model's log-probs (a separately loaded copy) to 1e-6 while
    the adapted policy's differ; after it the adapters are on and trainable again. With fresh
    adapters (B = 0) the policy is the base: the first update's KL is 0."""
    episodes = make_episodes()
    batch = collate(episodes, 0, CPU)
    args = (batch.input_ids, batch.attention_mask, batch.position_ids, batch.response_mask, 1.0)
    lm, adapters = policy(qwen2_dir, Config(lora_rank=4))
    scorer = ResponseLogProbs(lm)
    with torch.no_grad():
        ref = AdaptersOff(scorer, adapters)(*args)["logp"]
        adapted = scorer(*args)["logp"]
    base = logprobs(load_model(qwen2_dir), episodes)
    assert (ref - base).abs().max() <= 1e-6
    assert (adapted - base).abs().max() > 1e-3
    assert all(p.requires_grad for n, p in lm.named_parameters() if ".lora_" in n)
    assert torch.equal(logprobs(lm, episodes), adapted)

    fresh = load_model(qwen2_dir)
    adapters = add_lora(fresh, rank=4, alpha=32, targets="", base=qwen2_dir, dtype=torch.float32, seed=0)
    cfg = config("grpo", {"lora_rank": 4, "beta": 0.04}, micro=4)
    scorer = ResponseLogProbs(fresh)
    optimizer = torch.optim.SGD([p for p in fresh.parameters() if p.requires_grad], lr=1.0)
    out = train.update(learner(scorer, fresh, AdaptersOff(scorer, adapters), optimizer,
                               torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0), cfg), episodes)
    assert out["kl/k3"] == 0.0


# ============================================================================ rollouts

@pytest.mark.slow
@pytest.mark.needs("peft")
def test_the_engine_step_compiles_whole_with_lora_layers_and_sees_them():
    """With peft's LoRA layers in the model, the engine decodes from its inference copy with the
    adapters merged (W + (α/r)·B A): torch.compile(fullgraph=True) traces that step (no graph
    break: capturable as one CUDA graph), the trace writes what the eager step writes, and greedy it
    writes what HF generate writes on the adapted model (peft's layers), not what the base writes."""
    lm = random_lm("qwen2")
    rows = [p for p in prompts([3, 9, 5, 12, 7]) for _ in range(2)]
    greedy = Sampling(temperature=0, max_new_tokens=24)
    base = engine_decode(Engine(lm), rows, greedy, -1)
    add_lora(lm, rank=4, alpha=32, targets="", base=".", dtype=torch.float32, seed=0)
    draw = torch.Generator().manual_seed(1)
    for name, p in lm.named_parameters():
        if ".lora_B." in name:
            p.data.copy_(0.05 * torch.randn(p.shape, generator=draw))
    eos = frequent_token([t for t, _ in engine_decode(Engine(lm), rows, greedy, -1)])
    eager, traced = Engine(lm, compile="untraced"), Engine(lm, compile="eager")
    for sampling in (greedy, Sampling(0.8, 0.9, 20, max_new_tokens=24)):
        torch.manual_seed(3)
        expected = engine_decode(eager, rows, sampling, eos)
        torch.manual_seed(3)
        assert engine_decode(traced, rows, sampling, eos) == expected
    adapted = [t for t, _ in sample(lm, tokenizer(-1), rows, replace(greedy, sampler=sampler_for()))]
    assert [t for t, _ in engine_decode(Engine(lm), rows, greedy, -1)] == adapted
    assert adapted != [t for t, _ in base]


# ============================================================================ checkpoints

def trained_policy(checkpoint: Path):
    """The policy a resume from this checkpoint continues: the base from --model, the adapters
    (and nothing else) from its exact fp32 train state."""
    lm, _ = policy(SHIPPED, Config(lora_rank=8))
    optimizer = torch.optim.AdamW([p for p in lm.parameters() if p.requires_grad])
    load_train_state(checkpoint / "train_state", lm, optimizer)
    return lm


def rounding_floor(lm, episodes, draws: int = 3) -> float:
    """How far the policy's log-probs move when every weight moves by one unit in its last place (the most
    that rounding a weight once to fp32 does), each up or down at random: the largest change over a few
    draws. On the shipped model it is 4e-6 to 1.2e-5 (torch 2.13, transformers 5.24)."""
    floor, generator = 0.0, torch.Generator().manual_seed(0)
    for _ in range(draws):
        nudged = copy.deepcopy(lm)
        with torch.no_grad():
            for p in nudged.parameters():
                p.copy_(torch.nextafter(p, torch.where(torch.rand(p.shape, generator=generator) < 0.5,
                                                       -torch.inf, torch.inf)))
        floor = max(floor, (logprobs(nudged, episodes) - logprobs(lm, episodes)).abs().max().item())
    return floor


@pytest.mark.slow
@pytest.mark.needs("peft")
def test_checkpoints_load_in_peft_and_merged_in_transformers(reference, tmp_path):
    """Every checkpoint is an adapter folder; only the last also has merged weights, in merged/. The
    adapter folder loaded with PeftModel.from_pretrained (or transformers' own from_pretrained, which
    applies it to the base it names) and merged/ with AutoModelForCausalLM.from_pretrained give the
    trained policy's log-probs to within 4x the rounding floor (`rounding_floor`), and the base
    model's differ by far more than that. The run logged lr × 10 and a
    KL of 0 at step 1 (the adapters start at B = 0). eval.py --model accepts the adapter folder and
    scores what the merged model scores."""
    checkpoints = reference / "checkpoints"
    last = checkpoints / f"step-{STEPS}"
    assert complete(reference) == [f"step-{n}" for n in range(1, STEPS + 1)]
    for n in range(1, STEPS):
        assert not (checkpoints / f"step-{n}" / "merged").exists()
    assert {"adapter_config.json", "adapter_model.safetensors"} <= {p.name for p in last.iterdir()}
    assert not (last / "config.json").exists()  # from_pretrained(last) would apply the adapters to the merged model
    rows = metrics(reference)
    assert rows[0]["lr"] == pytest.approx(3e-4 * 10 * 2 / 5)  # lr × lora_lr_scale, warm-up step 2 of 5
    assert rows[0]["kl/k3"] == 0.0 and rows[-1]["kl/k3"] > 0

    lm = trained_policy(last)
    tok, problems = load_tokenizer(SHIPPED), [Problem(f"Add {p}", "0") for p in ("12+7+30", "5+61+8", "40+3+17")]
    torch.manual_seed(0)  # the policy's own responses: log-probs of the size training sees
    episodes = generate(lm, tok, problems, encode_prompts(tok, problems, True), group_size=4,
                        sampling=Sampling(1.0, max_new_tokens=48))
    policy_logp = logprobs(lm, episodes)
    from peft import PeftModel  # here, not at the top: without peft the module still collects
    in_peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(SHIPPED), str(last))
    merged = AutoModelForCausalLM.from_pretrained(str(last / "merged"))
    via_transformers = AutoModelForCausalLM.from_pretrained(str(last))  # its peft integration: base + adapters
    # Another library's forward of the same weights (peft's adapter layers, a merged W + s·B·A rounded once to
    # fp32) is the policy up to rounding, so the bound is the rounding floor, not a constant: a fixed 1e-5 sat
    # on the floor itself and failed by 1.05e-5 with peft 0.21.2 (and with torch 2.11 + transformers 5.17).
    # 4x leaves room for the merge's own rounding on top of the forward's; a wrong merge (scale, transpose,
    # a module left out) moves log-probs by the size of training's change, which the last line requires.
    tolerance = 4 * rounding_floor(lm, episodes)
    assert tolerance < 1e-4
    assert (logprobs(in_peft.get_base_model(), episodes) - policy_logp).abs().max() <= tolerance
    assert (logprobs(via_transformers, episodes) - policy_logp).abs().max() <= tolerance
    assert (logprobs(merged, episodes) - policy_logp).abs().max() <= tolerance
    assert (logprobs(load_model(SHIPPED), episodes) - policy_logp).abs().max() > 1e-3

    scores = {}
    for name, model in (("adapter", last), ("merged", last / "merged")):
        evaluation.main(["--model", str(model), "--problems", "8", "-n", "2", "--k", "1,2", "--no-greedy",
                         "--max-new-tokens", "48", "--out", str(tmp_path / name)])
        scores[name] = json.loads((tmp_path / name / "summary.json").read_text())["metrics"]
    assert scores["adapter"] == scores["merged"]


@pytest.mark.slow
@pytest.mark.needs("peft")
def test_a_damaged_lora_checkpoint_is_named(reference, tmp_path):
    run = shutil.copytree(reference, tmp_path / "run", ignore=shutil.ignore_patterns(".lock"))
    newest = run / "checkpoints" / f"step-{STEPS}"
    (newest / "adapter_model.safetensors").unlink()
    msg = run_main(["--resume", "auto", "--out", str(run)])
    assert msg.startswith("error: ") and "\n" not in msg, msg
    assert f"checkpoint {newest}: incomplete, no adapter_model.safetensors" in msg, msg


@pytest.mark.slow
@pytest.mark.extended  # a run of its own process, killed and resumed (test_faults' kill, with adapters)
@pytest.mark.needs("peft")
def test_kill_9_while_a_checkpoint_is_written_then_resume(reference, tmp_path, capsys):
    """A LoRA run in another process is killed as soon as a checkpoint after step-1 is being
    written; `--resume` loads the base from --model and the adapters and AdamW from the newest
    complete checkpoint, and replays the rest exactly: the final adapters, merged weights, train
    state and logs equal the uninterrupted run's."""
    run = tmp_path / "run"
    proc = start_train(RUN, run)
    try:
        wait_until(proc, lambda: [p for p in run.glob("checkpoints/.step-*.partial") if p.name != ".step-1.partial"],
                   "a checkpoint write after step-1")
    finally:
        kill_9(proc)
    partial = hidden(run)
    assert len(partial) == 1 and partial[0].endswith(".partial"), partial
    killed_at = int(partial[0].split("-")[1].split(".")[0])
    capsys.readouterr()
    train.main(["--resume", str(run)])
    assert f"resumed at step {killed_at - 1}" in capsys.readouterr().out
    assert hidden(run) == [] and complete(run) == complete(reference)
    final, expected = run / "checkpoints" / f"step-{STEPS}", reference / "checkpoints" / f"step-{STEPS}"
    for name in ("adapter_model.safetensors", "merged/model.safetensors"):
        assert equal(load_file(str(final / name)), load_file(str(expected / name))), name
    assert equal(train_state(final, tmp_path), train_state(expected, tmp_path))
    assert same_run(metrics(reference), metrics(run))


# ============================================================================ mistakes

@pytest.mark.needs("peft")  # without peft, --lora-rank stops first with the pip command (the last check)
def test_lora_mistakes_are_named_before_anything_loads(monkeypatch, tmp_path):
    msg = run_main(["--lora-rank", "8", "--lora-targets", "q_proj,qproj", "--max-steps", "1"])
    assert msg.startswith("error: --lora-targets q_proj,qproj: qproj is not a linear layer of LlamaForCausalLM's "
                          "decoder layers; choose from q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"), msg
    assert "lm_head is not a linear layer" in run_main(["--lora-rank", "8", "--lora-targets", "lm_head"])
    assert "give --lora-rank r" in run_main(["--lora-targets", "q_proj"])
    assert "lora_rank=-1: must be ≥ 0" in run_main(["--lora-rank", "-1"])
    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "/nowhere/base"}')
    msg = run_main(["--model", str(tmp_path), "--max-steps", "1"])
    assert msg == (f"error: --model {tmp_path}: its adapter_config.json names the base model '/nowhere/base', which "
                   f"is not a model folder here; set base_model_name_or_path there to the base model's folder"), msg
    monkeypatch.setitem(sys.modules, "peft", None)  # as if it were not installed
    msg = run_main(["--lora-rank", "8", "--max-steps", "1"])
    assert msg == "error: --lora-rank needs peft, which is not installed here: pip install peft", msg
