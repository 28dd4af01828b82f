"""Held-out evaluation: avg@n, unbiased pass@k, maj@n and greedy accuracy (docs/math.md §6).

    python eval.py                     # the shipped tiny model on the whole running-sum held-out split
    python eval.py --model PATH --data math500.jsonl -n 64 --k 1,2,4,8,16,32,64 --preset paper
    python eval.py --config runs/X/config.yaml --model runs/X/checkpoints/step-100
                                       # what train.py's periodic eval logged at step 100
                                       # (a LoRA checkpoint, an adapter folder: its base + the adapters, merged)
    python eval.py --config configs/tiny_delethink.yaml --max-chunks 12    # test-time scaling
    torchrun --nproc_per_node 2 eval.py ...                                 # same numbers, 2 ranks
    python eval.py --data running_sum,countdown                            # per-domain tables
    python eval.py --data code.jsonl --responses responses.jsonl           # grade given responses, no model
    python eval.py --compare runs/eval-a runs/eval-b                       # B − A, paired over problems
    python eval.py --compare runs/X/evals/step-0.jsonl runs/X/evals/step-150.jsonl   # a run's own evals

`train.py` calls `evaluate` for its periodic eval with the settings of `config.eval_settings`, and
this script builds the same Config (every Config field is a flag here too), so the two never
disagree. The draws do not depend on the number of ranks either: the problems are cut into fixed
batches and batch b is sampled after torch.manual_seed(seed + b), whichever rank takes it.

Writes to --out: problems.jsonl (per problem: every response with its extracted answer and
reward, the problem's accuracy and pass@k, the majority answer), summary.json (metrics and
settings), TensorBoard scalars. Every accuracy, pass@k, maj@n and greedy figure comes with its
standard error over problems (eval/accuracy_se, ...; docs/math.md §6.1), printed as "78.8% ± 1.4";
--compare sets two evals of the same problems side by side, paired problem by problem (§6.2).
With several --data sources every metric is also given per source, eval/<domain>/pass@1 ....

--responses FILE grades responses written elsewhere instead of sampling, no model loaded (no torch
either); grading/responses.py reads the file: its shapes and how each line finds its problem.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import Counter
from dataclasses import replace
from datetime import datetime
from pathlib import Path

from tqdm import tqdm

from config import check_prompts_fit, validate
from data import load
from rewards import DataError, grade_batch
from tasks import detail_means, has_own_splits, per_domain

PRESETS = {  # sampling at eval; "paper": ROVER, PACS and NSR evaluation settings (docs/math.md §6)
    "config": {},
    "paper": {"eval_temperature": 0.6, "eval_top_p": 0.95},
}


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of Chen et al. (2021) for one problem with n samples, c of them correct.
    n=4, c=2: k=1 -> 0.5, k=2 -> 0.833333."""
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority(samples: list[dict]) -> tuple[str | None, dict | None]:
    """(most frequent extracted answer, the first sample that gave it); a tie goes to the answer seen
    first, and responses without an answer do not vote. Answers 5, 7, 7, None -> ("7", the 2nd sample)."""
    votes = Counter(s["extracted"] for s in samples if s["extracted"] is not None)
    if not votes:
        return None, None
    top = votes.most_common(1)[0][0]  # most_common keeps first-seen order among equal counts
    return top, next(s for s in samples if s["extracted"] == top)


def graded(task, episodes, tokenizer, answer_after: str = "") -> list[dict]:
    """Each response's record; a trace of several chunks also keeps what each chunk wrote, a
    multi-turn trace its transcript (and its environment's reward and numbers)."""
    verdicts = grade_batch(task, [(e.problem, e.text) for e in episodes], answer_after=answer_after)
    records = []
    for e, v in zip(episodes, verdicts):
        e.settle(v)
        trace = ({"transcript": e.transcript} if e.transcript else
                 {"chunks": e.chunk_texts(tokenizer)} if len(e.chunks) > 1 else {})
        records.append({**sample_record(e.text, replace(v, details=e.details), reward=e.reward),
                        "length": len(e.response_ids), "truncated": e.truncated, **trace})
    return records


def sample_record(response: str, verdict, reward: float | None = None) -> dict:
    """A graded response as problems.jsonl keeps it, with the grader's details when it has some.
    reward: what the sample scored, when not the verdict's (a multi-turn trace's environment's).
    correct: the task's verdict gave full marks (reward ≥ 1) to the response (a trace: its last
    turn), what pass@k and maj@n count; an environment's reward (1/k for a right answer at attempt
    k: examples/env_retry.py) shapes training and avg@n, and a right final answer is correct at any
    attempt; with --reward-terms the task's own grader decides it (reward/correct), not the weighted total."""
    return {"response": response, "extracted": verdict.answer,
            "reward": verdict.reward if reward is None else reward,
            "correct": verdict.details.get("reward/correct", verdict.reward) >= 1.0,
            "failure": verdict.failure, **({"details": verdict.details} if verdict.details else {})}


def problem_record(problem, samples: list[dict], ks: list[int], greedy: dict | None) -> dict:
    """One problem's responses and its per-problem metrics (the rows of problems.jsonl), with the problem's id
    where it has one."""
    n, c = len(samples), sum(s["correct"] for s in samples)
    answer, first = majority(samples)
    return {**({"id": problem.id} if problem.id else {}), "prompt": problem.prompt, "gold": problem.answer,
            **({"domain": problem.domain} if problem.domain else {}),
            "correct": c, "accuracy": c / n, "pass@k": {str(k): pass_at_k(n, c, k) for k in ks},
            "majority_answer": answer, "majority_correct": bool(first and first["correct"]), "greedy": greedy, "samples": samples}


def standard_error(values: list[float]) -> float | None:
    """The standard error of the mean of per-problem values, each problem one unit whose n samples were
    averaged first (the clustered SE, docs/math.md §6.1): sqrt(Σ (x_i − x̄)² / (P (P − 1))) over P problems;
    None below 2 problems, where no spread can be seen. [1, 0, 1, 1] -> 0.25; [0.75, 0.25] -> 0.25."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((x - mean) ** 2 for x in values) / (len(values) * (len(values) - 1)))


def per_problem(records: list[dict], ks: list[int]) -> dict[str, list[float]]:
    """Each problem's value of every per-problem metric, the units its mean and standard error are taken
    over: {"accuracy": [c/n of each problem], "pass@k": [...], "maj@n": [0 or 1], "greedy": [its reward]}
    (greedy only where it was sampled). Reads problems.jsonl's rows as eval.py writes them."""
    n = len(records[0]["samples"])
    values = {"accuracy": [r["correct"] / len(r["samples"]) for r in records]}
    values.update({f"pass@{k}": [r["pass@k"][str(k)] for r in records] for k in ks})
    values[f"maj@{n}"] = [float(r["majority_correct"]) for r in records]
    if any(r["greedy"] is not None for r in records):
        values["greedy"] = [float(r["greedy"]["reward"]) if r["greedy"] else 0.0 for r in records]
    return values


def summarize(records: list[dict], ks: list[int]) -> dict:
    """Flat eval/ metrics over problems: accuracy (avg@n: the mean over all samples of whether each
    is correct (sample_record), = pass@1 estimated with n), pass@k, maj@n, greedy accuracy, each with
    its standard error over problems (eval/accuracy_se, ...: standard_error), mean length, truncation
    rate, the number of gradings that timed out or crashed (scored 0), and the mean of each grader
    detail. n is each problem's number of samples (maj@n is named by the first one's)."""
    samples = [s for r in records for s in r["samples"]]
    greedy = [r["greedy"] for r in records if r["greedy"] is not None]
    out = {}
    for name, values in per_problem(records, ks).items():
        out[f"eval/{name}"] = sum(values) / len(records)
        se = standard_error(values)
        if se is not None:
            out[f"eval/{name}_se"] = se
    if all("length" in s for s in samples):  # sampled here, not graded from --responses
        out.update({"eval/length": sum(s["length"] for s in samples) / len(samples),
                    "eval/truncated": sum(s["truncated"] for s in samples) / len(samples)})
    out["eval/grader_failures"] = float(sum(bool(s["failure"]) for s in samples + greedy))
    out.update({f"eval/{name}": v for name, v in detail_means([s.get("details", {}) for s in samples]).items()})
    return out


def paired(a: list[float], b: list[float]) -> dict:
    """B − A over the same problems, each problem's difference the unit (docs/math.md §6.2): the means,
    the mean difference, its standard error from the per-problem differences, the 95% interval
    diff ± 1.96 SE, the SE the two means' own SEs would give as if independent, and the share of the
    variance the pairing removed, 1 − SE² / SE_unpaired². a = [1, 0, 1, 0.5], b = [1, 0.5, 1, 1] ->
    diff 0.25, se 0.144338, interval (-0.032902, 0.532902), se_unpaired 0.270031, variance_cut 0.714286."""
    diff = sum(b) / len(b) - sum(a) / len(a)
    se = standard_error([y - x for x, y in zip(a, b)])
    unpaired = math.hypot(standard_error(a), standard_error(b))
    return {"a": sum(a) / len(a), "b": sum(b) / len(b), "diff": diff, "se": se,
            "low": diff - 1.96 * se, "high": diff + 1.96 * se, "se_unpaired": unpaired,
            "variance_cut": 1 - se ** 2 / unpaired ** 2 if unpaired > 0 else 0.0}


def shown(metrics: dict, keys) -> str:
    """The named metrics as a log line, each with its standard error where it has one:
    "eval/accuracy 0.788 ± 0.014 eval/length 41.200"."""
    return " ".join(f"{k} {metrics[k]:.3f}" + (f" ± {metrics[k + '_se']:.3f}" if k + "_se" in metrics else "")
                    for k in keys if not k.endswith("_se"))


def summarize_domains(records: list[dict], ks: list[int]) -> dict:
    """summarize over all problems, then over each source's (a mixed run's records carry their
    domain): eval/pass@1, ..., eval/running_sum/pass@1, eval/countdown/pass@1, ..."""
    out = summarize(records, ks)
    for domain in dict.fromkeys(r["domain"] for r in records if "domain" in r):
        mine = summarize([r for r in records if r.get("domain") == domain], ks)
        out.update({per_domain(name, domain): value for name, value in mine.items()})
    return out


def evaluate(lm, tokenizer, task, problems, *, n: int, ks: list[int], sampling, chat_template: bool, seed: int,
             shape=None, greedy: bool = False, batch_size: int = 256, answer_after: str = "",
             progress: bool = False, chat_kwargs: dict | None = None) -> tuple[dict, list[dict]]:
    """Sample n responses per problem (rollout.Sampling; batch_size sequences per generate call; the
    rollout's `shape`, config.rollout_shapes' second, None: plain), and one greedy response if
    asked; grade them. Returns (metrics of `summarize`, one record per problem in order), the same
    on every rank."""
    # here, not at the top: grading given responses (main) samples nothing and loads no torch
    import torch
    import torch.distributed as dist

    from rollout import PLAIN, encode_prompts, generate

    shape = shape or PLAIN
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    per_call = max(1, batch_size // n)
    mine = [(b, s) for b, s in enumerate(range(0, len(problems), per_call)) if b % world == rank]
    samples, best = {}, {}  # problem index -> its graded samples / its graded greedy response
    with torch.no_grad():
        for b, start in tqdm(mine, desc="eval", disable=not progress or rank != 0, unit="batch"):
            batch = problems[start:start + per_call]
            torch.manual_seed(seed + b)
            prompts = encode_prompts(tokenizer, batch, chat_template, shape.tools, chat_kwargs)
            episodes = generate(lm, tokenizer, batch, prompts, group_size=n, sampling=sampling, shape=shape)
            records = graded(task, episodes, tokenizer, answer_after)
            for j in range(len(batch)):
                samples[start + j] = records[j * n:(j + 1) * n]
        # Greedy: one response per problem, so batch_size problems per call (not batch_size / n).
        for b, start in enumerate(range(0, len(problems), batch_size) if greedy else []):
            if b % world == rank:
                batch = problems[start:start + batch_size]
                prompts = encode_prompts(tokenizer, batch, chat_template, shape.tools, chat_kwargs)
                episodes = generate(lm, tokenizer, batch, prompts, group_size=1, sampling=replace(sampling, temperature=0.0), shape=shape)
                best.update({start + j: r for j, r in enumerate(graded(task, episodes, tokenizer, answer_after))})
    if world > 1:
        parts = [None] * world
        dist.all_gather_object(parts, (samples, best))
        samples = {i: x for part, _ in parts for i, x in part.items()}
        best = {i: x for _, part in parts for i, x in part.items()}
    ordered = [problem_record(p, samples[i], ks, best.get(i)) for i, p in enumerate(problems)]
    return summarize_domains(ordered, ks), ordered


# ============================================================================ stand-alone

def parse_args(argv=None):
    """(eval options, Config). Flags this parser does not know go to train.py's Config parser."""
    from config import Parser, _parser_for, parse_config

    description = __doc__
    if {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):  # the shapes of a --responses file too
        from grading import responses as responses_file

        description += "\n" + responses_file.__doc__
    parser = Parser(
        description=description, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Every train.py Config field is accepted as well (python train.py --help); "
               "the flags above set the eval_* fields and replace the training flags of the same name.")
    parser.add_argument("--data", help="a built-in task (its held-out split), a .jsonl/.json/.parquet file or a "
                                       "dataset by name (org/name[:config[:split]], needs datasets); several, "
                                       "comma-separated, for per-domain tables")
    parser.add_argument("--responses", metavar="FILE", help='grade these responses instead of sampling, e.g. JSONL '
                        'of {"index": problem number from 0, "response": "..."} (shapes above); no model is loaded')
    parser.add_argument("--id-field", default="", metavar="NAME",
                        help="join --responses lines to the --data rows whose NAME has the same value")
    parser.add_argument("-n", "--samples", type=int, dest="eval_samples", metavar="N", help="samples per problem")
    parser.add_argument("--k", type=_parser_for(list), dest="eval_k", metavar="K,K", help="pass@k values, e.g. 1,2,4,8")
    parser.add_argument("--problems", type=int, dest="eval_problems", metavar="P",
                        help="the first this many problems; 0 = all (default: all, or the --config's value)")
    parser.add_argument("--preset", choices=PRESETS, default="config",
                        help="config: the config's eval sampling; paper: temperature 0.6, top-p 0.95")
    parser.add_argument("--temperature", type=float, dest="eval_temperature", metavar="T")
    parser.add_argument("--top-p", type=float, dest="eval_top_p", metavar="P")
    parser.add_argument("--max-chunks", type=int, dest="eval_max_chunks", metavar="I", help="Markovian chunk cap I")
    parser.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=True, dest="eval_greedy",
                        help="also score one greedy response per problem")
    parser.add_argument("--batch-size", type=int, dest="eval_batch_size", metavar="S",
                        help="sequences per generate call (the draws depend on it)")
    parser.add_argument("--out", default="", help="output folder (default runs/eval-<timestamp>)")
    parser.add_argument("--step", type=int, help="TensorBoard step (default: N of a checkpoints/step-N path, else 0)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"),
                        help="compare two evals of the same problems, problem by problem (eval.py --out folders or "
                             "problems .jsonl files, e.g. a run's evals/step-N.jsonl): B − A, its SE, a 95%% interval")
    args, rest = parser.parse_known_args(argv)
    if args.compare:
        if rest:
            raise DataError(f"--compare reads two written evals; drop {' '.join(rest)}")
        return args, None
    cfg = parse_config(rest, knobs=not args.responses)  # grading reads no algorithm's knob
    overrides = {} if cfg.config else {"eval_problems": 0}
    overrides.update(PRESETS[args.preset])
    overrides.update({k: v for k, v in vars(args).items() if k.startswith("eval_") and v is not None})
    if args.data:
        overrides["data"] = args.data
        overrides["eval_data"] = ",".join("" if has_own_splits(src.strip()) else src.strip()
                                          for src in args.data.split(","))
    if args.id_field and not args.responses:
        raise DataError(f"--id-field {args.id_field} joins --responses lines to problems: give --responses FILE")
    if args.responses:
        if args.eval_samples is not None:
            raise DataError("-n samples responses; --responses brings its own: drop -n")
        if "," in (args.data or cfg.data):
            raise DataError(f"--responses {args.responses}: its indices count the problems of one source; --data "
                            f"{args.data or cfg.data} has several: grade each source's responses on its own")
        overrides["eval_samples"] = max(overrides.get("eval_k", cfg.eval_k))  # the count is the file's (checked there)
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return args, cfg


def main(argv=None) -> None:
    first = os.environ.get("RANK", "0") == "0"  # every rank finds the same mistake; one says it
    try:
        args, cfg = parse_args(argv)
    except (ValueError, RuntimeError) as e:  # a DataError; with --resume, checkpoint's CheckpointError
        sys.exit(f"error: {e}" if first else 1)
    if args.compare:
        try:
            print(compared(*args.compare)[0])
        except ValueError as e:
            sys.exit(f"error: {e}")
        return
    (grade_given if args.responses else sample_and_grade)(args, cfg, first)


def held_out(cfg, first: bool):
    """(the task, its held-out problems), checked before any model loads or any grading starts;
    raises ValueError naming what to change."""
    validate(cfg, world=1)
    task, _, problems = load(cfg)
    if not problems:
        raise ValueError(f"no held-out problems: --data {cfg.data} has none; give --data FILE")
    if first:
        for note in task.warnings:  # a weak sandbox, said once
            print(f"warning: {note}", file=sys.stderr, flush=True)
    return task, problems


def output_folder(args, first: bool) -> Path:
    """--out (default runs/eval-<timestamp>), created by rank 0 once every check has passed, and
    before any sampling or grading, so that a folder it cannot write is said at once."""
    out = Path(args.out or Path("runs") / f"eval-{datetime.now():%Y%m%d-%H%M%S}")
    if first:
        writable(out)
    return out


def grade_given(args, cfg, first: bool) -> None:
    """eval.py --responses: grade the file's responses to the held-out problems; no model, no torch."""
    from grading import responses as responses_file

    task = None
    try:
        task, problems = held_out(cfg, first)
        problems, responses = responses_file.read_responses(args.responses, problems, cfg.eval_data or cfg.data,
                                                            args.id_field)
        ks = responses_file.response_ks(cfg.eval_k, explicit=args.eval_k is not None, responses=responses)
        out = output_folder(args, first)
    except (ValueError, FileNotFoundError) as e:
        if task is not None:
            task.close()  # its grading workers
        sys.exit(f"error: {e}")
    metrics, records = grade_responses(task, problems, responses, ks, batch_size=cfg.eval_batch_size,
                                       answer_after=cfg.answer_after)
    task.close()
    n = sorted({len(r["samples"]) for r in records})
    write_results(out, args.step or 0, {"data": cfg.eval_data or cfg.data, "responses": args.responses,
                                        "problems": len(records), "n": n[0] if len(n) == 1 else n, "k": ks},
                  metrics, records,
                  f"{args.responses} on {cfg.eval_data or cfg.data}: {sum(map(len, responses.values()))} "
                  f"responses to {len(records)} problems")


def sample_and_grade(args, cfg, first: bool) -> None:
    """eval.py: sample the model's responses to the held-out problems (every rank its share), grade them."""
    from transformers.utils import logging as hf_logging

    from checkpoint import CheckpointError
    from config import eval_settings, rollout_shapes, sampler_class
    from model import check_model_folder, load_model
    from parallel import autocast_context, gather_objects, setup_distributed, teardown, weights_dtype

    try:
        task, problems = held_out(cfg, first)  # validated first: --engine names a sampler
        if not sampler_class(cfg).alone:
            raise ValueError(f"--engine {cfg.engine} samples train.py's rollouts and evals; eval.py samples with "
                             f"--engine hf or fast: add --engine hf")
        tokenizer, hf_config = check_model_folder(cfg.model, cfg.trust_remote_code)
        _, shape = rollout_shapes(cfg, tokenizer)  # the held-out eval's
        check_prompts_fit(cfg, tokenizer, hf_config, problems, shape.tools)
        out = output_folder(args, first)
    except (ValueError, FileNotFoundError, CheckpointError) as e:
        sys.exit(f"error: {e}" if first else 1)
    rank, world, device = setup_distributed(cfg)
    out = Path(gather_objects(str(out), world)[0])  # rank 0's timestamp names the folder
    hf_logging.disable_progress_bar()  # our tqdm is the one progress bar
    # the weights as train.py's policy forward sees them, so that the numbers agree with its eval
    lm = load_model(cfg.model, dtype=weights_dtype(cfg, device), device=device,
                    trust_remote_code=cfg.trust_remote_code, trainable=False)
    sampler = sampler_class(cfg).start(cfg, lm, world)
    settings = eval_settings(cfg, shape, sampler)
    with sampler.serving(lm, autocast_context(cfg, device)):
        metrics, records = evaluate(lm, tokenizer, task, problems, progress=True, **settings)
    if rank == 0:
        chunks = cfg.eval_max_chunks or cfg.max_chunks
        described = {"model": cfg.model, "data": cfg.eval_data or cfg.data, "problems": len(records),
                     "n": cfg.eval_samples, "k": cfg.eval_k, "temperature": cfg.eval_temperature,
                     "top_p": cfg.eval_top_p, "top_k": cfg.top_k, "max_new_tokens": cfg.max_new_tokens,
                     "max_chunks": chunks, "carryover": cfg.chunk_carryover, "chunk_head": cfg.chunk_head_tokens,
                     "greedy": cfg.eval_greedy, "batch_size": cfg.eval_batch_size, "seed": settings["seed"]}
        step, name = args.step, Path(cfg.model).name
        if step is None:
            step = int(name[5:]) if name.startswith("step-") and name[5:].isdigit() else 0
        write_results(out, step, described, metrics, records,
                      f"{cfg.model} on {described['data']}: {len(records)} problems × n = {cfg.eval_samples}, "
                      f"temperature {cfg.eval_temperature}, top-p {cfg.eval_top_p}, max_chunks {chunks}")
    teardown()


def grade_responses(task, problems: list, responses: dict[int, list[str]], ks: list[int], *, batch_size: int,
                    answer_after: str = "") -> tuple[dict, list[dict]]:
    """Grade responses written elsewhere, batch_size at a time (each batch within the grading
    budget): (metrics, records) as evaluate returns them, for the problems that have responses,
    each record with its problem's index."""
    items = [(i, text) for i in sorted(responses) for text in responses[i]]
    verdicts = []
    for start in tqdm(range(0, len(items), batch_size), desc="grade", unit="batch"):
        verdicts += grade_batch(task, [(problems[i], text) for i, text in items[start:start + batch_size]],
                                answer_after=answer_after)
    samples: dict[int, list[dict]] = {}
    for (i, text), verdict in zip(items, verdicts):
        samples.setdefault(i, []).append(sample_record(text, verdict))
    records = [{"index": i, **problem_record(problems[i], samples[i], ks, None)} for i in sorted(samples)]
    return summarize_domains(records, ks), records


def read_eval(path: str) -> list[dict]:
    """An eval's rows, one per problem: an eval.py --out folder's problems.jsonl, or a .jsonl of such rows
    (a training run's evals/step-N.jsonl). ValueError naming the file, or what to give instead."""
    file = Path(path)
    if file.is_dir() and not (file / "problems.jsonl").is_file():
        steps = sorted(int(f.stem[5:]) for f in (file / "evals").glob("step-*.jsonl"))
        raise ValueError(f"{path}: a training run; compare one of its evals, {path}/evals/step-N.jsonl (N: "
                         f"{', '.join(map(str, steps))})" if steps else
                         f"{path}: no problems.jsonl here; give an eval.py --out folder or a problems .jsonl file")
    file = file / "problems.jsonl" if file.is_dir() else file
    if not file.is_file():
        raise ValueError(f"{path}: no such file or folder")
    rows = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        try:
            row = json.loads(line)
            if not {"prompt", "gold", "samples", "pass@k", "majority_correct", "greedy"} <= set(row):
                raise ValueError
        except ValueError:
            raise ValueError(f"{file}:{number}: not a problem's row as eval.py writes them (problems.jsonl)") from None
        rows.append(row)
    if not rows:
        raise ValueError(f"{file}: no problems in it")
    return rows


def aligned(a: list[dict], b: list[dict], names: tuple[str, str]) -> list[dict]:
    """b's rows in a's order, each matched to a's by its problem (its id, else its prompt and gold; a
    problem listed twice matches in turn); ValueError, with counts and an example, when the problem sets differ."""
    def keyed(rows):
        seen, out = Counter(), {}
        for r in rows:
            key = ("id", r["id"]) if "id" in r else (r["prompt"], str(r["gold"]))
            seen[key] += 1
            out[(key, seen[key])] = r
        return out

    ka, kb = keyed(a), keyed(b)
    if ka.keys() != kb.keys():
        only_a, only_b = [k for k in ka if k not in kb], [k for k in kb if k not in ka]
        example = (only_a or only_b)[0][0]
        raise ValueError(f"{names[0]} and {names[1]} are evals of different problems: {len(a)} and {len(b)} problems, "
                         f"{len(only_a)} only in the first, {len(only_b)} only in the second (e.g. {example!r}); "
                         f"a paired comparison needs the same problems: evaluate both with the same --data and "
                         f"--problems")
    return [kb[k] for k in ka]


def compared(a_path: str, b_path: str) -> tuple[str, dict]:
    """B against A, problem by problem, for every per-problem metric both evals have: (a Markdown table,
    {metric: paired(...)})."""
    a, b = read_eval(a_path), read_eval(b_path)
    b = aligned(a, b, (a_path, b_path))
    if len(a) < 2:
        raise ValueError(f"{a_path} and {b_path}: one problem; a standard error needs two or more")
    va, vb = (per_problem(rows, [int(k) for k in rows[0]["pass@k"]]) for rows in (a, b))
    results = {name: paired(va[name], vb[name]) for name in va if name in vb}
    pct = lambda x: f"{100 * x:+.1f}"  # noqa: E731
    lines = [f"A = {a_path}, B = {b_path}: {len(a)} problems (n = {len(a[0]['samples'])} and {len(b[0]['samples'])})",
             "", "| metric | A | B | B − A | 95% interval | SE paired | SE unpaired | variance removed by pairing |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {100 * r['a']:.1f}% ± {100 * standard_error(va[name]):.1f} | "
                     f"{100 * r['b']:.1f}% ± {100 * standard_error(vb[name]):.1f} | {pct(r['diff'])} | "
                     f"[{pct(r['low'])}, {pct(r['high'])}] | {100 * r['se']:.1f} | {100 * r['se_unpaired']:.1f} | "
                     f"{100 * r['variance_cut']:.0f}% |")
    lines.append("\nin points of %; ± = the standard error over problems (docs/math.md §6.1-6.2); an interval "
                 "that excludes 0 is a difference larger than these problems' and samples' noise. Paired like this, "
                 f"{len(a)} problems detect a true accuracy difference of {280 * results['accuracy']['se']:.1f} "
                 "points 80% of the time at the 5% level (2.8 SE paired).")
    return "\n".join(lines), results


def writable(out: Path) -> None:
    """Create the output folder and prove it takes a file, or say why not."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"--out {out}: cannot write there ({e.strerror}); choose another folder") from None


def percent(metrics: dict, key: str) -> str:
    """A proportion in % with its standard error where the metrics have one: "78.8% ± 1.4"."""
    se = metrics.get(f"{key}_se")
    return f"{100 * metrics[key]:.1f}%" + (f" ± {100 * se:.1f}" if se is not None else "")


def write_problems(path: Path, records: list[dict]) -> None:
    """One JSON line per problem (problem_record's), written whole to a temporary file and then renamed,
    so that a kill never leaves a half file under the final name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    with partial.open("w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")
    os.replace(partial, path)


def write_results(out: Path, step: int, described: dict, metrics: dict, records: list[dict], heading: str) -> None:
    """problems.jsonl, summary.json (metrics and the `described` settings) and TensorBoard scalars
    at `step`; then the pass@k table, one per source when there are several, on stdout."""
    # tensorboard's own writer, not torch's: grading --responses loads no torch
    import time

    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    write_problems(out / "problems.jsonl", records)
    (out / "summary.json").write_text(json.dumps({"metrics": metrics, "settings": described}, indent=1) + "\n")
    tb = EventFileWriter(str(out))
    scalars = [Summary.Value(tag=key, simple_value=value) for key, value in metrics.items()]
    tb.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=scalars)))
    tb.close()
    ks, domains = described["k"], Counter(r["domain"] for r in records if "domain" in r)
    print(heading)
    print("| k | " + " | ".join(str(k) for k in ks) + " |")
    print("|---" * (len(ks) + 1) + "|")
    print("| pass@k | " + " | ".join(percent(metrics, f"eval/pass@{k}") for k in ks) + " |")
    print(" ".join(f"{key[5:]} " + (percent(metrics, key) if f"{key}_se" in metrics else f"{value:.4f}")
                   for key, value in metrics.items() if "pass@" not in key and not key.endswith("_se")
                   and not key.startswith(tuple(f"eval/{d}/" for d in domains))))
    if domains:
        print("\n| domain | problems | accuracy | " + " | ".join(f"pass@{k}" for k in ks) + " |")
        print("|---" * (len(ks) + 3) + "|")
        for domain, count in domains.items():
            print(f"| {domain} | {count} | {percent(metrics, f'eval/{domain}/accuracy')} | "
                  + " | ".join(percent(metrics, f"eval/{domain}/pass@{k}") for k in ks) + " |")
    print(f"wrote {out}/problems.jsonl, summary.json and TensorBoard events")


if __name__ == "__main__":
    main()
