"""Problems from data files (`--data FILE`: JSONL, a JSON list, or parquet when pyarrow is installed) and from
datasets read through HF `datasets` when it is installed: a folder that `save_to_disk` wrote, or a Hub dataset
by name, `--data openai/gsm8k:main:test` (org/name[:config[:split]]; offline, from the local cache).

`load_file` reads a source's rows in the usual schemas: GSM8K question/answer ("#### x"), MATH500
problem/answer/solution, AIME/AMC problem or question with answer, OlympiadBench's final_answer
lists, verl's chat prompt with reward_model.ground_truth, Qwen2.5-Math's query/gt; every problem is named
by its source and line (row).

Qwen2.5-Math's evaluation files (QwenLM/Qwen2.5-Math, evaluation/data/NAME/test.jsonl) and the records its
math_eval.py writes (idx, question, gt_cot, gt and the source's answer; its eval_rm_maj_example adds query, the
question again) are read as its evaluation reads them (parser.py: parse_question, parse_ground_truth) in gsm8k
(question, answer "... #### x"), math and minerva_math (problem, solution, and answer where there is one), aime24
and amc23 (problem, answer), olympiadbench (question, final_answer), college_math, gaokao2024_I, gaokao2024_II,
gaokao_math_cloze and cmath (question, answer); a record's answer is read before its gt, Qwen's own stripped form
of it ("4:15p.." for "\\text{4:15 p.m.}"). Refused: gaokao2023en (its lines 168 and 193 have an empty answer),
svamp (Body, Question, Answer), mawps (input, target), carp_en (content), and the multiple-choice aqua, sat_math,
mmlu_stem and gaokao_math_qa (CHOICE_FIELDS). Read otherwise than by Qwen's evaluation: asdiv (the question
without its body, and "9 (apples)" as the gold), tabmwp (the question without its table; a row with choices is
refused), cn_middle_school and gaokao2024_mix (their answer, where Qwen grades choice_answer when a row has one).

`FileTask` is the task of such a source: graded by HF math-verify with the answer rules of
grading/math_answers.py, or by your own `--reward path/to/file.py:function`, both in worker
processes under a time limit (grading/pool.py). A file of code problems, told apart by its first
row (`is_code_file`), is grading/code.py's. data.py imports this module only when --data names no task.
"""
from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

from grading.math_answers import gold_answer
from grading.pool import GRADE_CPU, MathGraderPool, RewardFunction
from rewards import DataError, Problem, Verdict
from tasks import Task

PROMPT_FIELDS = ("prompt", "problem", "question", "query")  # query: Qwen2.5-Math's records (its question there)
# Where a row keeps its gold answer, read in this order: the three names an error asks for, each with the spellings
# of common datasets (OlympiadBench and DeepMath: final_answer; NVIDIA's OpenMathReasoning: expected_answer; verl
# rows: reward_model.ground_truth; Qwen2.5-Math's records: gt, after their answer). Not read: target and label, which
# hold other things in common datasets (Countdown's number to reach, a class index, a whole reference response).
ANSWER_FIELDS = {"answer": ("answer", "final_answer", "expected_answer"),
                 "ground_truth": ("ground_truth", "gt", "reward_model.ground_truth"),
                 "solution": ("solution",)}  # a worked solution: its last \boxed{} (MATH)
PARTS_FIELDS = ("final_answer",)  # where a list is the parts of one answer (a list under ground_truth may be aliases)
ID_FIELDS = ("id", "idx", "unique_id")  # a row's own id, kept in Problem.id; a --responses line's join to its row
ROW_ID_FIELDS = (*ID_FIELDS, "extra_info.index")  # and verl's, inside the row (Problem.id, extras/pass_filter.py)
# Where a multiple-choice row keeps its choices (MMLU: choices, its answer their index; AQuA, SAT: options). The prompt
# field lacks them and the gold may be an index, so such a row is refused rather than graded against the wrong thing.
CHOICE_FIELDS = ("choices", "options")
DATA_SUFFIXES = (".jsonl", ".json", ".parquet")
DATASET_NAME = re.compile(r"[\w.-]+/[\w.-]+(:[\w.-]*){0,2}")  # org/name[:config[:split]], as the Hub names them


class FileTask(Task):
    """Problems from a benchmark file (`load_file`), graded in a pool of `workers` processes:
    math-verify (grading.pool.MathGraderPool, `cpu` seconds of CPU time an answer), or the `reward`
    function (grading.pool.RewardFunction); `budget` seconds a batch (0: no limit; see rewards.grade_batch)."""

    name = "file"

    def __init__(self, path: str, grade_timeout: float = 10.0, workers: int = 4, budget: float = 0.0,
                 reward: str = "", cpu: float = GRADE_CPU):
        if not reward and importlib.util.find_spec("math_verify") is None:  # say so now, not as 0 per answer
            raise DataError(f"{path}: grading a benchmark file needs math-verify: pip install math-verify "
                            f"(or give --reward file.py:function)")
        self.path, self.budget = path, budget
        self.problems = load_file(path)
        self.grader = RewardFunction(reward, grade_timeout, workers) if reward else MathGraderPool(grade_timeout,
                                                                                                   workers, cpu=cpu)

    def splits(self) -> tuple[list[Problem], list[Problem]]:
        return self.problems, []  # its held-out problems are another file's (--eval-data)

    def read(self, path: str) -> list[Problem]:
        """The problems of its --eval-data file."""
        return load_file(path)

    def grade(self, problem: Problem, response: str) -> Verdict:
        return self.grader.grade_one(problem, response)

    def grade_batch(self, items: list[tuple[Problem, str]], budget: float) -> list[Verdict]:
        return self.grader.grade_items(items, budget)

    def close(self) -> None:
        """Kill the grading workers (they also die with this process)."""
        self.grader.close()


def load_file(path: str) -> list[Problem]:
    """Problems from .jsonl (one object per line), .json (a list of objects), .parquet (needs
    pyarrow) or a dataset through HF `datasets` (`dataset_rows`). A row's prompt is the first of PROMPT_FIELDS it
    has; its gold answer the first of the ANSWER_FIELDS spellings, through grading.math_answers.gold_answer; its id
    (Problem.id) the first of ROW_ID_FIELDS, as str() writes it. A list under final_answer is the parts of one answer:
    one part is the answer, several reach the grader as one gold string with a \\boxed{} each, every part required:

        {"question": "2+2?", "final_answer": ["4"], "idx": 7} -> Problem("2+2?", gold_answer("4"), id="7")
        {"problem": "x, y?", "final_answer": ["3", "5"]} -> Problem("x, y?", gold_answer("\\boxed{3} \\boxed{5}"))
        {"prompt": [{"role": "user", "content": "x?"}], "reward_model": {"ground_truth": "3"}} -> Problem("x?", "3")
        {"idx": 3, "query": "2+3?", "gt_cot": "...", "gt": "5"} -> Problem("2+3?", "5", id="3")

    Every error names the source, the line (row), the field and the fields the line has."""
    return [row_problem(row, path, lineno) for lineno, row in records(path)]


def records(path: str) -> list[tuple[int, dict]]:
    """(line or row number from 1, object) of each row of a data file, a saved dataset folder or a Hub
    dataset (`dataset_rows`), which must exist, hold only objects and not be empty."""
    p = Path(path)
    if is_saved_dataset(p) or is_dataset_name(path):
        rows = dataset_rows(path)
    elif p.is_file():
        rows = _rows(p)
    else:
        raise DataError(f"{path}: no such file (give --data running_sum, countdown, a .jsonl/.json/.parquet path, "
                        f"a folder that datasets' save_to_disk wrote, or a Hub dataset org/name[:config[:split]])")
    for lineno, row in rows:
        if not isinstance(row, dict):
            raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
    if not rows:
        raise DataError(f"{path}: the dataset is empty (no rows)")
    return rows


def is_dataset_name(value: str) -> bool:
    """Whether a --data value names a Hub dataset, org/name with an optional :config and :split (DATASET_NAME),
    rather than a data file or a path here: "openai/gsm8k:main:test" -> True; "data/aime.jsonl", "running_sum",
    "a/b/c" -> False."""
    return bool(DATASET_NAME.fullmatch(value)) and not value.endswith(DATA_SUFFIXES) and not Path(value).exists()


def is_saved_dataset(p: Path) -> bool:
    """Whether a folder holds a dataset that `datasets` saved: Dataset.save_to_disk writes state.json,
    DatasetDict.save_to_disk dataset_dict.json (and a folder of each split)."""
    return (p / "state.json").is_file() or (p / "dataset_dict.json").is_file()


def dataset_rows(source: str) -> list[tuple[int, object]]:
    """(row number from 1, row) of a dataset read through HF `datasets`, imported only here: a saved folder, or a
    Hub dataset org/name[:config[:split]], downloaded into the datasets cache once and read from there when offline
    (HF_DATASETS_OFFLINE=1 or no network). Without a split, the dataset's only one: "openai/gsm8k:main" has two
    (train, test) and is refused, naming them; "openai/gsm8k:main:test" is GSM8K's test split."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"{source}: reading a saved dataset or a dataset by name needs the datasets library: "
                        f"pip install datasets (or give a .jsonl/.json/.parquet file)") from None
    saved = is_saved_dataset(Path(source))
    name, config, split = [*source.split(":"), "", ""][:3]
    try:
        loaded = (datasets.load_from_disk(source) if saved else
                  datasets.load_dataset(name, config or None, split=split or None))
    except ConnectionError:  # datasets' words for "not cached, and the Hub out of reach"
        offline = datasets.config.HF_DATASETS_OFFLINE  # either variable sets it
        reach = "offline: HF_DATASETS_OFFLINE or HF_HUB_OFFLINE is set" if offline else "no network"
        raise DataError(f"{source}: no such file or folder here, and not in the local datasets cache "
                        f"({datasets.config.HF_DATASETS_CACHE}) while the Hub is out of reach ({reach}): load it once "
                        f"with network, or give a .jsonl/.json/.parquet file") from None
    except (OSError, ValueError, RuntimeError) as e:  # no such dataset, config or split: datasets says which
        raise DataError(f"{source}: {' '.join(str(e).split())}") from None
    if isinstance(loaded, datasets.DatasetDict):
        if len(loaded) != 1:
            named = [f"{source}/{s}" if saved else f"{name}:{config}:{s}" for s in loaded]
            raise DataError(f"{source}: the dataset has the splits {', '.join(loaded)}; name one: {' or '.join(named)}")
        (loaded,) = loaded.values()
    return list(enumerate(loaded.to_list(), 1))


def _rows(p: Path) -> list[tuple[int, object]]:
    """(line or row number from 1, record) pairs of a data file."""
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError:
            raise DataError(f"{p}: reading parquet needs pyarrow (pip install pyarrow), "
                            f"or convert the file to JSONL") from None
        return list(enumerate(pq.read_table(p).to_pylist(), 1))
    data = p.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise DataError(f"{p}:{line}: not valid UTF-8 (byte {data[e.start]:#04x} at offset {e.start}); "
                        f"save the file as UTF-8") from None
    if suffix == ".json":
        try:
            records = json.loads(text)
        except json.JSONDecodeError as e:
            if e.msg != "Extra data":  # "Extra data": JSON lines named .json, as HF datasets writes them
                raise DataError(f"{p}:{e.lineno}: not valid JSON ({e.msg})") from None
        else:
            if not isinstance(records, list):
                raise DataError(f"{p}: expected a JSON list of objects (or use .jsonl, one per line)")
            return list(enumerate(records, 1))
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
            raise DataError(f"{p}:{lineno}: not valid JSON ({e.msg}); each line must be "
                            f"one JSON object") from None
    return rows


def row_problem(row: dict, path: str, lineno: int) -> Problem:
    """A row's Problem (see load_file). A multiple-choice row, one with a field of CHOICE_FIELDS, is refused:
    {"question": "q", "choices": ["a", "b"], "answer": 1} has no choices in its prompt, and 1 is the second one."""
    choices = present(row, CHOICE_FIELDS)
    if choices:
        raise DataError(f"{path}:{lineno}: field '{choices}' holds the choices of a multiple-choice problem, which its "
                        f"prompt field lacks and its answer may index; write them into the prompt and the answer as "
                        f"text; {fields_of(row)}")
    return Problem(prompt=row_field(row, PROMPT_FIELDS, path, lineno), answer=row_gold(row, path, lineno),
                   id=row_id(row), turns=row_turns(row, path, lineno))


def row_turns(row: dict, path: str, lineno: int) -> tuple[dict, ...]:
    """The turns a chat prompt (verl's) has before its last user message, as written (Problem.turns), each
    as {"role", "content"}: [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    -> ({"role": "system", "content": "Be brief."},); () for a prompt that is text. A chat that goes on after
    its last user message, or a turn without a role and a string content, is refused."""
    name = first_field(row, PROMPT_FIELDS, path, lineno)
    chat = field_value(row, name)
    if not is_chat(chat):
        return ()
    last = max(i for i, turn in enumerate(chat) if turn.get("role") == "user")  # row_field found one
    bad = next((turn for turn in chat
                if not (isinstance(turn.get("role"), str) and isinstance(turn.get("content"), str))), None)
    if last < len(chat) - 1 or bad is not None:
        raise DataError(f"{path}:{lineno}: field '{name}' must be a chat of {{role, content}} turns ending with the "
                        f"user's, got {short(bad if bad is not None else chat[last + 1:])}; {fields_of(row)}")
    return tuple({"role": turn["role"], "content": turn["content"]} for turn in chat[:last])


def is_chat(value) -> bool:
    """Whether a field holds a chat, a non-empty list of turns (objects): verl's prompt."""
    return isinstance(value, list) and bool(value) and all(isinstance(turn, dict) for turn in value)


def row_field(row: dict, names: tuple[str, ...], path: str, lineno: int) -> str:
    """The text of the first of `names` the row has: a non-empty string, a number as str() writes it
    (AIME's 111 -> "111"), or in a chat (verl's prompt) the last user message's content:
    [{"role": "system", ...}, {"role": "user", "content": "2+2?"}] -> "2+2?" (the turns before it:
    row_turns)."""
    name = first_field(row, names, path, lineno)
    value = field_value(row, name)
    chat = is_chat(value)
    text = field_text(next((turn.get("content") for turn in reversed(value) if turn.get("role") == "user"), None)
                      if chat else value)
    if text is None:
        wanted = "a chat with a user message (role, content)" if chat else "a non-empty string"
        raise DataError(f"{path}:{lineno}: field '{name}' must be {wanted}, got {short(value)}; {fields_of(row)}")
    return text


def row_gold(row: dict, path: str, lineno: int) -> str:
    """A row's gold answer (see load_file): {"gt": "#### 7"} -> "7"; {"final_answer": ["3", "5"]} ->
    gold_answer("\\boxed{3} \\boxed{5}")."""
    name = first_field(row, sum(ANSWER_FIELDS.values(), ()), path, lineno, expected=tuple(ANSWER_FIELDS))
    if name not in PARTS_FIELDS:
        return gold_answer(row_field(row, (name,), path, lineno))
    value = field_value(row, name)
    parts = [field_text(part) for part in (value if isinstance(value, list) else [value])]
    if not parts or None in parts:
        raise DataError(f"{path}:{lineno}: field '{name}' must be a non-empty string or a list of them (the "
                        f"parts of the answer), got {short(value)}; {fields_of(row)}")
    return gold_answer(parts[0] if len(parts) == 1 else " ".join(f"\\boxed{{{part}}}" for part in parts))


def row_id(row: dict) -> str:
    """A row's own id, the first of ROW_ID_FIELDS it has, as str() writes it: {"idx": 7} -> "7",
    {"extra_info": {"index": "a1"}} -> "a1"; "" without one."""
    name = present(row, ROW_ID_FIELDS)
    return str(field_value(row, name)) if name else ""


def first_field(row: dict, names: tuple[str, ...], path: str, lineno: int, expected: tuple[str, ...] = ()) -> str:
    """The first of `names` the row has; else an error that asks for `expected` (default: the names)."""
    name = present(row, names)
    if name is None:
        raise DataError(f"{path}:{lineno}: missing field: expected one of {', '.join(expected or names)}; "
                        f"{fields_of(row)}")
    return name


def present(row: dict, names: tuple[str, ...]) -> str | None:
    """The first of `names` the row has, or None. A null is no field: parquet gives every row every
    column, None where the row has none."""
    return next((name for name in names if field_value(row, name) is not None), None)


def field_value(row: dict, name: str):
    """row[name], None where the row has none; a dotted name looks inside objects:
    field_value({"reward_model": {"ground_truth": "3"}}, "reward_model.ground_truth") -> "3"."""
    value = row
    for key in name.split("."):
        value = value.get(key) if isinstance(value, dict) else None
    return value


def field_text(value) -> str | None:
    """A field's value as text: a non-empty string as it is, a number as str() writes it (330.0 ->
    "330.0"); None for anything else ("", "  ", true, NaN, a list)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == value:  # not NaN
        value = str(value)
    return value if isinstance(value, str) and value.strip() else None


def fields_of(row: dict) -> str:
    """What an error says a line has: {"b": 1, "a": 2} -> "the line has a, b"."""
    return f"the line has {', '.join(sorted(row)) or 'no fields'}"


def short(value) -> str:
    """A value as an error quotes it, cut to 60 characters: [1] -> "[1]"."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# ----------------------------------------------------------------------------- code problems

CODE_FIELDS = ("tests", "input_output")  # where a row keeps its tests (APPS and TACO: input_output, as JSON text)


def is_code_file(path: str) -> bool:
    """Whether a data file holds code problems: its first row has one of CODE_FIELDS. Of a JSONL
    file only the first line is read, of a parquet file its schema; False for anything that is
    not a readable data file (load_file then says why)."""
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix.lower() == ".parquet":
        try:
            import pyarrow.parquet as pq
            return bool(set(CODE_FIELDS) & set(pq.read_schema(p).names))
        except (ImportError, OSError, ValueError):  # no pyarrow, not parquet
            return False
    with p.open("rb") as f:
        first = next((line for line in f if line.strip()), b"")
    try:
        row = json.loads(first)
    except ValueError:  # a JSON list over several lines (or a bad line, which _rows names)
        rows = _rows(p)
        row = rows[0][1] if rows else None
    if isinstance(row, list):  # a JSON list on one line
        row = row[0] if row else None
    return isinstance(row, dict) and any(row.get(name) is not None for name in CODE_FIELDS)
