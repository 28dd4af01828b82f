"""The GPU benchmarks' CPU paths, run as a user runs them: bench/decode_bound.py --quick measures
both regimes to the end, or says a row is too short to time; bench/gpu_check.py stops with one clear
line where there is no CUDA, runs its parts tiny on CPU (--device cpu --quick), each in a process
of its own, and records a part past its cap as timed out and runs the next. The fast tests check
the arithmetic those runs report on made-up inputs. The CPU runs of the benchmarks are marked
extended: a minute of child processes and compiles that tests bench/, not the trainer, so the
README's line skips them and .ci/run runs them."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.append(str(ROOT / "bench"))  # after the root: bench/engine.py must not shadow engine.py


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **(env or {})})


def table(stdout: str) -> tuple[list[str], list[list[str]]]:
    """A markdown table's header cells and body rows."""
    lines = [[cell.strip() for cell in line.strip()[1:-1].split(" | ")] for line in stdout.splitlines()
             if line.startswith("| ")]
    return lines[0], lines[1:]


def test_decode_time_is_a_figure_only_above_the_noise():
    """A run whose rows stop after a token or two once gave −0.01 s (one timed call less one 1-token
    call): now the 1-token calls' median stands for the prefill and their spread for the noise."""
    from decode_bound import decode_seconds
    assert decode_seconds([2.0], [0.5, 0.6, 0.4]) == pytest.approx(1.5)
    assert decode_seconds([1.0, 1.2], [0.1] * 6) == pytest.approx(2.0)  # no spread: any positive time counts
    assert decode_seconds([0.8], [0.5, 0.6, 0.4]) is None  # 0.3 s, not above 3 × the 0.2 s spread
    assert decode_seconds([0.29], [0.30, 0.31, 0.30]) is None  # shorter than the prefill alone
    assert decode_seconds([0.1], [0.1] * 3) is None


def test_a_step_histogram_subtracts_the_prefill():
    """gpu_check.step_kernels: a call of n tokens is a "prefill" (a sum) and n − 1 steps (a matmul of
    two new tensors each): the histogram per step counts the step's ops alone."""
    from gpu_check import step_kernels
    x = torch.ones(8, 8)

    def call(n):
        x.sum()
        return [torch.ones(8, 8) @ torch.ones(8, 8) for _ in range(n - 1)]
    kernels = step_kernels(call, 5, torch.device("cpu"), top=2)
    assert kernels["kernels_per_step"] == 3 and kernels["kernel_ms_per_step"] > 0
    assert dict(kernels["most_run"]) == {"aten::ones": 2, "aten::matmul": 1}


def test_train_summary_tells_compiling_apart():
    """gpu_check.summary: time/engine_compile is cumulative, a step's own is the difference; the steady
    step is the mean of the later steps less their compiling; a run from before train.py logged it
    still reads (None)."""
    from gpu_check import summary
    rows = [{"time/step": 100.0, "time/rollout": 90.0, "engine/compiles": 2, "time/engine_compile": 80.0,
             "engine/moves": 0},
            {"time/step": 14.0, "time/rollout": 9.0, "engine/compiles": 3, "time/engine_compile": 84.0,
             "engine/moves": 0},
            {"time/step": 11.0, "time/rollout": 6.0, "engine/compiles": 3, "time/engine_compile": 84.0,
             "engine/moves": 0}]
    s = summary(rows, dict(rollout=1.0, update=2.0))
    assert s["compile_s"] == [80.0, 4.0, 0.0] and s["steady_s"] == pytest.approx(10.5)
    assert s["rollout_share"] == [0.9, 9 / 14, 6 / 11] and s["moves"] == [0, 0, 0]
    old = summary([{k: v for k, v in r.items() if not k.startswith(("engine/", "time/engine"))} for r in rows], {})
    assert old["compile_s"] == [None] * 3 and old["compiles"] == [None] * 3 and old["steady_s"] == 12.5


def test_the_auto_decision_reads_steps_2_and_3():
    """gpu_check.decision: a line a step with both engines, then fast's steady step over hf's and what
    --engine auto on CUDA would pick; a pass cut short gives its steps and no verdict."""
    from gpu_check import decision, summary
    def steps(*pairs, **compiling):  # (rollout, update) a step; the engine logs its cumulative compiling
        return [{"time/step": r + u, "time/rollout": r, "time/update": u, **compiling} for r, u in pairs]
    hf = summary(steps((34.0, 9.0), (13.0, 5.0), (12.0, 5.0)), {})
    fast = summary(steps((70.0, 9.0), (3.0, 5.0), (3.0, 5.0), **{"time/engine_compile": 60.0}), {})
    lines = dict(decision(hf, fast))
    assert lines["fast / hf: step s less compiling, mean of steps 2-3"] == "8.0 / 17.5 = 0.46"
    assert lines["step 1: s (rollout, update)"] == ("hf 43.0 (rollout 34.0, update 9.0); "
                                                     "fast 79.0 (rollout 70.0, update 9.0, compiling 60.0)")
    assert lines["--engine auto on CUDA, by these steps"] == "fast (the engine)"
    assert dict(decision(fast, hf))["--engine auto on CUDA, by these steps"] == "hf (generate)"
    cut = dict(decision(hf, summary(steps((70.0, 9.0), **{"time/engine_compile": 60.0}), {})))
    assert len(cut) == 3 and "--engine auto on CUDA, by these steps" not in cut


@pytest.mark.slow
@pytest.mark.extended
def test_decode_bound_quick_measures_both_regimes():
    out = run("bench/decode_bound.py", "--device", "cpu", "--quick")
    assert out.returncode == 0, out.stderr
    header, rows = table(out.stdout)
    assert header == ["regime", "batch", "engine", "length mean [min, max]", "decode s", "tokens/s", "bound tokens/s",
                      "of bound", "of roofline", "× hf", "compiles"]
    assert [r[:3] for r in rows] == [[regime, batch, engine] for regime in ("bound", "training")
                                     for batch in ("4", "8") for engine in ("hf", "fast")]
    lengths = {}
    for r in rows:
        assert len(r) == len(header), r
        if r[4] == "too short to time":  # no rate at all, rather than one the noise made
            assert r[0] == "training" and r[5] == r[7] == r[8] == r[9] == "–", r
        else:
            assert float(r[4]) > 0 and float(r[5].replace(",", "")) > 0, r
            assert re.fullmatch(r"\d+\.\d%", r[7]) and re.fullmatch(r"\d+\.\d%", r[8]), r
        assert float(r[6].replace(",", "")) > 0, r
        mean, low, high = map(float, re.fullmatch(r"([\d.]+) \[(\d+), (\d+)\]", r[3]).groups())
        lengths.setdefault(r[0], []).append((mean, low, high))
    assert all(length == (24, 24, 24) for length in lengths["bound"])  # every row writes the whole budget
    # rows stop at lengths drawn around the mean 6: they vary, and fall short of the budget on average
    assert min(low for _, low, _ in lengths["training"]) < max(high for _, _, high in lengths["training"])
    assert all(mean < 24 for mean, _, _ in lengths["training"])


@pytest.mark.slow
def test_gpu_check_without_cuda_says_so_in_one_line():
    out = run("bench/gpu_check.py", env={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 1
    assert out.stderr.strip() == ("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): "
                                  "run it on a machine with one")
    assert out.stdout == ""


def quick_check(tmp_path, parts: str) -> dict:
    """`gpu_check.py --device cpu --quick --parts PARTS`, which must pass: its parts' report, each part within
    its cap, and the printed table one row group a part, in the report's order."""
    report_path = tmp_path / "check.json"
    out = run("bench/gpu_check.py", "--device", "cpu", "--quick", "--parts", parts, "--out", str(report_path))
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    parts = json.loads(report_path.read_text())["parts"]
    assert all(p["seconds"] <= p["cap_s"] and "timed_out" not in p for p in parts.values())
    header, rows = table(out.stdout.split("wrote")[-1])
    assert header == ["part", "measure", "value"] and list(dict.fromkeys(r[0] for r in rows)) == list(parts)
    return parts


@pytest.mark.slow
@pytest.mark.extended
def test_gpu_check_quick_on_cpu(tmp_path):
    # train is lora's code path twice (--engine fast, hf), and its own arithmetic is tested above;
    # lora, which needs peft, is the next test's
    parts = quick_check(tmp_path, "rng,agree,decode,probe")
    assert list(parts) == ["probe", "decode", "agree", "rng"]  # PARTS' order, whatever --parts' order
    for layers in (2, 8):  # the traced step on the copy: one graph, none more in other buckets; a softmax a layer
        probe = parts["probe"][str(layers)]
        assert probe["graphs"] == 1 and probe["recompiles"] == 0, layers
        assert [(name, count) for name, count, _ in probe["attention"]] == [("aten::softmax", layers)]
    decode = parts["decode"]
    assert [(r["regime"], r["batch"]) for r in decode["rows"]] == [
        (regime, b) for regime in ("bound", "training") for b in (4, 8) for _ in "ef"]
    assert all(r["roofline"] >= r["fraction"] > 0 for r in decode["rows"] if r["regime"] == "bound")
    for name, engine in decode["engines"].items():
        assert 0 <= engine["moves"] <= engine["calls"] and list(engine["batches"]) == ["4", "8"], name
        for b in engine["batches"].values():
            assert b["issue_s_per_step"] is None or b["issue_s_per_step"] > 0
    for b in decode["engines"]["bound"]["batches"].values():  # a step's ops on CPU: the profile read
        assert b["kernels_per_step"] > 10 and b["kernel_ms_per_step"] > 0 and len(b["most_run"]) == 5
    agree = parts["agree"]  # fp32 on CPU: the engine writes what generate writes, and both record the
    assert agree["identical"] == 1.0 and agree["margin_mean"] > 0  # trainer's log-probs
    assert all(gap["max"] < 1e-4 for gap in agree["logp_gap"].values())
    rng = parts["rng"]  # seeded, so not flaky: the eager engine's draws fit the known distribution
    assert rng["draws"] == 2 * 64 * 16 and min(rng["chi2_p"], rng["successive"]["p_value"],
                                                rng["across_calls"]["p_value"]) > 1e-3


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.needs("peft")
def test_gpu_check_quick_lora_on_cpu(tmp_path):
    parts = quick_check(tmp_path, "lora")
    assert list(parts) == ["lora"]
    lora = parts["lora"]["lora"]
    assert len(lora["step_s"]) == len(lora["compile_s"]) == 3 and lora["plan_gib"]["update"] > 0


@pytest.mark.slow
@pytest.mark.extended
def test_gpu_check_quick_pack_on_cpu(tmp_path):
    """The pack part's update, padded and packed on one model: the packed tensors never larger, their
    padding share what their tokens say of the same real tokens."""
    pack = quick_check(tmp_path, "pack")["pack"]
    padded, packed = pack["padded"], pack["packed"]
    assert packed["tensor_tokens"] <= padded["tensor_tokens"] and len(packed["all_s"]) == len(padded["all_s"]) == 3
    assert padded["real_tokens"] == packed["real_tokens"] > 0  # the same batch
    for layout in (padded, packed):
        assert layout["padding_share"] == pytest.approx(1 - layout["real_tokens"] / layout["tensor_tokens"])
    assert pack["packed_over_padded"] == pytest.approx(packed["seconds"] / padded["seconds"])


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed: the part would run")
def test_gpu_check_vllm_part_says_in_a_line_that_vllm_is_missing(tmp_path):
    parts = quick_check(tmp_path, "vllm")
    assert list(parts) == ["vllm"] and parts["vllm"]["skipped"] and parts["vllm"]["seconds"] < 60


@pytest.mark.slow
@pytest.mark.extended
def test_gpu_check_stops_a_part_at_its_cap_and_runs_the_next(tmp_path):
    report_path = tmp_path / "check.json"
    out = run("bench/gpu_check.py", "--device", "cpu", "--quick", "--parts", "decode,rng",
              "--caps", "decode=1,rng=300", "--out", str(report_path))
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    parts = json.loads(report_path.read_text())["parts"]
    assert list(parts) == ["decode", "rng"] and parts["decode"]["timed_out"] and parts["decode"]["seconds"] < 10
    assert parts["rng"]["draws"] == 2 * 64 * 16 and "timed_out" not in parts["rng"]
    assert ["decode", "timed out"] == table(out.stdout.split("wrote")[-1])[1][0][:2]
    assert not list(tmp_path.glob("*.part.json"))
