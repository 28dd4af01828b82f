"""Grading beyond the built-in tasks, imported only when a run asks for it.

    files.py          data files of problems (JSONL, JSON, parquet): their rows, golds and FileTask
    math_answers.py   the answer rules of math data files (boxes, final-answer statements, golds of
                      several parts) and the math-verify worker: --data file.jsonl
    pool.py           graders in bounded worker processes: math-verify, and your --reward file.py:function
    code.py           code problems (rows with tests) graded by running the program: --data code.jsonl
    sandbox.py        where model-written programs run: code problems and --env python
    responses.py      reading responses written elsewhere: eval.py --responses FILE

The default run (built-in running sums, graded in process by rewards.py) imports none of these.
"""
