"""Grading beyond the built-in tasks, imported only when a run asks for it.

    files.py          data files of problems (JSONL, JSON, parquet): their rows, golds and FileTask
    math_answers.py   the answer rules of math data files, in the order a response travels (the gold of a
                      row, the final answer of a response, how the gold reads it): --data file.jsonl
    precheck.py       plain arithmetic that would stall math-verify, decided without it
    pool.py           graders in bounded worker processes: math-verify (its worker and CPU bound), and your
                      --reward file.py:function
    explain.py        one verdict's steps: python -m grading.explain --gold G --response R
    code.py           code problems (rows with tests) graded by running the program: --data code.jsonl
    sandbox.py        where model-written programs run: code problems and --env python
    responses.py      reading responses written elsewhere: eval.py --responses FILE
    mixed.py          several sources in one run, each graded by its own task: --data a,b --data-weights ...

The default run (built-in running sums, graded in process by rewards.py) imports none of these.
"""
