"""Benchmark data files: loading (JSONL / JSON list / parquet), error messages, and grading.

The fixtures in tests/fixtures/ are small hand-written problems in the real public schemas:
gsm8k.jsonl (question/answer "... #### x"), math500.jsonl (problem/solution/answer/subject/level/
unique_id), aime.jsonl (id/problem/answer/url?/year, answers as JSON ints in some rows and strings
in others) and amc.jsonl (question/answer/id?, answers as floats like 330.0).

Gold answers, as `grading.math_answers.gold_answer` gives them (text after "####", else the last \\boxed{},
else the field stripped; numbers are str()-ed first):
- GSM8K "#### 1,200" -> "1,200": the thousands separator is kept in the gold string; math-verify
  reads it as 1200 when grading.
- AIME "033" (a string) stays "033" (leading zero kept); the JSON integer 111 becomes "111".
- AMC 330.0 (a float) becomes "330.0"; 4.25 becomes "4.25".
- MATH500 takes the `answer` field ("\\frac{7}{12}") over the solution's \\boxed{\\dfrac{7}{12}}.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from grading.math_answers import gold_answer
from rewards import DataError, Problem
from data import make_task
from grading.files import load_file

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
NAMES = ("gsm8k", "math500", "aime", "amc")
PROMPT_FIELD = {"gsm8k": "question", "math500": "problem", "aime": "problem", "amc": "question"}

# the exact gold strings, one per row, worked out by hand from the problems
GOLD = {
    "gsm8k": ["216", "1,200", "2.5", "8", "120"],
    "math500": ["\\frac{7}{12}", "3\\sqrt{2}", "(-\\infty, 3]", "(2, -1)", "1, 2, 5",
                "\\text{Tuesday}"],
    "aime": ["111", "376", "170", "033", "56"],
    "amc": ["330.0", "117.0", "6.0", "4.25", "7.0"],
}

# (a correct response in a form other than the gold text, a wrong response), one per row
OTHER_FORMS = {
    "gsm8k": [("They made 72 * 3 = 216 dollars.\n#### 216", "#### 217"),
              ("40 * 30 = 1200 books.\n#### 1200", "#### 1,300"),
              ("Change: 10 - 7.50 = 2.50\n#### $2.50", "#### 2.6"),
              ("So the answer is \\boxed{8}.", "#### 9"),
              ("48 + 72 = 120 legs in all.\n#### 120", "#### 84")],
    "math500": [("\\boxed{\\dfrac{7}{12}}", "\\boxed{\\frac{5}{12}}"),
                ("\\boxed{\\sqrt{18}}", "\\boxed{2\\sqrt{3}}"),
                ("\\boxed{(-\\infty,3]}", "\\boxed{(-\\infty, 3)}"),
                ("\\boxed{(2,-1)}", "\\boxed{(-1, 2)}"),
                ("\\boxed{5, 1, 2}", "\\boxed{1, 2}"),
                ("\\boxed{\\text{Tuesday}}", "\\boxed{\\text{Wednesday}}")],
    "aime": [("\\boxed{111}", "\\boxed{166}"),
             ("\\boxed{376}", "\\boxed{367}"),
             ("\\boxed{170}", "\\boxed{1170}"),
             ("\\boxed{33}", "\\boxed{34}"),
             ("\\boxed{056}", "\\boxed{120}")],
    "amc": [("\\boxed{330}", "\\boxed{385}"),
            ("\\boxed{117}", "\\boxed{171}"),
            ("\\boxed{6}", "\\boxed{5}"),
            ("\\boxed{\\frac{17}{4}}", "\\boxed{4.5}"),
            ("\\boxed{7}", "\\boxed{16}")],
}


def fixture(name: str) -> Path:
    return FIXTURES / f"{name}.jsonl"


def raw_rows(name: str) -> list[dict]:
    return [json.loads(line) for line in fixture(name).read_text(encoding="utf-8").splitlines()
            if line.strip()]


# ----------------------------------------------------------------------------- loading

@pytest.mark.parametrize("name", NAMES)
def test_fixture_prompts_and_gold_answers(name):
    problems = load_file(str(fixture(name)))
    rows = raw_rows(name)
    assert 4 <= len(problems) <= 6 and len(problems) == len(rows)
    assert all(isinstance(p, Problem) for p in problems)
    assert [p.prompt for p in problems] == [r[PROMPT_FIELD[name]] for r in rows]
    assert [p.answer for p in problems] == GOLD[name]


def test_fixture_schemas_are_the_real_ones():
    gsm8k, math500, aime, amc = (raw_rows(n) for n in NAMES)
    assert all(set(r) == {"question", "answer"} and "\n#### " in r["answer"] for r in gsm8k)
    assert any(r["answer"].endswith("#### 1,200") for r in gsm8k)
    assert all(set(r) == {"problem", "solution", "answer", "subject", "level", "unique_id"}
               and "\\boxed{" in r["solution"] for r in math500)
    assert all({"id", "problem", "answer", "year"} <= set(r) <= {"id", "problem", "answer", "url",
                                                                  "year"} for r in aime)
    assert {type(r["answer"]) for r in aime} == {int, str}  # both spellings of AIME answers
    assert all(int(r["answer"]) in range(1000) for r in aime)
    assert all({"question", "answer"} <= set(r) <= {"question", "answer", "id"}
               and isinstance(r["answer"], float) for r in amc)


def test_first_prompt_and_answer_fields_win(tmp_path):
    path = tmp_path / "fields.jsonl"
    rows = [{"prompt": "p", "problem": "no", "question": "no", "answer": "1", "ground_truth": "2",
             "solution": "\\boxed{3}"},
            {"problem": "p2", "question": "no", "ground_truth": "2", "solution": "\\boxed{3}"},
            {"question": "p3", "solution": "So $x = \\boxed{\\frac{1}{2}}$."},
            {"question": "p4", "answer": 7}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    assert load_file(str(path)) == [Problem("p", "1"), Problem("p2", "2"),
                                    Problem("p3", "\\frac{1}{2}"), Problem("p4", "7")]


def _columns_of_one_type(rows: list[dict]) -> list[dict]:
    """Parquet columns hold one type: a column mixing ints and strings (AIME) is stored as strings,
    which load_file turns into the same gold strings (str(33) == "33")."""
    keys = {k for r in rows for k in r}
    mixed = {k for k in keys if len({type(r[k]) for r in rows if k in r}) > 1}
    return [{k: str(v) if k in mixed else v for k, v in r.items()} for r in rows]


@pytest.mark.needs("pyarrow")
@pytest.mark.parametrize("name", NAMES)
def test_json_list_and_parquet_copies_load_the_same(name, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    expected = load_file(str(fixture(name)))
    rows = raw_rows(name)

    as_json = tmp_path / f"{name}.json"
    as_json.write_text(json.dumps(rows, indent=2), encoding="utf-8")
    assert load_file(str(as_json)) == expected

    as_parquet = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(_columns_of_one_type(rows)), as_parquet)
    assert load_file(str(as_parquet)) == expected


@pytest.mark.needs("pyarrow")
def test_parquet_keeps_float_and_int_answer_columns(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "typed.parquet"
    table = pa.table({"question": ["a", "b"], "answer": pa.array([142.0, 4.25], pa.float64()),
                      "year": pa.array([2023, 2023], pa.int64())})
    pq.write_table(table, path)
    assert [p.answer for p in load_file(str(path))] == ["142.0", "4.25"]
    path2 = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"problem": ["a"], "answer": pa.array([33], pa.int64())}), path2)
    assert load_file(str(path2)) == [Problem("a", "33")]


# ----------------------------------------------------------------------------- errors

def _write(tmp_path, filename: str, text: str) -> str:
    path = tmp_path / filename
    path.write_text(text, encoding="utf-8")
    return str(path)


def _copy_fixture_with(tmp_path, name: str, line_no: int, new_line: str) -> str:
    """The fixture with its line `line_no` (from 1) replaced by `new_line`."""
    lines = fixture(name).read_text(encoding="utf-8").splitlines()
    lines[line_no - 1] = new_line
    return _write(tmp_path, f"{name}.jsonl", "\n".join(lines) + "\n")


def test_bad_json_line_names_file_and_line(tmp_path):
    path = _copy_fixture_with(tmp_path, "gsm8k", 3, '{"question": "Q", "answer": "#### 3"')
    with pytest.raises(DataError, match=r"gsm8k\.jsonl:3: not valid JSON .*one JSON object"):
        load_file(path)


def test_blank_lines_are_skipped_but_counted(tmp_path):
    path = _write(tmp_path, "blank.jsonl",
                  '{"question": "a", "answer": "#### 1"}\n\n   \n{"question": "b"}\n')
    with pytest.raises(DataError, match=r"blank\.jsonl:4: missing field"):
        load_file(path)


def test_bad_json_in_json_list_names_the_line(tmp_path):
    path = _write(tmp_path, "bad.json", '[\n  {"problem": "a", "answer": "1"},\n  {"problem": }\n]')
    with pytest.raises(DataError, match=r"bad\.json:3: not valid JSON"):
        load_file(path)


def test_missing_answer_field_lists_what_the_row_has(tmp_path):
    path = _copy_fixture_with(tmp_path, "aime", 2, json.dumps(
        {"id": 91, "problem": "Find x.", "Answer": 376, "year": 2024}))
    with pytest.raises(DataError) as info:
        load_file(path)
    message = str(info.value)
    assert f"{path}:2:" in message
    assert "missing field: expected one of answer, ground_truth, solution" in message
    assert message.endswith("the line has Answer, id, problem, year")


def test_missing_prompt_field_lists_what_the_row_has(tmp_path):
    path = _copy_fixture_with(tmp_path, "amc", 5, json.dumps({"id": 4, "text": "Q?", "answer": 7.0}))
    with pytest.raises(DataError, match=r"amc\.jsonl:5: missing field: expected one of prompt, "
                                        r"problem, question, query; the line has answer, id, text$"):
        load_file(path)


def test_empty_object_row_says_it_has_no_fields(tmp_path):
    path = _write(tmp_path, "empty_row.jsonl", "{}\n")
    with pytest.raises(DataError, match=r"empty_row\.jsonl:1: missing field: .*no fields"):
        load_file(path)


@pytest.mark.parametrize("value", ['""', '"   "', "true", "[1]", "NaN"])
def test_empty_or_non_text_field_is_named(tmp_path, value):
    path = _write(tmp_path, "v.jsonl",
                  '{"question": "a", "answer": "1"}\n{"question": "b", "answer": ' + value + "}\n")
    with pytest.raises(DataError, match=r"v\.jsonl:2: field 'answer' must be a non-empty string"):
        load_file(path)


NULLS = [{"problem": "a", "answer": "1", "solution": None}, {"problem": "b", "answer": None, "solution": "\\boxed{2}"}]


def test_a_null_field_falls_back_to_the_next_name(tmp_path):
    path = _write(tmp_path, "mixed.jsonl", "".join(json.dumps(r) + "\n" for r in NULLS))
    assert load_file(path) == [Problem("a", "1"), Problem("b", "2")]
    with pytest.raises(DataError, match=r"nulls\.jsonl:1: missing field: expected one of answer"):
        load_file(_write(tmp_path, "nulls.jsonl", '{"question": "a", "answer": null}\n'))


@pytest.mark.needs("pyarrow")
def test_null_field_falls_back_to_the_next_name_as_in_parquet(tmp_path):
    """pyarrow gives every row every column (None where the row had none), so a null is a missing field."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.Table.from_pylist(NULLS), tmp_path / "mixed.parquet")
    assert load_file(str(tmp_path / "mixed.parquet")) == [Problem("a", "1"), Problem("b", "2")]


@pytest.mark.parametrize("filename,text", [("empty.jsonl", ""), ("blank.jsonl", "\n  \n"),
                                           ("empty.json", "[]")])
def test_empty_file(tmp_path, filename, text):
    path = _write(tmp_path, filename, text)
    with pytest.raises(DataError, match=rf"{filename.replace('.', r'[.]')}: the dataset is empty"):
        load_file(path)


@pytest.mark.needs("pyarrow")
def test_empty_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"problem": pa.array([], pa.string()),
                             "answer": pa.array([], pa.string())}), path)
    with pytest.raises(DataError, match=r"empty\.parquet: the dataset is empty"):
        load_file(str(path))


@pytest.mark.parametrize("text", ['{"problem": "a", "answer": "1"}',
                                  '{"data": [{"problem": "a", "answer": "1"}]}', '"text"'])
def test_json_that_is_not_a_list(tmp_path, text):
    path = _write(tmp_path, "obj.json", text)
    with pytest.raises(DataError, match=r"obj\.json: expected a JSON list of objects"):
        load_file(path)


def test_non_object_row_in_jsonl(tmp_path):
    path = _copy_fixture_with(tmp_path, "math500", 4, '["(2, -1)"]')
    with pytest.raises(DataError, match=r"math500\.jsonl:4: expected a JSON object, got list"):
        load_file(path)


def test_non_object_row_in_json_list_names_the_row(tmp_path):
    path = _write(tmp_path, "rows.json", json.dumps([{"problem": "a", "answer": "1"}, 42]))
    with pytest.raises(DataError, match=r"rows\.json:2: expected a JSON object, got int"):
        load_file(path)


def test_missing_file(tmp_path):
    path = str(tmp_path / "nowhere" / "aime25.jsonl")
    with pytest.raises(DataError, match=r"aime25\.jsonl: no such file"):
        load_file(path)
    with pytest.raises(DataError, match=r"aime25\.jsonl: no such file"):
        make_task(path)


def test_directory_is_not_a_data_file(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        load_file(str(tmp_path))


# ----------------------------------------------------------------------------- grading

@pytest.fixture(scope="module")
def tasks(math_grader):
    """One FileTask per fixture, all graded by the session's one math-verify worker (conftest.math_grader)."""
    made = {name: make_task(str(fixture(name))) for name in NAMES}
    for task in made.values():
        task.grader = math_grader
    return made


def _reference(name: str, gold: str) -> str:
    if name == "gsm8k":
        return f"Let me work it out step by step.\n#### {gold}"
    return f"Working through the problem step by step, so the answer is \\boxed{{{gold}}}."


@pytest.mark.parametrize("name", NAMES)
def test_file_task_grades_reference_and_wrong_responses(tasks, name):
    task = tasks[name]
    assert task.problems == load_file(str(fixture(name)))
    assert len(OTHER_FORMS[name]) == len(task.problems)
    for problem, (other_form, wrong) in zip(task.problems, OTHER_FORMS[name]):
        for response in (_reference(name, problem.answer), other_form):
            verdict = task.grade(problem, response)
            assert (verdict.reward, verdict.failure) == (1.0, ""), (problem.answer, response, verdict)
            assert verdict.answer is not None
        verdict = task.grade(problem, wrong)
        assert (verdict.reward, verdict.failure) == (0.0, ""), (problem.answer, wrong, verdict)


def test_file_task_scores_no_answer_as_zero(tasks):
    task = tasks["aime"]
    verdict = task.grade(task.problems[0], "I could not solve this one.")
    assert verdict.reward == 0.0 and verdict.answer is None and verdict.failure == ""


def test_gsm8k_thousands_separator_is_graded_as_a_number(tasks):
    task = tasks["gsm8k"]
    problem = task.problems[1]
    assert problem.answer == "1,200"
    for response in ("#### 1,200", "#### 1200", "\\boxed{1200}", "\\boxed{1,200}",
                     "The library holds 1,200 books."):
        verdict = task.grade(problem, response)
        assert verdict.reward == 1.0 and verdict.answer == "1200", (response, verdict)
    assert task.grade(problem, "#### 120").reward == 0.0


def test_make_task_on_a_json_copy(tmp_path):
    """make_task accepts a .json list copy too; its FileTask grades the same way."""
    rows = raw_rows("amc")
    path = tmp_path / "amc.json"
    path.write_text(json.dumps(rows), encoding="utf-8")
    task = make_task(str(path))
    try:
        assert task.problems == load_file(str(fixture("amc")))
        assert task.grade(task.problems[0], "\\boxed{330}").reward == 1.0
    finally:
        task.grader.close()



# ----------------------------------------------------------------------------- other schemas: gold and id fields
# olympiad.jsonl (OlympiadBench: solution and final_answer are lists, the latter one element or several when
# is_multiple_answer), verl.jsonl (verl's rows: a chat prompt, reward_model.ground_truth, extra_info), gt.jsonl
# (Qwen2.5-Math's eval records: idx/question/gt_cot/gt) and ground_truth.jsonl (unique_id/problem/ground_truth).

def test_final_answer_lists_reach_the_grader_as_the_contract_says():
    """One part: the part is the gold; several: one gold string with a \\boxed{} each (every part required)."""
    problems = load_file(str(FIXTURES / "olympiad.jsonl"))
    rows = [json.loads(line) for line in (FIXTURES / "olympiad.jsonl").read_text().splitlines()]
    assert all(isinstance(r["solution"], list) for r in rows)  # worked solutions, never read as the gold
    assert [p.prompt for p in problems] == [r["question"] for r in rows]
    assert [p.answer for p in problems] == [gold_answer("15"), gold_answer("$x+1$"),
                                            gold_answer("\\boxed{2} \\boxed{3}")]
    assert [p.id for p in problems] == ["2231", "2232", "2233"]


def test_what_a_final_answer_list_hands_to_gold_answer(monkeypatch):
    from grading import files
    monkeypatch.setattr(files, "gold_answer", lambda raw: f"<{raw}>")
    assert [p.answer for p in load_file(str(FIXTURES / "olympiad.jsonl"))] == [
        "<15>", "<$x+1$>", "<\\boxed{2} \\boxed{3}>"]


def test_gt_ground_truth_and_verl_rows_load():
    assert load_file(str(FIXTURES / "gt.jsonl")) == [
        Problem("Natalia sold 48 clips in April and half as many in May. How many clips did she sell in all?", "72",
                id="0"),
        Problem("What is $\\sqrt{50}$ in simplest radical form?", "5\\sqrt{2}", id="1"),
        Problem("A train travels 180 km in 2 hours. What is its average speed in km/h?", "90", id="2")]
    assert [(p.answer, p.id) for p in load_file(str(FIXTURES / "ground_truth.jsonl"))] == [
        ("6", "fixture/algebra/1"), ("13", "fixture/geometry/2"), ("1", "fixture/precalculus/3")]
    verl = load_file(str(FIXTURES / "verl.jsonl"))
    rows = [json.loads(line) for line in (FIXTURES / "verl.jsonl").read_text().splitlines()]
    assert [p.answer for p in verl] == ["17", "36", "24"]
    assert [p.prompt for p in verl] == [r["prompt"][-1]["content"] for r in rows]  # the last user turn
    assert verl[2].prompt.startswith("Solve the following")
    assert [p.id for p in verl] == [str(r["extra_info"]["index"]) for r in rows]  # verl's id: extra_info.index
    # the turns before it, as written: rows 1 and 2 have none, row 3 its system turn
    assert [p.turns for p in verl] == [(), (), ({"role": "system", "content": "You are a helpful assistant."},)]


@pytest.mark.needs("pyarrow")
@pytest.mark.parametrize("name", ["olympiad", "verl"])
def test_lists_and_nested_objects_load_the_same_from_parquet(name, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = raw_rows(name)
    if name == "verl":  # one parquet column has one type: extra_info's index is text in every row
        rows = [{**r, "extra_info": {"index": str(r["extra_info"]["index"]), "split": r["extra_info"]["split"]}}
                for r in rows]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet")
    assert load_file(str(tmp_path / f"{name}.parquet")) == load_file(str(fixture(name)))


def test_ids_are_kept_first_of_id_idx_unique_id():
    assert [p.id for p in load_file(str(fixture("aime")))] == ["90", "91", "92", "93", "94"]
    assert load_file(str(fixture("math500")))[0].id == "test/counting_and_probability/9001.json"
    assert [p.id for p in load_file(str(fixture("amc")))] == ["0", "1", "2", "", "4"]  # its 4th row has none
    assert [p.id for p in load_file(str(fixture("gsm8k")))] == [""] * 5


def test_gold_spellings_in_order(tmp_path):
    rows = [{"q": 1, "problem": "a", "final_answer": ["1"], "ground_truth": "2", "solution": "\\boxed{3}"},
            {"problem": "b", "gt": "2", "solution": "\\boxed{3}", "unique_id": "u", "idx": 5},
            {"problem": "c", "expected_answer": "4", "gt": "2", "id": 0},
            {"problem": "d", "final_answer": "5"},
            {"problem": "e", "final_answer": [6, 7.5]},
            {"problem": "f", "reward_model": {"ground_truth": None}, "solution": "\\boxed{8}"}]
    path = _write(tmp_path, "spellings.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert load_file(path) == [Problem("a", "1"), Problem("b", "2", id="5"), Problem("c", "4", id="0"),
                               Problem("d", "5"), Problem("e", gold_answer("\\boxed{6} \\boxed{7.5}")),
                               Problem("f", "8")]


@pytest.mark.parametrize("row", [{"question": "a", "target": "3"}, {"question": "a", "label": 1},
                                 {"question": "a", "Answer": "3"},
                                 {"question": "a", "reward_model": {"style": "rule"}}])
def test_fields_that_mean_something_else_are_not_gold(tmp_path, row):
    path = _write(tmp_path, "other.jsonl", json.dumps(row) + "\n")
    with pytest.raises(DataError, match=r"other\.jsonl:1: missing field: expected one of answer, ground_truth, "
                                        rf"solution; the line has {', '.join(sorted(row))}$"):
        load_file(path)


@pytest.mark.parametrize("value", ["[]", '["3", ""]', '[["3"]]', "[null]", '{"a": 1}'])
def test_bad_final_answer_is_named(tmp_path, value):
    path = _write(tmp_path, "parts.jsonl", '{"problem": "a", "final_answer": ' + value + "}\n")
    with pytest.raises(DataError, match=r"parts\.jsonl:1: field 'final_answer' must be a non-empty string or a list "
                                        r"of them \(the parts of the answer\), got .*; the line has final_answer, "
                                        r"problem$"):
        load_file(path)


@pytest.mark.parametrize("prompt", [[{"role": "system", "content": "Be brief."}],
                                    [{"role": "user", "content": ""}], [{"role": "user"}]])
def test_chat_prompt_without_a_user_message_is_named(tmp_path, prompt):
    path = _write(tmp_path, "chat.jsonl", json.dumps({"prompt": prompt, "reward_model": {"ground_truth": "1"}}) + "\n")
    with pytest.raises(DataError, match=r"chat\.jsonl:1: field 'prompt' must be a chat with a user message "
                                        r"\(role, content\), got .*; the line has prompt, reward_model$"):
        load_file(path)


# ----------------------------------------------------------------------------- Qwen2.5-Math's records, multiple choice
# qwen25_math.jsonl: hand-written problems in the shape of Qwen2.5-Math's evaluation/data/eval_rm_maj_example/
# math_cot_100.jsonl (the records its math_eval.py writes, with a reward model's scores): the question twice (question,
# query), Qwen's stripped gold (gt: "4:15p.." for "\\text{4:15 p.m.}") beside the source's answer, n responses each.

QWEN_FIELDS = ["idx", "question", "gt_cot", "gt", "level", "solution", "answer", "code", "pred", "report", "score",
               "system", "query", "response", "history", "pred_score"]


def test_qwen_fixture_has_the_real_shape():
    rows = raw_rows("qwen25_math")
    assert all(list(r) == QWEN_FIELDS for r in rows)
    assert all(r["query"] == r["question"] and r["code"] == r["response"] and r["solution"] == r["gt_cot"]
               and len(r["pred"]) == len(r["score"]) == len(r["pred_score"]) == len(r["response"]) for r in rows)
    assert [r["gt"] for r in rows] != [r["answer"] for r in rows]


def test_qwen_records_read_their_answer_before_gt():
    rows = raw_rows("qwen25_math")
    assert load_file(str(fixture("qwen25_math"))) == [Problem(r["question"], r["answer"], id=str(r["idx"]))
                                                      for r in rows]
    assert [r["answer"] for r in rows][2:] == ["\\text{4:15 p.m.}", "50,\\!625"]  # gt: "4:15p..", "50,625"


def test_query_and_gt_rows_load(tmp_path):
    """Refused before query was a prompt field ("missing field: expected one of prompt, problem, question")."""
    rows = [{k: r[k] for k in ("idx", "query", "gt_cot", "gt", "system")} for r in raw_rows("qwen25_math")]
    path = _write(tmp_path, "query.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert load_file(path) == [Problem(r["query"], r["gt"], id=str(r["idx"])) for r in rows]


def test_qwen_answer_grades_what_its_gt_would_not(tmp_path, math_grader):
    """The time row: a right response scores 1 against its answer, 0 against Qwen's stripped gt "4:15p.."."""
    task = make_task(str(fixture("qwen25_math")))
    task.grader = math_grader
    gt_only = load_file(_write(tmp_path, "gt.jsonl", json.dumps({"query": "q", "gt": "4:15p.."}) + "\n"))[0]
    response = "1:45 p.m. + 2:30 = $\\boxed{4:15 \\text{ p.m.}}$"
    assert [task.grade(p, response).reward for p in (task.problems[2], gt_only)] == [1.0, 0.0]


@pytest.mark.parametrize("row", [
    {"question": "Which is prime?", "type": "college_mathematics", "choices": ["4", "6", "7", "9"], "answer": 2},
    {"id": "0", "question": "f(-6)?", "options": "A) 0 B) -6 C) 6 D) 1", "answer": "A"},
    {"question": "x?", "options": ["A)5", "B)6"], "rationale": "...", "answer": "B"}])
def test_multiple_choice_rows_are_refused(tmp_path, row):
    """mmlu_stem (choices; the answer their index), sat_math and aqua (options) as Qwen2.5-Math keeps them, with
    an answer field: they loaded before, the prompt without its choices."""
    path = _write(tmp_path, "choices.jsonl", json.dumps(row) + "\n")
    name = "choices" if "choices" in row else "options"
    with pytest.raises(DataError, match=rf"choices\.jsonl:1: field '{name}' holds the choices of a multiple-choice "
                                        rf"problem, .*; the line has {', '.join(sorted(row))}$"):
        load_file(path)


def test_a_null_options_field_is_no_choice(tmp_path):
    """gaokao_math_cloze's rows carry options: null (and label: null)."""
    row = {"passage": None, "question": "x = ?", "options": None, "label": None, "answer": "2",
           "other": {"source": "2021"}}
    assert load_file(_write(tmp_path, "cloze.jsonl", json.dumps(row) + "\n")) == [Problem("x = ?", "2")]


# ----------------------------------------------------------------------------- datasets: saved folders, Hub names
# `datasets` is optional: these tests skip without it. Nothing here reaches the network: a saved folder is read from
# disk, and a Hub name from a cache written here, in a subprocess with HF_DATASETS_OFFLINE=1 and its own HF_HOME.

@pytest.fixture
def hf_datasets():
    import datasets
    return datasets


@pytest.mark.parametrize("value, named", [
    ("openai/gsm8k", True), ("openai/gsm8k:main:test", True), ("HuggingFaceH4/MATH-500::test", True),
    ("data/aime.jsonl", False), ("running_sum", False), ("a/b/c", False), ("my.py:Task", False),
    ("openai/gsm8k:main:test:x", False), ("tests/fixtures", False)])  # the last one is a folder here
def test_what_names_a_hub_dataset(value, named):
    from grading.files import is_dataset_name
    assert is_dataset_name(value) is named


@pytest.mark.needs("datasets")
@pytest.mark.parametrize("name", ["gsm8k", "math500", "olympiad", "qwen25_math"])
def test_a_saved_dataset_folder_loads_like_its_file(hf_datasets, tmp_path, name):
    hf_datasets.Dataset.from_list(raw_rows(name)).save_to_disk(str(tmp_path / name))
    assert load_file(str(tmp_path / name)) == load_file(str(fixture(name)))


@pytest.mark.needs("datasets")
def test_a_saved_dataset_dict_names_its_splits(hf_datasets, tmp_path):
    rows, folder = raw_rows("gsm8k"), tmp_path / "gsm8k"
    hf_datasets.DatasetDict({"train": hf_datasets.Dataset.from_list(rows[:3]),
                             "test": hf_datasets.Dataset.from_list(rows[3:])}).save_to_disk(str(folder))
    train, test = (re.escape(str(folder / split)) for split in ("train", "test"))
    with pytest.raises(DataError, match=rf"^{re.escape(str(folder))}: the dataset has the splits train, test; "
                                        rf"name one: {train} or {test}$"):
        load_file(str(folder))
    assert load_file(str(folder / "test")) == load_file(str(fixture("gsm8k")))[3:]


@pytest.mark.needs("datasets")
def test_a_saved_folder_as_data_and_as_eval_data(hf_datasets, tmp_path):
    import config
    import data
    hf_datasets.Dataset.from_list(raw_rows("gsm8k")).save_to_disk(str(tmp_path / "gsm8k"))
    gsm8k, math500 = load_file(str(fixture("gsm8k"))), load_file(str(fixture("math500")))
    for flags, (train, held) in [((str(fixture("math500")), str(tmp_path / "gsm8k")), (math500, gsm8k)),
                                 ((str(tmp_path / "gsm8k"), str(fixture("math500"))), (gsm8k, math500))]:
        task, problems, held_out = data.load(config.parse_config(["--data", flags[0], "--eval-data", flags[1]]))
        task.close()
        assert (problems, held_out) == (train, held)


def test_without_datasets_a_saved_folder_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` fails, as where it is not installed
    (tmp_path / "saved").mkdir()
    (tmp_path / "saved" / "state.json").write_text("{}")
    with pytest.raises(DataError, match=r"saved: reading a saved dataset or a dataset by name needs the datasets "
                                        r"library: pip install datasets \(or give a \.jsonl/\.json/\.parquet file\)$"):
        make_task(str(tmp_path / "saved"))


def populate_hub_cache(cache: Path, repo_id: str, config: str, splits: dict[str, list[dict]]) -> None:
    """Write what load_dataset(repo_id, config) leaves in HF_DATASETS_CACHE once it has downloaded a dataset, and
    reads offline: CACHE/org___name/CONFIG/0.0.0/HASH/ with name-SPLIT.arrow (an Arrow stream) for each split and
    dataset_info.json naming the config and its splits; `datasets` writes the name in snake case
    ("HuggingFaceH4/MATH-500" -> HuggingFaceH4___math-500/, math-500-test.arrow)."""
    import pyarrow as pa
    from datasets import Dataset, DatasetInfo, SplitDict, SplitInfo
    from datasets.naming import camelcase_to_snakecase
    org, name = repo_id.split("/")
    name = camelcase_to_snakecase(name)
    folder = cache / f"{org}___{name}" / config / "0.0.0" / "0123456789abcdef"
    folder.mkdir(parents=True)
    split_infos = SplitDict(dataset_name=name)
    for split, rows in splits.items():
        table = Dataset.from_list(rows).data.table
        with pa.OSFile(str(folder / f"{name}-{split}.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        split_infos.add(SplitInfo(name=split, num_examples=len(rows), dataset_name=name))
    DatasetInfo(dataset_name=name, config_name=config, features=Dataset.from_list(rows).features,
                splits=split_infos).write_to_directory(str(folder))


def offline(tmp_path) -> dict:
    """The environment of a run without network whose datasets cache is tmp_path/cache."""
    return {**os.environ, "HF_HOME": str(tmp_path / "hf"), "HF_DATASETS_CACHE": str(tmp_path / "cache"),
            "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


LOAD_EACH = """import json, sys
from grading.files import load_file
from rewards import DataError
out = {}
for source in sys.argv[1:]:
    try:
        out[source] = [[p.prompt, p.answer, p.id] for p in load_file(source)]
    except DataError as e:
        out[source] = str(e)
print(json.dumps(out))"""


@pytest.mark.needs("datasets")
def test_hub_datasets_from_the_cache_offline(hf_datasets, tmp_path):
    gsm8k = raw_rows("gsm8k")
    populate_hub_cache(tmp_path / "cache", "openai/gsm8k", "main", {"train": gsm8k[:3], "test": gsm8k[3:]})
    populate_hub_cache(tmp_path / "cache", "HuggingFaceH4/MATH-500", "default", {"test": raw_rows("math500")})
    sources = ["openai/gsm8k:main:test", "HuggingFaceH4/MATH-500", "openai/gsm8k:main", "openai/gsm8k:socratic:test",
               "openai/gsm8k:main:validation", "nobody/nothing:main:test"]
    done = subprocess.run([sys.executable, "-c", LOAD_EACH, *sources], cwd=ROOT, env=offline(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    triples = {name: [[p.prompt, p.answer, p.id] for p in load_file(str(fixture(name)))]
               for name in ("gsm8k", "math500")}
    assert got["openai/gsm8k:main:test"] == triples["gsm8k"][3:]
    assert got["HuggingFaceH4/MATH-500"] == triples["math500"]  # its only split
    assert got["openai/gsm8k:main"] == ("openai/gsm8k:main: the dataset has the splits train, test; name one: "
                                        "openai/gsm8k:main:train or openai/gsm8k:main:test")
    assert got["openai/gsm8k:socratic:test"] == ("openai/gsm8k:socratic:test: Couldn't find cache for openai/gsm8k for "
                                                 "config 'socratic' Available configs in the cache: ['main']")
    assert got["openai/gsm8k:main:validation"].startswith("openai/gsm8k:main:validation: Unknown split \"validation\"")
    assert got["nobody/nothing:main:test"] == (
        f"nobody/nothing:main:test: no such file or folder here, and not in the local datasets cache "
        f"({tmp_path / 'cache'}) while the Hub is out of reach (offline: HF_DATASETS_OFFLINE or HF_HUB_OFFLINE is "
        f"set): load it once with network, or give a .jsonl/.json/.parquet file")


@pytest.mark.needs("datasets")
def test_eval_reads_a_hub_dataset_offline_and_says_a_missing_one_in_one_line(hf_datasets, tmp_path):
    gsm8k = raw_rows("gsm8k")
    populate_hub_cache(tmp_path / "cache", "openai/gsm8k", "main", {"train": gsm8k[:3], "test": gsm8k[3:]})
    responses = _write(tmp_path, "responses.jsonl", "".join(json.dumps(line) + "\n" for line in [
        {"index": 0, "responses": ["<answer>8</answer>", "<answer>9</answer>"]},
        {"index": 1, "responses": ["<answer>120</answer>", "<answer>120</answer>"]}]))

    def eval_py(data: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "eval.py", "--data", data, "--responses", responses, "--k", "1", "--out",
                               str(tmp_path / "ev"), "--reward", str(ROOT / "examples" / "reward_number.py:closeness")],
                              cwd=ROOT, env=offline(tmp_path), capture_output=True, text=True, timeout=120)

    done = eval_py("openai/gsm8k:main:test")
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "ev" / "summary.json").read_text())
    assert summary["settings"]["data"] == "openai/gsm8k:main:test"
    assert summary["metrics"]["eval/accuracy"] == pytest.approx((0.5 + 1.0) / 2)
    missing = eval_py("nobody/nothing:main:test")
    assert missing.returncode != 0 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and missing.stderr.startswith(
        "error: nobody/nothing:main:test: no such file or folder here, and not in the local datasets cache")


def test_files_and_built_in_tasks_never_import_datasets():
    script = (f"import sys, data; data.make_task('running_sum'); data.make_task({str(fixture('gsm8k'))!r}).close(); "
              "print('datasets' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "False", done.stderr
