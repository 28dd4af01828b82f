"""A model's own graded responses as SFT data (`--algo sft --sft-data`): all of them, or the correct ones alone
(rejection sampling; expert iteration when the model is the one being trained, as Stanford CS336 names it).

    python -m extras.traces assets/tiny-running-sum traces.jsonl --correct --problems 256 -n 4
    python -m extras.traces runs/eval-X traces.jsonl --correct          # eval.py's output folder or problems.jsonl
    python -m extras.traces MODEL traces.jsonl -- --data train.jsonl --max-new-tokens 512   # any train.py flags

From a model folder: n responses (-n) to each of the first P (--problems) of --data's *training* problems,
sampled and graded as the held-out eval samples and grades (eval.evaluate: --eval-temperature, --eval-top-p,
max_new_tokens, the chat template, seeded), so that the traces never hold a held-out problem. Each prompt is
written as the data has it, before --prompt-template and --system-prompt: an SFT run with the same flags shows
the model the prompt it answered. From eval.py's output (problems.jsonl): its samples as it graded them; eval.py
samples held-out problems, so such traces are for a task whose eval is another split, and its prompts are after
--prompt-template (train on them without it).

One JSON line per response: {"prompt", "response", "answer" (the gold), "reward", "correct"} (and "id" where the
problem has one). Prints how many were written of how many sampled.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path


def rows_of(records: list[dict], correct_only: bool, prompts: list | None = None) -> list[dict]:
    """The JSON rows of eval.py's per-problem records (problem_record's), one per sample, the correct ones alone
    when asked. prompts: what to write as each record's prompt (default: its own)."""
    out = []
    for i, r in enumerate(records):
        for s in r["samples"]:
            if s["correct"] or not correct_only:
                out.append({**({"id": r["id"]} if "id" in r else {}), "prompt": prompts[i] if prompts else r["prompt"],
                            "response": s["response"], "answer": r["gold"], "reward": s["reward"],
                            "correct": s["correct"]})
    return out


def sampled(model: str, problems: int, n: int, flags: list[str]) -> tuple[list[dict], list]:
    """(eval.py's records of n responses to each of the first `problems` training problems of --data, the prompts
    to write: each problem's own, a chat when the data gave it turns)."""
    import data
    from config import eval_settings, parse_config, rollout_shapes, sampler_class, validate
    from eval import evaluate
    from model import check_model_folder, load_model
    from tasks import with_template

    cfg = parse_config([*flags, "--model", model, "--eval-samples", str(n), "--eval-k", "1", "--eval-greedy", "false"])
    validate(cfg, world=1)
    _, raw, _ = data.load(replace(cfg, prompt_template="", system_prompt=""))
    task, _, _ = data.load(cfg)
    raw = raw[:problems]
    tokenizer, _ = check_model_folder(cfg.model, cfg.trust_remote_code)
    _, shape = rollout_shapes(cfg, tokenizer)
    lm = load_model(cfg.model, trainable=False, trust_remote_code=cfg.trust_remote_code)
    sampler = sampler_class(cfg).start(cfg, lm, 1)
    _, records = evaluate(lm, tokenizer, task, with_template(raw, cfg.prompt_template, cfg.system_prompt),
                          progress=True, **eval_settings(cfg, shape, sampler))
    task.close()
    return records, [[*p.turns, {"role": "user", "content": p.prompt}] if p.turns else p.prompt for p in raw]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="a model folder, or eval.py's output (its folder or problems.jsonl)")
    parser.add_argument("out", help="the JSONL file to write")
    parser.add_argument("--correct", action="store_true", help="only the responses graded correct")
    parser.add_argument("--problems", type=int, default=256, help="a model folder: training problems to answer")
    parser.add_argument("-n", type=int, default=1, help="a model folder: responses per problem")
    parser.add_argument("flags", nargs="*", help="after --: train.py flags (--data, --max-new-tokens, ...)")
    args = parser.parse_args(argv)
    source = Path(args.source)
    evals = source / "problems.jsonl" if source.is_dir() else source
    try:
        if evals.is_file():
            records, prompts = [json.loads(line) for line in evals.read_text().splitlines() if line.strip()], None
        else:
            records, prompts = sampled(args.source, args.problems, args.n, args.flags)
    except ValueError as e:  # a DataError, a model folder's
        sys.exit(f"error: {e}")
    rows = rows_of(records, args.correct, prompts)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{args.out}: {len(rows)} responses of {sum(len(r['samples']) for r in records)} sampled"
          f"{' (the correct ones)' if args.correct else ''}")


if __name__ == "__main__":
    main()
