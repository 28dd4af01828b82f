"""python -m extras.plot: the curves of runs' metrics.jsonl as a picture, with matplotlib when it is installed."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from extras import plot

ROOT = Path(__file__).resolve().parent.parent


def a_run(folder: Path, rows: list[dict], torn: str = "") -> str:
    """A run folder whose metrics.jsonl holds `rows`, then `torn` (what a killed run leaves mid-line)."""
    folder.mkdir()
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + torn)
    return str(folder)


def two_runs(tmp_path: Path) -> list[str]:
    """Two runs as train.py logs them: an eval row at step 0 and every 2 steps, a training row every step."""
    def rows(shift):
        return [{"step": s, **({"reward/mean": 0.1 * s + shift, "length/mean": 40.0} if s else {}),
                 **({"eval/accuracy": 0.5 + shift, "eval/pass@1": 0.5, "eval/pass@4": 0.8} if s % 2 == 0 else {})}
                for s in range(5)]
    return [a_run(tmp_path / "a", rows(0.0)), a_run(tmp_path / "b", rows(0.1), torn='{"step": 5, "rew')]


def test_keys_and_patterns_pick_what_the_runs_logged(tmp_path, capsys):
    a, b = two_runs(tmp_path)
    runs = plot.read_runs([a, b])
    assert list(runs) == [a, b] and [r["step"] for r in runs[b]] == [0, 1, 2, 3, 4]  # the torn line left out
    assert plot.chosen_keys(plot.DEFAULT_KEYS.split(","), runs) == [
        "eval/accuracy", "eval/pass@1", "eval/pass@4", "reward/mean", "length/mean"]
    assert plot.chosen_keys(["length/*", "entropy/mean", "reward/mean"], runs) == ["length/mean", "reward/mean"]
    assert "no run logged entropy/mean; left out" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="logged none of grad/norm; they logged eval/accuracy, eval/pass@1"):
        plot.chosen_keys(["grad/norm"], runs)
    assert plot.trailing_mean([1, 3, 5, 7], 2) == [1, 2, 4, 6]


@pytest.mark.needs("matplotlib")
@pytest.mark.parametrize("suffix", ["png", "svg"])
def test_the_command_draws_one_panel_per_key_and_one_line_per_run(tmp_path, suffix):
    out = tmp_path / f"curves.{suffix}"
    a, b = two_runs(tmp_path)
    done = subprocess.run([sys.executable, "-m", "extras.plot", a, b, "--keys", "eval/pass@*,reward/mean",
                           "--smooth", "2", "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{out}: eval/pass@1, eval/pass@4, reward/mean of {a}, {b}"
    if suffix == "png":
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:  # text kept as text: the panels' titles and the runs' names can be read in it
        svg = out.read_text()
        assert all(f">{text}<" in svg for text in ("eval/pass@1", "eval/pass@4", "reward/mean", a, b))


def test_x_is_the_step_or_a_per_step_metric_summed():
    rows = [{"step": 0, "eval/accuracy": 0.5}, {"step": 2, "tokens/generated": 20.0, "eval/accuracy": 0.6},
            {"step": 1, "tokens/generated": 10.0}, {"step": 3, "tokens/generated": 30.0}]
    assert plot.x_values(rows, "tokens/generated") == {0: 0.0, 1: 10.0, 2: 30.0, 3: 60.0}
    assert plot.x_values(rows, "step") == {0: 0, 2: 2, 1: 1, 3: 3}


@pytest.mark.needs("matplotlib")
def test_the_command_draws_a_panel_per_key_and_x(tmp_path):
    out = tmp_path / "cost.svg"
    a, b = two_runs(tmp_path)
    done = subprocess.run([sys.executable, "-m", "extras.plot", a, b, "--keys", "eval/accuracy",
                           "--x", "step,length/mean", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{out}: eval/accuracy against step, length/mean of {a}, {b}"
    assert ">length/mean, summed over the steps<" in out.read_text()


def test_what_is_missing_is_said_in_one_line(tmp_path, monkeypatch):
    with pytest.raises(SystemExit, match=r"^error: .*nowhere: no metrics.jsonl here; give run folders"):
        plot.read_runs([str(tmp_path / "nowhere")])
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    with pytest.raises(SystemExit, match=r"^error: extras/plot.py draws with matplotlib, which is not installed "
                                         r"here: pip install matplotlib$"):
        plot.main(two_runs(tmp_path))
