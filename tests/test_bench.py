"""The GPU benchmarks' CPU paths, run as a user runs them: bench/decode_bound.py --quick measures
both regimes to the end; bench/gpu_check.py stops with one clear line where there is no CUDA, and
runs its parts tiny on CPU (--device cpu --quick)."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow  # each test runs a benchmark script in a fresh process


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


def table(stdout: str) -> tuple[list[str], list[list[str]]]:
    """A markdown table's header cells and body rows."""
    lines = [[cell.strip() for cell in line.strip()[1:-1].split(" | ")] for line in stdout.splitlines()
             if line.startswith("| ")]
    return lines[0], lines[1:]


def test_decode_bound_quick_measures_both_regimes():
    out = run("bench/decode_bound.py", "--device", "cpu", "--quick")
    assert out.returncode == 0, out.stderr
    header, rows = table(out.stdout)
    assert header == ["regime", "batch", "engine", "length mean [min, max]", "decode s", "tokens/s", "bound tokens/s",
                      "of bound", "× hf", "compiles"]
    assert [r[:3] for r in rows] == [[regime, batch, engine] for regime in ("bound", "training")
                                     for batch in ("4", "8") for engine in ("hf", "fast")]
    lengths = {}
    for r in rows:
        assert len(r) == len(header) and re.fullmatch(r"\d+\.\d%", r[7]), r
        assert float(r[5].replace(",", "")) > 0 and float(r[6].replace(",", "")) > 0, r
        mean, low, high = map(float, re.fullmatch(r"([\d.]+) \[(\d+), (\d+)\]", r[3]).groups())
        lengths.setdefault(r[0], []).append((mean, low, high))
    assert all(length == (24, 24, 24) for length in lengths["bound"])  # every row writes the whole budget
    # rows stop at lengths drawn around the mean 6: they vary, and fall short of the budget on average
    assert min(low for _, low, _ in lengths["training"]) < max(high for _, _, high in lengths["training"])
    assert all(mean < 24 for mean, _, _ in lengths["training"])


def test_gpu_check_without_cuda_says_so_in_one_line():
    out = run("bench/gpu_check.py", env={"CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 1
    assert out.stderr.strip() == ("gpu_check: no CUDA GPU here (torch.cuda.is_available() is False): "
                                  "run it on a machine with one")
    assert out.stdout == ""


def test_gpu_check_quick_on_cpu(tmp_path):
    # decode runs in the test above; train is lora's code path twice (--engine fast, hf)
    report_path = tmp_path / "check.json"
    out = run("bench/gpu_check.py", "--device", "cpu", "--quick", "--skip", "decode,train", "--out", str(report_path))
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    parts = json.loads(report_path.read_text())["parts"]
    assert list(parts) == ["agree", "rng", "lora"]
    # fp32 on CPU: the engine writes what generate writes, and both record the trainer's log-probs
    assert parts["agree"]["identical"] == 1.0
    assert all(gap["max"] < 1e-4 for gap in parts["agree"]["logp_gap"].values())
    rng = parts["rng"]  # seeded, so not flaky: the eager engine's draws fit the known distribution
    assert rng["draws"] == 2 * 64 * 16 and min(rng["chi2_p"], rng["successive"]["p_value"],
                                                rng["across_calls"]["p_value"]) > 1e-3
    lora = parts["lora"]["lora"]
    assert len(lora["step_s"]) == 3 and lora["plan_gib"]["update"] > 0
    header, rows = table(out.stdout)
    assert header == ["part", "measure", "value"] and {r[0] for r in rows} == {"agree", "rng", "lora"}
