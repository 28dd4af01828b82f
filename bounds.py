"""What a setting may be: the one bounds check behind Config's fields (config.BOUNDS) and every
algorithm's knobs (algos/base.Knob). It imports nothing of the project, so that config.py can check
fields without importing the algorithms (and with them torch)."""
from __future__ import annotations

import math
import operator


def out_of_bounds(value, *, choices: tuple = (), above=None, at_least=None, at_most=None) -> str:
    """"" when value is one of `choices` (if any) and within every bound given, else the rule it
    breaks, whole: 2 with above 0, at_most 1 -> "must be > 0 and ≤ 1"; "z" with choices ("a", "b")
    -> "choose one of a, b". A number is finite too: inf (--opd-alpha inf) could only make every loss
    inf or NaN -> "must be a finite number"."""
    if choices and value not in choices:
        return f"choose one of {', '.join(map(str, choices))}"
    if isinstance(value, float) and not math.isfinite(value):
        return "must be a finite number"
    bounds = [(">", above, operator.gt), ("≥", at_least, operator.ge), ("≤", at_most, operator.le)]
    given = [(sign, bound, holds) for sign, bound, holds in bounds if bound is not None]
    if all(holds(value, bound) for _, bound, holds in given):
        return ""
    return "must be " + " and ".join(f"{sign} {bound}" for sign, bound, _ in given)
