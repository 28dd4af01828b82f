"""Answer equivalence at the edges real data and real policies hit (issue 32), one rule each, as
docs/math.md ("Grading math answers") states them: times of day, letters that are variables,
golds of several parts, golds written as lists without boxes, decimal commas, the number fallback's
word boundaries, final-answer conventions, and the pre-check that decides answers which stall
math-verify. The equivalence cases are in tests/fixtures/answer_cases.jsonl, each verdict decided
from the rule before the grader was run (both directions per rule: a right answer stays right, a
wrong one stays wrong); the stalling answers are built here. No test here asserts a timing (the
project's rule): a stalling answer is shown decided without the library by a pool whose workers
never answer.
"""
import json
import logging
import math
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from grading import precheck as precheck_module
from grading.pool import MathGraderPool
from grading.precheck import Huge, arithmetic
from grading.math_answers import MATH_ANSWER_CHARS, MAX_PARTS, clock_time, decimal_reading, listed_parts, math_request
from grading.math_answers import answer_parts, gold_answer, last_boxes, same_clock, split_parts, stated_answer
from grading.math_answers import STEP_WORDS, THOUSANDS, uses_variables, without_thousands
from rewards import Problem, Verdict

FIXTURES = Path(__file__).resolve().parent / "fixtures"
HANG = [sys.executable, str(FIXTURES / "hang_worker.py")]
CASES = [json.loads(line) for line in (FIXTURES / "answer_cases.jsonl").read_text().splitlines() if line.strip()]


def test_fixture_file_is_well_formed():
    assert len(CASES) >= 50 and len({c["id"] for c in CASES}) == len(CASES)
    for case in CASES:
        assert set(case) <= {"id", "gold", "response", "expected", "case", "why", "field"}, case
        assert case["expected"] in (0, 1) and case["case"] and case["why"], case
    for kind in {c["case"] for c in CASES} - {"last-box"}:  # every rule in both directions
        assert {c["expected"] for c in CASES if c["case"] == kind} == {0, 1}, kind


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_answer_case(math_grader, case):
    verdict = math_grader(case["response"], case["gold"])
    assert verdict.failure == "", verdict
    assert verdict.reward == case["expected"], (case, verdict)


@pytest.mark.parametrize("case", [c for c in CASES if "field" in c], ids=[c["id"] for c in CASES if "field" in c])
def test_gold_field_gives_the_gold(case):
    assert gold_answer(case["field"]) == case["gold"]


# Every fixture case where the project's verdict differs from bare math-verify,
# verify(parse(gold), parse(response)) with the library's defaults, and why.
BARE_IS_WRONG = {
    # times of day: the library reads H:MM as a ratio and cannot read a gold in \text{}
    "time-pm-text": "gold \\text{4:30 p.m.} unreadable; the answer read as the ratio 2/15",
    "time-same": "the undelimited gold 4:30 read as its first number, 4; the answer as 2/15",
    "time-ambiguous-gold": "the same: 4 against 2/15",
    "time-24h": "gold in \\text{} unreadable; 16:30 read as 8/15",
    "time-hour-am": "gold in \\text{} unreadable; 9:00 read as 9/0",
    "time-midnight": "gold in \\text{} unreadable; 0:15 read as 0",
    # letters: t, s, m ... are in the library's unit list (latex2sympy2_extended, from MathQA), dropped after a number
    "var-4": "the gold 4t read as 4: a variable dropped as if it were tons (false-correct)",
    "var-4s": "4t and 4s both read as 4 (false-correct)",
    "var-t4": "the gold read as 4, the answer as 4t",
    "var-4-cdot-t": "the gold read as 4; the answer's t dropped, leaving '4 \\cdot'",
    "var-2m": "the undelimited gold 2m+3 read as 2; the answer's m dropped: 3+2m as 5",
    "var-poly": "the undelimited gold x^2+2x+1 is not extracted at all (the project parses the gold boxed)",
    # several boxes
    "multi-one-at-a-time": "the library joins only boxes separated by ',', 'and', 'or': it reads {3, 5}",
    "multi-statement": "'The answer is 2, 3, 5' read as 2, the first number after the anchor",
    "last-box-gold": "the library joins '\\boxed{5} and \\boxed{7}' into the set {5, 7}; one part reads the last box",
    # golds written as lists: the library joins the boxes too, but reads an undelimited gold by its last number
    "list-pairs-quad": "the gold (2, 2), (6, 2) read as its last number, 2",
    "list-assignments": "the gold k = 45, n = 2 read as 2",
    "list-set-commas": "the gold {1,2,3} not extracted at all",
    "list-set-and": "the gold \\{1, 2, 3\\} read as 3",
    "list-roots": "the gold 1, 2, 5 read as 5",
    # decimal commas: the library reads a delimited gold as a list, an undelimited one as a decimal only
    "decimal-comma-negative": "the gold $-2,5$ read as the set {-2, 5}",
    "decimal-comma-as-list": "the gold 1,22 read as the decimal 1.22 alone",
}


def test_disagreements_with_bare_math_verify(math_grader):
    """The project agrees with the bare library wherever the library is right: the cases where
    they differ are exactly BARE_IS_WRONG. (The stalling answers are not run bare: the library
    takes its 5 s timeout on each, or never returns.)"""
    import math_verify as mv
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    differ = {}
    for case in CASES:
        bare = float(mv.verify(mv.parse(case["gold"]), mv.parse(case["response"])))
        ours = math_grader(case["response"], case["gold"]).reward
        if bare != ours:
            differ[case["id"]] = (bare, ours)
    assert set(differ) == set(BARE_IS_WRONG), differ
    assert all(differ[case["id"]][1] == case["expected"] for case in CASES if case["id"] in differ)


# ----------------------------------------------------------------------------- gold fields and parts

def test_gold_answer_keeps_the_parts_of_a_multi_part_gold():
    roots = "The roots are $\\boxed{2}$, $\\boxed{3}$ and $\\boxed{5}$."
    assert gold_answer(roots) == "\\boxed{2} \\boxed{3} \\boxed{5}"
    assert gold_answer("$\\boxed{1}$ or $\\boxed{-1}$") == "\\boxed{1} \\boxed{-1}"
    assert gold_answer("$\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}$") == "\\boxed{(2, 2)} \\boxed{(6, 2)}"
    # text between boxes: the earlier ones are steps, the last is the answer (Hendrycks' last_boxed_only_string)
    assert gold_answer("So $x = \\boxed{4}$. Then $y = 2x = \\boxed{8}$.") == "8"
    assert gold_answer("$\\fbox{5}$ and $\\boxed{6}$ then $\\fbox{7}$.") == "7"


@pytest.mark.parametrize("parts", [["3", "5"], ["(1, 2)", "\\frac{1}{2}"], ["x^{2}", "\\{1, 2\\}", "7"]])
def test_the_data_contract_for_a_list_of_parts(parts):
    """A data row whose gold is a list reaches the grader as gold_answer of its parts, boxed and
    joined by spaces: the string keeps them, and answer_parts reads them back."""
    gold = gold_answer(" ".join(f"\\boxed{{{p}}}" for p in parts))
    assert gold == " ".join(f"\\boxed{{{p}}}" for p in parts) and answer_parts(gold) == parts
    assert gold_answer(parts[0]) == parts[0] and answer_parts(parts[0]) == [parts[0]]  # a one-element list


def test_answer_parts_and_split_parts():
    assert answer_parts("1, 2, 5") == ["1, 2, 5"]  # one box of a list is one part: math-verify reads it as a set
    assert answer_parts("\\boxed{1, 2} \\boxed{7}") == ["1", "2", "7"]
    assert split_parts("(1, 2), [3, 4), \\{5, 6\\}") == ["(1, 2)", "[3, 4)", "\\{5, 6\\}"]
    assert split_parts("1,000, 2,500.5, 3,5") == ["1,000", "2,500.5", "3", "5"]  # thousands separators kept
    assert split_parts("2, 3, ") == ["2", "3"]


def test_last_boxes():
    assert last_boxes("a \\boxed{1}, \\boxed{2} and $\\boxed{3}$.") == ["1", "2", "3"]
    assert last_boxes("\\boxed{1} so \\boxed{2}") == ["2"]
    assert last_boxes("\\boxed{1} so \\boxed{2}", joined=False) == ["1", "2"]
    assert last_boxes("\\boxed{1} \\boxed{2} \\boxed{3}", most=2) == ["2", "3"]
    assert last_boxes("\\boxed{\\boxed{5}}") == ["5"]  # an enclosing box ends the list, as last_box reads it
    assert last_boxes("\\boxed{5} \\boxed{6") == []  # the last box unclosed: no boxes, as last_box
    # LaTeX spacing and math delimiters only lay the parts out
    assert last_boxes("$$\\boxed{1} \\quad \\text{and} \\quad \\boxed{2}$$") == ["1", "2"]
    assert last_boxes("\\( \\boxed{1} \\),\\;\\( \\boxed{2} \\) or~\\[\\boxed{3}\\]") == ["1", "2", "3"]
    # a label within one sentence joins, as math-verify joins boxes: under 10 characters, or under 70 with
    # "and", "or", "," or ";"
    assert last_boxes("$x_1 = \\boxed{1}$, $x_2 = \\boxed{2}$") == ["1", "2"]
    assert last_boxes("\\boxed{(3, 3)} \\text{ for part (a) and } \\boxed{(1, 1)}") == ["(3, 3)", "(1, 1)"]
    assert last_boxes("\\boxed{1} papers and \\boxed{2} bins") == ["1", "2"]
    assert last_boxes("\\boxed{1} \\quadrilateral \\boxed{2}") == ["2"]  # 16 characters, no "and" or comma
    assert last_boxes("\\boxed{1} and" + " x" * 40 + " \\boxed{2}") == ["2"]  # 85 characters
    # a sentence's end, or a word that moves on from a box or takes it back, makes it a step
    for gap in (". ", ".", "! ", ".$ $", " and\n\nthe other ", " then ", ", no wait, ", ", actually ",
                " and, checking, ", " \\implies ", " \\Rightarrow y = ", " and not "):
        assert last_boxes(f"\\boxed{{1}}{gap}\\boxed{{2}}") == ["2"], gap
    # labelled: an assignment before a box stays with it; a box that holds one keeps its own
    labelled = "$y_1 = \\boxed{x + 1}$ and $\\alpha_{2} = \\boxed{3}$, $\\boxed{k = 4}$"
    assert last_boxes(labelled, labelled=True) == ["y_1 = x + 1", "\\alpha_{2} = 3", "k = 4"]
    assert last_boxes("$2x = \\boxed{4}$, $xy = \\boxed{5}$", labelled=True) == ["4", "5"]  # not names
    spaced = "\\boxed{1}" + " " * 5000 + "\\boxed{2}"  # a gap past max_chars is text: bounded time
    assert last_boxes(spaced) == ["1", "2"] and last_boxes(spaced, max_chars=4096) == ["2"]


def test_every_step_word_makes_the_box_before_it_a_step():
    """STEP_WORDS is the list the runs are cut by: a fork that edits it edits the rule."""
    for word in STEP_WORDS:
        assert last_boxes(f"\\boxed{{1}}, {word} \\boxed{{2}}") == ["2"], word
        assert last_boxes(f"\\boxed{{1}}, {word.upper()} \\boxed{{2}}") == ["2"], word
    assert last_boxes("\\boxed{1}, both correct, and \\boxed{2}") == ["1", "2"]  # "correct" affirms


@pytest.mark.parametrize("response,reward", [
    ("\\boxed{2}, both correct, and \\boxed{3}", 1.0),  # scored 0 while "correct" was a step word; bare math-verify: 1
    ("\\boxed{2}, which is not prime, and \\boxed{3}", 0.0),  # the list's price: "not" labels here, and cuts
    ("\\boxed{2} is incorrect, \\boxed{3}", 0.0),  # taken back: 3 alone (joined, it read {2, 3})
])
def test_step_words_against_a_list_gold(math_grader, response, reward):
    assert math_grader(response, "2, 3").reward == reward


@pytest.mark.parametrize("text,grouped", [("1,000", True), ("-12,345", True), ("1,234,567", True), ("0,111", False),
                                          ("1234,567", False), ("1,22", False)])
def test_one_definition_of_a_thousands_comma(text, grouped):
    """split_parts keeps a grouped number whole, decimal_reading never reads its comma as a point, and
    the pre-check reads it without commas: one rule, THOUSANDS, for all three."""
    assert bool(THOUSANDS.fullmatch(text)) is grouped
    assert (split_parts(text) == [text]) is grouped
    assert (without_thousands(text) == text.replace(",", "")) is grouped
    assert (decimal_reading(text) is None) is (grouped or text.count(",") > 1)


@pytest.mark.parametrize("gold,parts", [
    ("(2, 2), (6, 2)", ["(2, 2)", "(6, 2)"]), ("$k = 45, n = 2$", ["k = 45", "n = 2"]), ("{1,2,3}", ["1", "2", "3"]),
    ("\\{1, 2, 3\\}", ["1", "2", "3"]), ("\\left\\{ (1, 2), (3, 4) \\right\\}", ["(1, 2)", "(3, 4)"]),
    ("1,22", ["1", "22"]), ("1, 2, 5", ["1", "2", "5"]),
    # one part: a point, an interval, a number with thousands, a union of sets, a one-element set
    ("(1, 2)", ["(1, 2)"]), ("[0, 1)", ["[0, 1)"]), ("1,000", ["1,000"]), ("$7$", ["7"]),
    ("\\{1\\} \\cup \\{2, 3\\}", ["\\{1\\} \\cup \\{2, 3\\}"]), ("\\{5\\}", ["5"]),
    ("\\int_{0}^{1} \\frac{\\ln x}{1-x}\\,dx", ["\\int_{0}^{1} \\frac{\\ln x}{1-x}\\,dx"]),  # "\\," is LaTeX spacing
])
def test_listed_parts(gold, parts):
    assert listed_parts(gold) == parts


@pytest.mark.parametrize("gold,decimal", [
    ("1,22", "1.22"), ("$-2,5$", "-2.5"), ("0,111", "0.111"), ("1234,567", "1234.567"), ("1000,99", "1000.99"),
    ("1,000", None), ("-12,345", None), ("1, 22", None), ("1,2,3", None), ("1,5 cm", None), ("1.22", None),
])
def test_decimal_reading(gold, decimal):
    """Three digits after a comma that follows one to three digits, the first not 0, group thousands;
    any other comma inside a lone number is also read as a decimal point."""
    assert decimal_reading(gold) == decimal


def test_the_closing_run_is_sent_apart_from_the_boxes():
    """A multi-part gold reads any of the last boxes (parts); a gold written as a list, the closing run."""
    request = math_request("Trying $y = 2$ gives \\boxed{(2, 2)}. So the pairs are "
                           "\\boxed{(2, 2)} \\quad \\text{and} \\quad \\boxed{(6, 2)}.", "(2, 2), (6, 2)")
    assert request["region"] == "\\boxed{(6, 2)}" and request["run"] == ["(2, 2)", "(6, 2)"]
    assert request["parts"] == ["(2, 2)", "(2, 2)", "(6, 2)"]


def test_the_joined_run_is_bounded(math_grader):
    """At most MAX_PARTS boxes, and MATH_ANSWER_CHARS in all: a megabyte of boxes sends the last
    MAX_PARTS; a run too long in all is read as its last box."""
    assert math_request("\\boxed{1}, " * 100_000 + "\\boxed{2}", "1, 2")["run"] == ["1"] * (MAX_PARTS - 1) + ["2"]
    long_part = "9" * (MATH_ANSWER_CHARS // 2)
    assert math_grader(f"\\boxed{{{long_part}}}, \\boxed{{{long_part}}}, \\boxed{{1}}", "1, 2").answer == "1"
    assert math_grader("\\boxed{1}, \\boxed{2}", "1, 2").answer == "{1, 2}"


# ----------------------------------------------------------------------------- final-answer conventions

@pytest.mark.parametrize("text,answer", [
    ("Jen picked <<10+20+25=55>>55 apples.\nA: 55", "55"),
    ("Q: two and two?\nA: 4\n", "4"),
    ("Half of 24.\nAnswer: 12", "12"),
    ("Final Answer: 12", "12"),
    ("ANSWER:\n$\\frac{1}{2}$", "\\frac{1}{2}"),
    ("So the answer is 12.", "12"),
    ("Final Answer: The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}"),
    ("so the answer is **15**.", "15"),
    ("I thought the answer is 53. No: the answer is 54.", "54"),
])
def test_stated_answer(text, answer):
    assert stated_answer(text)[1] == answer


@pytest.mark.parametrize("response,found,answers", [
    # after the last box only a statement of the *final* answer is the answer (rule 2.2), as in Minerva's format
    ("so \\boxed{5}. The answer is 7.", "2.1 the last box", {"5": 1.0, "7": 0.0}),
    ("so \\boxed{5}.\nAnswer: 7", "2.1 the last box", {"5": 1.0, "7": 0.0}),
    ("so \\boxed{5}. Final Answer: The final answer is $7$.", "2.2 a final answer stated after the last box",
     {"5": 0.0, "7": 1.0}),
])
def test_what_a_statement_after_the_last_box_decides(math_grader, response, found, answers):
    assert math_request(response, "5")["found"] == found
    assert {gold: math_grader(response, gold).reward for gold in answers} == answers


@pytest.mark.parametrize("text", ["Q&A: see below", "the answers are below", "Answer: ", "Data: 5"])
def test_no_stated_answer(text):
    assert stated_answer(text) is None


def test_gold_fields_by_convention():
    assert gold_answer("She pays 3 * 4 = <<3*4=12>>12 dollars.\nA: 12") == "12"
    assert gold_answer("Q: two and two?\nA: <<2+2=4>>4\n") == "4"  # calculator annotations go as the field comes in
    assert gold_answer("Answer: \\frac{1}{2}") == "\\frac{1}{2}"
    assert gold_answer("Half of 24 is 12. The answer is 12.") == "12"
    assert gold_answer("... #### 72") == "72"  # "####" first, then boxes, then statements
    assert gold_answer("The answer is 3: so $\\boxed{4}$") == "4"
    assert gold_answer("It is **12**.") == "It is **12**."  # bold in a written solution is emphasis, not an answer


# ----------------------------------------------------------------------------- times of day and variables

@pytest.mark.parametrize("text,seconds,ambiguous", [
    ("\\text{4:30 p.m.}", 16 * 3600 + 1800, False), ("4:30", 4 * 3600 + 1800, True), ("16:30", 59400, False),
    ("12:05 a.m.", 300, False), ("12:00 p.m.", 12 * 3600, False), ("4 PM", 16 * 3600, False),
    ("4:30:05", 16205, True), ("0:15", 900, False),
])
def test_clock_time(text, seconds, ambiguous):
    assert clock_time(text, whole=True) == (seconds, ambiguous)


@pytest.mark.parametrize("text", ["3:4", "25:30", "13:00 p.m.", "4", "2/15", "4:30 and 5:00"])
def test_no_clock_time(text):
    assert clock_time(text, whole=True) is None


def test_same_clock():
    four_thirty, pm = clock_time("4:30", whole=True), clock_time("4:30 p.m.", whole=True)
    assert same_clock(four_thirty, pm) and same_clock(four_thirty, clock_time("16:30", whole=True))
    assert same_clock(pm, clock_time("16:30", whole=True)) and not same_clock(pm, four_thirty)
    assert clock_time("left at 4:30 p.m., back at 5:15 p.m.") == (17 * 3600 + 900, False)  # the last one


@pytest.mark.parametrize("gold,variables", [
    ("4t", True), ("x^2+2x+1", True), ("3ab", True), ("10 m", True), ("\\mathbf{v}", True), ("2m+3", True),
    ("10 cm", False), ("3 hours", False), ("5\\text{ m}", False), ("\\text{(C)}", False),
    ("\\frac{\\pi}{2}", False), ("30^\\circ", False), ("1,000", False), ("\\$12.50", False),
])
def test_uses_variables(gold, variables):
    assert uses_variables(gold) is variables


# ----------------------------------------------------------------------------- the pre-check

def precheck(response: str, gold: str):
    """The pre-check on what a MathGrader reads of the response."""
    return precheck_module.precheck(math_request(response, gold))


def _nested_fractions(depth: int) -> str:
    """\\frac{1}{1+\\frac{1}{1+...}}: a continued fraction, exactly F(depth+1)/F(depth+2)."""
    latex = "1"
    for _ in range(depth):
        latex = "\\frac{1}{1+" + latex + "}"
    return latex


# answers that stall math-verify (docs/math.md, "Grading math answers", has the times), and one past
# PRECHECK_BITS that does not (4000 digits): each decided by the pre-check
STALLS = {
    "factorial": "(10^{100})!",
    "tower": "9^{9^{9^{9^{9}}}}",
    "tower_3": "10^{10^{10}}",
    "nested_fractions_20": _nested_fractions(20),
    "nested_fractions_50": _nested_fractions(50),
    "nested_fractions_300": _nested_fractions(300),
    "digits_4000": "9" * 4000,
    "deep_braces": "{" * 1500 + "1" + "}" * 1500,
}


@pytest.mark.parametrize("name", STALLS)
def test_stalling_answer_is_decided_without_the_library(name):
    """Decided by precheck, and by a pool whose only worker never answers: the verdict comes back
    as a decision (failure "") instead of the worker's timeout."""
    answer = STALLS[name]
    for response in (f"So it is \\boxed{{{answer}}}.", f"The answer is {answer}", f"#### {answer}"):
        assert precheck(response, "54") == Verdict(0.0, answer), response
    pool = MathGraderPool(timeout=5.0, workers=1, command=HANG)
    try:
        assert pool(f"\\boxed{{{answer}}}", "54") == Verdict(0.0, answer)
        assert pool.grade_items([(Problem("q", "1,200"), f"\\boxed{{{answer}}}")]) == [Verdict(0.0, answer)]
    finally:
        pool.close()


def test_precheck_loses_no_right_answer():
    """It says 0 only when the value cannot be within the library's tolerance of the gold."""
    nested = f"\\boxed{{{_nested_fractions(300)}}}"
    value = arithmetic(_nested_fractions(300))[0]  # 1/phi within 1e-100
    assert precheck(nested, f"\\frac{{{value.numerator}}}{{{value.denominator}}}") is None  # equal
    assert precheck(nested, "0.6180339887") is None  # close: the library decides
    assert precheck("\\boxed{(10^{100})!}", "(10^{100})!") is None  # a gold it cannot compute: never decided
    assert precheck("\\boxed{2^{10000}}", "2^{10000}") is None
    assert precheck("\\boxed{2^{10000} - 2^{10000} + 54}", "54") is None  # a huge difference is not pinned down


def test_precheck_leaves_ordinary_answers_to_the_worker():
    for response, gold in [("\\boxed{70}", "72"), ("\\boxed{\\frac{1}{2}}", "0.5"), ("\\boxed{2^{100}}", "3"),
                           ("\\boxed{x^{9^{9^{9}}}}", "3"), ("\\boxed{(10^{100})!}", "\\boxed{1} \\boxed{2}"),
                           ("\\boxed{(10^{100})!}", "4:30"), ("no answer at all", "3")]:
        assert precheck(response, gold) is None, response


@pytest.mark.parametrize("latex", [
    "-3^2", "2^{3}", "2^3", "\\frac{1}{2}+3", "2 \\cdot 3!", "(2+3)!", "2^{-2}", "2.5", "\\frac{1}{2}^{3}",
    "\\dfrac{3}{4} \\times 8", "7 - 2 - 1", "2^{3^{2}}", "12 / 4 / 3", "-\\frac{-6}{4}", "\\left(2\\right)^{3}",
    "1 + 2 \\cdot 3 ^ 2", "(3!)^{2}", "{2+3}\\cdot 4", "10 \\div 4", "0^{0}", "(-2)^{3}", "5!", "033",
])
def test_arithmetic_reads_as_the_library_reads(latex):
    """On what it reads, arithmetic() gives the value math-verify's parse gives: so its exact
    distance to the gold is the library's."""
    import math_verify as mv
    import sympy
    parsed = mv.parse(f"\\boxed{{{latex}}}", parsing_timeout=None)[0]
    value, stalls = arithmetic(latex)
    assert not stalls and sympy.simplify(parsed - sympy.Rational(value.numerator, value.denominator)) == 0, parsed


def _random_arithmetic(rng, depth: int) -> str:
    """A random answer in arithmetic()'s grammar, for the comparison with the library."""
    if depth == 0 or rng.random() < 0.3:
        return str(rng.randint(0, 12)) + rng.choice(["", "", "", ".5", "!"])
    a, b = _random_arithmetic(rng, depth - 1), _random_arithmetic(rng, depth - 1)
    return rng.choice([f"{a}+{b}", f"{a}-{b}", f"{a} \\cdot {b}", f"{a} \\times {b}", f"{a}/{b}", f"{a} \\div {b}",
                       f"\\frac{{{a}}}{{{b}}}", f"\\dfrac{{{a}}}{{{b}}}", f"({a})^{{{rng.randint(-2, 3)}}}",
                       f"{{{a}}}^{rng.randint(0, 3)}", f"-{a}", f"({a})", f"({a})!"])


@pytest.mark.slow
def test_arithmetic_reads_random_answers_as_the_library_reads():
    """The same on 150 seeded random answers of the grammar (by hand before: 1,300 more, no difference).
    The library reads a decimal as a float, so the values are compared to 1e-9."""
    import random

    import math_verify as mv
    import sympy
    rng, compared = random.Random(0), 0
    for _ in range(150):
        latex = _random_arithmetic(rng, 3)
        read = arithmetic(latex)
        if read is None or isinstance(read[0], Huge):  # 0 / 0, 12!!, (-5)!: not read; huge: not computable
            continue
        parsed = mv.parse(f"\\boxed{{{latex}}}", parsing_timeout=5)[0]
        value = sympy.Rational(read[0].numerator, read[0].denominator)
        assert abs(sympy.N(parsed - value, 50)) <= 1e-9 * max(1, abs(value)), (latex, parsed, read)
        compared += 1
    assert compared >= 100


@pytest.mark.parametrize("latex", ["3!!", "2^{3}!", "3!^{2}", "2^10", "2(3)", "\\frac12", "2^x", "\\sqrt{4}", "1,000",
                                   "5\\%", ""])
def test_arithmetic_refuses_what_reads_two_ways_or_is_not_arithmetic(latex):
    assert arithmetic(latex) is None


@pytest.mark.parametrize("latex,exact", [
    ("3^{50}", 3 ** 50), ("30!", math.factorial(30)), ("7^{30} \\cdot 5", 7 ** 30 * 5),
    ("-(2^{70}) + 3", -(2 ** 70) + 3),
    ("(2^{40})^{3}", 2 ** 120), ("\\frac{2^{90}}{7}", Fraction(2 ** 90, 7)), ("-(3^{41})", -(3 ** 41)),
    ("(-3)^{41} \\cdot 2", -2 * 3 ** 41), ("2^{2^{7}}", 2 ** 128), ("3^{60} - 3^{20}", 3 ** 60 - 3 ** 20),
    ("30! \\cdot 3^{45}", math.factorial(30) * 3 ** 45), ("(2^{70})!", None),
])
def test_huge_bounds_are_true(monkeypatch, latex, exact):
    """With PRECHECK_BITS lowered to 64 these values are past it: the lower bound arithmetic()
    keeps, |x| >= 2**bits, holds against the exact value Python computes, and so does its sign."""
    monkeypatch.setattr(precheck_module, "PRECHECK_BITS", 64)
    value, stalls = arithmetic(latex)
    assert isinstance(value, Huge) and stalls
    if exact is None:  # (2^70)! >= (2^70/e)^(2^70): log2 >= 2^70 (70 - 1.45)
        assert value.bits <= 2 ** 70 * 68 and value.sign == 1
    else:
        assert Fraction(2) ** value.bits <= abs(Fraction(exact)) and value.sign in (0, 1 if exact > 0 else -1)
