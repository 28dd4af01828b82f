"""Is it learning? A run's curves read for it: each finding a symptom, its evidence, causes, knobs, docs.

    python -m extras.health runs/grpo-20261203-061000                 # one run, most serious first
    python -m extras.health runs/a runs/b                             # several, one report each

It reads a run folder's metrics.jsonl (and config.yaml for the run's budget, batch and dtype,
samples.jsonl for a response to explain), of a finished run, one still going or one that crashed:
a last line cut short by a kill is skipped and said, a metric an older version did not log is a check
not made. Each finding has a severity (alarm: the run is broken; warning: something is likely
wrong; note: worth knowing, no failure) and names the metric, the steps and the values against the
healthy range, the likely causes, the knobs with their flags, and its section of docs/run-health.md,
which says how each threshold below was measured (the default run's seeds, a tiny_* recipe, the
failures of docs/measured.md re-run, and short runs made to fail). A healthy run is one line.

train.py calls `verdict` at each eval (`--health false`: never): one line on the console and the
whole report as TensorBoard text (tag `health`); the step itself never calls it.
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

SEVERITIES = ("alarm", "warning", "note")  # most serious first
DOCS = "docs/run-health.md"

# Each threshold with its measured reason (docs/run-health.md has the runs). "default": `python train.py`,
# seeds 0, 1 and 2 to step 150 (and before them seed 0 to step 112, seed 1 to 24), per step or per window (a
# fifth of the run); the failures: short runs.
NO_SIGNAL = 0.9  # all-equal groups, last window: default ≤ 0.94 a step, ≤ 0.68 a window; 4-digit sums 1.0
ENTROPY_BLOWUP = 0.2  # nats a token, last window: default ≤ 0.048 a step; lr 1e-2 and μ 4 at 2e-3 reach 0.29-0.45
ENTROPY_COLLAPSE = 0.1  # last window over first: default ends at 0.53-0.64 of its start
COLLAPSE_DROP = 0.25  # reward's fall from its best window: default ≤ 0.14; lr 1e-3 constant fell 0.52, lr 1e-2 0.56
COLLAPSE_EVAL_SE = 3.0  # held-out fall in SEs of the difference (and 10 points): lr 1e-3 constant fell 8.9
TRUNCATED = 0.2  # responses without EOS, last window: default ≤ 0.031 a step; --max-new-tokens 24 cuts all
LENGTH_RISE = 1.2  # mean length, last window over first: default 0.98-1.03; a verbose term 1.44
FLAT = 0.05  # correctness changes smaller than this are flat: default +0.05 to +0.10 between the windows
CLIPFRAC = 0.004  # tokens clipped, median: K = 1 none; tiny_clip_cov (K = 4) ≤ 0.0006; ε 0.01 clips 0.005-0.02
GRAD_NORM = 3.0  # pre-clip norm, median: default ≤ 0.32 a window (2.09 a step); 4 prompts ≤ 1.24; rewards ×40: 4.1
KL_RISE, KL_MIN = 10.0, 0.05  # k3 KL, last window over first, and at least: β 0.05, lr 2e-3 ran ×197 (no recipe: β)
MISMATCH = {"fp32": 1e-5, "bf16": 5e-3}  # mismatch/kl a token: fp32 default 0 a step (6 decimals); bf16 unmeasured
FORMAT_SHARE = 0.5  # of the zeros, the share with no answer: default ≤ 0.13 a step, ≤ 0.012 a window
EVAL_Z = 1.96  # a 95% interval: a held-out change inside it is one the eval cannot tell from noise
OTHER_CLIPS = ("gspo", "cispo", "sapo")  # their pg/clipfrac counts another clip: GSPO's (ε 3e-4) 0.25 on tiny_gspo
# PACS scores each response's whole log-ratio sum in a BCE, unclipped (its recipe's grad_clip 0): grad/norm 7-50
# a step on tiny_pacs at its lr 7.5e-5, healthy, and 20-37 in its lr-3e-4 collapse (docs/measured.md); the norm
# cannot tell the two apart, so its reward (the collapse check) is what is read
OWN_GRAD_SCALE = ("pacs",)
ALWAYS_FAILS = 0.99  # a term failing on this share of the responses fails on all of them, but for rounding
TAKEN = {"mean", "std", "zero_std_groups", "grader_failures", "format_failures", "correct"}  # reward/ keys, not terms


class RunError(ValueError):
    """A run folder that cannot be read at all: one line that says what to give instead."""


@dataclass
class Finding:
    severity: str  # one of SEVERITIES
    symptom: str
    evidence: str  # the metric, the steps, the values against the healthy range
    causes: str
    knobs: str  # the flags to turn
    section: str  # anchor in docs/run-health.md

    def line(self) -> str:
        return f"[{self.severity}] {self.symptom}: {self.evidence}"

    def block(self) -> str:
        return "\n".join([self.line(), f"  likely:  {self.causes}", f"  knobs:   {self.knobs}",
                          f"  docs:    {DOCS}#{self.section}"])


@dataclass
class Run:
    folder: Path
    train: list  # rows with a training step's metrics (reward/mean), by step
    evals: list  # rows with eval/accuracy, by step
    config: dict  # config.yaml, or {} when the folder has none
    remarks: list  # what reading met: a cut last line, no config

    def values(self, key: str, rows=None) -> list[tuple[int, float]]:
        """(step, value) of each row that logged key: a run from an older version may have none."""
        return [(r["step"], float(r[key])) for r in (self.train if rows is None else rows) if key in r]

    def cfg(self, key: str, default):
        return self.config.get(key, default)


def read_run(folder) -> Run:
    """A run folder -> its Run; a RunError for a folder that is missing, has no metrics.jsonl or an empty one."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RunError(f"{folder}: no such folder; give a run folder (the --out of train.py, runs/<algo>-<timestamp>)")
    path = folder / "metrics.jsonl"
    if not path.is_file():
        raise RunError(f"{folder}: no metrics.jsonl here; a run writes it at its first eval or step (has it started?)")
    lines = path.read_text().splitlines()
    by_step, remarks = {}, []
    for n, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            by_step[int(row["step"])] = {**by_step.get(int(row["step"]), {}), **row}  # a resume logs a step again
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            remarks.append(f"metrics.jsonl line {n} is cut short (a run killed mid-write): read the rest"
                           if n == len(lines) else f"metrics.jsonl line {n} is not a metrics row: skipped")
    if not by_step:
        raise RunError(f"{folder}: metrics.jsonl holds no rows yet; read it after the first step or eval")
    try:
        config = _yaml(folder / "config.yaml")
    except (OSError, ValueError) as e:
        config, remarks = {}, remarks + [f"config.yaml unreadable ({e}): read with the defaults' budget and batch"]
    rows = [by_step[s] for s in sorted(by_step)]
    return Run(folder, [r for r in rows if "reward/mean" in r], [r for r in rows if "eval/accuracy" in r],
               config, remarks)


def _yaml(path: Path) -> dict:
    import yaml  # config.py's own reader; only a run folder with a config.yaml needs it

    if not path.is_file():
        raise OSError("none in the folder")
    try:
        values = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ValueError(str(e).splitlines()[0]) from None
    return values if isinstance(values, dict) else {}


# ----------------------------------------------------------------------------- the windows a check reads

def window(n: int) -> int:
    """Rows a start or end window holds: a fifth of the run, 3 at least (150 steps -> 30; 12 -> 3)."""
    return max(3, n // 5)


def mean(xs) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def median(xs) -> float:
    xs = sorted(xs)
    return (xs[(len(xs) - 1) // 2] + xs[len(xs) // 2]) / 2 if xs else math.nan


def ends(run: Run, key: str, stat=mean) -> tuple[float, float, str, str] | None:
    """(start value, end value, their step spans) of a metric over the run's first and last window; None
    under 6 steps, where the two would overlap, or for a metric never logged (an older version)."""
    series = run.values(key)
    if len(series) < 6:
        return None
    w = window(len(series))
    head, tail = series[:w], series[-w:]
    return (stat(v for _, v in head), stat(v for _, v in tail), f"steps {head[0][0]}-{head[-1][0]}",
            f"steps {tail[0][0]}-{tail[-1][0]}")


def last_window(run: Run, key: str, stat=mean) -> tuple[float, str]:
    """(stat of a metric's finite values over the run's last window, "steps a-b"); (nan, "") under 3 steps
    or never logged (an older version), which no threshold exceeds."""
    series = [(s, v) for s, v in run.values(key) if math.isfinite(v)]
    if len(series) < 3:
        return math.nan, ""
    w = window(len(series))
    return stat(v for _, v in series[-w:]), f"steps {series[-w][0]}-{series[-1][0]}"


# ----------------------------------------------------------------------------- the checks, most serious first

def non_finite(run: Run) -> list[Finding]:
    keys = ("grad/norm", "loss/total", "pg/loss", "entropy/mean", "kl/k3", "reward/mean")
    bad = [(r["step"], k, r[k]) for r in run.train for k in keys if k in r and not math.isfinite(float(r[k]))]
    if not bad:
        return []
    step, key, value = bad[0]
    return [Finding("alarm", "NaN or inf in training", f"{key} = {value} at step {step} ({len(bad)} value(s) in all; "
                    f"healthy: finite at every step)",
                    "an overflow in the update: a learning rate far too high, a loss divided by a zero count, "
                    "bf16 where a sum needs fp32",
                    "--lr (÷10), --grad-clip 1.0, --precision fp32; resume from a checkpoint before that step",
                    "nan-or-inf")]


def collapse(run: Run) -> list[Finding]:
    found = []
    reward = run.values("reward/mean")
    if len(reward) >= 10:
        w = window(len(reward))
        smooth = {i: mean(v for _, v in reward[i - w + 1:i + 1]) for i in range(w - 1, len(reward) - w)}
        peak = max(smooth, key=smooth.__getitem__, default=None)  # the best window of w steps before the last
        last = mean(v for _, v in reward[-w:])
        # a small batch's reward is noisy: the fall must also be 4 standard errors of two windows' difference,
        # a step's noise read from step-to-step changes (a trend, the collapse itself, barely moves them)
        step_noise = statistics.pstdev(b - a for (_, a), (_, b) in zip(reward, reward[1:])) / math.sqrt(2)
        noise = 4 * step_noise * math.sqrt(2 / w)
        if peak is not None and smooth[peak] - last > max(COLLAPSE_DROP, noise):
            found.append(Finding(
                "alarm", "training reward collapsed after its peak",
                f"reward/mean {smooth[peak]:.3f} over steps {reward[peak - w + 1][0]}-{reward[peak][0]} (its best), "
                f"{last:.3f} over steps {reward[-w][0]}-{reward[-1][0]} (healthy: the default run never falls more "
                f"than 0.14 below its best)",
                "each update overshoots: the learning rate too high for the batch, too many optimizer steps per "
                "rollout batch (K mini-batches × μ epochs), a constant schedule",
                "--lr (e.g. ÷3), --lr-schedule linear, fewer --mini-batches or --epochs, --grad-clip", "collapse"))
    evals = [r for r in run.evals if "eval/accuracy_se" in r]
    if len(evals) >= 2:  # the best eval before the last may be the first: then the run made the model worse
        best = max(evals[:-1], key=lambda r: r["eval/accuracy"])
        last = evals[-1]
        drop = best["eval/accuracy"] - last["eval/accuracy"]
        se = math.hypot(best["eval/accuracy_se"], last["eval/accuracy_se"])
        if drop > max(COLLAPSE_EVAL_SE * se, 0.1):
            found.append(Finding(
                "alarm", "held-out accuracy collapsed after its peak",
                f"eval/accuracy {best['eval/accuracy']:.1%} at step {best['step']}, {last['eval/accuracy']:.1%} at "
                f"step {last['step']}: down {drop:.1%}, {drop / se:.1f} standard errors (healthy: within 3)",
                "the policy overshot and forgot: the learning rate too high, too many optimizer steps per rollout "
                "batch, LoRA's lr multiplier too large for a small model",
                "--lr, --lr-schedule linear, --lora-lr-scale, fewer --mini-batches; keep the checkpoint of the peak "
                "(--save-every)", "collapse"))
    if len(found) == 2:  # one collapse is one finding: the reward's, with the eval's evidence
        found[0].evidence += f"; {found.pop().evidence}"
    return found


def entropy(run: Run) -> list[Finding]:
    got = ends(run, "entropy/mean", median)
    if got is None:
        return []
    start, end, head, tail = got
    if end > ENTROPY_BLOWUP and end > 2 * start:
        extra = []
        for key, label in (("length/truncated", "truncated"), ("reward/format_failures", "format failures")):
            got = ends(run, key)
            if got:
                extra.append(f"{label} {got[0]:.2f} → {got[1]:.2f}")
        return [Finding("alarm", "entropy blew up: the policy writes gibberish",
                        f"entropy/mean {start:.3f} over {head}, {end:.3f} nats per token over {tail} (healthy: "
                        f"≤ 0.048 a step on the default run){'; ' + ', '.join(extra) if extra else ''}",
                        "a learning rate so high that an update breaks the model, a sampling temperature too high, "
                        "a negative-only or entropy-bonus objective pushing probability out",
                        "--lr (÷10), --temperature 1.0, --entropy-coef 0, --grad-clip 1.0", "entropy-blow-up")]
    if start > 0 and end < ENTROPY_COLLAPSE * start:
        return [Finding("warning", "entropy collapsed: the policy stopped exploring",
                        f"entropy/mean {start:.4f} over {head}, {end:.5f} over {tail}: {end / start:.3f} of its start "
                        f"(healthy: the default run ends at 0.55-0.64 of its start)",
                        "updates too large sharpen every token (the learning rate, K × μ optimizer steps per batch), "
                        "a clip that lets probabilities rise unbounded",
                        "--lr, --temperature (higher), --clip-high (DAPO's clip-higher), "
                        "--top-entropy-quantile 0.2, --algo clip_cov or kl_cov", "entropy-collapse")]
    return []


def no_signal(run: Run) -> list[Finding]:
    share, span = last_window(run, "reward/zero_std_groups")
    if not share > NO_SIGNAL:
        return []
    level = last_window(run, "reward/mean")[0]
    kind = ("all right: the problems are too easy" if level > 0.5 else "all wrong: the problems are too hard, or "
            "the grader never finds an answer")
    # truncation, format failures or a collapse that zero the rewards are the cause, said first; this is their echo
    explained = truncation(run) or format_failures(run) or collapse(run)
    if explained:
        kind = f"{'all right' if level > 0.5 else 'all wrong'}, an echo of: {explained[0].symptom}"
    return [Finding("warning" if explained else "alarm", "no learning signal: nearly every group scores alike",
                    f"reward/zero_std_groups {share:.2f} over {span}, reward/mean "
                    f"{level:.3f} (healthy: ≤ 0.81 a step on the default run); the groups are {kind}",
                    "a group whose G rewards are equal has advantage 0 everywhere, so the step learns nothing from "
                    "it: problems outside the model's reach, too small a group, a grader that cannot read the answers",
                    "--group-size (larger), easier or harder --data (python -m extras.pass_filter keeps the "
                    "problems of pass rate 0.1-0.9), --dynamic-sampling true", "no-learning-signal")]


def format_failures(run: Run) -> list[Finding]:
    (level, span), zeros = last_window(run, "reward/format_failures"), 1 - last_window(run, "reward/mean")[0]
    if not (level > FORMAT_SHARE and zeros >= 0.2):
        return []
    return [Finding("warning", "format failures are most of the zeros: the grader finds no answer to judge",
                    f"reward/format_failures {level:.2f} of the zero rewards over {span} "
                    f"(healthy: ≤ 0.012 over a window on the default run), and {zeros:.0%} of the responses score 0",
                    "the prompt asks for another format than the grader reads, an answer gate (--answer-after) the "
                    "model never writes, a chat template that is off, responses cut before their answer",
                    "--prompt-template, --answer-after, --chat-template; ask the grader why: "
                    + explain_command(run), "format-failures")]


def explain_command(run: Run) -> str:
    """`python -m grading.explain ...` for a logged response that scored 0 with no answer extracted."""
    task = run.cfg("data", "running_sum")
    for line in _lines(run.folder / "samples.jsonl"):
        try:
            s = json.loads(line)
        except json.JSONDecodeError:
            continue
        if s.get("reward") == 0 and s.get("extracted") is None and len(s.get("response", "")) <= 300:
            task_flag = f"--task {task} " if task in ("running_sum", "countdown") else ""
            return (f"python -m grading.explain {task_flag}--gold {shlex.quote(str(s.get('gold')))} "
                    f"--response {shlex.quote(s['response'])}")
    return "python -m grading.explain --gold GOLD --response @response.txt (a response from samples.jsonl)"


def _lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines()[-200:] if path.is_file() else []


def truncation(run: Run) -> list[Finding]:
    level, span = last_window(run, "length/truncated")
    if not level > TRUNCATED:
        return []
    budget, length = run.cfg("max_new_tokens", 80), last_window(run, "length/mean")[0]
    return [Finding("warning", "responses run out of budget: most are truncated",
                    f"length/truncated {level:.2f} over {span}, length/mean {length:.1f} "
                    f"of a budget of {budget} (healthy: ≤ 0.031 a step on the default run)",
                    "too small a budget for the task's answers, or a policy that no longer stops (a blow-up, "
                    "length hacking)",
                    "--max-new-tokens (larger); or --overlong-penalty true, --mask-truncated true, "
                    "--zero-truncated true to stop paying for cut responses", "truncation")]


def length_hacking(run: Run) -> list[Finding]:
    name = "reward/correct" if run.values("reward/correct") else "reward/mean"  # with --reward-terms: correctness
    length, correct = ends(run, "length/mean"), ends(run, name)
    if length is None or correct is None:
        return []
    (start, end, head, tail), (c0, c1, _, _) = length, correct
    if end <= LENGTH_RISE * start or c1 - c0 > FLAT:
        return []
    # correctness falling as the length grows is the reward's collapse, and this its cause
    severity = "alarm" if c0 - c1 > COLLAPSE_DROP else "warning"
    return [Finding(severity, "length hacking: responses grow while correctness does not",
                    f"length/mean {start:.1f} over {head}, {end:.1f} over {tail} (×{end / start:.2f}; healthy: "
                    f"×1.02-1.03 on the default run), {name} {c0:.3f} → {c1:.3f}",
                    "a reward term or penalty that pays for length, a loss normaliser that favours long wrong "
                    "responses (per-response mean), no penalty for running on",
                    "--reward-terms (weights), --algo dr_grpo or --loss-agg token-mean, --overlong-penalty true",
                    "length-hacking")]


# metrics whose median over the last window has a ceiling: (metric, ceiling, the algorithms it is not read for,
# symptom, healthy range, causes, knobs, section)
CEILINGS = (
    ("pg/clipfrac", CLIPFRAC, OTHER_CLIPS, "clip fraction out of range: the clip binds far more than in healthy runs",
     "0 with one optimizer step per batch, ≤ 0.0006 with tiny_clip_cov's K = 4",
     "each optimizer step moves the policy far from the one that sampled: the learning rate too high for K "
     "mini-batches × μ epochs per rollout batch, or a clip range too narrow",
     "--lr, fewer --mini-batches or --epochs, --clip-low and --clip-high (0.2 each by default)", "clip-fraction"),
    ("grad/norm", GRAD_NORM, OWN_GRAD_SCALE, "gradient norm out of range",
     "≤ 0.32 over a window on the default run (2.09 a step), ≤ 1.24 at 4 prompts a step; before --grad-clip",
     "rewards on a scale the advantage does not normalise (--adv-norm none with large rewards), the policy leaving "
     "the region the learning rate suits (a collapse on its way)",
     "--reward-terms or --reward on a 0-1 scale, --adv-norm, --lr, --grad-clip 1.0", "grad-norm"),
)


def ceilings(run: Run) -> list[Finding]:
    found = []
    for key, ceiling, not_read_for, symptom, healthy, causes, knobs, section in CEILINGS:
        if run.cfg("algo", "grpo") in not_read_for:
            continue
        level, span = last_window(run, key, median)
        if level > ceiling:
            found.append(Finding("warning", symptom, f"{key} {level:.3g} (median) over {span} (healthy: {healthy})",
                                 causes, knobs, section))
    return found


def kl_runaway(run: Run) -> list[Finding]:
    got = ends(run, "kl/k3", median)  # logged with β > 0 alone
    if not got or got[1] < max(KL_MIN, KL_RISE * got[0]):
        return []
    start, end, head, tail = got
    return [Finding("alarm" if collapse(run) else "warning", "the KL to the reference runs away",
                    f"kl/k3 {start:.4f} over {head}, {end:.4f} over {tail} with β = {run.cfg('beta', '?')} "
                    f"(healthy: a β that holds the policy stays near its start; ×{end / max(start, 1e-9):.0f} here)",
                    "β too small to hold the policy at this learning rate, or updates too large",
                    "--beta (larger), --lr (smaller), --lr-schedule linear", "kl-runaway")]


def mismatch(run: Run) -> list[Finding]:
    dtype = "bf16" if run.cfg("precision", "auto") == "bf16" or run.cfg("engine", "auto") == "vllm" else "fp32"
    level, span = last_window(run, "mismatch/kl", median)
    if not level > MISMATCH[dtype]:
        return []
    return [Finding("warning", "the sampler and the trainer disagree more than the dtype explains",
                    f"mismatch/kl {level:.2e} per token (median) over {span} "
                    f"(healthy for {dtype}: ≤ {MISMATCH[dtype]:g})",
                    "the sampler serves other weights than the trainer holds (stale or not pushed), another "
                    "logit transform, temperature or precision in the sampler",
                    "--engine hf (the reference sampler) to compare, --precision fp32, --tis-cap or --mis-cap "
                    "to correct for it", "mismatch")]


def reward_terms(run: Run) -> list[Finding]:
    """A --reward-terms term whose value never changes, or that fails on every response."""
    if not run.cfg("reward_terms", ""):
        return []
    keys = {k[7:] for r in run.train for k in r if k.startswith("reward/")}
    terms = sorted(k for k in keys if k not in TAKEN and not k.endswith("_failures"))
    batch = run.cfg("prompts_per_step", 16) * run.cfg("group_size", 8)
    found = []
    for name in terms:
        values = [v for _, v in run.values(f"reward/{name}")]
        failures = [v for _, v in run.values(f"reward/{name}_failures")]
        if len(values) < 3:
            continue
        if failures and min(failures) >= ALWAYS_FAILS * batch:
            found.append(Finding("warning", f"the reward term {name} fails on every response",
                                 f"reward/{name}_failures ≥ {min(failures):.0f} of {batch} responses at every one "
                                 f"of {len(failures)} steps (healthy: 0)",
                                 "the function raises, times out or returns something other than a finite number on "
                                 "these responses: it scores 0 each time, so it adds nothing to any advantage",
                                 f"--reward-terms (fix or drop {name}); run it on a logged response from samples.jsonl",
                                 "reward-terms"))
        elif max(values) - min(values) < 1e-9:
            found.append(Finding("warning", f"the reward term {name} is constant",
                                 f"reward/{name} = {values[0]:g} at every one of {len(values)} steps",
                                 "a term every response scores alike (a format bonus on a model that always formats) "
                                 "moves no advantage: it changes no group's ranking",
                                 f"--reward-terms (drop {name} or make it discriminate)", "reward-terms"))
    return found


def eval_cannot_tell(run: Run) -> list[Finding]:
    evals, reward = [r for r in run.evals if "eval/accuracy_se" in r], ends(run, "reward/mean")
    if len(evals) < 2 or reward is None:
        return []
    start, end, head, tail = reward
    first, last = evals[0], evals[-1]
    change = last["eval/accuracy"] - first["eval/accuracy"]
    band = EVAL_Z * math.hypot(first["eval/accuracy_se"], last["eval/accuracy_se"])
    if end - start <= FLAT or abs(change) >= band:
        return []
    return [Finding("note", "training reward rose, and the held-out eval cannot yet tell",
                    f"reward/mean {start:.3f} over {head} → {end:.3f} over {tail}; eval/accuracy "
                    f"{first['eval/accuracy']:.1%} at step {first['step']} → {last['eval/accuracy']:.1%} at step "
                    f"{last['step']}, a change of {change:+.1%} inside its 95% interval ±{band:.1%}",
                    "too few held-out problems for the change (the standard error falls as 1/√problems), or "
                    "training reward that does not carry over (memorised prompts, a reward the eval does not count)",
                    "--eval-problems (4× the problems halves the interval), --eval-samples, more --max-steps",
                    "eval-cannot-tell")]


# a cause before its echoes: a blow-up truncates and fails the format, length hacking costs correctness, a KL
# running away is the policy leaving, a budget too small cuts answers off, answers the grader cannot find leave
# every group at 0
CHECKS = (non_finite, entropy, length_hacking, kl_runaway, collapse, truncation, format_failures, no_signal, ceilings,
          mismatch, reward_terms, eval_cannot_tell)


def findings(run: Run) -> list[Finding]:
    """Every check's findings, most serious first (then in CHECKS' order: a cause before its echoes)."""
    found = [f for check in CHECKS for f in check(run)]
    return sorted(found, key=lambda f: SEVERITIES.index(f.severity))


# ----------------------------------------------------------------------------- what is said

def summary(run: Run, live: bool = False) -> str:
    """The run in a few numbers: steps read, reward start → end, held-out accuracy first → last with its SE.
    live: said by the run itself, which is still going by definition."""
    parts = [f"{len(run.train)} steps read"]
    if run.train and run.train[-1]["step"] < run.cfg("max_steps", 0) and not live:
        parts[0] += f" (of {run.cfg('max_steps', 0)}: still going or stopped)"
    reward = ends(run, "reward/mean")
    if reward:
        parts.append(f"reward {reward[0]:.3f} → {reward[1]:.3f}")
    if len(run.evals) >= 2:
        first, last = run.evals[0], run.evals[-1]
        se = f" ± {last['eval/accuracy_se']:.1%}" if "eval/accuracy_se" in last else ""
        parts.append(f"held-out accuracy {first['eval/accuracy']:.1%} → {last['eval/accuracy']:.1%}{se}")
    elif not run.evals:
        parts.append("no eval logged")
    return ", ".join(parts)


def report(run: Run) -> str:
    """What `python -m extras.health RUN` prints for one run: a healthy one in one line, else each finding."""
    found = findings(run)
    serious = [f for f in found if f.severity != "note"]
    head = f"{run.folder}: " + (f"{len(serious)} finding(s) — {summary(run)}" if serious
                                else f"healthy — {summary(run)}")
    body = [f.block() for f in serious] + [f.line() for f in found if f.severity == "note"]
    return "\n".join([head, *body, *(f"(read: {r})" for r in run.remarks)])


def verdict(out: Path, metrics: dict, tb=None) -> str:
    """train.py's line at an eval: the run so far (metrics.jsonl, and metrics: this step's row, its
    training metrics and this eval's, logged after the eval) read as `python -m extras.health` reads it;
    the whole report as TensorBoard text (tb: the Logger's SummaryWriter or None)."""
    try:
        run = read_run(out)
    except RunError:  # the eval before step 1: nothing written yet
        return f"health at step {metrics['step']}: nothing to read yet"
    run.train = [r for r in run.train if r["step"] != metrics["step"]] + [metrics] * ("reward/mean" in metrics)
    run.evals = [r for r in run.evals if r["step"] != metrics["step"]] + [metrics]
    found = [f for f in findings(run) if f.severity != "note"]
    at = f"health at {'the end, ' if metrics['step'] == run.cfg('max_steps', 0) else ''}step {metrics['step']}"
    if tb is not None:
        tb.add_text("health", report(run).replace("\n", "  \n"), metrics["step"])
    if not found:
        return f"{at}: healthy — {summary(run, live=True)}"
    more = f" (+{len(found) - 1} more)" if len(found) > 1 else ""
    return f"{at}: {found[0].line()}{more}; python -m extras.health {out}"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m extras.health", description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", metavar="RUN", help="run folders, each with its metrics.jsonl")
    args = parser.parse_args(argv)
    failed = False
    for folder in args.runs:
        try:
            print(report(read_run(folder)), flush=True)
        except RunError as e:
            print(f"error: {e}", file=sys.stderr)
            failed = True
        except BrokenPipeError:  # `... | head` has read what it wanted: stop quietly, as cat does
            sys.stdout = None
            sys.exit(0)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
