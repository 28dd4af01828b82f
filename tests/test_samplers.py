"""Who samples (issue 60): one sampler a run holds, built from --engine by config.SAMPLERS. A fourth sampler
plugs in by a file of its own and one registry line, and trains; the run asks the sampler, not its name."""
from __future__ import annotations

import json
import re
from contextlib import nullcontext

import pytest
import torch

import config
from config import Config, sampler_class
from rewards import Problem
from rollout import Generate, Sampling, encode_prompts, sample

from helpers import metrics

# The whole fourth sampler, as a fork would write it: it reads each prompt's numbers and writes the running
# sums, every other row with its total off by one, each token at log-prob −1 (it has no model of its own).
REPLAY = '''import re

from rollout import Generate


class Replay(Generate):
    def sample(self, lm, tokenizer, rows, sampling, *, width=0, cache=None):
        out = []
        for i, row in enumerate(rows):
            terms = [int(t) for t in re.findall(r"Add ([0-9+]+)", tokenizer.decode(row))[-1].split("+")]
            sums = [sum(terms[:k + 1]) for k in range(len(terms))]
            steps = " ".join(f"{a}+{b}={c}" for a, b, c in zip(sums, terms[1:], sums[1:]))
            text = f"{steps} <answer>{sums[-1] + i % 2}</answer>"
            ids = tokenizer(text, add_special_tokens=False)["input_ids"][:sampling.max_new_tokens - 1]
            out.append((ids + [tokenizer.eos_token_id], [-1.0] * (len(ids) + 1)))
        return out
'''


def test_a_fourth_sampler_plugs_in_by_one_file_and_one_registry_line_and_trains(tmp_path, monkeypatch):
    """replay_sampler.py (above) and `SAMPLERS["replay"] = "replay_sampler:Replay"`: `--engine replay` is
    accepted, samples every rollout and eval, and the run trains 2 steps on what it wrote: half of each group
    right (reward 0.5), so GRPO has a gradient; the eval reads it too (accuracy 0.5 of n = 4)."""
    (tmp_path / "replay_sampler.py").write_text(REPLAY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(config.SAMPLERS, "replay", "replay_sampler:Replay")
    import train

    out = tmp_path / "run"
    train.main(["--engine", "replay", "--max-steps", "2", "--eval-every", "2", "--eval-problems", "8",
                "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "80", "--report-to", "none",
                "--out", str(out)])
    steps = [row for row in metrics(out) if row["step"] >= 1]
    assert [row["step"] for row in steps] == [1, 2]
    assert all(row["reward/mean"] == 0.5 and row["grad/norm"] > 0 for row in steps), steps
    assert steps[-1]["eval/accuracy"] == 0.5
    for row in map(json.loads, (out / "samples.jsonl").read_text().splitlines()):
        terms = [int(t) for t in row["prompt"].removeprefix("Add ").split("+")]
        assert re.fullmatch(r"(\d+\+\d+=\d+ ?)* <answer>\d+</answer>", row["response"]), row
        assert int(row["response"].split("<answer>")[1].split("<")[0]) - sum(terms) in (0, 1), row


def test_the_registry_names_each_engines_sampler_and_an_unknown_one_is_refused():
    """hf and auto are HF generate, fast engine.py's, vllm extras/vllm_engine.py's; --engine is checked against
    the registry itself, so a name a fork adds is accepted and a name nobody added is refused in one line."""
    from engine import Fast
    from extras.vllm_engine import VLLM

    assert [sampler_class(Config(engine=e)) for e in ("hf", "auto", "fast", "vllm")] == [Generate, Generate, Fast, VLLM]
    with pytest.raises(ValueError, match=r"engine='turbo': choose one of hf, auto, fast, vllm"):
        config.validate(Config(engine="turbo"), 1)


def test_generate_serves_within_the_runs_autocast_and_samples_as_before():
    """The HF sampler's block is the run's autocast (bf16 on a bf16 run) around generate, and `sample` with
    Sampling's default sampler is Generate's: the same greedy rows either way."""
    from model import load_model, load_tokenizer

    lm, tok = load_model(config.DEFAULT_MODEL), load_tokenizer(config.DEFAULT_MODEL)
    seen = []
    with Generate().serving(lm, lambda: torch.autocast("cpu", dtype=torch.bfloat16)):
        seen.append(torch.is_autocast_enabled("cpu"))
    with Generate().serving(lm, nullcontext):
        seen.append(torch.is_autocast_enabled("cpu"))
    assert seen == [True, False]
    rows = encode_prompts(tok, [Problem("Add 1+2", "3"), Problem("Add 40+2+9", "51")], chat_template=True)
    greedy = Sampling(temperature=0, max_new_tokens=16)
    assert sample(lm, tok, rows, greedy) == Generate().sample(lm, tok, rows, greedy)
