"""Keep the rows of a data file that the model solves sometimes but not always: a filter by pass rate.

    python eval.py --model PATH --data train.jsonl -n 8 --no-greedy --out runs/rates   # each row's pass rate
    python -m extras.pass_filter train.jsonl runs/rates --keep 0.1,0.9 --out train.kept.jsonl
    python train.py --model PATH --data train.kept.jsonl --eval-data test.jsonl ...

A group whose G responses all score alike has advantage 0 and teaches nothing (`reward/zero_std_groups`);
on a small model most groups of the easiest and the hardest rows are such groups. This keeps the rows
whose pass rate lies in [lo, hi] (both ends included: with n = 8 samples, --keep 0.1,0.9 keeps 1 to 7
right of 8), once, before training, where DAPO's dynamic sampling (--dynamic-sampling) pays for it with
more generation at every step.

Rows meet their pass rates by id: the row's id, idx, unique_id or verl's extra_info.index (as grading/files.py reads it),
and the "id" that eval.py writes into problems.jsonl for a problem that has one. RATES is an eval.py
--out folder or its problems.jsonl (a problem's pass rate: its correct samples over its samples, the
avg@n of docs/math.md §6), or any JSONL of {"id": ..., "pass_rate": x}. A row without a rate is
unmatched and left out unless --keep-unmatched. The kept rows are written as JSONL, each as the file
had it, and the counts printed.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run as a file too: python extras/pass_filter.py

from grading.files import ROW_ID_FIELDS, records, row_id  # noqa: E402
from rewards import DataError  # noqa: E402


def pass_rates(path: str) -> dict[str, float]:
    """{problem id: pass rate} of an eval.py --out folder, its problems.jsonl, or a JSONL of {"id", "pass_rate"}."""
    file = Path(path) / "problems.jsonl" if Path(path).is_dir() else Path(path)
    if not file.is_file():
        raise DataError(f"{path}: no such file (give an eval.py --out folder, its problems.jsonl, or a JSONL of "
                        f'{{"id": ..., "pass_rate": x}})')
    rates = {}
    for number, line in enumerate(file.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            rate = row["pass_rate"] if "pass_rate" in row else row["correct"] / len(row["samples"])
            key = str(row["id"])
        except (ValueError, KeyError, TypeError, ZeroDivisionError):
            raise DataError(f"{file}:{number}: expected a problems.jsonl row with an id (eval.py writes one for a "
                            f'problem whose data row has an id) or {{"id": ..., "pass_rate": x}}') from None
        rates[key] = rate
    return rates


def split(rows: list[tuple[int, dict]], rates: dict[str, float], lo: float, hi: float) -> dict[str, list[dict]]:
    """The rows by verdict: kept (lo ≤ rate ≤ hi), too_easy (above hi), too_hard (below lo), unmatched (no rate).
    Rates {"a": 0, "b": 0.5, "c": 1}, keep 0.1-0.9, rows a, b, c, d -> kept b, too_hard a, too_easy c, unmatched d."""
    out = {"kept": [], "too_easy": [], "too_hard": [], "unmatched": []}
    for _, row in rows:
        rate = rates.get(row_id(row))
        verdict = ("unmatched" if rate is None else "too_hard" if rate < lo else "too_easy" if rate > hi else "kept")
        out[verdict].append(row)
    return out


def bounds(text: str) -> tuple[float, float]:
    """--keep "0.1,0.9" -> (0.1, 0.9): two rates in [0, 1], the first no larger than the second."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two rates LO,HI such as 0.1,0.9, got {text!r}") from None
    if not 0 <= lo <= hi <= 1:
        raise argparse.ArgumentTypeError(f"{text}: need 0 ≤ LO ≤ HI ≤ 1 (an empty or outside range keeps nothing)")
    return lo, hi


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m extras.pass_filter", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__.split("\n\n", 2)[2],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", help="the data file to filter (.jsonl, .json, .parquet), its rows with ids")
    parser.add_argument("rates", help="an eval.py --out folder of this file, its problems.jsonl, or a JSONL of "
                                      '{"id": ..., "pass_rate": x}')
    parser.add_argument("--keep", type=bounds, default=(0.1, 0.9), metavar="LO,HI",
                        help="keep the rows whose pass rate is in [LO, HI] (default 0.1,0.9)")
    parser.add_argument("--keep-unmatched", action="store_true", help="also keep the rows that have no pass rate")
    parser.add_argument("--out", required=True, help="the filtered file (JSONL)")
    args = parser.parse_args(argv)
    try:
        rows = records(args.data)
        if not any(row_id(row) for _, row in rows):
            raise DataError(f"{args.data}: its rows have no id ({', '.join(ROW_ID_FIELDS)}), so no pass rate can "
                            f"find its row: give each row an id field, then evaluate the file again (eval.py --data "
                            f"{args.data}) so that problems.jsonl carries the same ids")
        rates = pass_rates(args.rates)
        parts = split(rows, rates, *args.keep)
        if len(parts["unmatched"]) == len(rows):
            raise DataError(f"{args.rates}: none of its {len(rates)} ids is the id of a row of {args.data}; give the "
                            f"eval of this file (eval.py --data {args.data})")
    except (DataError, ValueError) as e:
        sys.exit(f"error: {e}")
    kept = parts["kept"] + (parts["unmatched"] if args.keep_unmatched else [])
    Path(args.out).write_text("".join(json.dumps(row) + "\n" for row in kept))
    lo, hi = args.keep
    print(f"{args.data}: {len(rows)} rows; kept {len(parts['kept'])} (pass rate in [{lo}, {hi}]), dropped "
          f"{len(parts['too_easy'])} too easy (> {hi}), {len(parts['too_hard'])} too hard (< {lo}); "
          f"{len(parts['unmatched'])} unmatched (no pass rate: {'kept' if args.keep_unmatched else 'dropped'})\n"
          f"wrote {len(kept)} rows to {args.out}")


if __name__ == "__main__":
    main()
