"""The prompt, whole: a system prompt, chat-template keyword arguments and a data row's own chat reach the
model as apply_chat_template renders them, in training and in eval; and the pass-rate filter of data files."""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest
from transformers import AutoTokenizer

import eval as evaluation
import rollout
import train
from config import parse_config, validate
from extras import pass_filter
from helpers import run_main
from rewards import Problem
from rollout import encode_prompts, warn_ignored_kwargs

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
# the tiny model's template, plus Qwen3's switch: enable_thinking false writes an empty thinking block
THINKING = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{% if m['role'] == 'assistant' %}<eos>"
            "{% endif %}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% if enable_thinking is defined and "
            "not enable_thinking %}<think></think>{% endif %}{% endif %}")


@pytest.fixture
def thinking_model(tmp_path) -> str:
    """The shipped tiny model with a chat template that branches on enable_thinking."""
    folder = tmp_path / "thinking"
    shutil.copytree(ROOT / "assets" / "tiny-running-sum", folder)
    (folder / "chat_template.jinja").write_text(THINKING)
    return str(folder)


def expected(tokenizer, prompt: str, **kwargs) -> list[int]:
    """The ids apply_chat_template itself gives for the system turn and the prompt, tokenised by it."""
    out = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}],
                                        add_generation_prompt=True, **kwargs)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


def test_train_and_eval_feed_the_model_what_the_template_renders(thinking_model, tmp_path, monkeypatch):
    """train.py's rollouts, its periodic eval and eval.py: every prompt's ids are apply_chat_template's with the
    system turn and enable_thinking false; the rendered text shows both took effect."""
    fed = []  # (who, prompt ids) of every generate call
    real_generate = rollout.generate

    def spy(lm, tokenizer, problems, prompt_ids, **kw):
        fed.append((kw.get("group_size"), problems, prompt_ids))
        return real_generate(lm, tokenizer, problems, prompt_ids, **kw)

    monkeypatch.setattr(train, "generate", spy)
    monkeypatch.setattr(rollout, "generate", spy)  # eval.evaluate imports it when it runs
    flags = ["--model", thinking_model, "--system-prompt", "Be brief.", "--chat-template-kwargs",
             '{"enable_thinking": false}', "--prompts-per-step", "2", "--group-size", "2", "--max-new-tokens", "8"]
    train.main([*flags, "--max-steps", "1", "--eval-every", "1", "--eval-problems", "3", "--out", str(tmp_path / "run")])
    evaluation.main([*flags, "--problems", "3", "-n", "2", "--k", "1", "--no-greedy", "--out", str(tmp_path / "ev")])
    tokenizer = AutoTokenizer.from_pretrained(thinking_model)
    assert len(fed) == 4  # training's rollout, the eval at steps 0 and 1, eval.py
    for _, problems, ids in fed:
        assert ids == [expected(tokenizer, p.prompt, enable_thinking=False) for p in problems]
        text = tokenizer.decode(ids[0])
        assert text.startswith("<|system|>Be brief.<|user|>Add ") and text.endswith("<|assistant|><think></think>")
    # and without the keyword argument the template takes its other branch
    assert expected(tokenizer, "x") != expected(tokenizer, "x", enable_thinking=False)


def test_a_data_rows_system_turn_reaches_the_model_and_plain_rows_are_unchanged(tmp_path):
    from grading.files import load_file

    tokenizer = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-running-sum")
    verl = load_file(str(FIXTURES / "verl.jsonl"))
    ids = encode_prompts(tokenizer, verl, True)
    assert tokenizer.decode(ids[2]).startswith("<|system|>You are a helpful assistant.<|user|>Solve the following")
    # every fixture file without a chat: the prompt as it was before turns existed, the user message alone
    files = [f for f in sorted(FIXTURES.glob("*.jsonl")) if f.name not in ("verl.jsonl",)]
    checked = 0
    for f in files:
        try:
            problems = load_file(str(f))
        except ValueError:  # not a file of problems (responses, code with tests read elsewhere, broken on purpose)
            continue
        if any(p.turns for p in problems):
            continue
        before = [tokenizer(tokenizer.apply_chat_template([{"role": "user", "content": p.prompt}],
                                                          add_generation_prompt=True, tokenize=False),
                            add_special_tokens=False)["input_ids"] for p in problems]
        assert encode_prompts(tokenizer, problems, True) == before, f.name
        checked += 1
    assert checked >= 5


def test_a_chat_that_ends_with_a_model_turn_is_refused(tmp_path):
    from grading.files import load_file

    path = tmp_path / "chat.jsonl"
    path.write_text(json.dumps({"prompt": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}],
                                "answer": "4"}) + "\n")
    with pytest.raises(ValueError, match=r"chat.jsonl:1: field 'prompt' must be a chat of \{role, content\} turns "
                                         r"ending with the user's"):
        load_file(str(path))


def test_bad_prompt_settings_are_said_before_anything_loads(tmp_path, thinking_model):
    with pytest.raises(ValueError, match="expected a JSON object such as"):
        parse_config(["--chat-template-kwargs", "enable_thinking=False"])
    with pytest.raises(ValueError, match="--system-prompt and --chat-template-kwargs are the chat template's"):
        validate(parse_config(["--system-prompt", "Be brief.", "--chat-template", "false"]), 1)
    assert run_main(["--system-prompt", f"@{tmp_path}/none.txt", "--out", str(tmp_path / "r")]) == (
        f"error: --system-prompt @{tmp_path}/none.txt: no such file {tmp_path}/none.txt; give the text, or @ and a "
        f"file's path")
    # a data row's own system turn beside the run's: refused, naming how many
    message = run_main(["--data", str(FIXTURES / "verl.jsonl"), "--system-prompt", "Be brief.", "--eval-every", "0",
                        "--out", str(tmp_path / "r2")])
    assert message.startswith("error: --system-prompt: 1 problem(s) carry their own system turn")
    # a data row's chat without the chat template: refused before any load, not dropped
    message = run_main(["--data", str(FIXTURES / "verl.jsonl"), "--chat-template", "false", "--eval-every", "0",
                        "--out", str(tmp_path / "r3")])
    assert message.startswith("error: a prompt with chat turns before it ('Solve the following") and message.endswith(
        "needs the tokenizer's chat template: set chat_template true with a model that has one, or drop the turns")
    assert not (tmp_path / "r3").exists()
    # a file's text is the system turn
    (tmp_path / "system.txt").write_text("Add carefully.")
    problems = rollout.encode_prompts(AutoTokenizer.from_pretrained(thinking_model),
                                      __import__("tasks").with_template([Problem("Add 1+2", "3")], "",
                                                                        f"@{tmp_path}/system.txt"), True)
    assert AutoTokenizer.from_pretrained(thinking_model).decode(problems[0]).startswith("<|system|>Add carefully.<|user|>")


def test_a_keyword_the_template_ignores_is_warned_of(thinking_model):
    shipped = AutoTokenizer.from_pretrained(ROOT / "assets" / "tiny-running-sum")
    with pytest.warns(UserWarning, match="chat template ignores 'enable_thinking'"):
        assert warn_ignored_kwargs(shipped, {"enable_thinking": False}) == ["enable_thinking"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the thinking template reads it: no warning
        assert warn_ignored_kwargs(AutoTokenizer.from_pretrained(thinking_model), {"enable_thinking": False}) == []


def rows_file(path: Path, ids: list) -> str:
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": "1", **({"id": i} if i is not None else {})})
                            + "\n" for i in ids))
    return str(path)


def test_the_pass_rate_filter_counts_and_keeps_rows_as_written(tmp_path, capsys):
    data = rows_file(tmp_path / "train.jsonl", ["a", "b", "c", "d", "e"])
    rates = tmp_path / "problems.jsonl"  # eval.py's rows: a 0/8, b 1/8, c 4/8, d 8/8 right; e not evaluated
    rates.write_text("".join(json.dumps({"id": i, "prompt": "", "gold": "", "correct": c,
                                         "samples": [{}] * 8}) + "\n" for i, c in (("a", 0), ("b", 1), ("c", 4), ("d", 8))))
    pass_filter.main([data, str(tmp_path), "--keep", "0.1,0.9", "--out", str(tmp_path / "kept.jsonl")])
    kept = [json.loads(x) for x in (tmp_path / "kept.jsonl").read_text().splitlines()]
    assert kept == [{"question": "qb", "answer": "1", "id": "b"}, {"question": "qc", "answer": "1", "id": "c"}]
    assert ("5 rows; kept 2 (pass rate in [0.1, 0.9]), dropped 1 too easy (> 0.9), 1 too hard (< 0.1); "
            "1 unmatched (no pass rate: dropped)") in capsys.readouterr().out
    # a JSONL of pass_rate, ids as numbers; unmatched kept when asked
    data = rows_file(tmp_path / "numbered.jsonl", [1, 2])
    (tmp_path / "rates.jsonl").write_text('{"id": 1, "pass_rate": 0.5}\n')
    pass_filter.main([data, str(tmp_path / "rates.jsonl"), "--keep-unmatched", "--out", str(tmp_path / "k2.jsonl")])
    assert len((tmp_path / "k2.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize("args,message", [
    (["--keep", "0.9,0.1"], "need 0 ≤ LO ≤ HI ≤ 1"),
    (["--keep", "0.1,1.5"], "need 0 ≤ LO ≤ HI ≤ 1"),
    (["--keep", "half"], "expected two rates LO,HI such as 0.1,0.9"),
])
def test_the_pass_rate_filter_refuses_a_bad_range(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit):
        pass_filter.main([rows_file(tmp_path / "t.jsonl", ["a"]), str(tmp_path), *args, "--out", str(tmp_path / "o")])
    assert message in capsys.readouterr().err


def test_the_pass_rate_filter_names_the_fix_for_rows_without_ids_or_matches(tmp_path):
    rates = tmp_path / "rates.jsonl"
    rates.write_text('{"id": "z", "pass_rate": 0.5}\n')
    with pytest.raises(SystemExit, match=r"its rows have no id \(id, idx, unique_id, extra_info.index\), so no pass "
                                         r"rate can find its row"):
        pass_filter.main([rows_file(tmp_path / "t.jsonl", [None, None]), str(rates), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match=r"none of its 1 ids is the id of a row of .*t2.jsonl; give the eval of this file"):
        pass_filter.main([rows_file(tmp_path / "t2.jsonl", ["a"]), str(rates), "--out", str(tmp_path / "o")])
    (tmp_path / "bad.jsonl").write_text('{"prompt": "q"}\n')
    with pytest.raises(SystemExit, match=r"bad.jsonl:1: expected a problems.jsonl row with an id"):
        pass_filter.main([rows_file(tmp_path / "t3.jsonl", ["a"]), str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o")])


def test_a_config_file_gives_the_keyword_arguments_as_a_mapping(tmp_path):
    (tmp_path / "c.yaml").write_text("chat_template_kwargs: {enable_thinking: false}\nsystem_prompt: Be brief.\n")
    cfg = parse_config(["--config", str(tmp_path / "c.yaml")])
    assert (cfg.chat_template_kwargs, cfg.system_prompt) == ({"enable_thinking": False}, "Be brief.")
    assert parse_config(["--config", str(tmp_path / "c.yaml"), "--chat-template-kwargs", '{"a": 1}']
                        ).chat_template_kwargs == {"a": 1}  # the command line over the file
