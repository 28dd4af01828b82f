"""Optional features on top of the core, each imported only when its flag asks for it: train.py, eval.py
and the commands import these files, and no file of the core imports one (tests/test_layout.py), so a
fork may delete any of them, or the whole folder, and a run that does not ask for it still runs.

    lora.py       LoRA adapters through peft: --lora-rank r
    plan.py       the per-GPU memory plan, from the config alone: --plan
    plot.py       runs' metrics as a PNG or SVG: python -m extras.plot RUN [RUN ...] --out fig.svg
    seeds.py      one config over several seeds, mean and SE over them: python -m extras.seeds --seeds 0,1,2 --out DIR
    pass_filter.py  a data file's rows by the model's pass rate: python -m extras.pass_filter DATA RATES --keep 0.1,0.9
    health.py     a run's curves read: symptom, evidence, causes, knobs: python -m extras.health RUN [RUN ...]

The default run imports none of these but health.py, which its evals call (--health false: none).
"""
