"""A fork in minutes (README "Fork it"): a new algorithm with a knob is one file plus one registry
line, a reward or a task is one file of yours; knobs an algorithm does not read are named errors;
a plug-in reward runs bounded; every citation of the math resolves inside the repository.

The 2-rank launches run train.py for 2 steps: the toy algorithm in a copy of the repository that
differs from this one by the new file and the registry line; the reward and task examples through
the session's shared launch (tests/pair.py), one process group for all of them.
"""
import difflib
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import algos
import config
import pair
from helpers import metrics, torchrun
import train
from grading.pool import RewardFunction
from rewards import DataError, Problem, Verdict
from data import make_task

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SMALL = ["--max-steps", "2", "--prompts-per-step", "4", "--group-size", "4", "--max-new-tokens", "80",
         "--eval-every", "0"]


def load_example(name: str):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- a new algorithm: one file, one line

def fork_with_toy(dest: Path) -> list[str]:
    """A copy of what train.py runs (the top-level modules, algos/, the shipped model by link) with
    examples/toy_algo.py as algos/toy.py and its line added to MODULES. Returns the diff's lines."""
    dest.mkdir()
    for path in ROOT.glob("*.py"):
        shutil.copy(path, dest)
    shutil.copytree(ROOT / "algos", dest / "algos", ignore=shutil.ignore_patterns("__pycache__"))
    os.symlink(ROOT / "assets", dest / "assets")
    shutil.copy(EXAMPLES / "toy_algo.py", dest / "algos" / "toy.py")
    registry = dest / "algos" / "__init__.py"
    text = registry.read_text()
    last = '    "opd": ("opd",),  # on-policy distillation, docs/math.md §10\n'  # the toy's line follows it
    registry.write_text(text.replace(last, last + '    "toy": ("toy",),\n'))
    changed = []
    for path in [*ROOT.glob("*.py"), *(ROOT / "algos").glob("*.py")]:
        mine = (dest / path.relative_to(ROOT)).read_text().splitlines()
        changed += [line for line in difflib.unified_diff(path.read_text().splitlines(), mine, lineterm="", n=0)
                    if line[:1] in "+-" and line[:3] not in ("+++", "---")]
    return changed


@pytest.mark.slow
def test_a_toy_algorithm_with_a_knob_is_one_file_and_one_registry_line(tmp_path):
    fork = tmp_path / "fork"
    assert fork_with_toy(fork) == ['+    "toy": ("toy",),']  # config.py, train.py and the rest untouched
    r = torchrun("train.py", "--algo", "toy", "--toy-cap", "0.3", "--out", str(tmp_path / "run"), *SMALL, cwd=fork)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = metrics(tmp_path / "run")
    assert [x["step"] for x in lines] == [1, 2]
    for x in lines:
        assert x["update/optimizer_steps"] == 1 and math.isfinite(x["loss/total"])
        assert x["grad/norm"] > 0 or x["reward/zero_std_groups"] == 1
    assert "toy_cap: 0.3" in (tmp_path / "run" / "config.yaml").read_text()
    # the knob is in --help, and set for an algorithm that does not read it, a named error: the two
    # processes at once, one a core (each is seconds of imports)
    helped, said = [subprocess.Popen([sys.executable, "train.py", *args], cwd=fork, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True) for args in (["--help"], ["--toy-cap", "0.3"])]
    help_text = " ".join(helped.communicate(timeout=120)[0].split())  # argparse wraps long lines
    assert "--toy-cap" in help_text and "toy: the advantage is clipped to [−cap, cap] [toy]" in help_text
    error = said.communicate(timeout=120)[1]
    assert said.returncode == 1 and error.startswith(
        "error: toy_cap=0.3: --algo grpo does not read toy_cap; leave it at its default 0.5, or choose an "
        "algorithm that reads it (toy)"), error[-2000:]


def test_toy_worked_example():
    """R = [1, 0, 0, 1], cap 0.3, 3 tokens each, on-policy: A = ±0.3, loss 0, ∂loss/∂logp = −A/12."""
    toy = load_example("toy_algo")
    cfg = SimpleNamespace(toy_cap=0.3, beta=0.0)
    adv = toy.advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0]]), cfg).flatten()
    assert adv.tolist() == pytest.approx([0.3, -0.3, -0.3, 0.3])
    logp = torch.tensor([[-0.5, -1.2, -0.3], [-0.9, -0.4, -2.0], [-1.1, -0.7, -0.2], [-0.2, -1.5, -0.6]],
                        requires_grad=True)
    mb = algos.LossInputs(logp=logp, old_logp=logp.detach(), mask=torch.ones(4, 3), adv=adv)
    loss, _ = toy.loss(mb, cfg, {"seqs": 4, "tokens": 12, "max_len": 3})
    loss.backward()
    assert loss.item() == pytest.approx(0.0, abs=1e-7)
    assert torch.allclose(logp.grad, -adv[:, None].expand(4, 3) / 12)


# ---------------------------------------------------------------- knobs: owned, learned, refused

@pytest.mark.parametrize("flags,message", [
    (["--algo", "rover", "--beta", "0.1"], "beta=0.1: --algo rover does not read beta (its loss has no KL term, so "
                                           "it loads no reference model)"),
    (["--algo", "gspo", "--dual-clip", "3"], "dual_clip=3.0: --algo gspo does not read dual_clip"),
    (["--algo", "sapo", "--clip-high", "0.3"], "clip_high=0.3: --algo sapo does not read clip_high (its smooth gate"),
    (["--algo", "kl_cov", "--clip-low", "0.1"], "clip_low=0.1: --algo kl_cov does not read clip_low"),
    (["--algo", "pacs", "--beta", "0.1"], "beta=0.1: --algo pacs does not read beta"),
    (["--algo", "nsr", "--adv-norm", "batch"], "adv_norm='batch': --algo nsr does not read adv_norm"),
    (["--algo", "rover", "--tis-cap", "2"], "tis_cap=2.0: --algo rover does not read tis_cap"),
    # a knob of another file: no field of grpo's run config, so the whole registry's names it
    (["--rover-temp", "0.5"], "rover_temp=0.5: --algo grpo does not read rover_temp; leave it at its default 1.0, "
                              "or choose an algorithm that reads it (rover)"),
])
def test_a_knob_the_algorithm_does_not_read_is_a_named_error_that_loads_nothing(flags, message, tmp_path, monkeypatch):
    def no_loading(*args, **kwargs):
        raise AssertionError("a model was loaded")
    monkeypatch.setattr(train, "load_model", no_loading)
    monkeypatch.setattr(train, "check_model_folder", no_loading)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stopped:
        train.main([*flags, "--out", str(out)])
    assert str(stopped.value).startswith("error: " + message), stopped.value
    assert not out.exists()


def test_yaml_and_presets_follow_the_same_rule(tmp_path):
    yaml = tmp_path / "x.yaml"
    yaml.write_text("algo: rover\nrover_temp: 0.5\nbeta: 0.1\n")
    with pytest.raises(DataError, match="beta=0.1: --algo rover does not read beta"):
        config.validate(config.parse_config(["--config", str(yaml)]), 1)
    yaml.write_text("algo: rover\nrover_temp: 0.5\n")
    assert config.parse_config(["--config", str(yaml)]).rover_temp == 0.5
    yaml.write_text("kl_cov_ratio: 0.5\n")
    with pytest.raises(DataError, match=r"kl_cov_ratio=0.5: --algo grpo does not read kl_cov_ratio; .* \(kl_cov\)"):
        config.validate(config.parse_config(["--config", str(yaml)]), 1)
    for name, algo in algos.ALGORITHMS.items():  # no preset sets a knob its algorithm does not read,
        reads = {k.name for k in algo.knobs}  # and each reason for refusing one names a knob it does not
        assert set(algo.preset) & set(algos.KNOBS) <= reads and set(algo.refuses) <= set(algos.KNOBS) - reads, name


@pytest.mark.slow
def test_a_run_imports_the_file_of_its_algorithm_alone():
    """parse_config and validate of --algo rover load algos/rover.py and the shared pieces, no other
    algorithm's file; its config holds the shared knobs and rover's own, and a default run's is grpo's and the
    teacher, which the trainer loads (train.models) and --algo grpo refuses."""
    probe = ("import sys, config; cfg = config.parse_config(['--algo', 'rover', '--rover-temp', '0.5']); "
             "config.validate(cfg, 1); "
             "print(sorted(m for m in sys.modules if m.startswith('algos')), cfg.rover_temp, cfg.beta, "
             "hasattr(cfg, 'clip_cov_ratio'))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["['algos',", "'algos.base',", "'algos.policy_gradient',", "'algos.rover']", "0.5", "0.0",
                           "False"]
    assert set(config.run_config("grpo").KNOBS) == {k.name for k in algos.get("grpo").knobs} | {"teacher"}


def test_modules_names_what_each_file_defines(monkeypatch):
    """A MODULES line that lists a name its file does not define is a named error, not a silent miss."""
    monkeypatch.setitem(algos.MODULES, "rover", ("rover", "rover2"))
    algos._registry.cache_clear()
    try:
        with pytest.raises(ValueError, match="rover.py defines rover; MODULES says rover, rover2"):
            algos._registry()
    finally:
        monkeypatch.undo()
        algos._registry.cache_clear()
    assert list(algos.ALGORITHMS) == [name for names in algos.MODULES.values() for name in names]


def test_every_knob_is_a_field_flag_and_yaml_key_with_its_readers_in_help(capsys):
    with pytest.raises(SystemExit):
        config.parse_config(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())  # argparse wraps long lines
    for name, knob in algos.KNOBS.items():
        assert getattr(config.Config(), name) == knob.default
        assert "--" + name.replace("_", "-") in help_text
    assert config._help("dual_clip").endswith("[grpo, dapo, dr_grpo, lite_ppo, rloo, maxrl, psr, nsr, w_reinforce, "
                                              "delethink, reinforce_pp, gdpo, opd, opsm]")
    assert config.readers("rover_temp") == ["rover"]


@pytest.mark.parametrize("flags,message", [
    (["--grade-workers", "0"], "grade_workers=0: must be ≥ 1 (grading worker processes per rank"),
    (["--grade-timeout", "0"], "grade_timeout=0.0: must be > 0 (seconds per grading"),
    (["--eval-top-p", "1.5"], "eval_top_p=1.5: must be > 0 and ≤ 1 (nucleus sampling at eval"),
    (["--engine", "turbo"], "engine='turbo': choose one of hf, auto, fast, vllm (who generates"),
    (["--algo", "rover", "--rover-temp", "0"], "rover_temp=0.0: must be > 0 (ρ: Q = ρ · (logp − logp_old))"),
    (["--dual-clip", "0.5"], "dual_clip=0.5: must be > 1 (or 0.0: off)"),
    (["--algo", "clip_cov", "--clip-cov-lb", "6"], "clip_cov_lb (6.0) must be < clip_cov_ub (5.0)"),
])
def test_one_check_one_message_per_field(flags, message):
    with pytest.raises(DataError) as refused:
        config.validate(config.parse_config(flags), 1)
    assert str(refused.value).startswith(message), refused.value
    assert str(refused.value).count("must be") + str(refused.value).count("choose one of") <= 1


# ---------------------------------------------------------------- rewards and tasks plug in

HOSTILE = '''
import os, time
def reward(prompt, response, answer):
    """What the response asks for: a hostile verifier's every way to fail."""
    print("a stray print must not reach the protocol")
    if "raise" in response:
        raise RuntimeError("verifier bug")
    if "hang" in response:
        time.sleep(3600)
    if "string" in response:
        return "1"
    if "nan" in response:
        return float("nan")
    if "exit" in response:
        os._exit(3)
    if "pair" in response:
        return 1.0, "42"  # a reward and the answer maj@n votes on
    return 0.75
'''


@pytest.mark.slow
def test_a_reward_that_raises_hangs_or_returns_a_string_scores_zero_counted(tmp_path):
    path = tmp_path / "hostile.py"
    path.write_text(HOSTILE)
    grader = RewardFunction(f"{path}:reward", timeout=1.0, workers=2)
    p = Problem("Add 1+2", "3")
    try:
        start = time.monotonic()
        verdicts = grader.grade_items([(p, r) for r in ("raise", "hang", "string", "nan", "exit", "fine", "pair")])
        seconds = time.monotonic() - start
        # a failure says why: the exception, or the value returned; a worker that died, only "error"
        assert verdicts == [Verdict(0.0, None, "error: RuntimeError: verifier bug"), Verdict(0.0, None, "timeout"),
                            Verdict(0.0, None, "error: returned '1'"), Verdict(0.0, None, "error: returned nan"),
                            Verdict(0.0, None, "error"), Verdict(0.75), Verdict(1.0, "42")]
        assert seconds < 5.0  # the hang is cut at the 1 s timeout
        assert grader.grade_one(p, "fine again") == Verdict(0.75)  # killed workers were restarted
    finally:
        grader.close()


def test_the_batch_form_and_its_failures(tmp_path):
    rewards = load_example("reward_number")
    assert rewards.closeness("Add 90+5", "<answer>100</answer>", "95") == 0.5
    grader = RewardFunction(f"{EXAMPLES / 'reward_number.py'}:closeness_batch", timeout=2.0)
    p = Problem("Add 2+3", "5")
    try:
        assert grader.batch and len(grader.graders) == 1
        got = grader.grade_items([(p, "<answer>5</answer>"), (p, "<answer>6</answer>"), (p, "no")])
        assert [v.reward for v in got] == [1.0, 0.0, 0.0] and not any(v.failure for v in got)
    finally:
        grader.close()
    path = tmp_path / "short.py"
    path.write_text("def r(prompts, responses, answers):\n    return [1.0]\n")  # one score for two rows
    grader = RewardFunction(f"{path}:r", timeout=2.0)
    try:
        assert grader.grade_items([(p, "a"), (p, "b")]) == [
            Verdict(0.0, None, "error: returned 1 value(s) for 2 response(s)")] * 2
    finally:
        grader.close()


@pytest.mark.parametrize("source,spec,message", [
    ("", "{dir}/missing.py:r", "no such file"),
    ("def other(prompt, response, answer):\n    return 1\n", "{dir}/reward.py:r", "has no top-level function r"),
    ("def r(text):\n    return 1\n", "{dir}/reward.py:r", r"r\(text\) must take \(prompt, response, answer\)"),
    ("def r(prompt, response, answer)\n", "{dir}/reward.py:r", "is not valid Python"),
    ("import not_a_module_anywhere\ndef r(prompt, response, answer):\n    return 1\n", "{dir}/reward.py:r",
     "its worker did not start: importing .* failed: ModuleNotFoundError"),
    ("def r(prompt, response, answer):\n    return 1\n", "{dir}/reward.py", "give path/to/file.py:function"),
])
def test_a_bad_reward_file_stops_before_any_model_loads(source, spec, message, tmp_path):
    (tmp_path / "reward.py").write_text(source)
    data = tmp_path / "rows.jsonl"
    data.write_text(json.dumps({"prompt": "Add 1+2", "answer": "3"}) + "\n")
    with pytest.raises(DataError, match=message):
        make_task(str(data), reward=spec.format(dir=tmp_path))


def test_a_task_of_your_own_gets_seeded_splits_and_the_rules_of_a_task():
    task = make_task(f"{EXAMPLES / 'task_small_sums.py'}:SmallSums")
    train_split, heldout = task.splits()
    assert len(heldout) == 500 and not {p.prompt for p in heldout} & {p.prompt for p in train_split}
    assert task.splits()[1] == heldout
    assert task.grade(heldout[0], f"<answer>{heldout[0].answer}</answer>").reward == 1.0
    for flags, message in [(["--eval-data", "x.jsonl"], "is a task of its own"),
                           (["--reward", "x.py:f"], "--reward grades the rows of a data file")]:
        cfg = config.parse_config(["--data", "examples/task_small_sums.py:SmallSums", *flags])
        with pytest.raises(DataError, match=message):
            config.validate(cfg, 1)
    with pytest.raises(DataError, match="defines no class Nope that subclasses tasks.Task"):
        make_task(f"{EXAMPLES / 'task_small_sums.py'}:Nope")


pair.register("fork-closeness", ["--data", "examples/sums.jsonl", "--reward", "examples/reward_number.py:closeness",
                                  *SMALL])


def _hostile_run(root):
    """HOSTILE, made to raise or hang on 2/3 of the responses, as a --reward."""
    (root / "hostile.py").write_text(HOSTILE.replace('if "raise" in response', 'if len(response) % 3 == 0')
                                     .replace('if "hang" in response', 'if len(response) % 3 == 1'))
    return ["--data", "examples/sums.jsonl", "--reward", f"{root}/hostile.py:reward", "--grade-timeout", "1", *SMALL]


pair.register("fork-hostile", _hostile_run)
pair.register("fork-task", ["--data", "examples/task_small_sums.py:SmallSums", *SMALL])
pair.register("fork-env", ["--env", "examples/env_retry.py:Retry", "--max-turns", "3", *SMALL])


def test_reward_and_task_examples_train_two_steps_on_two_ranks(two_rank_runs):
    closeness, hostile_run, task = (metrics(pair.folder(two_rank_runs, f"fork-{name}"))
                                    for name in ("closeness", "hostile", "task"))
    for lines in (closeness, hostile_run, task):
        assert [x["step"] for x in lines] == [1, 2] and all(math.isfinite(x["loss/total"]) for x in lines)
    assert all(x["reward/grader_failures"] == 0 for x in closeness + task)
    # responses of length 0 or 1 mod 3 raise or hang: about 2/3 of 16 fail each step, and count
    failures = [x["reward/grader_failures"] for x in hostile_run]
    assert all(n >= 4 for n in failures), failures


def test_an_environment_of_your_own_trains_two_steps_on_two_ranks(two_rank_runs):
    """examples/env_retry.py: a wrong answer is told so and the model tries again, so some traces
    take several turns; a right one at attempt k scores 1/k, which the task's 0/1 grade never gives."""
    rows = metrics(pair.folder(two_rank_runs, "fork-env"))
    assert [x["step"] for x in rows] == [1, 2] and all(math.isfinite(x["loss/total"]) for x in rows)
    assert all(x["env/failures"] == 0 for x in rows) and max(x["turns/mean"] for x in rows) > 1
    samples = [json.loads(line) for line in (pair.folder(two_rank_runs, "fork-env") / "samples.jsonl").open()]
    assert any(s["reward"] not in (0.0, 1.0) or "<|tool|>Wrong, try again." in s["transcript"] for s in samples)


# ---------------------------------------------------------------- the math lives in the repository

STALE = r"SPEC(?:\.md)? ?§\d+|\.\./" + "shared"  # the contract outside the repository, as code used to cite it


def test_every_citation_of_the_math_resolves_inside_the_repository():
    sections = set(re.findall(r"^## (\d+)\. ", (ROOT / "docs" / "math.md").read_text(), flags=re.M))
    assert sections == {str(n) for n in range(13)}
    cited, stale = set(), []
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text()
        cited |= {(rel, n) for n in re.findall(r"docs/math\.md §(\d+)", text)}
        stale += [f"{rel}: {m}" for m in re.findall(STALE, text)]
    assert not stale, stale
    assert cited and all(n in sections for _, n in cited), sorted(cited)
    readme = (ROOT / "README.md").read_text()
    assert not re.findall(STALE, readme) and "docs/math.md" in readme


def test_the_docs_name_every_knob():
    math_md = (ROOT / "docs" / "math.md").read_text()
    assert [k for k in algos.KNOBS if f"`{k}`" not in math_md] == []


def test_the_fork_it_table_is_measured():
    """Each row's line count is its example's (the algorithm's "+ 1" is the registry line that
    test_a_toy_algorithm_with_a_knob_is_one_file_and_one_registry_line finds to be the whole diff)."""
    section = (ROOT / "README.md").read_text().split("\n## Fork it\n")[1].split("\n## ")[0]
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")]
                                          for line in section.splitlines() if line.startswith("| a new"))}

    def lines(name):
        return len((EXAMPLES / name).read_text().splitlines())

    assert rows["a new algorithm with its own knob"][2] == f"{lines('toy_algo.py')} + 1"
    assert rows["a new reward"][2] == str(lines("reward_number.py"))
    assert rows["a new task"][2] == str(lines("task_small_sums.py"))
    assert rows["a new environment (multi-turn, tools)"][2] == str(lines("env_retry.py"))
