"""extras/health.py: each failure a real short run made (tests/fixtures/health/README.md has the commands) is
named first; the default run over seeds 0, 1, 2 raises nothing above a note; bad input is one line."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from extras import health

FIXTURES = Path(__file__).parent / "fixtures" / "health"

# fixture folder -> the docs/run-health.md section of the finding the reader must name first
FAILURES = {
    "truncation": "truncation",
    "format": "format-failures",
    "no_signal": "no-learning-signal",
    "terms": "reward-terms",
    "blowup": "entropy-blow-up",
    "blowup_epochs": "entropy-blow-up",
    "clip": "clip-fraction",
    "kl": "kl-runaway",
    "nan": "nan-or-inf",
    "length": "length-hacking",
    "collapse": "collapse",
    "sapo_collapse": "collapse",  # docs/measured.md's own failures, re-run
    "pacs_collapse": "collapse",
    "lora_collapse": "collapse",
    "grad_norm": "grad-norm",
    "mismatch": "mismatch",
    "eval_cannot_tell": "eval-cannot-tell",  # a note: 30 held-out problems, 1 sample each
}
HEALTHY = ("default_s0", "default_s1", "default_s2")  # the default run's seeds, each to its 150th step
# every CPU recipe, configs/tiny_*.yaml: 18 at their full length, 3 shortened to 10 steps at 4 prompts a step
# (fixtures/health/README.md)
RECIPES = sorted(p.stem[5:] for p in (FIXTURES.parents[2] / "configs").glob("tiny_*.yaml"))


@pytest.mark.parametrize("name", sorted(FAILURES))
def test_a_run_made_to_fail_is_named_first(name):
    found = health.findings(health.read_run(FIXTURES / name))
    assert found, f"{name}: nothing found"
    assert found[0].section == FAILURES[name], [f.line() for f in found]


@pytest.mark.parametrize("name", HEALTHY)
def test_the_default_run_raises_nothing_above_a_note(name):
    run = health.read_run(FIXTURES / name)
    assert [f.line() for f in health.findings(run) if f.severity != "note"] == []
    assert health.report(run).splitlines()[0].startswith(f"{FIXTURES / name}: healthy — 150 steps read, reward ")


def test_the_same_run_with_the_default_eval_tells():
    """eval_cannot_tell's 40 steps again with the default eval (200 problems × 4 samples): the same training
    reward (the eval samples on its own stream), 56.2% ± 2.7 → 72.0% ± 2.6, outside ±7.4 points: no note."""
    small, full = (health.read_run(FIXTURES / name) for name in ("eval_cannot_tell", "eval_tells"))
    assert [r["reward/mean"] for r in small.train] == [r["reward/mean"] for r in full.train]
    assert health.findings(full) == []


@pytest.mark.parametrize("name", RECIPES)
def test_a_recipe_raises_nothing_above_a_note(name):
    run = health.read_run(FIXTURES / f"recipe_{name}")
    assert [f.line() for f in health.findings(run) if f.severity != "note"] == []


def test_an_entropy_collapse_on_rows_written_by_hand():
    """No short run of the tiny model collapses its entropy (docs/run-health.md#entropy-collapse): rows by hand,
    0.03 for 5 steps then 0.002, a fifteenth of the start, under the tenth the check allows."""
    rows = [{"step": s, "entropy/mean": 0.03 if s <= 5 else 0.002} for s in range(1, 26)]
    (found,) = health.entropy(health.Run(Path("r"), rows, [], {}, []))
    assert found.section == "entropy-collapse" and "0.0300 over steps 1-5, 0.00200 over steps 21-25" in found.evidence


def test_a_finding_names_its_evidence_causes_knobs_and_section():
    found = health.findings(health.read_run(FIXTURES / "truncation"))[0]
    text = found.block()
    assert "length/truncated 1.00 over steps" in text and "budget of 24" in text  # every response cut at 24 tokens
    assert "--max-new-tokens" in text and "docs/run-health.md#truncation" in text
    assert f"## {found.section}" in _anchors()


def _anchors() -> str:
    """docs/run-health.md's headings as the anchors GitHub makes of them."""
    page = (Path(__file__).parent.parent / "docs" / "run-health.md").read_text()
    return "\n".join("## " + line[3:].lower().replace(" ", "-").replace(",", "").replace(":", "")
                     for line in page.splitlines() if line.startswith("## "))


@pytest.mark.parametrize("section", sorted({*FAILURES.values(), "entropy-collapse", "eval-cannot-tell"}))
def test_every_section_a_finding_cites_is_in_the_docs(section):
    assert f"## {section}\n" in _anchors() + "\n"


def test_the_eval_that_cannot_tell_is_worked_out_from_its_standard_errors():
    """Reward 0.5 -> 0.7 over 10 steps; accuracy 60% ± 5 -> 64% ± 5: the 95% interval of the change is
    1.96·√(0.05² + 0.05²) = ±13.9 points, so +4 is inside it; at 80% it is outside."""
    rows = [{"step": s, "reward/mean": 0.5 if s <= 5 else 0.7} for s in range(1, 11)]
    evals = [{"step": 0, "eval/accuracy": 0.6, "eval/accuracy_se": 0.05},
             {"step": 10, "eval/accuracy": 0.64, "eval/accuracy_se": 0.05}]
    run = health.Run(Path("r"), rows, evals, {}, [])
    (found,) = health.eval_cannot_tell(run)
    assert "±13.9%" in found.evidence and "+4.0%" in found.evidence
    evals[1]["eval/accuracy"] = 0.8
    assert health.eval_cannot_tell(run) == []


def test_windows_and_ends_by_hand():
    assert health.window(150) == 30 and health.window(12) == 3
    run = health.Run(Path("r"), [{"step": s, "reward/mean": float(s)} for s in range(1, 11)], [], {}, [])
    assert health.ends(run, "reward/mean") == (2.0, 9.0, "steps 1-3", "steps 8-10")  # window 3: 1, 2, 3 and 8, 9, 10
    assert health.ends(run, "entropy/mean") is None  # not logged
    assert health.median([3, 1, 2, 10]) == 2.5


# ----------------------------------------------------------------------------- bad input: one line each

def run_main(capsys, *argv) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        health.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return e.value.code, out, err


def test_a_missing_folder_and_an_empty_one_are_one_line_each(tmp_path, capsys):
    code, out, err = run_main(capsys, tmp_path / "nope")
    assert code == 1 and out == "" and err == f"error: {tmp_path / 'nope'}: no such folder; give a run folder " \
                                             "(the --out of train.py, runs/<algo>-<timestamp>)\n"
    code, _, err = run_main(capsys, tmp_path)
    assert code == 1 and err.startswith(f"error: {tmp_path}: no metrics.jsonl here") and err.count("\n") == 1
    (tmp_path / "metrics.jsonl").write_text("")
    code, _, err = run_main(capsys, tmp_path)
    assert code == 1 and "holds no rows yet" in err and err.count("\n") == 1


def test_one_bad_folder_does_not_stop_the_others(tmp_path, capsys):
    code, out, err = run_main(capsys, tmp_path / "nope", FIXTURES / "truncation")
    assert code == 1 and "no such folder" in err and "[warning] responses run out of budget" in out


def test_a_last_line_cut_by_a_kill_is_skipped_and_said(tmp_path, capsys):
    run = shutil.copytree(FIXTURES / "default_s0", tmp_path / "run")
    text = (run / "metrics.jsonl").read_text()
    (run / "metrics.jsonl").write_text(text[:-len(text.splitlines()[-1]) // 2 - 1])  # half the last row
    code, out, _ = run_main(capsys, run)
    n = len(text.splitlines())
    assert code == 0 and out.startswith(f"{run}: healthy — {n - 2} steps read (of 150: still going or stopped)")
    assert f"(read: metrics.jsonl line {n} is cut short (a run killed mid-write): read the rest)" in out


def test_a_run_with_no_eval_and_an_older_one_missing_keys(tmp_path, capsys):
    """An older version logged no format failures, truncation, entropy or mismatch, and no config.yaml:
    those checks are not made, the rest are."""
    run = tmp_path / "old"
    run.mkdir()
    old = ("reward/format_failures", "length/truncated", "entropy/mean", "mismatch/kl")
    rows = [json.loads(x) for x in (FIXTURES / "truncation" / "metrics.jsonl").read_text().splitlines()]
    (run / "metrics.jsonl").write_text("".join(json.dumps({k: v for k, v in r.items() if k not in old}) + "\n"
                                               for r in rows))
    code, out, _ = run_main(capsys, run)
    assert code == 0 and "no eval logged" in out
    assert "[alarm] no learning signal" in out  # without the truncation it explains, the zeros are the finding
    assert "(read: config.yaml unreadable (none in the folder): read with the defaults' budget and batch)" in out


# ----------------------------------------------------------------------------- in the run

@pytest.mark.slow
def test_the_run_says_its_verdict_at_each_eval_and_writes_it_to_tensorboard(tmp_path, capsys):
    import train
    train.main(["--max-steps", "2", "--eval-every", "2", "--eval-problems", "8", "--prompts-per-step", "4",
                "--out", str(tmp_path / "run")])
    said = capsys.readouterr()
    assert "health at the end, step 2: healthy — 2 steps read" in said.out + said.err
    events = b"".join(p.read_bytes() for p in (tmp_path / "run").glob("events.out.tfevents.*"))
    assert b"health/text_summary" in events


def test_a_reader_piped_into_head_stops_without_a_traceback():
    """`python -m extras.health RUN ... | head -1`: the pipe closes after the first line; the reader stops quietly."""
    import subprocess
    import sys
    folders = [str(FIXTURES / name) for name in sorted(FAILURES)] * 10  # 190 KB: more than a pipe holds
    reader = subprocess.Popen([sys.executable, "-m", "extras.health", *folders], cwd=FIXTURES.parents[2],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = reader.stdout.readline()
    reader.stdout.close()  # as head does after its line
    stderr = reader.stderr.read().decode()
    assert reader.wait(timeout=60) == 0 and first and "Traceback" not in stderr and "Exception" not in stderr, stderr
