"""Why did this response score what it scored: one verdict, step by step, as the grader reached it.

    python -m grading.explain --gold '2, 3' --response '\\boxed{2}, both correct, and \\boxed{3}'
    python -m grading.explain --data tests/fixtures/math500.jsonl --row 4 --response @response.txt
    python -m grading.explain --task running_sum --gold 54 --response '12+7=19 19+35=54 <answer>54</answer>'

For a data file's math grader it prints the gold as rule 1 reads the field (--gold is such a field:
"#### 72" gives 72), the rule of 2 that found the response's final answer and the region math-verify
reads, the boxes and the closing run (and what cut it), the parts on both sides, the rules of 3 that
decided (as docs/math.md numbers them), the parsed forms and the verdict, or the bound of 4 that
ended it. It runs the grader's own functions (math_request, precheck, judge) in this process, the
judging under --grade-cpu seconds of CPU time after the worker's warm-up, so the verdict is the
worker's; hostile input is read in bounded time, as the grader reads it. For the built-in tasks
(--task running_sum or countdown) it prints the tag read and the verdict. A response or gold given
as @FILE is read from FILE.
"""
from __future__ import annotations

import argparse
import json
import logging
import signal
from pathlib import Path

from grading.math_answers import (CALCULATOR_ANNOTATION, MATH_ANSWER_CHARS, MAX_PARTS, AnswerTooLong, answer_parts,
                                  gold_reading, judge, last_boxes, listed_parts, math_request)
from grading.pool import GRADE_CPU, OverCPU, on_cpu_limit, warm_up, within_cpu
from grading.precheck import precheck
from grading.countdown import COUNTDOWN_ANSWER_CHARS, ExpressionError, grade_countdown, parse_arithmetic
from rewards import RUNNING_SUM_ANSWER_CHARS, DataError, Problem, answer_window, extract_tag, grade_running_sum

SHOWN = 160  # characters of any text printed: a hostile response is cut here, with its length said


def shown(value) -> str:
    """A value as printed: its repr, cut to SHOWN characters: "x" * 500 -> "'xxx...' ... (500 characters)"."""
    text = repr(value)
    return text if len(text) <= SHOWN else f"{text[:SHOWN]}... ({len(value)} characters)"


def explain_math(gold_field: str, response: str, cpu: float, gold_rule: str = "") -> list[tuple[str, str]]:
    """The steps of a math verdict, (label, what) each, in the order the response travels."""
    gold, rule = (gold_field, gold_rule) if gold_rule else gold_reading(gold_field)
    steps = [("gold", f"{shown(gold)}  ({rule})")]
    try:
        request = math_request(response, gold)
    except AnswerTooLong:
        return steps + [("verdict", f"0.0: a box, #### line or tag longer than {MATH_ANSWER_CHARS} characters is no "
                                    "sane answer; scored 0 unsent (rule 2)")]
    steps += [("final answer", f"{request['found']}: {shown(request['answer'])}"),
              ("region", f"{shown(request['region'])}  (what math-verify reads; the last number {request['number']!r} "
                         "if it reads nothing there)")]
    golds, listed = answer_parts(gold), listed_parts(gold)
    steps.append(("gold parts", f"{shown(golds)} (3.1 several parts: the response's last boxes are its parts)"
                  if len(golds) > 1 else f"{shown(listed)} (3.2 a list written without boxes: the response's "
                  "closing run of boxes is its answer)" if len(listed) > 1 else "one"))
    if request["found"].startswith("2.1") and (len(golds) > 1 or len(request["parts"]) > 1):
        run = ""
        if len(golds) == 1 and len(listed) > 1:
            why: list[str] = []
            last_boxes(CALCULATOR_ANNOTATION.sub("", response), MATH_ANSWER_CHARS, MAX_PARTS, labelled=True, why=why)
            run = f"; closing run: {shown(request['run'])}" + (f"; the box before it is a step: {why[0]}" if why else "")
        elif len(golds) == 1:
            run = "; a one-part gold reads the last box alone"
        steps.append(("boxes", f"the last {len(request['parts'])}: {shown(request['parts'])}{run}"))
    decided = precheck(request)
    if decided is not None:
        return steps + [("verdict", f"{decided.reward}: 4.1 the pre-check: plain arithmetic that cannot be within "
                                    "math-verify's tolerance of the gold, decided without it")]
    import math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    warm_up(math_verify)  # as a worker does before its first answer that is not a number: the bound is sized for it
    previous = signal.signal(signal.SIGPROF, on_cpu_limit)
    try:
        judged = within_cpu(cpu, judge, math_verify, request)
    except OverCPU:
        return steps + [("verdict", f"0.0, failure timeout: 4.2 over {cpu:g} s of CPU time (--grade-cpu)")]
    finally:
        signal.signal(signal.SIGPROF, previous)
    return steps + [("rule", judged.rule),
                    ("parsed", f"gold {shown(judged.gold or gold)}; answer {shown(judged.answer)} from "
                               f"{shown(judged.read)}"),
                    ("verdict", f"{judged.reward}  (maj@n votes on {shown(judged.answer)})")]


def explain_task(task: str, gold: str, response: str) -> list[tuple[str, str]]:
    """The steps of a built-in task's verdict (rewards.grade_running_sum, grading.countdown.grade_countdown)."""
    chars = RUNNING_SUM_ANSWER_CHARS if task == "running_sum" else COUNTDOWN_ANSWER_CHARS
    tag = extract_tag(answer_window(response, chars))
    steps = [("gold", shown(gold)),
             ("read", f"the last <answer> tag, within {chars} characters before its end: {shown(tag)}")]
    if task == "countdown" and tag is not None:
        try:
            value, used = parse_arithmetic(tag)
            steps.append(("parsed", f"value {value}, numbers used {sorted(used)}"))
        except ExpressionError as e:
            steps.append(("parsed", f"not arithmetic this grader reads: {e}"))
    verdict = (grade_running_sum if task == "running_sum" else grade_countdown)(Problem("", gold), response)
    return steps + [("verdict", f"{verdict.reward}, answer {shown(verdict.answer)}"
                                + (f", failure {verdict.failure}" if verdict.failure else ""))]


def text_argument(value: str) -> str:
    """A flag's text, or the contents of the file it names as @FILE."""
    return Path(value[1:]).read_text(encoding="utf-8", errors="surrogatepass") if value.startswith("@") else value


def _json_or_none(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m grading.explain", description=__doc__.split("\n\n")[0])
    parser.add_argument("--response", required=True, type=text_argument, help="the response, or @FILE")
    parser.add_argument("--gold", type=text_argument, help="the gold: a data row's answer field, or @FILE "
                        "(countdown: {\"numbers\": [...], \"target\": n})")
    parser.add_argument("--data", help="a data file whose row --row holds the gold (instead of --gold)")
    parser.add_argument("--row", type=int, default=0, help="the row of --data, from 0")
    parser.add_argument("--task", choices=("math", "running_sum", "countdown"), default="math",
                        help="whose grader: a data file's math grader (the default) or a built-in task's")
    parser.add_argument("--grade-cpu", type=float, default=GRADE_CPU, help="CPU seconds for the judging, as train.py's")
    args = parser.parse_args(argv)
    if (args.gold is None) == (args.data is None):
        parser.error("give the gold (--gold) or where it is (--data FILE --row N), one of them")
    if args.data and args.task != "math":
        parser.error(f"--data {args.data}: a data file is graded by the math grader; --task {args.task} takes --gold")
    if args.data:
        from grading.files import load_file

        try:
            problems = load_file(args.data)
        except DataError as e:
            parser.error(str(e))
        if not 0 <= args.row < len(problems):
            parser.error(f"--row {args.row}: {args.data} has rows 0 to {len(problems) - 1}")
        problem = problems[args.row]
        print(f"{'problem':13s} {shown(problem.prompt)}")
        steps = explain_math(problem.answer, args.response, args.grade_cpu,
                             gold_rule=f"rule 1 on the answer field of {args.data}, row {args.row}")
    elif args.task == "math":
        steps = explain_math(args.gold, args.response, args.grade_cpu)
    else:
        if args.task == "countdown" and not isinstance(_json_or_none(args.gold), dict):
            parser.error('--gold: countdown\'s gold is {"numbers": [...], "target": n}')
        steps = explain_task(args.task, args.gold, args.response)
    print(f"{'response':13s} {shown(args.response)}")
    for label, what in steps:
        print(f"{label:13s} {what}")


if __name__ == "__main__":
    main()
