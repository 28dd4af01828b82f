"""Optional features, each imported only when its flag asks for it.

    lora.py       LoRA adapters through peft: --lora-rank r
    plan.py       the per-GPU memory plan, from the config alone: --plan
    mixed.py      several data sources in one run, with their weights: --data a,b --data-weights ...
    markovian.py  Markovian thinking, the rollout's shape that writes a trace in chunks: --max-chunks I
    trackers.py   wandb and trackio beside TensorBoard: --report-to tensorboard,wandb,trackio
    plot.py       runs' metrics as a PNG or SVG: python -m extras.plot RUN [RUN ...] --out fig.svg
    seeds.py      one config over several seeds, mean and SE over them: python -m extras.seeds --seeds 0,1,2 --out DIR
    pass_filter.py  a data file's rows by the model's pass rate: python -m extras.pass_filter DATA RATES --keep 0.1,0.9

The default run imports none of these.
"""
