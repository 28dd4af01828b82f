"""What counts as the same math answer: the rules a data file's responses are graded by, in front of
HF math-verify, in the order a response travels and numbered as docs/math.md ("Grading math answers")
numbers them, with each rule's source there (docs/data-and-eval.md: what differs from the bare library).

1. The gold answer of a data row (`gold_answer`, when the file is read): 1.1 GSM8K's "#### x", 1.2 the
   closing run of boxes (several boxes are the parts of one answer; a box that a sentence's end or a
   STEP_WORDS word separates from the run is a step), 1.3 a final-answer statement, 1.4 the field.
2. The final answer of a response (`math_request`, in the trainer's process, in bounded time): 2.1 the
   last box, 2.2 unless a statement of the *final* answer follows it, 2.3 "#### x", 2.4 an <answer>
   tag, 2.5 a final-answer statement ("A:", "Answer:", "The answer is"), 2.6 a closing **x**, 2.7 the
   end of the text (what math-verify finds there, else the last number that stands alone).
3. How the gold reads that answer (`judge`, in a grading worker): 3.1 a gold of several parts needs
   every part, in any order; 3.2 against a list written without boxes the closing run of boxes is
   one answer; 3.3 times of day as times; 3.4 a letter the gold uses as a variable is never dropped
   as a unit; 3.5 anything else: math-verify, \\mathrm{e} read as e; 3.6 a lone number with a comma
   that cannot group thousands is also read with a decimal comma.
4. Bounds, beside: 4.1 the pre-check (grading/precheck.py) decides plain arithmetic that would stall
   the library; 4.2 the worker grades each answer within --grade-cpu seconds of CPU time
   (grading/pool.py, which runs `judge` in its workers). MATH_ANSWER_CHARS bounds what is read.

`python -m grading.explain --gold G --response R` prints each step of one verdict.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from itertools import accumulate

from rewards import extract_tag


MATH_ANSWER_CHARS = 4096  # the most of a response a math worker sees: sane final answers are far shorter
MAX_PARTS = 10  # boxes read for a multi-part gold: matching compares up to MAX_PARTS² pairs in one worker call
# GSM8K's calculator annotations, "48/2 = <<48/2=24>>24": they repeat the result that follows them, and
# are removed once, where a gold field (gold_answer) or a response (math_request) comes in
CALCULATOR_ANNOTATION = re.compile(r"<<[^<>\n]*>>")


# ============================================================================= 1. the gold answer of a data row

_BRACES = re.compile(r"[{}]")
_BRACELESS_BOX = re.compile(r" +([^\s$]+)")  # "\\boxed 5"


class AnswerTooLong(ValueError):
    """A final answer longer than MATH_ANSWER_CHARS: not a sane answer, scored 0 without parsing."""


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


# Words that make the box before them a step of the working, never a part of the answer, when they
# stand between two boxes (last_boxes): "\\boxed{5}, so \\boxed{7}", "\\boxed{5}, no wait, \\boxed{7}". They
# are this project's choice, not a benchmark's: math-verify joins any boxes under 70 characters apart with
# "and", "or", "," or ";" between, and would pay a self-correction's first try. A fork edits this list
# (docs/math.md, rule 1.2, has it). Its price: a listed word used to label a part splits the run, so
# "\\boxed{2}, which is not prime, and \\boxed{3}" against the gold "2, 3" reads 3 alone and scores 0
# (tests/test_answers.py holds both this and a word left out, "both correct").
STEP_WORDS = (
    # moving on: what follows is derived from the box
    "so", "thus", "hence", "therefore", "then", "give", "gives", "giving", "yield", "yields", "implies",
    "means", "get", "gets",
    # taking it back
    "wait", "actually", "no", "not", "rather", "instead", "but", "however", "oops", "sorry", "hmm", "hmmm",
    "hmmmm", "wrong", "mistake", "mistakes", "incorrect", "incorrectly", "correction", "corrections",
    "corrected", "correcting",
    # trying it: a box under test is a try
    "check", "checks", "checked", "checking", "recheck", "rechecked", "rechecking", "again", "try", "trying",
    "retry",
)
# and an arrow, which moves on as "so" does: \\to, \\iff, \\Rightarrow, \\longrightarrow ... (\\implies is "implies")
_STEP_WORD = re.compile(r"(?i)\b(?:" + "|".join(STEP_WORDS) + r")\b|\\(?:to|iff|\w*rightarrow)\b")
# What may stand between the boxes of one answer, whatever its length: spaces, commas, "and", "or" --
# the joins across which math-verify's own parser reads several boxed answers as one set (parser.py,
# `next_groups`) -- and what only lays them out: math delimiters ($, \( \), \[ \]) and LaTeX spacing
# (\quad, \qquad, \, \; ~)
_BOX_GAP = re.compile(r"(?:\s|\$|,|~|\\[()\[\],;:! ]|\\q?quad(?![A-Za-z])|\\text\{\s*(?:and|or)\s*\}|\band\b|\bor\b)*")
# Words between two boxes, within one sentence, may label them ("\\boxed{(3, 3)} for part (a) and
# \\boxed{(1, 1)}", "$y_1 = \\boxed{...}$ and $y_2 = \\boxed{...}$"), as math-verify's own rule has it
# (latex2sympy2_extended, extract_boxed_content: boxes under 10 characters apart, or under 70 with
# "and", "or", "," or ";" between, are one answer), unless a sentence ends or a STEP_WORDS word stands there
_LABEL_CHARS, _NEAR_CHARS = 70, 10
_SEPARATOR = re.compile(r"\b(?:and|or)\b|[,;]")
_SENTENCE_END = re.compile(r"[.!?](?=\s|\$|\\[)\]]|\Z)|\n\s*\n")
# an assignment that labels the box after it, "y_2 = ", "\\alpha_{1} = ": kept with a list's parts
_BOX_LABEL = re.compile(r"(?<![\w\\])((?:\\[A-Za-z]+|[A-Za-z])(?:_\{?\w+\}?)?)\s*=\s*(?:\$|\\[(\[])?\s*\Z")


def last_boxes(text: str, max_chars: int | None = None, most: int | None = None, joined: bool = True,
               labelled: bool = False, why: list | None = None) -> list[str]:
    """Contents of the last box (as last_box reads it) and of the boxes before it, in order,
    at most `most`. joined: only the boxes of one answer, each joined to the next (gap_break):
    "so $\\boxed{3}$ and $\\boxed{5}$." -> ["3", "5"]; "\\boxed{3} \\text{ for (a) and } \\boxed{5}"
    -> ["3", "5"]; "$\\fbox{5}$ then $\\fbox{7}$" -> ["7"]; "\\boxed{5}. Wait: \\boxed{7}" -> ["7"].
    Not joined: any boxes, "(a) \\boxed{3}. (b) \\boxed{5}" -> ["3", "5"]. labelled: a box that an
    assignment labels (_BOX_LABEL) keeps it: "$x_1 = \\boxed{3}$, $x_2 = \\boxed{5}$" -> ["x_1 = 3",
    "x_2 = 5"]. [] when there is no closed last box. Only the last box raises AnswerTooLong; an
    earlier box past max_chars, a gap that breaks the run (joined), or a box that encloses the box
    after it, ends the list. `why`, a list, receives the break's reason (explain prints it)."""
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
        if box is None or box[1] > stop:
            break
        broken = gap_break(text, box[1], stop, max_chars) if found and joined else ""
        if broken:
            if why is not None:
                why.append(f"{text[box[1]:stop][:80]!r} after \\boxed{{{box[0][:80]}}}: {broken}")
            break
        label = _BOX_LABEL.search(text, max(0, start - _LABEL_CHARS), start) if labelled else None
        found.insert(0, f"{label.group(1)} = {box[0]}" if label and "=" not in box[0] else box[0])
        stop = start
    return found


def gap_break(text: str, end: int, start: int, max_chars: int | None) -> str:
    """Why text[end:start], between two boxes, makes the earlier box a step ("" when it joins them
    into one answer): only _BOX_GAP joins at any length up to max_chars (a megabyte of spaces between
    two boxes is read as text, in bounded time); other words join within one sentence, as math-verify
    joins them, none of them a STEP_WORDS word or an arrow. " \\text{ for part (a) and } " and
    "$ and $y_2 = " -> ""; ". Then " -> "a sentence ends"; " so " -> "the step word 'so'"."""
    if max_chars is not None and start - end > max_chars:
        return f"over {max_chars} characters apart"
    if _BOX_GAP.fullmatch(text, end, start):
        return ""
    gap = text[end:start]
    if len(gap) >= _LABEL_CHARS:
        return f"words {len(gap)} characters long"
    if len(gap) >= _NEAR_CHARS and _SEPARATOR.search(gap) is None:
        return f"words {len(gap)} characters long without 'and', 'or', ',' or ';'"
    if _SENTENCE_END.search(gap):
        return "a sentence ends"
    step = _STEP_WORD.search(gap)
    return f"the step word {step.group()!r}" if step else ""


# A number whose commas group thousands: one to three digits, the first not 0, then groups of three
# ("1,000", "-12,345,678"). The one definition: split_parts never splits it, decimal_reading never reads
# its comma as a decimal point, the pre-check reads it without commas; "0,111" and "1234,5" are no such number.
THOUSANDS = re.compile(r"(?<![\w.])-?[1-9]\d{0,2}(?:,\d{3})+(?!\d)")


def without_thousands(text: str) -> str:
    """text with its thousands separators removed: "1,000 + 2" -> "1000 + 2"; "0,5" stays."""
    return THOUSANDS.sub(lambda number: number.group().replace(",", ""), text)


def split_parts(text: str) -> list[str]:
    """The parts of a list written in one answer: text split at its commas outside brackets, as
    OlympiadBench's judge splits answers (`split_by_comma`), but never inside a THOUSANDS number nor
    at LaTeX's thin space "\\,"; empty parts dropped. "(1, 2), [3, 4)" -> ["(1, 2)", "[3, 4)"];
    "1,000, 7" -> ["1,000", "7"]; "\\int_0^1 x\\,dx" -> one part."""
    grouping = {m.start() + i for m in THOUSANDS.finditer(text) for i, c in enumerate(m.group()) if c == ","}
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += (c in "([{") - (c in ")]}")
        if c == "," and depth == 0 and i not in grouping and text[i - 1:i] != "\\":  # "\\," is LaTeX spacing
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def answer_parts(answer: str) -> list[str]:
    """The parts of a gold answer every one of which a response must give (rule 3.1). Several boxes --
    gold_answer's form of a multi-part answer, "\\boxed{3} \\boxed{5}" -- are the parts, each split
    by split_parts: ["3", "5"]; "\\boxed{1, 2} \\boxed{7}" -> ["1", "2", "7"]. Anything else is one
    part, which math-verify reads whole: "1, 2, 5" -> ["1, 2, 5"] (a set, as MATH writes it; against
    such a list the response's closing run of boxes is read, rule 3.2)."""
    boxes = last_boxes(answer)
    return [part for box in boxes for part in split_parts(box)] if len(boxes) > 1 else [answer]


# A final-answer statement: "A:" opening a line (the answers of GSM8K's few-shot chain-of-thought
# exemplars, lm-eval-harness gsm8k-cot), "Answer:" and "Final Answer:" (simple-evals' ANSWER_PATTERN,
# Minerva's "Final Answer: The final answer is $x$. I hope it is correct."), "the answer is" (the
# same exemplars' "The answer is 6.", Qwen2.5-Math's extract_answer)
_STATEMENT = re.compile(r"(?m:^[ \t]*A[ \t]*:)|(?i:\banswer[ \t]*:|\banswer is\b:?)")
_STATED = re.compile(r"\s*([^\n]*)")
_MINERVA_TAIL = "I hope it is correct."


def stated_answer(text: str) -> tuple[str, str] | None:
    """(its line, the answer) of the last final-answer statement of a text, the answer being the
    rest of that line (or the next line when the marker ends one), without Minerva's closing
    sentence, a full stop, bold ** or one pair of $: "A: 7\\n" -> ("A: 7", "7"); "Final Answer: The
    final answer is $\\frac{1}{2}$. I hope it is correct." -> (that line, "\\frac{1}{2}"); None when
    there is none or it is empty."""
    last = None
    for last in _STATEMENT.finditer(text):
        pass
    if last is None:
        return None
    rest = _STATED.match(text, last.end())
    answer = rest.group(1).split(_MINERVA_TAIL)[0].strip().rstrip(".").strip("* ")
    if answer.count("$") == 2 and answer.startswith("$") and answer.endswith("$"):
        answer = answer[1:-1].strip()
    return (text[text.rfind("\n", 0, last.start()) + 1:rest.end()], answer) if answer else None


def gold_answer(raw: str) -> str:
    """The gold answer of an answer/solution field (rule 1; gold_reading says which rule read it)."""
    return gold_reading(raw)[0]


def gold_reading(raw: str) -> tuple[str, str]:
    """(the gold answer, the rule that read it) from an answer/solution field, calculator
    annotations removed, by the first rule that applies: 1.1 GSM8K's "...#### 72" -> "72"; 1.2 the
    boxes of a MATH solution, "... \\boxed{3}" -> "3", the last box alone when a sentence's end or a
    step word stands before it (gap_break; Hendrycks' last_boxed_only_string: earlier boxes are
    steps), all of them, kept boxed, when they are the parts of one answer: "roots $\\boxed{3}$ and
    $\\boxed{5}$" -> "\\boxed{3} \\boxed{5}" (answer_parts reads them back); 1.3 a final-answer
    statement (stated_answer: "A: 55", "Answer: 55", "The answer is 55"); 1.4 else the field,
    stripped. A gold field's trailing **bold** is not read: in a written solution it is emphasis."""
    raw = CALCULATOR_ANNOTATION.sub("", raw)
    if "####" in raw:
        return raw.split("####")[-1].strip(), "1.1 GSM8K's ####"
    boxes = last_boxes(raw)
    if len(boxes) > 1:
        return " ".join(f"\\boxed{{{box}}}" for box in boxes), "1.2 the closing run of boxes (several parts)"
    if boxes and boxes[0]:
        return boxes[0], "1.2 the closing run of boxes"
    stated = stated_answer(raw)
    return (stated[1], "1.3 a final-answer statement") if stated else (raw.strip(), "1.4 the field itself")


# ============================================================================= 2. the final answer of a response

# a number standing alone: not inside a word ("H2O", "x2", "x_2") nor the fraction part of a decimal;
# its commas only where they group thousands (THOUSANDS)
_NUMBER = re.compile(rf"(?<!\w)(?<!\d\.)(?:{THOUSANDS.pattern}|-?\d+)(?:\.\d+)?(?!\w)")
_BOLD = re.compile(r"\*\*([^*\n]+)\*\*[\s.!]*\Z")  # a closing "**55**."
# Only a statement of the *final* answer outranks the last box (rule 2.2), as in Minerva's format and
# Qwen2.5-Math's extract_answer ("final answer is $x$. I hope" before the box, the box before "the
# answer is"): after a box, "The answer is ..." and "Answer: ..." are more often comment ("the answer is
# consistent with ...") than a new answer, so "so \\boxed{5}. The answer is 7." reads 5
_FINAL_ANSWER = re.compile(r"(?i)\bfinal answer\b")


def math_request(response: str, gold: str) -> dict:
    """What a math worker is sent of a response, read in bounded time (calculator annotations
    removed): the gold; `found`, the rule that found the final answer; `region`, what math-verify
    reads; `answer`, the final answer as written (None when no convention marks one); `number`, the
    last number standing alone in the tail, for when the region holds nothing math-verify reads;
    `parts`, the last MAX_PARTS boxes (or the final answer), for a gold of several parts; `run`, the
    closing run of boxes (last_boxes, joined and labelled), for a gold written as a list.

    The final answer, by the first convention the response follows: 2.1 its last \\boxed{} (alone:
    math-verify would join "\\boxed{5}, ... \\boxed{7}" into the set {5, 7}, and a self-corrected trace
    would score 0), 2.2 unless a statement of the final answer ("Final Answer: The final answer is $x$",
    _FINAL_ANSWER) follows it, which is the later answer (the box was a step); 2.3 the line after
    GSM8K's "####"; 2.4 an <answer> tag's content; 2.5 a final-answer statement (stated_answer, whose
    line is the region, so that math-verify's own "answer" anchors read "The answer is 54, not 53" as
    54); 2.6 a closing **bold** span (math-verify's own number patterns accept ** around a number);
    2.7 else the end of the text, at most about MATH_ANSWER_CHARS. "Trying \\boxed{(2, 2)}. So
    \\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}" -> found "2.1 the last box", region
    "\\boxed{(6, 2)}", parts ["(2, 2)", "(2, 2)", "(6, 2)"], run ["(2, 2)", "(6, 2)"]. Linear time; a
    box, line or tag longer than MATH_ANSWER_CHARS raises AnswerTooLong."""
    response = CALCULATOR_ANNOTATION.sub("", response)
    tail = _tail(response, MATH_ANSWER_CHARS)
    box = last_box(response, MATH_ANSWER_CHARS)
    later = box and stated_answer(response[max(box[1], len(response) - MATH_ANSWER_CHARS):])  # read in the tail
    hashes = response.rfind("####")
    if later and _FINAL_ANSWER.search(later[0]):
        found, region, answer = "2.2 a final answer stated after the last box", _short(later[0]), later[1]
    elif box:
        found, region, answer = "2.1 the last box", "\\boxed{" + box[0] + "}", box[0]
    elif hashes >= 0:
        line = _short(response[hashes + 4:].strip().partition("\n")[0])
        found, region, answer = "2.3 GSM8K's ####", line, line
    elif (tag := extract_tag(response)) is not None:
        found, region, answer = "2.4 an <answer> tag", "$" + _short(tag) + "$", tag
    elif (stated := stated_answer(response)) is not None:
        found, region, answer = "2.5 a final-answer statement", _short(stated[0]), stated[1]
    elif (bold := _BOLD.search(tail)) is not None:
        found, region, answer = "2.6 a closing **bold**", bold.group(1), bold.group(1)
    else:
        found, region, answer = "2.7 the end of the text", tail, None
    boxed = found.startswith("2.1")
    numbers = _NUMBER.findall(tail)
    return {"gold": gold, "found": found, "region": region, "answer": answer,
            "number": numbers[-1].replace(",", "") if numbers else None,
            "parts": (last_boxes(response, MATH_ANSWER_CHARS, MAX_PARTS, joined=False) if boxed else [])
            or ([answer] if answer else []),
            "run": last_boxes(response, MATH_ANSWER_CHARS, MAX_PARTS, labelled=True) if boxed else []}


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


# ============================================================================= 3. how the gold reads the answer

@dataclass
class Judgement:
    """How the gold read one response's answer, in a worker: its verdict, and what explain prints."""
    reward: float  # 1.0 or 0.0
    answer: str | None  # the answer as math-verify parsed it, normalised (maj@n votes on it); None: nothing parsed
    rule: str  # the rules that decided, as docs/math.md numbers them: "3.2 a list written without boxes; 3.5 ..."
    gold: str = ""  # the gold as parsed ("" when it did not parse: compared as text)
    read: str = ""  # the text the answer was parsed from: the region, the run joined, the last number, the parts


def judge(mv, request: dict) -> Judgement:
    """The verdict on a math_request (mv: the math_verify module): 3.1 a gold of several parts
    (answer_parts) against the response's parts (_parts); else 3.2, against a gold written as a
    list (listed_parts), the response's closing run of boxes as one box, which math-verify reads
    as a set: ["(2, 2)", "(6, 2)"] -> "\\boxed{(2, 2), (6, 2)}" (a run of more than MATH_ANSWER_CHARS
    in all is not joined); then the gold compares the region (else the last number) by compare
    (3.3-3.5) and, failing that, 3.6 read with a decimal comma (decimal_reading)."""
    gold, region, run = request["gold"], request["region"], request["run"]
    golds = answer_parts(gold)
    if len(golds) > 1:
        return _parts(mv, golds, request["parts"], region)
    joined = ", ".join(run)
    listed = len(run) > 1 and len(joined) <= MATH_ANSWER_CHARS and len(listed_parts(gold)) > 1
    if listed:
        region = "\\boxed{" + joined + "}"
    judged = compare(mv, gold, region, request["number"])
    decimal = decimal_reading(gold)
    if decimal and not judged.reward:
        judged = compare(mv, decimal, region, request["number"])
        judged = replace(judged, rule=f"3.6 a decimal comma ({gold} as {decimal}); {judged.rule}")
    return replace(judged, rule="3.2 a list written without boxes; " + judged.rule) if listed else judged


def _parts(mv, golds: list[str], parts: list[str], region: str) -> Judgement:
    """3.1: every part of a multi-part gold against its own part of the response, in any order, as
    OlympiadBench's judge (eval/auto_scoring_judge.py) pairs answer lists: the same number of
    parts, each gold part taking the first unpaired response part equal to it (compare). The
    response's parts are read from its last boxes back, each split by split_parts, until
    there are as many as the gold's: "\\boxed{3} and \\boxed{5}" or "\\boxed{5, 3}" against
    ["3", "5"] -> 1; "\\boxed{5}" -> 0 (a part missing). A response without boxes or a final
    answer gives no parts: the gold's parts, as one set, are read against its region as
    math-verify reads them, "$${3, 5}$$" -> 1. The answer, for maj@n, is the parts sorted."""
    rule = f"3.1 several parts ({len(golds)})"
    if not parts:
        judged = compare(mv, ", ".join(golds), region)
        return replace(judged, rule=f"{rule}, the response read whole as one set; {judged.rule}")
    said: list[str] = []
    for box in reversed(parts):
        if len(said) >= len(golds):
            break
        said = split_parts(box) + said
    answer, read = ", ".join(sorted(said)) or None, " | ".join(said)
    if len(said) != len(golds):
        return Judgement(0.0, answer, f"{rule}: the response gives {len(said)}", " | ".join(golds), read)
    unpaired = list(said)
    for gold in golds:
        pair = next((part for part in unpaired if compare(mv, gold, "\\boxed{" + part + "}").reward), None)
        if pair is None:
            return Judgement(0.0, answer, f"{rule}: no part of the response equals {gold!r}", " | ".join(golds), read)
        unpaired.remove(pair)
    return Judgement(1.0, answer, f"{rule}: each paired", " | ".join(golds), read)


_DOLLARS = re.compile(r"\$+([^$]*)\$+")  # "$k = 45, n = 2$", as answer fields often write a gold
_SET_LITERAL = re.compile(r"(?:\\left)?\\?\{(.*?)(?:\\right)?\\?\}", re.DOTALL)  # "\\{1, 2\\}", "{1,2}"


def listed_parts(gold: str) -> list[str]:
    """3.2: the parts of a one-part gold written as a list without boxes: its top-level commas
    (split_parts), or the elements of a set written whole, $ or $$ around either ignored.
    "(2, 2), (6, 2)" -> ["(2, 2)", "(6, 2)"]; "$k = 45, n = 2$" -> ["k = 45", "n = 2"]; "{1,2,3}" and
    "\\{1, 2, 3\\}" -> ["1", "2", "3"]; "1,22" -> ["1", "22"] (decimal_reading adds 1.22). One part,
    not a list: a tuple or an interval, "(1, 2)" and "[0, 1)" (a point is one answer); a number with
    thousands, "1,000"; two sets, "\\{1\\} \\cup \\{2, 3\\}". Against a list, judge joins the
    response's closing run of boxes into one answer."""
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


# Euler's number written upright (ISO 80000-2), "\\mathrm{e}": latex2sympy reads it as a word, and a
# formula around it not at all ("1 - \\frac{1}{\\mathrm{e}}" parses as 1, so that 1 + 1/e matched it)
_UPRIGHT_E = re.compile(r"\\mathrm\s*\{\s*e\s*\}")


def compare(mv, gold: str, region: str, number: str | None = None) -> Judgement:
    """One gold answer against an answer region (else a number), read as the gold asks: 3.3 against
    a time of day, the region's last time of day (clock_time; the library would read "4:30" as the
    ratio 2/15); 3.4 against a gold that writes a letter as a variable (uses_variables), math-verify
    without its unit dropping, which reads the letters t, s, m, h, c ... after a number as units
    ("4t" as 4); 3.5 else math-verify as configured upstream, on both sides with an upright e as e
    (_UPRIGHT_E). A gold the library cannot read is compared as text."""
    clock = clock_time(gold, whole=True)
    if clock is not None:
        said = clock_time(region)
        return Judgement(float(said is not None and same_clock(clock, said)), said and _clock_text(said),
                         "3.3 a time of day", _clock_text(clock), region)
    latex, rule = mv.LatexExtractionConfig(boxed_match_priority=0), "3.5 math-verify"
    if uses_variables(gold):
        latex = replace(latex, normalization_config=replace(latex.normalization_config, units=False))
        rule = "3.4 a letter as a variable (math-verify, no unit dropped)"
    configs = [latex, mv.ExprExtractionConfig()]

    def parse(text: str) -> list:
        return mv.parse(_UPRIGHT_E.sub("e", text), extraction_config=configs, parsing_timeout=None)

    gold_parsed = parse("\\boxed{" + gold + "}")  # gold first: math-verify treats it as the reference
    read, pred = region, parse(region)
    if not pred and number:
        read, pred = number, parse(number)
    shown = str(gold_parsed[0]) if gold_parsed else ""
    if not pred:
        return Judgement(0.0, None, rule, shown, read)
    if not gold_parsed:  # a gold answer math-verify cannot read: exact text match
        return Judgement(float(pred[-1].strip() == gold.strip()), str(pred[0]), rule + ", the gold as text", "", read)
    return Judgement(float(mv.verify(gold_parsed, pred, timeout_seconds=None)), str(pred[0]), rule, shown, read)


_SPACING = re.compile(r"\\[ ,;:!]|~|\$")
# upright text, whose letters are words (units, names), not variables: \text{ cm}, \mathrm{m}, \mbox{...}
_TEXT_MACRO = re.compile(r"\\(?:text(?:rm|normal|up|sf|tt|bf|it)?|mathrm|mbox|operatorname)\s*\{([^{}]*)\}")
# a time of day: H:MM, H:MM:SS or H, with a.m./p.m. (any case, dots and spaces optional) required after H
_CLOCK = re.compile(r"(?<![\d:.])(\d{1,2})(?::([0-5]\d)(?::([0-5]\d))?)?(?![\d:])\s*(?:([ap])\.?\s*m\b\.?)?", re.I)
_HALF_DAY = 12 * 3600


def clock_time(text: str, whole: bool = False) -> tuple[int, bool] | None:
    """3.3: (seconds after midnight, ambiguous?) of the whole text read as a time of day, or (whole
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


_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_UNIT_WORD = re.compile(r"(?<=\s)[A-Za-z]{2,}")  # "10 cm", "3 hours": a word set off by a space


def uses_variables(gold: str) -> bool:
    """3.4: whether a gold answer writes a Latin letter as a variable: one outside upright text
    (\\text{}, \\mathrm{}, \\mbox{}) and LaTeX commands, other than a word of two or more letters
    set off by a space (a unit). A bare letter in mathematics is italic, a variable; Minerva's
    answer normalisation (Lewkowycz et al. 2022, appendix D) likewise removes unit words and
    \\text{} units, never a bare letter. "4t", "x^2+2x+1", "3ab", "10 m" -> True; "10 cm",
    "5\\text{ m}", "\\text{(C)}", "\\frac{\\pi}{2}", "30^\\circ" -> False."""
    bare = _UNIT_WORD.sub("", _LATEX_COMMAND.sub("", _TEXT_MACRO.sub("", gold)))
    return re.search(r"[A-Za-z]", bare) is not None


_COMMA_NUMBER = re.compile(r"(-?\d+),(\d+)")


def decimal_reading(gold: str) -> str | None:
    """3.6: the gold read with a decimal comma, as much of Europe writes decimals, where it is a lone
    number with one comma that cannot group thousands (THOUSANDS): "1,22" -> "1.22"; "0,111" ->
    "0.111" (no group starts with 0); "1234,5" -> "1234.5". None for "1,000" (thousands: 1000, never
    1.0), "1, 22" (a comma with a space after it is a list's), "1,2,3" and anything else. The gold
    keeps its reading as written, a list ("1,22": the set {1, 22}); an answer equal to either scores 1."""
    text = _unwrapped(gold)
    number = _COMMA_NUMBER.fullmatch(text)
    return None if number is None or THOUSANDS.fullmatch(text) else f"{number.group(1)}.{number.group(2)}"
