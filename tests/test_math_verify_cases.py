"""Graded at least as well as the bare library (issue 56): (gold, response, verdict) triples in the
spirit of huggingface/Math-Verify's own tests (numbers and their separators, fractions, intervals,
math delimiters, percent, relations, matrices, several boxes with labels or steps between them, a
final answer stated after a box, Euler's number written upright), each verdict decided from the
mathematics before any grader was run; none is copied from that repository. Each triple is graded
as a data file's row is (make_task, grade_batch: the gold field through gold_answer) and by the bare
library, verify(parse(gold), parse(response)) with its defaults: the project is right on every one,
and the library is wrong exactly where BARE_IS_WRONG says, and why.
"""
import json
import logging

import pytest

from data import make_task
from rewards import grade_batch

PAIRS = "$(2, 1), (0, 0)$"
MATRIX = "$\\begin{pmatrix}1 & 2\\\\ 3 & 4\\end{pmatrix}$"
LOAN = ("Interest: $0.1 \\cdot 1,000 = \\boxed{100}$, and $1,000 + 100 + 110 = 1,210$. "
        "Final Answer: The final answer is $1,210$. I hope it is correct.")
# (id, gold field, response, verdict, why)
CASES = [
    # numbers: separators, decimal points and commas, currency, digits inside a word
    ("thousands", "3512000", "3,512,000", 1, "commas group thousands"),
    ("space-thousands", "2000", "2 000", 1, "a space groups thousands"),
    ("trailing-zero", "2000", "2000.0", 1, "the same number"),
    ("leading-point", "0.7", ".7", 1, "a decimal without its 0"),
    ("decimal-comma", "1000.25", "1000,25", 1, "a decimal comma: 25 cannot be a group of thousands"),
    ("currency", "1200.5", "so it costs 1,200.50€ in all", 1, "the number before a currency sign"),
    ("digits-in-word", "3", "AB3CD", 0, "no number stands alone"),
    ("slash-vs-frac", "-7/4", "-\\frac{7}{4}", 1, "a fraction written two ways"),
    # intervals, delimiters, percent, relations, matrices, expressions
    ("interval-same", "$[2,5)$", "$[2,5)$", 1, "the same interval"),
    ("interval-bracket", "$(2,5)$", "$[2,5)$", 0, "2 is in one interval, not in the other"),
    ("interval-end", "$[2,7)$", "$[2,5)$", 0, "another right end"),
    ("display-bracket", "$7$", "Answer \\[ 7 \\]", 1, "display math"),
    ("inline-paren-sum", "$8$", "Answer \\( (5+3) \\)", 1, "5 + 3 is 8"),
    ("percent", "$15\\%$", "$15$", 1, "a percentage given as its number"),
    ("assignment", "$x=4$", "$4$", 1, "the value of the assignment"),
    ("equation", "$y = 2x + 1$", "$y = 1 + 2x$", 1, "the same line"),
    ("inequality-set", "$x \\ge 3$", "$x \\in [3, \\infty)$", 1, "the same set of x"),
    ("symbolic", "$\\frac{x^2 - 1}{x - 1}$", "$x + 1$", 1, "equal where both are defined"),
    ("sqrt-approx", "$\\sqrt{2}$", "$1.414214$", 1, "equal to 6 decimals, the library's rounding"),
    ("sqrt-approx-far", "$\\sqrt{2}$", "$1.41$", 0, "not equal to 6 decimals"),
    ("matrix", MATRIX, MATRIX, 1, "the same matrix"),
    ("matrix-wrong", MATRIX, "$\\begin{pmatrix}1 & 2\\\\ 4 & 3\\end{pmatrix}$", 0, "a row reversed"),
    # several boxes: labels within one sentence join them; a step or a sentence's end does not
    ("parts-labelled", PAIRS, "$$\\boxed{(2, 1)} \\text{ for the first case and } \\boxed{(0, 0)}$$", 1,
     "each pair boxed, a label between"),
    ("parts-labelled-wrong", PAIRS, "$$\\boxed{(2, 1)} \\text{ for the first case and } \\boxed{(0, 1)}$$", 0,
     "(0, 1) is not (0, 0)"),
    ("assignment-labels", "$a = 3, b = -1$", "So $a = \\boxed{3}$ and $b = \\boxed{-1}$.", 1, "each value labelled"),
    ("assignment-labels-swapped", "$a = 3, b = -1$", "So $a = \\boxed{-1}$ and $b = \\boxed{3}$.", 0,
     "a is not -1: the labels say which value is which"),
    ("self-correction-wait", PAIRS, "\\boxed{(2, 1)}, no wait, \\boxed{(0, 0)}", 0,
     "the first box was taken back: the answer is (0, 0) alone"),
    ("self-correction-comma", PAIRS, "First \\boxed{(2, 1)}, which fails the check, so it is \\boxed{(0, 0)}", 0,
     "the first box failed a check: the answer is (0, 0) alone"),
    ("self-correction-sentence", "$3, 5$", "We get \\boxed{3}. That fails the check; the root is \\boxed{5}", 0,
     "a sentence ends after the first box: the answer is 5 alone"),
    ("self-correction-actually", "$3, 5$", "\\boxed{3}, actually \\boxed{5}", 0, "3 taken back"),
    ("one-box-two-parts", "\\boxed{4} apples and \\boxed{6} pears", "$\\boxed{4,6}$", 1,
     "a gold of two labelled boxes, one box listing both"),
    ("gold-boxes-step", "\\boxed{4} no no no no \\boxed{6}", "$\\boxed{4,6}$", 0,
     "the gold's first box was taken back"),
    ("gold-boxes-unboxed-set", "$$\\boxed{1}, \\boxed{4}, \\boxed{9}$$", "$${1, 4, 9}$$", 1,
     "the gold's parts written as one set, unboxed"),
    ("gold-boxes-unboxed-set-wrong", "$$\\boxed{1}, \\boxed{4}, \\boxed{9}$$", "$${1, 4, 8}$$", 0, "8 is not 9"),
    ("repeated-box-gold", "so \\boxed{012}. Let me check again: 12 is right.\n\n**Final Answer**\n\\boxed{012}",
     "$012$", 1, "the gold's last box"),
    # a final answer stated after the last box is the later answer
    ("final-answer-after-box", "$1210$", LOAN, 1, "the final answer, 1,210"),
    ("final-answer-after-box-step", "$100$", LOAN, 0, "the box was a step"),
    # Euler's number written upright
    ("upright-e", "$1 - \\frac{1}{\\mathrm{e}}$", "$1 - \\frac{1}{e}$", 1, "e upright or italic"),
    ("upright-e-sign", "$1 - \\frac{1}{\\mathrm{e}}$", "$1 + \\frac{1}{\\mathrm{e}}$", 0, "1 + 1/e is not 1 - 1/e"),
    ("upright-e-power", "$\\mathrm{e}^{2}$", "$e^2$", 1, "e squared"),
]

# Every case the bare library gets wrong, and why (its parse and verify with their defaults)
BARE_IS_WRONG = {
    "assignment-labels-swapped": "labelled boxes are joined by their contents alone: {-1, 3} against a = 3, b = -1",
    # boxes under 70 characters apart with "and", "or", "," or ";" between (or under 10 with anything) are one set
    "self-correction-wait": "a taken-back box joins the set: {(2, 1), (0, 0)}",
    "self-correction-comma": "a box that failed a check joins the set: {(2, 1), (0, 0)}",
    "self-correction-sentence": "boxes in two sentences join: {3, 5}",
    "self-correction-actually": "a taken-back box joins the set: {3, 5}",
    "upright-e": "\\mathrm{e} becomes a word, and the gold's formula around it parses as 1 alone",
    "upright-e-sign": "both read as 1: 1 - \\frac{1}{ is all that parses",
    "upright-e-power": "\\mathrm{e}^{2} is a word squared, not e squared",
}


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory, math_grader):
    """The project's verdict on each case, graded as a data file's rows are (by the session's math worker)."""
    path = tmp_path_factory.mktemp("mv") / "cases.jsonl"
    path.write_text("".join(json.dumps({"question": f"q{i}", "answer": case[1]}) + "\n"
                            for i, case in enumerate(CASES)))
    task = make_task(str(path))
    task.grader = math_grader
    graded = grade_batch(task, [(problem, case[2]) for problem, case in zip(task.problems, CASES)])
    return {case[0]: verdict for case, verdict in zip(CASES, graded)}


def test_cases_are_well_formed():
    assert len({case[0] for case in CASES}) == len(CASES)
    assert all(case[3] in (0, 1) and case[4] for case in CASES)
    assert set(BARE_IS_WRONG) <= {case[0] for case in CASES}


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_the_project_grades_the_case_right(verdicts, case):
    verdict = verdicts[case[0]]
    assert (verdict.reward, verdict.failure) == (case[3], ""), (case, verdict)


def test_the_bare_library_is_wrong_exactly_where_listed():
    """So the project, right on every case, is right at least as often as the library."""
    import math_verify as mv
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    wrong = {case[0] for case in CASES if float(mv.verify(mv.parse(case[1]), mv.parse(case[2]))) != case[3]}
    assert wrong == set(BARE_IS_WRONG)
