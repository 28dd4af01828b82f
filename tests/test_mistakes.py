"""A user's mistake stops train.py or eval.py with exit status 1 and one `error:` line naming the
flag or file and the fix: no traceback, no model loaded, nothing written (no run folder, no lock,
no output folder); under torchrun on 2 ranks the same, said once."""
import json
from pathlib import Path

import pytest

import config
import eval as evaluation
import pair
import train



def shipped_copy(tmp_path: Path, name: str) -> Path:
    """A copy of the shipped model's folder, to damage."""
    folder = tmp_path / name
    folder.mkdir()
    for f in Path(config.DEFAULT_MODEL).iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    return folder


def truncated_model(tmp_path: Path) -> Path:
    """The shipped model with its weights cut in half, as an interrupted copy leaves them."""
    folder = shipped_copy(tmp_path, "cut-model")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:weights.stat().st_size // 2])
    return folder


def long_prompts(tmp_path: Path) -> Path:
    """Every prompt longer than the shipped model's 512 positions (one token per character)."""
    data = tmp_path / "long.jsonl"
    data.write_text("".join(json.dumps({"prompt": "1+" * 300 + str(i), "answer": "1"}) + "\n" for i in range(3)))
    return data


def a_file(tmp_path: Path) -> Path:
    (tmp_path / "a_file").write_text("")
    return tmp_path / "a_file"


def flags(*given):
    """A case's arguments that need no file: given flags and the output folder."""
    return lambda tmp, out: ["--out", str(out), *given]


# (program, its arguments given tmp_path and the output folder, what the error line says)
CASES = {
    "out under a file": (train, lambda tmp, out: ["--out", str(a_file(tmp) / "run")],
                         "a_file is a file, not a folder; choose another --out"),
    "eval, truncated weights": (evaluation, lambda tmp, out: ["--model", str(truncated_model(tmp)), "--out", str(out)],
                                "model.safetensors is truncated or corrupt"),
    "a group of one": (train, lambda tmp, out: ["--out", str(out), "--group-size", "1"],
                       "group_size=1: the advantage of --algo grpo compares each response with the rest of its group"),
    "a group of one, leave-one-out": (train, lambda tmp, out: ["--out", str(out), "--algo", "rloo", "--group-size", "1"],
                                      "group_size=1: the advantage of --algo rloo"),
    "uneven mini-batches": (train, lambda tmp, out: ["--out", str(out), "--prompts-per-step", "4", "--mini-batches", "3"],
                            "mini_batches=3 must divide prompts_per_step=4"),
    "a flag's value": (train, lambda tmp, out: ["--out", str(out), "--lr", "abc"],
                       "argument --lr: invalid float value: 'abc'"),
    "eval, a flag's value": (evaluation, lambda tmp, out: ["--out", str(out), "-n", "four"],
                             "argument -n/--samples: invalid int value: 'four'"),
    "eval, prompts beyond the context": (
        evaluation, lambda tmp, out: ["--data", str(long_prompts(tmp)), "--out", str(out)],
        "3 prompt(s) do not fit the model's context of 512 tokens with 80 new tokens"),
    # issue 74: inputs that ran silently, ended in a traceback, or named another flag
    **{name: (program, given if callable(given) else flags(*given), says) for name, (program, given, says) in {
        "an infinite knob": (train, ["--algo", "opd", "--teacher", config.DEFAULT_MODEL, "--opd-alpha", "inf"],
                             "opd_alpha=inf: must be a finite number"),
        "an infinite field": (train, ["--entropy-coef", "inf"], "entropy_coef=inf: must be a finite number"),
        "every term weighs 0": (train, ["--reward-terms", "correct=0"], "--reward-terms correct=0: every weight is 0"),
        "an empty system prompt file": (
            train, lambda tmp, out: ["--out", str(out), "--system-prompt", f"@{written(tmp, 'empty.txt', b'  ')}"],
            "empty.txt is empty; write the system prompt in it, or drop --system-prompt"),
        "a system prompt file not UTF-8": (
            train, lambda tmp, out: ["--out", str(out), "--system-prompt",
                                     f"@{written(tmp, 'latin.txt', 'Réponds'.encode('latin-1'))}"],
            "latin.txt is not UTF-8 text (invalid continuation byte at byte 1)"),
        # on a file of 64 rows: the task's own 20,500 prompts would each be tokenized, seconds for the same line
        "a system prompt beyond the context": (train, ["--system-prompt", "x" * 600, "--data", "examples/sums.jsonl",
                                                       "--eval-every", "0"],
                                               "with its chat turns before it (--system-prompt's or the data row's)"),
        "eval, no k": (evaluation, ["--k", ""], "eval_k is empty (--eval-k, eval.py's --k)"),
        "the template's own kwargs": (train, ["--chat-template-kwargs", '{"tokenize": true}'],
                                      "tokenize the project passes itself"),
        "eval, the template's own kwargs": (evaluation, ["--chat-template-kwargs",
                                                         '{"add_generation_prompt": false, "tools": []}'],
                                            "add_generation_prompt, tools the project passes itself"),
        "a teacher with fewer rows": (
            train, lambda tmp, out: ["--out", str(out), "--algo", "opd", "--teacher", str(narrow_teacher(tmp))],
            "narrow-teacher: its embedding has 40 rows, the student's"),
        "eval, an unknown engine": (evaluation, ["--engine", "nosuch"], "engine='nosuch': choose one of hf, auto, fast"),
        "a term's missing file": (train, ["--reward-terms", "correct,nowhere.py:f"],
                                  "--reward-terms nowhere.py:f: no such file nowhere.py"),
        "a term's missing function": (train, ["--reward-terms", "correct,examples/brevity.py:f"],
                                      "--reward-terms examples/brevity.py:f: examples/brevity.py has no top-level "
                                      "function f"),
        "a term's signature": (
            train, lambda tmp, out: ["--out", str(out), "--reward-terms",
                                     f"correct,{written(tmp, 'sig.py', b'def f(text):  return 1')}:f"],
            "sig.py:f: f(text) must take (prompt, response, answer)"),
        "a term's failing import": (
            train, lambda tmp, out: ["--out", str(out), "--reward-terms",
                                     f"correct,{written(tmp, 'imp.py', IMPORT_FAILS)}:f"],
            "imp.py:f: its worker did not start: importing"),
    }.items()},
}
IMPORT_FAILS = b"import not_a_module_anywhere\ndef f(prompt, response, answer):\n    return 1\n"


def written(tmp_path: Path, name: str, data: bytes) -> Path:
    (tmp_path / name).write_bytes(data)
    return tmp_path / name


def narrow_teacher(tmp_path: Path) -> Path:
    """The shipped model's folder with vocab_size 40 in its config: its tokenizer is the student's, its
    embedding (as the config says, which is what is read before any weight) smaller."""
    folder = shipped_copy(tmp_path, "narrow-teacher")
    hf = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**hf, "vocab_size": 40}))
    return folder


@pytest.mark.parametrize("case", CASES)
def test_one_named_error_and_nothing_written(case, tmp_path):
    program, args, says = CASES[case]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        program.main(args(tmp_path, out))
    message = str(stop.value)
    assert message.startswith("error: ") and says in message and "\n" not in message
    assert not out.exists() and not (tmp_path / "a_file" / "run").exists()


def test_a_group_of_one_trains_where_no_group_baseline_is_needed():
    """psr, nsr, w_reinforce and reinforce_pp (a group of one keeps its score, docs/math.md §7), and opd (its
    advantage is the teacher's per token, §10) take G = 1; every algorithm with a group baseline refuses it (the
    cases above), and opd too once opd_alpha adds the group's (tests/test_opd.py)."""
    for algo in config.without_group_baseline():
        if algo == "sft":  # no groups at all: tests/test_sft.py checks what it refuses
            continue
        teacher = ["--teacher", config.DEFAULT_MODEL] if algo == "opd" else []
        config.validate(config.parse_config(["--algo", algo, "--group-size", "1", *teacher]), world=1)
    assert sorted(config.without_group_baseline()) == ["nsr", "opd", "psr", "reinforce_pp", "sft", "w_reinforce"]


# Under torchrun each way an error leaves main(): argparse (a flag's value), a CheckpointError
# (the run folder), and eval.py's own main; every config rule (validate) takes the first way's
# path, which test_train.test_torchrun_config_error_is_said_once_and_nothing_hangs runs too.
ON_TWO_RANKS = ["a flag's value", "out under a file", "eval, truncated weights"]


def _register(case: str) -> None:
    name = f"mistake-{ON_TWO_RANKS.index(case)}"
    program, args, _ = CASES[case]

    def flags(root):
        (root / f"{name}-files").mkdir()
        return args(root / f"{name}-files", root / name)
    pair.register(name, flags, program=program.__name__)


for _case in ON_TWO_RANKS:
    _register(_case)


@pytest.mark.parametrize("case", ON_TWO_RANKS)
def test_under_torchrun_said_once(case, two_rank_runs):
    """2 ranks (the session's shared launch): each stops with sys.exit, rank 0 with the error line
    (the interpreter prints it and exits with status 1), the other with status 1 alone, so the line
    is said once; nothing written."""
    name = f"mistake-{ON_TWO_RANKS.index(case)}"
    said = pair.exits(two_rank_runs, name)
    assert said.keys() == {0, 1} and said[1] == "1", said
    assert said[0].startswith("error: ") and CASES[case][2] in said[0] and "\n" not in said[0], said
    assert not (two_rank_runs / name).exists() and not (two_rank_runs / f"{name}-files" / "a_file" / "run").exists()


def test_a_yaml_date_in_the_template_kwargs_is_its_text(tmp_path):
    """date_string: 2026-12-02 (a Qwen3 template kwarg) is a date to YAML: the template gets the text as written."""
    (tmp_path / "c.yaml").write_text("chat_template_kwargs:\n  date_string: 2026-12-02\n")
    assert config.parse_config(["--config", str(tmp_path / "c.yaml")]).chat_template_kwargs == {
        "date_string": "2026-12-02"}


def test_a_run_that_saved_no_checkpoint_says_how_to_start_again_in_its_folder(tmp_path):
    """A run stopped before its first save leaves config.yaml and metrics.jsonl: the refusal names --resume auto,
    and that command does start afresh there."""
    import checkpoint

    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    with pytest.raises(checkpoint.CheckpointError, match=f"start it afresh there with --resume auto --out {run}"):
        checkpoint.run_folder("", str(run), tmp_path / "default")
    assert checkpoint.run_folder("auto", str(run), tmp_path / "default") == (run, None)
