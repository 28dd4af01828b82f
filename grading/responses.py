"""A responses file (eval.py --responses FILE: grade responses written elsewhere): a JSON object a
line (or a .json list, or parquet) with one response (a string) under response, completion or output, or
a list of n under responses, completions or outputs:
    {"index": 0, "response": "..."}   {"idx": "0", "completion": "..."}   {"id": "p7", "responses": ["...", "..."]}
Each line names its problem by the first of these that applies, as line 1 does (`join_rule`):
- `--id-field NAME`: the --data row whose NAME has the same value, compared as text (7 and "7" are one id;
  a dotted NAME looks inside objects: extra_info.index);
- `index`: the problem's position in --data from 0 (a JSONL file's first line is 0), an integer or digits;
- the first of id, idx, unique_id that line 1 and every row of --data have, as with --id-field;
- `idx`, as a position. An idx on both sides may mean either: where the rows' idx differ from their
  positions, eval stops and asks for --id-field idx, or for positions under index.
Several lines may name one problem; problems without a line are left out. eval.py writes the same
problems.jsonl (each problem with its index, and its id where it has one) and summary.json as a sampled
eval (no lengths, no greedy).
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rewards import DataError
from grading.files import ID_FIELDS, field_value, fields_of, first_field, records, short
from tasks import has_own_splits


# where a line keeps its responses: one (a string), or a list of n (the samples of one problem)
RESPONSE_FIELDS = {"response": str, "responses": list, "completion": str, "completions": list, "output": str,
                   "outputs": list}


def read_responses(path: str, problems: list, data: str, id_field: str = "") -> tuple[list, dict[int, list[str]]]:
    """--responses FILE -> (the problems, {problem index: its responses, in file order}); where the lines are
    joined by an id field (join_rule), each problem's id is its row's value of it. With 3 problems,
    {"index": 2, "response": "a"} and {"index": "2", "responses": ["b", "c"]} -> {2: ["a", "b", "c"]}.
    Every mistake names the line, the field expected and the fields the line has."""
    if not Path(path).is_file():
        raise DataError(f"--responses {path}: no such file")
    lines = records(path)
    field, ids = join_rule(path, lines[0][1], problems, data, id_field)
    if ids is not None:
        problems = [replace(p, id=i) for p, i in zip(problems, ids)]
    index_of = {i: index for index, i in enumerate(ids or ())}
    by_index: dict[int, list[str]] = {}
    for lineno, row in lines:
        value = field_value(row, field)
        if value is None:
            raise DataError(f"{path}:{lineno}: missing field '{field}', which joins each line to its problem "
                            f"(chosen by {'--id-field' if id_field else 'line 1'}); {fields_of(row)}")
        index = position(value) if ids is None else index_of.get(str(value))
        if index is None or index >= len(problems):
            wanted = (f"an integer from 0 to {len(problems) - 1} (a problem's position in --data {data}, from 0)"
                      if ids is None else f"the {field} of one of the {len(problems)} problems of --data {data}")
            raise DataError(f"{path}:{lineno}: '{field}' must be {wanted}, got {short(value)}; {fields_of(row)}")
        by_index.setdefault(index, []).extend(line_responses(row, path, lineno))
    return problems, by_index


def join_rule(path: str, first: dict, problems: list, data: str, id_field: str) -> tuple[str, list[str] | None]:
    """The field that joins each line of a responses file to its problem, from --id-field or line 1 (`first`),
    and the problems' values of it, as text (None: the field is a position). In order: --id-field NAME ->
    (NAME, each problem's row's NAME); line 1 has index -> ("index", None); line 1 and every problem's row
    have one of ID_FIELDS -> (the first such, the rows' values); line 1 has idx -> ("idx", None). An idx
    shared with the rows may be either: where the rows' idx differ from their positions, it is refused."""
    if first.get("index") is not None and not id_field:
        return "index", None
    rows = [] if has_own_splits(data) else records(data)[:len(problems)]
    on_rows = [name for name in ID_FIELDS if rows and all(row.get(name) is not None for _, row in rows)]
    name = id_field or next((name for name in on_rows if first.get(name) is not None), None)
    if name is None and first.get("idx") is not None:
        return "idx", None
    if name is None:
        raise DataError(f"{path}:1: missing field: expected index or idx (the problem's position in --data {data}, "
                        f"from 0), an id field that every row of --data has ({', '.join(ID_FIELDS)}; its rows have "
                        f"{', '.join(on_rows) or 'none of them'}), or --id-field NAME; {fields_of(first)}")
    ids = problem_ids(data, rows, name)
    moved = next((k for k, i in enumerate(ids) if i != str(k)), None) if name == "idx" and not id_field else None
    if moved is not None:
        raise DataError(f"{path}:1: 'idx' may be a problem's position in --data {data} or its row's idx, and these "
                        f"differ ({data}:{rows[moved][0]}, position {moved}, has idx {ids[moved]}): give --id-field "
                        f"idx to join on the rows' idx, or name positions 'index'; {fields_of(first)}")
    return name, ids


def problem_ids(data: str, rows: list[tuple[int, dict]], name: str) -> list[str]:
    """Each problem's row's `name` as text, the problems' ids to join responses on: every row has one,
    and no two rows the same. Rows {"id": 7}, {"id": "a"} -> ["7", "a"]."""
    if not rows:
        raise DataError(f"--id-field {name}: --data {data} has no rows to join on (a task with its own "
                        f"problems); give each line its problem's position, index")
    first_seen: dict[str, int] = {}
    for lineno, row in rows:
        value = field_value(row, name)
        if value is None:
            raise DataError(f"{data}:{lineno}: missing field '{name}', which joins --responses lines to the rows; "
                            f"{fields_of(row)}")
        if first_seen.setdefault(str(value), lineno) != lineno:
            raise DataError(f"{data}:{lineno}: field '{name}' is {short(value)}, as on line {first_seen[str(value)]}: "
                            f"responses cannot be joined on {name}; give positions (index) or --id-field NAME")
    return list(first_seen)


def position(value) -> int | None:
    """A problem's position as a line writes it: 3 or "3" -> 3; None for anything else (-1, "x", 3.0, true)."""
    if isinstance(value, str) and value.strip().isdecimal():
        return int(value)
    return value if type(value) is int and value >= 0 else None  # type(): a bool is no position


def line_responses(row: dict, path: str, lineno: int) -> list[str]:
    """The responses of one line, in the first of RESPONSE_FIELDS it has: {"completion": "a"} -> ["a"];
    {"responses": ["a", "b"]} -> ["a", "b"]."""
    name = first_field(row, tuple(RESPONSE_FIELDS), path, lineno)
    value = row[name]
    if RESPONSE_FIELDS[name] is str:
        if not isinstance(value, str):
            raise DataError(f"{path}:{lineno}: '{name}' must be a string, got {type(value).__name__}; "
                            f"{fields_of(row)}")
        return [value]
    if not isinstance(value, list) or not value or not all(isinstance(text, str) for text in value):
        raise DataError(f"{path}:{lineno}: '{name}' must be a non-empty list of strings (a problem's responses), "
                        f"got {short(value)}; {fields_of(row)}")
    return value


def response_ks(ks: list[int], *, explicit: bool, responses: dict[int, list[str]]) -> list[int]:
    """The pass@k values for given responses: each k needs every graded problem to have k responses.
    Asked for with --k, a k beyond that is an error; else the config's are kept where they fit."""
    fewest = min(map(len, responses.values()))
    if explicit and max(ks) > fewest:
        index = min(responses, key=lambda i: len(responses[i]))
        raise DataError(f"--k {','.join(map(str, ks))}: pass@{max(ks)} needs {max(ks)} responses per problem, and "
                        f"problem {index} has {fewest}")
    return [k for k in ks if k <= fewest] or [1]
