"""Supervised fine-tuning (SFT): the update on demonstrations from a file instead of on sampled rollouts.

docs/math.md §12. The cold start of the small-model recipe (SFT, then RL: nanochat's chat_sft.py before
chat_rl.py; Stanford CS336's alignment assignment), and expert iteration when the demonstrations are a model's
own correct responses (extras/traces.py writes them).

    loss       L = −(1/N) Σ_rows Σ_t m_t · log π_θ(y_t | x, y_<t)   at τ = 1
               N = Σ m over the whole mini-batch on all ranks: the token mean of the response tokens' NLL
    logged     sft/nll = L (the same sum, as a share of the mini-batch); sft/epoch = demonstrations seen / rows

Each step takes the next prompts_per_step demonstrations of --sft-data instead of sampling (`source` below,
train.py calls it where it would call collect_rollouts) and trains on them through train.update: the same
micro-batches, ranks, FSDP/DDP, LoRA, checkpoints, resume and held-out eval (of --data's task) as any algorithm.

The data (--sft-data): a JSONL/JSON/parquet file, a saved dataset folder or a Hub dataset by name, read as
--data's files are (grading/files.py), one demonstration a row:
- {"prompt": ..., "response": ...} (or "completion"; the prompt in any of --data's prompt fields, text or a chat
  ending with the user's turn): the prompt is encoded as an RL prompt is (rollout.encode_prompts: --chat-template,
  --system-prompt, --prompt-template, --chat-template-kwargs), the response is its text's tokens and the EOS,
  as a sampled response ends: so SFT and RL see the same tokens. The loss is on the response and its EOS alone.
- {"messages": [{"role", "content"}, ...]}: one training row per assistant turn, its prompt the chat before it
  rendered by the template with the generation prompt: the loss is on the assistant turns alone, never on a user,
  system or template token. Each assistant turn must follow a user turn.
Order and epochs: demonstration i of the run is tasks.PromptStream's, the file reshuffled with --seed at each pass
(a run of max_steps × prompts_per_step demonstrations makes that many / rows passes); the run's data_pos counts
demonstrations, so --resume continues the same order. Padding carries no loss (rollout.collate's response mask).

Refused, since SFT samples nothing in training and reads no reward: a group of more than one, --temperature (the
NLL is the model's own distribution, τ = 1; the eval samples at --eval-temperature), top-p/top-k, the batch
shaping of DAPO and Dr. GRPO, --reward-terms, train_on, μ > 1 and K > 1 (one optimizer step a batch: to step more
often, take fewer demonstrations a step), Markovian chunks and --env. A row whose prompt and response exceed the
model's context is refused before any weight loads, naming its line.
"""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import numpy as np

from algos.base import Algorithm, Knob, LossInputs

SFT_DATA = Knob("sft_data", "", "--algo sft: the demonstrations, a file or dataset of prompt/response rows or of "
                "chat messages (loss on the responses, the assistant turns, alone)")
RESPONSE_FIELDS = ("response", "completion")
# the run's fields that mean something only when a run samples or reads rewards: name -> their SFT value
UNREAD = {"group_size": 1, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "rollout_batch_size": 0,
          "dynamic_sampling": False, "overlong_penalty": False, "overlong_cache": 0, "zero_truncated": False,
          "mask_truncated": False, "reward_terms": "", "train_on": "all", "epochs": 1, "mini_batches": 1,
          "max_chunks": 1, "env": ""}


@dataclass(frozen=True)
class Demonstration:
    """One row of --sft-data, encoded: its problem (prompt, and gold answer when the row has one) and its training
    rows, (prompt ids, response ids) each: one for a prompt/response row, one per assistant turn of a chat."""
    problem: object  # rewards.Problem
    rows: tuple  # rollout.Chunk each
    text: str  # the (last) response's text, for samples.jsonl


def loss(mb: LossInputs, cfg, totals: dict):
    """−Σ mask·logp / N, N the mini-batch's response tokens on all ranks: this micro-batch's share of the token-mean
    NLL. logp [[-0.5, -1.0]], mask [[1, 1]], N 4 -> 0.375 (a row elsewhere holds the other 2 tokens)."""
    nll = -(mb.logp * mb.mask).sum() / max(totals["tokens"], 1)
    return nll, {"sft/nll": nll.detach()}


def check(cfg) -> str:
    """The rules of an SFT run; the data last (it is read from disk and tokenized, before any weight loads)."""
    if not cfg.sft_data:
        return ("--algo sft learns from demonstrations: give --sft-data FILE (JSONL rows of prompt and response, "
                "or of chat messages; docs/data-and-eval.md)")
    unread = [name for name, value in UNREAD.items() if getattr(cfg, name) != value]
    if unread:
        return (f"{', '.join(f'{n}={getattr(cfg, n)!r}' for n in unread)}: --algo sft trains on demonstrations, "
                f"samples nothing in training and reads no reward (docs/math.md §12); set "
                f"{', '.join(f'{n}={UNREAD[n]!r}' for n in unread)}")
    if cfg.plan:
        return ""
    try:
        demonstrations(cfg)
    except ValueError as e:  # a DataError, or the model folder's
        return str(e)
    return ""


def demonstrations(cfg) -> list[Demonstration]:
    """--sft-data's demonstrations, encoded with the run's tokenizer and chat settings (read once a process)."""
    return _encoded(cfg.sft_data, cfg.model, cfg.trust_remote_code, cfg.chat_template,
                    json.dumps(cfg.chat_template_kwargs, sort_keys=True), cfg.system_prompt, cfg.prompt_template)


@functools.lru_cache(maxsize=1)
def _encoded(path: str, model: str, trust_remote_code: bool, chat_template: bool, chat_kwargs: str, system: str,
             template: str) -> list[Demonstration]:
    from grading.files import PROMPT_FIELDS, fields_of, present, records, row_field, row_gold
    from model import check_model_folder
    from rewards import DataError, Problem
    from rollout import Chunk, encode_prompts
    from tasks import with_template

    tokenizer, hf_config = check_model_folder(model, trust_remote_code)
    limit = getattr(hf_config.get_text_config(), "max_position_embeddings", None) or float("inf")
    kwargs = json.loads(chat_kwargs)
    out = []
    for lineno, row in records(path):
        where = f"--sft-data {path}:{lineno}"
        if "messages" in row:
            turns = chat_turns(row["messages"], where)
            problems = [Problem(prompt=turns[i - 1]["content"], answer="", turns=tuple(turns[:i - 1]))
                        for i, t in enumerate(turns) if t["role"] == "assistant"]
            texts = [t["content"] for t in turns if t["role"] == "assistant"]
            if template:
                raise DataError(f"{where}: --prompt-template wraps a problem, and a row of messages is a chat as "
                                f"written: drop --prompt-template, or write the row as prompt and response")
        else:
            if present(row, RESPONSE_FIELDS) is None:
                raise DataError(f"{where}: missing field: expected one of {', '.join(RESPONSE_FIELDS)} (the "
                                f"demonstration to learn) beside {', '.join(PROMPT_FIELDS)}, or messages (a chat); "
                                f"{fields_of(row)}")
            gold = row_gold(row, path, lineno) if present(row, ("answer",)) else ""
            problems = [Problem(prompt=row_field(row, PROMPT_FIELDS, path, lineno), answer=gold)]
            texts = [row_field(row, RESPONSE_FIELDS, path, lineno)]
        problems = with_template(problems, template, system)
        prompts = encode_prompts(tokenizer, problems, chat_template, None, kwargs)
        rows = tuple(Chunk(p, tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
                     for p, t in zip(prompts, texts))
        longest = max(len(c.prompt_ids) + len(c.response_ids) for c in rows)
        if longest > limit:
            raise DataError(f"{where}: prompt and response are {longest} tokens, over the model's context of {limit}; "
                            f"shorten or drop the row")
        out.append(Demonstration(problems[-1], rows, texts[-1]))
    return out


def chat_turns(messages, where: str) -> list[dict]:
    """A row's messages as {role, content} turns, each assistant turn after a user turn; else a DataError."""
    from rewards import DataError

    ok = isinstance(messages, list) and all(isinstance(t, dict) and isinstance(t.get("role"), str)
                                            and isinstance(t.get("content"), str) for t in messages)
    turns = [{"role": t["role"], "content": t["content"]} for t in messages] if ok else []
    if not ok or not any(t["role"] == "assistant" for t in turns):
        raise DataError(f"{where}: field 'messages' must be a list of {{role, content}} turns with at least one "
                        f"assistant turn (the turns the loss is on)")
    bad = next((i for i, t in enumerate(turns) if t["role"] == "assistant" and (i == 0 or
                turns[i - 1]["role"] != "user" or not t["content"].strip())), None)
    if bad is not None:
        raise DataError(f"{where}: message {bad + 1} is an assistant turn that is empty or follows no user turn; "
                        f"each assistant turn must answer a user turn")
    return turns


def source(lm, tokenizer, task, stream, data_pos, cfg, rank: int, world: int, shape, sampler):
    """What train.py's rollout step returns (train.collect_rollouts' signature), from demonstrations: the next
    prompts_per_step of them as Episodes, the same on every rank (nothing to gather), group ids unique over the run;
    (episodes, episodes, new data_pos, stats). The task's stream and the sampler are not read."""
    from rollout import Episode
    from tasks import PromptStream

    demos = demonstrations(cfg)
    batch = PromptStream(demos, cfg.seed).get(data_pos, cfg.prompts_per_step)
    episodes = [Episode(prompt_ids=d.rows[0].prompt_ids, response_ids=[t for c in d.rows for t in c.response_ids],
                        text=d.text, truncated=False, group=data_pos + j, problem=d.problem, chunks=list(d.rows))
                for j, d in enumerate(batch)]
    lengths = np.array([len(e.response_ids) for e in episodes])
    stats = {"length/mean": lengths.mean(), "length/min": lengths.min(), "length/max": lengths.max(),
             "tokens/trained": lengths.sum(), "sft/epoch": (data_pos + len(batch)) / len(demos)}
    return episodes, episodes, data_pos + cfg.prompts_per_step, stats


@dataclass(frozen=True)
class SFT(Algorithm):
    """An Algorithm whose batches come from `source` instead of train.collect_rollouts."""
    source: object = None


ALGORITHMS = [SFT("sft", dict(group_size=1), None, loss, knobs=(SFT_DATA,), check=check, source=source)]
