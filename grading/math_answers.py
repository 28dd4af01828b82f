"""What counts as the same math answer: the rules a data file's responses are graded by, in front of
HF math-verify (docs/math.md, "Grading math answers", gives each rule with its source; docs/data-and-eval.md
what differs from the bare library, and why).

- The answer: the response's last \\boxed{} (several, where the gold has several parts) unless a
  statement of the final answer follows it ("Final Answer: The final answer is $x$"), else GSM8K's
  "#### x", an <answer> tag, the last final-answer statement ("A:", "Answer:", "The answer is"), a
  closing **x**, what math-verify finds in the tail, the last number that stands alone (never digits
  inside a word: "H2O").
- A gold of several parts needs every part, in any order, each matched once (OlympiadBench); a
  response without boxes or a final answer is read whole, against the parts as one set.
- A gold written as a list without boxes ("(2, 2), (6, 2)", "\\{1, 2, 3\\}") reads the response's
  closing run of boxes as one answer, "\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}", labels
  within one sentence included ("$y_1 = \\boxed{...}$ and $y_2 = \\boxed{...}$", the assignment kept);
  a box that a sentence's end or a step word ("so", "wait", "actually") separates from the run is a
  step, never a part: a self-correction's first try is not paid.
- A lone number whose comma cannot group thousands ("1,22", "0,5") also reads as a decimal (1.22);
  three digits after a comma of a number of up to three digits group thousands ("1,000" is 1000).
- Times of day are compared as times, not ratios ("4:30 p.m." is not 2/15).
- A letter the gold uses as a variable is never dropped as a unit ("4t" is not "4"); units stay
  droppable where the gold is a number or a quantity ("10 cm" is 10). Euler's number written
  upright, "\\mathrm{e}", is e.
- `precheck`: plain arithmetic whose value cannot be close to the gold, or cannot be computed in
  bounded time (a huge factorial, an exponent tower, hundreds of nested fractions), scores 0 here
  exactly, without the library, so such an answer never holds a worker until its timeout.
- Every other answer is graded within MATH_CPU_SECONDS of its worker's CPU time, or scores 0 as a
  timeout there (an expression whose size explodes under sympy: (x+1)^{1000}, a power tower against
  an integral, \\binom{10^9}{5 \\cdot 10^8}).

grading/pool.py's MathGrader runs this module as its worker (with --math-worker): the parent sends
`math_request`s, found here in bounded time, and the worker judges them with math-verify. The
extraction rules (boxes, the parts of a list, final-answer statements, a data file's gold answer:
`gold_answer`) come first.
"""
from __future__ import annotations

import json
import math
import operator
import re
import sys
from dataclasses import dataclass, replace
from fractions import Fraction
from itertools import accumulate

from rewards import Verdict, extract_tag


# ----------------------------------------------------------------------------- boxes, parts, final-answer statements

_BRACES = re.compile(r"[{}]")
_BRACELESS_BOX = re.compile(r" +([^\s$]+)")  # "\\boxed 5"


class AnswerTooLong(ValueError):
    """A final answer longer than math_answers.MATH_ANSWER_CHARS: not a sane answer, scored 0 without parsing."""


def last_box(text: str, max_chars: int | None = None) -> tuple[str, int] | None:
    """(content, the index just past it) of the last \\boxed{...} or \\fbox{...}, with nested braces,
    as MATH solutions write them: "so \\boxed{\\frac{1}{2}}." -> ("\\frac{1}{2}", 22); the brace-less
    "\\boxed 5" -> ("5", 8); None when there is none or it is unclosed. Given max_chars, at most
    max_chars + 2 characters after the macro are read, and a box that does not end within them
    raises AnswerTooLong."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    return _box_at(text, start, max_chars) if start >= 0 else None


def _box_at(text: str, start: int, max_chars: int | None) -> tuple[str, int] | None:
    """(content, the index just past the box) of the \\boxed or \\fbox macro at `start`, as
    last_box reads it; None when it is unclosed."""
    i = start + (6 if text.startswith("\\boxed", start) else 5)  # after "\\boxed" / "\\fbox"
    end = len(text) if max_chars is None else min(len(text), i + max_chars + 2)  # + the braces
    if not text.startswith("{", i):
        found = _BRACELESS_BOX.match(text, i, end)
        if found and found.end() == end < len(text):  # the token may go on past what was read
            raise AnswerTooLong
        return (found.group(1), found.end()) if found else None
    depth = 0
    for brace in _BRACES.finditer(text, i, end):
        depth += 1 if brace.group() == "{" else -1
        if depth == 0:
            return text[i + 1:brace.start()].strip(), brace.end()
    if end < len(text):
        raise AnswerTooLong
    return None


# What may stand between the boxes of one answer, whatever its length: spaces, commas, "and", "or" --
# the joins across which math-verify's own parser reads several boxed answers as one set (parser.py,
# `next_groups`) -- and what only lays them out: math delimiters ($, \( \), \[ \]) and LaTeX spacing
# (\quad, \qquad, \, \; ~)
_BOX_GAP = re.compile(r"(?:\s|\$|,|~|\\[()\[\],;:! ]|\\q?quad(?![A-Za-z])|\\text\{\s*(?:and|or)\s*\}|\band\b|\bor\b)*")
# Words between two boxes, within one sentence, may label them ("\\boxed{(3, 3)} for part (a) and
# \\boxed{(1, 1)}", "$y_1 = \\boxed{...}$ and $y_2 = \\boxed{...}$"), as math-verify's own rule has it
# (latex2sympy2_extended, extract_boxed_content: boxes under 10 characters apart, or under 70 with
# "and", "or", "," or ";" between, are one answer); but a sentence's end or a word that moves on from
# a box or takes it back ("so", "then", "wait", "actually", "not" ...) makes the box before it a step,
# so that a self-correction's first try is never a part of the answer
_LABEL_CHARS, _NEAR_CHARS = 70, 10
_SEPARATOR = re.compile(r"\b(?:and|or)\b|[,;]")
_SENTENCE_END = re.compile(r"[.!?](?=\s|\$|\\[)\]]|\Z)|\n\s*\n")
_STEP_WORD = re.compile(r"(?i)\b(?:so|thus|hence|therefore|then|gives?|giving|yields?|implies|means|gets?|"
                        r"wait|actually|no|not|rather|instead|but|however|oops|sorry|hmm+|wrong|mistakes?|"
                        r"correct\w*|\w*check\w*|again|try|trying|retry)\b|\\(?:to|iff|\w*rightarrow)\b")
# an assignment that labels the box after it, "y_2 = ", "\\alpha_{1} = ": kept with a list's parts
_BOX_LABEL = re.compile(r"(?<![\w\\])((?:\\[A-Za-z]+|[A-Za-z])(?:_\{?\w+\}?)?)\s*=\s*(?:\$|\\[(\[])?\s*\Z")


def last_boxes(text: str, max_chars: int | None = None, most: int | None = None, joined: bool = True,
               labelled: bool = False) -> list[str]:
    """Contents of the last box (as last_box reads it) and of the boxes before it, in order,
    at most `most`. joined: only the boxes of one answer, each joined to the next by _joins:
    "so $\\boxed{3}$ and $\\boxed{5}$." -> ["3", "5"]; "\\boxed{3} \\text{ for (a) and } \\boxed{5}"
    -> ["3", "5"]; "$\\fbox{5}$ then $\\fbox{7}$" -> ["7"]; "\\boxed{5}. Wait: \\boxed{7}" -> ["7"].
    Not joined: any boxes, "(a) \\boxed{3}. (b) \\boxed{5}" -> ["3", "5"]. labelled: a box that an
    assignment labels (_BOX_LABEL) keeps it: "$x_1 = \\boxed{3}$, $x_2 = \\boxed{5}$" -> ["x_1 = 3",
    "x_2 = 5"]. [] when there is no closed last box. Only the last box raises AnswerTooLong; an
    earlier box past max_chars, a gap past max_chars (joined), or a box that encloses the box after
    it, ends the list."""
    found: list[str] = []
    stop = len(text)
    while most is None or len(found) < most:
        start = max(text.rfind("\\boxed", 0, stop), text.rfind("\\fbox", 0, stop))
        try:
            box = _box_at(text, start, max_chars) if start >= 0 else None
        except AnswerTooLong:
            if not found:
                raise
            box = None
        if box is None or box[1] > stop or (found and joined and not _joins(text, box[1], stop, max_chars)):
            break
        label = _BOX_LABEL.search(text, max(0, start - _LABEL_CHARS), start) if labelled else None
        found.insert(0, f"{label.group(1)} = {box[0]}" if label and "=" not in box[0] else box[0])
        stop = start
    return found


def _joins(text: str, end: int, start: int, max_chars: int | None) -> bool:
    """Whether text[end:start], between two boxes, joins them into one answer: only _BOX_GAP, at
    most max_chars long (a megabyte of spaces between two boxes is read as text, in bounded time),
    or words within one sentence, as math-verify joins them, none of them a _STEP_WORD:
    " \\text{ for part (a) and } " and "$ and $y_2 = " join; ". Then " and " so " do not."""
    if max_chars is not None and start - end > max_chars:
        return False
    if _BOX_GAP.fullmatch(text, end, start):
        return True
    gap = text[end:start]
    return (len(gap) < _LABEL_CHARS and (len(gap) < _NEAR_CHARS or _SEPARATOR.search(gap) is not None)
            and not _SENTENCE_END.search(gap) and not _STEP_WORD.search(gap))


# a comma between a digit and three more that end a number: a thousands separator, not a list's comma
THOUSANDS_COMMA = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


def split_parts(text: str) -> list[str]:
    """The parts of a list written in one answer: text split at its commas outside brackets, as
    OlympiadBench's judge splits answers (`split_by_comma`), but never at a thousands separator;
    empty parts dropped. "(1, 2), [3, 4)" -> ["(1, 2)", "[3, 4)"]; "1,000, 7" -> ["1,000", "7"]."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c in "([{") - (c in ")]}")
        if c == "," and depth == 0 and not THOUSANDS_COMMA.match(text, i):
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def answer_parts(answer: str) -> list[str]:
    """The parts of a gold answer every one of which a response must give. Several boxes --
    gold_answer's form of a multi-part answer, "\\boxed{3} \\boxed{5}" -- are the parts, each split
    by split_parts: ["3", "5"]; "\\boxed{1, 2} \\boxed{7}" -> ["1", "2", "7"]. Anything else is one
    part, which math-verify reads whole: "1, 2, 5" -> ["1, 2, 5"] (a set, as MATH writes it; against
    such a list the response's closing run of boxes is read, listed_parts)."""
    boxes = last_boxes(answer)
    return [part for box in boxes for part in split_parts(box)] if len(boxes) > 1 else [answer]


_DOLLARS = re.compile(r"\$+([^$]*)\$+")  # "$k = 45, n = 2$", as answer fields often write a gold
_SET_LITERAL = re.compile(r"(?:\\left)?\\?\{(.*?)(?:\\right)?\\?\}", re.DOTALL)  # "\\{1, 2\\}", "{1,2}"


def listed_parts(gold: str) -> list[str]:
    """The parts of a one-part gold written as a list without boxes: its top-level commas
    (split_parts), or the elements of a set written whole, $ or $$ around either ignored.
    "(2, 2), (6, 2)" -> ["(2, 2)", "(6, 2)"]; "$k = 45, n = 2$" -> ["k = 45", "n = 2"]; "{1,2,3}" and
    "\\{1, 2, 3\\}" -> ["1", "2", "3"]; "1,22" -> ["1", "22"] (decimal_reading adds 1.22). One part,
    not a list: a tuple or an interval, "(1, 2)" and "[0, 1)" (a point is one answer); a number with
    thousands, "1,000"; two sets, "\\{1\\} \\cup \\{2, 3\\}". Against a list, the worker joins the
    response's closing run of boxes into one answer (_math_verdict)."""
    text = _unwrapped(gold)
    parts = split_parts(text)
    braces = _SET_LITERAL.fullmatch(text) if len(parts) == 1 else None
    if braces:
        # the first brace must close at the end: "\\{1\\} \\cup \\{2, 3\\}" dips below depth 0 inside
        depths = [0, *accumulate((c in "([{") - (c in ")]}") for c in braces.group(1))]
        if min(depths) == 0 == depths[-1]:
            return split_parts(braces.group(1))
    return parts


def _unwrapped(gold: str) -> str:
    """The gold without the spaces and the $ or $$ around it: " $k = 45$ " -> "k = 45"."""
    dollars = _DOLLARS.fullmatch(gold.strip())
    return dollars.group(1).strip() if dollars else gold.strip()


# A final-answer statement: "A:" opening a line (the answers of GSM8K's few-shot chain-of-thought
# exemplars, lm-eval-harness gsm8k-cot), "Answer:" and "Final Answer:" (simple-evals' ANSWER_PATTERN,
# Minerva's "Final Answer: The final answer is $x$. I hope it is correct."), "the answer is" (the
# same exemplars' "The answer is 6.", Qwen2.5-Math's extract_answer)
_STATEMENT = re.compile(r"(?m:^[ \t]*A[ \t]*:)|(?i:\banswer[ \t]*:|\banswer is\b:?)")
_STATED = re.compile(r"\s*([^\n]*)")
# GSM8K's calculator annotations, "48/2 = <<48/2=24>>24": they repeat the result that follows them
CALCULATOR_ANNOTATION = re.compile(r"<<[^<>\n]*>>")
_MINERVA_TAIL = "I hope it is correct."


def stated_answer(text: str) -> tuple[str, str] | None:
    """(its line, the answer) of the last final-answer statement of a text, the answer being the
    rest of that line (or the next line when the marker ends one), without calculator
    annotations, Minerva's closing sentence, a full stop, bold ** or one pair of $:
    "A: <<3+4=7>>7\\n" -> ("A: <<3+4=7>>7", "7"); "Final Answer: The final answer is $\\frac{1}{2}$.
    I hope it is correct." -> (that line, "\\frac{1}{2}"); None when there is none or it is empty."""
    last = None
    for last in _STATEMENT.finditer(text):
        pass
    if last is None:
        return None
    rest = _STATED.match(text, last.end())
    answer = CALCULATOR_ANNOTATION.sub("", rest.group(1)).split(_MINERVA_TAIL)[0]
    answer = answer.strip().rstrip(".").strip("* ")
    if answer.count("$") == 2 and answer.startswith("$") and answer.endswith("$"):
        answer = answer[1:-1].strip()
    return (text[text.rfind("\n", 0, last.start()) + 1:rest.end()], answer) if answer else None


def gold_answer(raw: str) -> str:
    """The gold answer from an answer/solution field, by the first rule that applies: GSM8K's
    "...#### 72" -> "72"; the boxes of a MATH solution, "... \\boxed{3}" -> "3", the last box alone
    when a sentence's end or a step word stands before it (_joins; Hendrycks' last_boxed_only_string:
    earlier boxes are steps), all of them, kept boxed, when they are the parts of one answer: "roots
    $\\boxed{3}$ and $\\boxed{5}$" -> "\\boxed{3} \\boxed{5}" (answer_parts reads them back); a final-answer
    statement (stated_answer: "A: 55", "Answer: 55", "The answer is 55"); else the field, stripped.
    A gold field's trailing **bold** is not read: in a written solution it is emphasis."""
    if "####" in raw:
        return raw.split("####")[-1].strip()
    boxes = last_boxes(raw)
    if len(boxes) > 1:
        return " ".join(f"\\boxed{{{box}}}" for box in boxes)
    if boxes and boxes[0]:
        return boxes[0]
    stated = stated_answer(raw)
    return stated[1] if stated else raw.strip()


# ----------------------------------------------------------------------------- grading a response

MATH_ANSWER_CHARS = 4096  # the most of a response a math worker sees: sane final answers are far shorter
MAX_PARTS = 10  # boxes read for a multi-part gold: matching compares up to MAX_PARTS² pairs in one worker call
# a number standing alone: not inside a word ("H2O", "x2", "x_2") nor the fraction part of a decimal
_NUMBER = re.compile(r"(?<!\w)(?<!\d\.)-?\d[\d,]*(?:\.\d+)?(?!\w)")
_BOLD = re.compile(r"\*\*([^*\n]+)\*\*[\s.!]*\Z")  # a closing "**55**."


# The most CPU time a worker spends on one answer before it scores 0 as a timeout (_within_cpu):
# an answer whose comparison explodes (a power of a sum expanded, (x+1)^{1000}: 5 s; a power tower
# against an integral: 4 s; \binom{10^9}{5 \cdot 10^8}: unbounded) ends here, in the worker, instead
# of at the parent's --grade-timeout and a worker restart. On this CPU the slowest answer of the
# suite's fixtures takes at most 0.3 s, of math-verify's own test triples 0.55-0.84 s (a wrong one; the
# next 0.25 s); the worst pairing of a multi-part gold, ten polynomials answered in reverse order (55
# comparisons), 0.9 s: a gold of that many symbolic parts may time out.
MATH_CPU_SECONDS = 0.9


class _OverCPU(BaseException):
    """An answer's grading passed MATH_CPU_SECONDS. A BaseException, as math-verify's own
    TimeoutException is, so that no `except Exception` in sympy or the library swallows it."""


def _math_worker() -> None:
    """The child side of MathGrader: `math_request` JSON lines in, Verdict JSON lines out; each
    answer graded within MATH_CPU_SECONDS (_within_cpu), or scored 0 as a "timeout"."""
    import logging
    import signal

    import math_verify
    logging.getLogger("math_verify").setLevel(logging.ERROR)  # "timeout disabled": the parent times us
    signal.signal(signal.SIGPROF, _on_cpu_limit)
    # a first grading is slow, and so are the first simplification and the first relation (sympy imports
    # modules on first use: 0.2-0.4 s each, halved for what follows): no answer's fault, nor its CPU time
    for gold, response in (("1", "\\boxed{1}"), ("x^2-1", "\\boxed{(x-1)(x+1)}"),
                           ("1 \\le x \\le 2", "\\boxed{x \\in [1, 2]}")):
        _math_verdict(math_verify, **math_request(response, gold))
    print(json.dumps("ready"), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        try:
            reward, answer = _within_cpu(MATH_CPU_SECONDS, _math_verdict, math_verify, **request)
            reply = {"reward": reward, "answer": answer, "failure": ""}
        except _OverCPU:
            reply = {"reward": 0.0, "answer": None, "failure": "timeout"}
        except Exception:  # noqa: BLE001 - any grader crash scores 0 and is counted, never kills the run
            reply = {"reward": 0.0, "answer": None, "failure": "error"}
        print(json.dumps(reply), flush=True)


_cpu_limited = False  # whether a SIGPROF now ends the grading (_within_cpu arms it)


def _on_cpu_limit(signum, frame) -> None:
    if _cpu_limited:
        raise _OverCPU


def _within_cpu(seconds: float, fn, *args, **kwargs):
    """fn(*args, **kwargs), raising _OverCPU once this process has spent `seconds` of CPU time on
    it (SIGPROF, which a worker routes to _on_cpu_limit; math-verify's own timeout interrupts sympy
    the same way, by a signal, on wall time). The signal repeats every 0.05 s until fn ends, in case
    a bare `except:` in sympy swallows one; when fn ends the flag goes down first, so that a signal
    still pending then does nothing. CPU time, not wall time: a verdict does not depend on how
    loaded the machine is."""
    import signal
    global _cpu_limited
    _cpu_limited = True
    signal.setitimer(signal.ITIMER_PROF, seconds, 0.05)
    try:
        return fn(*args, **kwargs)
    finally:
        _cpu_limited = False
        signal.setitimer(signal.ITIMER_PROF, 0)


def _math_verdict(mv, region: str, number: str | None, gold: str, parts: list | tuple = (),
                  run: list | tuple = ()) -> tuple[float, str | None]:
    """(reward, normalised answer): a gold of several parts (answer_parts) against the
    response's `parts` (none: its region, _parts_verdict), else the gold against the response's
    answer region, else its last number, the gold read as written and, failing that, with a
    decimal comma (decimal_reading). Against a gold written as a list (listed_parts) the region is
    the response's closing `run` of boxes as one box, which math-verify reads as a set: ["(2, 2)",
    "(6, 2)"] -> "\\boxed{(2, 2), (6, 2)}"; a run of more than MATH_ANSWER_CHARS in all is not
    joined. mv is the math_verify module."""
    golds = answer_parts(gold)
    if len(golds) > 1:
        return _parts_verdict(mv, golds, parts, region)
    joined = ", ".join(run)
    if len(run) > 1 and len(joined) <= MATH_ANSWER_CHARS and len(listed_parts(gold)) > 1:
        region = "\\boxed{" + joined + "}"
    verdict = _judge(mv, gold, region, number)
    decimal = decimal_reading(gold)
    return _judge(mv, decimal, region, number) if decimal and not verdict[0] else verdict


# Euler's number written upright (ISO 80000-2), "\\mathrm{e}": latex2sympy reads it as a word, and a
# formula around it not at all ("1 - \\frac{1}{\\mathrm{e}}" parses as 1, so that 1 + 1/e matched it)
_UPRIGHT_E = re.compile(r"\\mathrm\s*\{\s*e\s*\}")


def _judge(mv, gold: str, region: str, number: str | None = None) -> tuple[float, str | None]:
    """(reward, normalised answer) of one gold answer against an answer region (else a number),
    read as the gold asks: against a time of day, the region's last time of day (clock_time; the
    library would read "4:30" as the ratio 2/15); against a gold that writes a letter as a
    variable (uses_variables), math-verify without its unit dropping, which reads the letters
    t, s, m, h, c ... after a number as units ("4t" as 4); else math-verify as configured upstream,
    on both sides with an upright e as e (_UPRIGHT_E). A gold the library cannot read is compared
    as text."""
    clock = clock_time(gold, whole=True)
    if clock is not None:
        said = clock_time(region)
        return float(said is not None and same_clock(clock, said)), said and _clock_text(said)
    latex = mv.LatexExtractionConfig(boxed_match_priority=0)
    if uses_variables(gold):
        latex = replace(latex, normalization_config=replace(latex.normalization_config, units=False))
    configs = [latex, mv.ExprExtractionConfig()]

    def parse(text: str) -> list:
        return mv.parse(_UPRIGHT_E.sub("e", text), extraction_config=configs, parsing_timeout=None)

    gold_parsed = parse("\\boxed{" + gold + "}")  # gold first: math-verify treats it as the reference
    pred = parse(region) or (parse(number) if number else [])
    if not pred:
        return 0.0, None
    answer = str(pred[0])
    if not gold_parsed:  # a gold answer math-verify cannot read: exact text match
        return float(pred[-1].strip() == gold.strip()), answer
    return float(mv.verify(gold_parsed, pred, timeout_seconds=None)), answer


def _parts_verdict(mv, golds: list[str], parts: list[str], region: str) -> tuple[float, str | None]:
    """Every part of a multi-part gold against its own part of the response, in any order, as
    OlympiadBench's judge (eval/auto_scoring_judge.py) pairs answer lists: the same number of
    parts, each gold part taking the first unpaired response part equal to it (_judge). The
    response's parts are read from its last boxes back, each split by split_parts, until
    there are as many as the gold's: "\\boxed{3} and \\boxed{5}" or "\\boxed{5, 3}" against
    ["3", "5"] -> 1; "\\boxed{5}" -> 0 (a part missing). A response without boxes or a final
    answer gives no parts: the gold's parts, as one set, are read against its region as
    math-verify reads them, "$${3, 5}$$" -> 1. The answer, for maj@n, is the parts sorted."""
    if not parts:
        return _judge(mv, ", ".join(golds), region)
    said: list[str] = []
    for box in reversed(parts):
        if len(said) >= len(golds):
            break
        said = split_parts(box) + said
    answer = ", ".join(sorted(said)) or None
    if len(said) != len(golds):
        return 0.0, answer
    unpaired = list(said)
    for gold in golds:
        pair = next((part for part in unpaired if _judge(mv, gold, "\\boxed{" + part + "}")[0]), None)
        if pair is None:
            return 0.0, answer
        unpaired.remove(pair)
    return 1.0, answer


def math_request(response: str, gold: str) -> dict:
    """What a math worker is sent of a response (calculator annotations removed): its answer
    region, its last MAX_PARTS boxes (or its final answer) for a multi-part gold, and the last
    number of its tail for when the region holds no answer math-verify can read, and its closing
    run of boxes (last_boxes, joined and labelled: a sentence's end or a step word between boxes
    makes the earlier ones steps) for a gold written as a list: "Trying \\boxed{(2, 2)}. So
    \\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}" -> parts ["(2, 2)", "(2, 2)",
    "(6, 2)"], run ["(2, 2)", "(6, 2)"]. A final-answer statement after the last box is the
    answer, and stands for the boxes (_final_answer)."""
    response = CALCULATOR_ANNOTATION.sub("", response)
    region, answer = _final_answer(response)
    stated_last = not region.startswith("\\boxed{")  # no box, or a final answer stated after the last
    boxes = [] if stated_last else last_boxes(response, MATH_ANSWER_CHARS, MAX_PARTS, joined=False)
    numbers = _NUMBER.findall(_tail(response, MATH_ANSWER_CHARS))
    return {"region": region, "gold": gold, "number": numbers[-1].replace(",", "") if numbers else None,
            "parts": boxes or ([answer] if answer else []),
            "run": [] if stated_last else last_boxes(response, MATH_ANSWER_CHARS, MAX_PARTS, labelled=True)}


_FINAL_ANSWER = re.compile(r"(?i)\bfinal answer\b")


def _final_answer(response: str) -> tuple[str, str | None]:
    """(the region math-verify reads, the final answer as written, or None) by the first
    convention the response follows: its last \\boxed{} (alone: math-verify would join "\\boxed{5},
    ... \\boxed{7}" into the set {5, 7}, and a self-corrected trace would score 0), unless a
    statement of the final answer ("Final Answer: The final answer is $x$", Minerva's) follows it,
    which is the later answer: the box was a step; the line after GSM8K's "####"; an <answer>
    tag's content; a final-answer statement (stated_answer, whose line is the region, so that
    math-verify's own "answer" anchors read "The answer is 54, not 53" as 54); a closing **bold**
    span (math-verify's own number patterns accept ** around a number); else the end of the text,
    at most about MATH_ANSWER_CHARS, with no final answer as such. Found in linear time; a box,
    line or tag longer than MATH_ANSWER_CHARS raises AnswerTooLong."""
    box = last_box(response, MATH_ANSWER_CHARS)
    if box is not None:
        later = stated_answer(response[max(box[1], len(response) - MATH_ANSWER_CHARS):])  # read in the tail
        if later is not None and _FINAL_ANSWER.search(later[0]):
            return _short(later[0]), later[1]
        return "\\boxed{" + box[0] + "}", box[0]
    hashes = response.rfind("####")
    if hashes >= 0:
        line = _short(response[hashes + 4:].strip().partition("\n")[0])
        return line, line
    tag = extract_tag(response)
    if tag is not None:
        return "$" + _short(tag) + "$", tag
    stated = stated_answer(response)
    if stated is not None:
        return _short(stated[0]), stated[1]
    tail = _tail(response, MATH_ANSWER_CHARS)
    bold = _BOLD.search(tail)
    return (bold.group(1), bold.group(1)) if bold else (tail, None)


def _short(answer: str) -> str:
    if len(answer) > MATH_ANSWER_CHARS:
        raise AnswerTooLong
    return answer


def _tail(text: str, chars: int) -> str:
    """The last `chars` characters of text at most, from a word boundary (a number cut in two
    would be another number): _tail("so x is 1234", 6) -> "1234"; "" when no boundary is in them."""
    if len(text) <= chars:
        return text
    tail = text[-chars - 1:]
    space = re.search(r"\s", tail)
    return tail[space.end():] if space else ""


# ----------------------------------------------------------------------------- how the gold reads an answer

_COMMA_NUMBER = re.compile(r"(-?\d+),(\d+)")
_GROUPED = re.compile(r"-?[1-9]\d{0,2},\d{3}")  # a thousands separator: 1-3 digits (no leading 0), then 3


def decimal_reading(gold: str) -> str | None:
    """The gold read with a decimal comma, as much of Europe writes decimals, where it is a lone
    number with one comma that cannot group thousands: "1,22" -> "1.22"; "0,111" -> "0.111" (no
    group starts with 0); "1234,5" -> "1234.5". None for "1,000" (thousands: 1000, never 1.0),
    "1, 22" (a comma with a space after it is a list's), "1,2,3" and anything else. The gold keeps
    its reading as written, a list ("1,22": the set {1, 22}); an answer equal to either scores 1."""
    text = _unwrapped(gold)
    number = _COMMA_NUMBER.fullmatch(text)
    return None if number is None or _GROUPED.fullmatch(text) else f"{number.group(1)}.{number.group(2)}"


# upright text, whose letters are words (units, names), not variables: \text{ cm}, \mathrm{m}, \mbox{...}
_TEXT_MACRO = re.compile(r"\\(?:text(?:rm|normal|up|sf|tt|bf|it)?|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_UNIT_WORD = re.compile(r"(?<=\s)[A-Za-z]{2,}")  # "10 cm", "3 hours": a word set off by a space


def uses_variables(gold: str) -> bool:
    """Whether a gold answer writes a Latin letter as a variable: one outside upright text
    (\\text{}, \\mathrm{}, \\mbox{}) and LaTeX commands, other than a word of two or more letters
    set off by a space (a unit). A bare letter in mathematics is italic, a variable; Minerva's
    answer normalisation (Lewkowycz et al. 2022, appendix D) likewise removes unit words and
    \\text{} units, never a bare letter. "4t", "x^2+2x+1", "3ab", "10 m" -> True; "10 cm",
    "5\\text{ m}", "\\text{(C)}", "\\frac{\\pi}{2}", "30^\\circ" -> False."""
    bare = _UNIT_WORD.sub("", _LATEX_COMMAND.sub("", _TEXT_MACRO.sub("", gold)))
    return re.search(r"[A-Za-z]", bare) is not None


_SPACING = re.compile(r"\\[ ,;:!]|~|\$")
# a time of day: H:MM, H:MM:SS or H, with a.m./p.m. (any case, dots and spaces optional) required after H
_CLOCK = re.compile(r"(?<![\d:.])(\d{1,2})(?::([0-5]\d)(?::([0-5]\d))?)?(?![\d:])\s*(?:([ap])\.?\s*m\b\.?)?", re.I)
_HALF_DAY = 12 * 3600


def clock_time(text: str, whole: bool = False) -> tuple[int, bool] | None:
    """(seconds after midnight, ambiguous?) of the whole text read as a time of day, or (whole
    False) of its last time of day; None when there is none. Upright text macros, LaTeX spacing
    and $ are ignored: "\\text{4:30 p.m.}" -> (59400, False); "16:30" -> (59400, False); "12:05 a.m."
    -> (300, False); "4:30" -> (16200, True): without a.m./p.m. an hour from 1 to 12 is ambiguous
    (same_clock). Hours past 12 with a.m./p.m., past 23 without, or a bare number are no time."""
    text = _SPACING.sub(" ", _TEXT_MACRO.sub(r"\1", text)).strip()
    found = [_CLOCK.fullmatch(text)] if whole else list(_CLOCK.finditer(text))
    for match in reversed(found):
        if match is None:
            continue
        hour, minute, second, half = match.groups()
        hour, seconds = int(hour), int(minute or 0) * 60 + int(second or 0)
        if half and 1 <= hour <= 12:
            return (hour % 12 + 12 * (half.lower() == "p")) * 3600 + seconds, False
        if minute and not half and hour <= 23:
            return hour * 3600 + seconds, 1 <= hour <= 12
    return None


def same_clock(gold: tuple[int, bool], said: tuple[int, bool]) -> bool:
    """Whether an answer's time of day is the gold's: the same time, or, for a gold without
    a.m./p.m. (ambiguous), the same reading of a 12-hour clock: gold "4:30" takes "4:30 p.m.",
    "16:30" and "4:30 a.m."; gold "4:30 p.m." takes "16:30" but not the ambiguous "4:30"."""
    return gold[0] == said[0] or (gold[1] and (gold[0] - said[0]) % _HALF_DAY == 0)


def _clock_text(clock: tuple[int, bool]) -> str:
    """A time of day for maj@n to vote on: "16:30"; seconds when there are some: "4:30:05"."""
    minutes, second = divmod(clock[0], 60)
    return f"{minutes // 60}:{minutes % 60:02d}" + (f":{second:02d}" if second else "")


# ----------------------------------------------------------------------------- the pre-check

PRECHECK_BITS = 8192  # exact values are kept up to this many bits; past it, a lower bound on |x|
PRECHECK_DEPTH = 8  # brackets nested deeper stall math-verify (10 nested fractions: 0.4 s, 20: over 5 s)
_MOST_BITS = 1 << 40  # lower bounds are capped here: a smaller lower bound is still a true one


@dataclass(frozen=True)
class Huge:
    """A number known by a lower bound on its size only: |x| >= 2**bits; sign 1, -1 or 0 (unknown)."""
    bits: int
    sign: int


def precheck(response: str, gold: str) -> Verdict | None:
    """Verdict 0, reached without math-verify, on a final answer that could stall the library --
    one whose value passes PRECHECK_BITS (a factorial of a huge number, a tower of exponents, a
    long number) or which nests brackets deeper than PRECHECK_DEPTH (hundreds of nested
    fractions) -- and whose value cannot be within the library's tolerance of the gold's; None
    for every other answer (a worker grades it). Only plain arithmetic is read (arithmetic()),
    on both sides; a multi-part gold is left to the worker.

    Why no right answer is lost: it only ever says 0; arithmetic() reads an answer as the library
    does (tests/test_answers.py compares them), exactly or, past PRECHECK_BITS, by a proven lower
    bound on |x|; and it says 0 only when the exact distance to the gold is over 1/1000 of
    max(1, |gold|) or the bound puts |x| above twice |gold|, while the library takes two such
    numbers for equal only when they agree to 6 decimals (floats) or exactly (verify's
    float_rounding 6, numeric_precision 15). OlympiadBench's judge scores a power whose exponent
    is over 1000 as 0 outright (can_compute_power); this decides only what it can prove."""
    try:
        _, answer = _final_answer(CALCULATOR_ANNOTATION.sub("", response))
        if answer is None or len(answer_parts(gold)) > 1:
            return None
        said, expected = arithmetic(answer), arithmetic(THOUSANDS_COMMA.sub("", gold))
    except Exception:  # noqa: BLE001 - AnswerTooLong (MathGrader scores it 0 unsent), or a bug: the worker grades it
        return None
    if said is None or not said[1] or expected is None or isinstance(expected[0], Huge):
        return None
    return Verdict(0.0, answer) if _far(said[0], expected[0]) else None


def _far(value: Fraction | Huge, gold: Fraction) -> bool:
    """Whether value is certainly outside the library's tolerance of the gold (see precheck)."""
    if isinstance(value, Huge):
        return value.bits >= _log2_above(gold) + 1  # |value| >= 2 |gold|, and |gold| < 2**_log2_above
    return abs(value - gold) * 1000 > max(1, abs(gold))


_ARITHMETIC_TOKEN = re.compile(r"\s+|(\d+(?:\.\d+)?)|(\\[dt]?frac|\\cdot|\\times|\\div|\\left|\\right|[-+*/^!(){}])|.",
                               re.DOTALL)
_OPERATOR = {"\\cdot": "*", "\\times": "*", "\\div": "/"}
_EXACT = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}
_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3, "^": 4}  # -3^2 = -(3^2), as latex2sympy reads it


def arithmetic(latex: str) -> tuple[Fraction | Huge, bool] | None:
    """(value, could it stall math-verify?) of a LaTeX answer made of decimal numbers, + - * / \\cdot
    \\times \\div, ^{...} or ^digit, \\frac{}{} (\\dfrac, \\tfrac), n!, ( ), { } and \\left( \\right);
    None for anything else or anything that reads two ways ("!!", "2^{3}!", "3!^2", "2^10", "2(3)",
    "\\frac12"). "-3^2" -> (Fraction(-9), False); "(10^{100})!" -> (Huge(...), True): the value
    passes PRECHECK_BITS, or the brackets nest deeper than PRECHECK_DEPTH. An iterative
    operator-precedence parse, each step bounded by PRECHECK_BITS: no nesting reaches Python's
    recursion limit, and any answer of MATH_ANSWER_CHARS takes milliseconds."""
    read = _arithmetic_tokens(latex)
    if read is None:
        return None
    tokens, deepest = read
    values: list = []
    ops: list[str] = []  # "(" or an operator
    expect, huge = True, False  # an operand comes next; a value passed PRECHECK_BITS

    def push(value) -> bool:
        nonlocal huge
        values.append(value)
        huge |= isinstance(value, Huge)
        return value is not None

    def reduce(op: str) -> bool:
        right = values.pop()
        return push(_apply(op, None if op == "neg" else values.pop(), right))

    for token in tokens:
        if token == "!":
            if expect or (ops and ops[-1] == "^"):
                return None  # "2^{3}!": a factorial of the exponent, or of the power?
            if not push(_factorial(values.pop())):
                return None
        elif expect:
            if isinstance(token, Fraction):
                if not push(_bounded(token)):
                    return None
                expect = False
            elif token in ("(", "-"):
                ops.append("neg" if token == "-" else "(")
            elif token != "+":  # a sign + changes nothing
                return None
        elif isinstance(token, Fraction) or token == "(":
            return None  # a product without a sign: "2(3)"
        else:  # ")" or a binary operator: first reduce what binds tighter (^ groups to the right)
            while ops and ops[-1] != "(" and (token == ")" or _PRECEDENCE[ops[-1]] > _PRECEDENCE[token]
                                              or _PRECEDENCE[ops[-1]] == _PRECEDENCE[token] != 4):
                if not reduce(ops.pop()):
                    return None
            if token != ")":
                ops.append(token)
                expect = True
            elif not ops:
                return None
            else:
                ops.pop()
    while ops and ops[-1] != "(" and not expect:
        if not reduce(ops.pop()):
            return None
    if expect or ops or len(values) != 1:
        return None
    return values[0], huge or deepest > PRECHECK_DEPTH


def _arithmetic_tokens(latex: str) -> tuple[list, int] | None:
    """The tokens of arithmetic() with the LaTeX resolved, and the deepest nesting of brackets:
    numbers as Fractions, \\frac{a}{b} as ( ( a ) / ( b ) ), { } as ( ), \\cdot and \\times as *,
    \\div as /. "\\frac{1}{2}^{3}" -> (["(", "(", 1, ")", "/", "(", 2, ")", ")", "^", "(", 3, ")"], 2).
    None where a macro lacks its braces, ^ is followed by neither { nor one digit, or ! by ! or ^."""
    tokens, braces, want, depth, deepest = [], [], "", 0, 0  # want: "frac", "denominator", "exponent"
    for match in _ARITHMETIC_TOKEN.finditer(latex):
        number, op, text = match.group(1), match.group(2), match.group()
        if text.isspace() or op in ("\\left", "\\right"):
            continue
        if (op is None and number is None) or (op in ("!", "^") and tokens[-1:] == ["!"]):
            return None  # "3!!", "3!^2": the library reads neither as arithmetic
        if want and text != "{" and not (want == "exponent" and number and len(text) == 1):
            return None
        if op in ("{", "("):
            depth += 1
            deepest = max(deepest, depth)
        if op == "{":
            braces.append(want)
            tokens += ["(", "("] if want == "frac" else ["("]
            want = ""
        elif op == "}":
            if not braces:
                return None
            tokens += [")", "/"] if braces[-1] == "frac" else [")", ")"] if braces[-1] == "denominator" else [")"]
            want = "denominator" if braces.pop() == "frac" else ""
        elif op in ("\\frac", "\\dfrac", "\\tfrac"):
            want = "frac"
        elif number and len(text) > MATH_ANSWER_CHARS:
            return None  # int() refuses 4,301 digits and more; no answer sent is this long
        else:
            tokens.append(Fraction(text) if number else _OPERATOR.get(op, op))
            want = "exponent" if op == "^" else ""
        depth -= op in ("}", ")")
    return (tokens, deepest) if not want and not braces else None


def _apply(op: str, left: Fraction | Huge | None, right: Fraction | Huge | None) -> Fraction | Huge | None:
    """left op right ("neg": -right) on exact values or Huge bounds; None when the result cannot be
    pinned down (a sum of two huge numbers, a huge divisor, a fractional exponent, x / 0)."""
    if right is None or (left is None and op != "neg"):
        return None
    if op == "neg":
        return -right if isinstance(right, Fraction) else Huge(right.bits, -right.sign)
    if op == "^":
        return _power(left, right)
    if isinstance(left, Fraction) and isinstance(right, Fraction):
        if op == "/" and right == 0:
            return None
        return _bounded(_EXACT[op](left, right))
    return _huge_arithmetic(op, left, right)


def _huge_arithmetic(op: str, left: Fraction | Huge, right: Fraction | Huge) -> Fraction | Huge | None:
    """+ - * / with a Huge side: |H ± c| >= 2**(bits - 1) when |c| < 2**(bits - 1); |H c| >= 2**bits |c|;
    |H / c| >= 2**bits / |c|; a sum of two huge numbers or a huge divisor is not pinned down."""
    if op in "+-":
        huge, small, sign = (left, right, 1) if isinstance(left, Huge) else (right, left, -1 if op == "-" else 1)
        if isinstance(small, Huge) or _log2_above(small) >= huge.bits:
            return None
        return Huge(huge.bits - 1, huge.sign * sign)
    if op == "*":
        if 0 in (left, right):
            return Fraction(0)
        if isinstance(left, Huge) and isinstance(right, Huge):
            return _huge(left.bits + right.bits, left.sign * right.sign)
        huge, small = (left, right) if isinstance(left, Huge) else (right, left)
        return _huge(huge.bits + _log2_below(small), huge.sign * (1 if small > 0 else -1))
    if isinstance(right, Huge) or right == 0:
        return None
    return _huge(left.bits - _log2_above(right), left.sign * (1 if right > 0 else -1))


def _power(base: Fraction | Huge, exponent: Fraction | Huge) -> Fraction | Huge | None:
    """base ** exponent for a whole exponent: exact within PRECHECK_BITS; else, for |base| >= 2**j
    (j >= 1) and exponent n > 0, |base**n| >= 2**(j n), and for exponent >= 2**k, >= 2**(j 2**k)
    (a positive base). None for a fractional exponent, 0 to a negative power, or a huge base to one."""
    if isinstance(exponent, Fraction) and exponent.denominator != 1:
        return None
    if isinstance(exponent, Huge):
        j = base.bits if isinstance(base, Huge) else _log2_below(base) if base > 0 else 0
        positive = exponent.sign == 1 and (base.sign == 1 if isinstance(base, Huge) else base > 0)
        return _huge(j << min(exponent.bits, 40), 1) if positive and j >= 1 else None
    n = exponent.numerator
    if isinstance(base, Huge):
        return Fraction(1) if n == 0 else _huge(base.bits * n, base.sign if n % 2 else 1) if n > 0 else None
    if base == 0 and n < 0:
        return None
    if abs(base) in (0, 1) or abs(n) * max(abs(base.numerator).bit_length(), base.denominator.bit_length()) \
            <= PRECHECK_BITS:
        return base ** n
    if n > 0 and _log2_below(base) >= 1:
        return _huge(n * _log2_below(base), 1 if base > 0 or n % 2 == 0 else -1)
    return None


def _factorial(x: Fraction | Huge | None) -> Fraction | Huge | None:
    """x! for a whole x >= 0: exact within PRECHECK_BITS (n! < n**n), else a bound from
    n! >= (n/e)**n: log2 n! >= n (log2 n - 2) >= n (bits of n - 3); for x >= 2**k, >= 2**k (k - 2)."""
    if isinstance(x, Huge):
        return _huge((1 << min(x.bits, 40)) * (x.bits - 2), 1) if x.sign == 1 else None
    if x is None or x.denominator != 1 or x < 0:
        return None
    n = x.numerator
    if n * n.bit_length() <= PRECHECK_BITS:
        return Fraction(math.factorial(n))
    return _huge(n * (n.bit_length() - 3), 1)


def _bounded(x: Fraction) -> Fraction | Huge | None:
    """x itself within PRECHECK_BITS; past them a Huge bound when |x| is that large, else None (a
    long fraction of moderate size proves nothing)."""
    if max(abs(x.numerator).bit_length(), x.denominator.bit_length()) <= PRECHECK_BITS:
        return x
    below = _log2_below(x)
    return Huge(min(below, _MOST_BITS), 1 if x > 0 else -1) if below >= PRECHECK_BITS // 2 else None


def _huge(bits: int, sign: int) -> Huge | None:
    """A Huge bound, capped at _MOST_BITS; None when the bound says less than |x| >= 2."""
    return Huge(min(bits, _MOST_BITS), sign) if bits >= 1 else None


def _log2_below(x: Fraction) -> int:
    """An integer at most log2 |x| (x != 0): |numerator| >= 2**(its bits - 1), denominator <= 2**(bits of d - 1)."""
    return abs(x.numerator).bit_length() - 1 - (x.denominator - 1).bit_length()


def _log2_above(x: Fraction) -> int:
    """An integer k with |x| < 2**k: |numerator| < 2**(its bits), denominator >= 2**(its bits - 1)."""
    return abs(x.numerator).bit_length() - x.denominator.bit_length() + 1


if __name__ == "__main__" and sys.argv[1:2] == ["--math-worker"]:
    _math_worker()
