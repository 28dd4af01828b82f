"""Batched generation -> Episodes, and Episodes -> padded training tensors.

A plain rollout is one `generate` call per rank per step: all of the rank's prompts × G samples (or
batches of `rollout_batch_size` of them) in one batched `sample`, left-padded, with the model in eval
mode and the KV cache on. `generate` takes the rollout's shape, built once from the config: `Plain`
here; Markovian thinking (environments/markovian.py, docs/math.md §5), one `sample` call per chunk round;
or turns with an environment (environments/rollout.py, `--env`, §8), one call per turn, observations
as context, never trained. Each Episode keeps its chunks, each with the exact prompt it was
generated from: they are the training rows. Every sampling knob is passed explicitly; nothing is
inherited from the checkpoint's generation_config (model.load_model resets it).
"""
from __future__ import annotations

import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import GenerationConfig, LogitsProcessor, StoppingCriteria, StoppingCriteriaList

from model import cache_kwarg, forward_columns, inference
from parallel import full_weights
from rewards import Problem


@dataclass
class Sampling:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off (HF's own default would be 50)
    max_new_tokens: int = 64
    prefill_chunk: int = 0  # prompt tokens per prefill forward, bounding its activations; 0 = all at once
    stop_strings: tuple = ()  # text that ends a response where it first appears, kept (StopStrings)
    sampler: Generate = field(default_factory=lambda: Generate())  # who samples: the run's (config.SAMPLERS)


@dataclass
class Chunk:
    """One generate call of a trace: exactly what the model was fed and what it wrote."""
    prompt_ids: list[int]
    response_ids: list[int]
    sampler_logp: list[float] = field(default_factory=list)  # per response token, log_softmax(z/τ) as sampled


@dataclass
class Episode:
    """One sampled response (a trace). response_ids run up to and including the first EOS."""
    prompt_ids: list[int]  # the query q
    response_ids: list[int]  # every generated token, chunk after chunk
    text: str  # what the grader reads (Markovian: the last chunk's prompt tail ⧺ the last chunk)
    truncated: bool  # no EOS within the budget (max_new_tokens, or the chunk cap I)
    group: int  # responses to the same prompt share a group id
    problem: Problem
    reward: float = 0.0  # the task's verdict (0/1)
    grader_failed: bool = False  # the grader timed out or crashed, so reward is 0 by default
    extracted: str | None = None  # the answer the grader read (Verdict.answer); None: it found none
    details: dict = field(default_factory=dict)  # the grader's numbers to log (Verdict.details)
    score: float = 0.0  # reward after shaping (e.g. DAPO overlong penalty); what advantages use
    advantage: float = 0.0  # set by the algorithm before the update
    chunks: list[Chunk] = field(default_factory=list)  # one per generate call (rollout order)
    env_reward: float | None = None  # a multi-turn trace's reward from its environment; None: the task grades
    transcript: str = ""  # a multi-turn trace after its query, observations included (for logs)
    env_error: str = ""  # what failed, in words, when a multi-turn trace's environment failed
    turn_rewards: list[float] = field(default_factory=list)  # a multi-turn trace's environment rewards, one per row
    turn_advantages: list[float] = field(default_factory=list)  # one per row under --turn-credit; empty: `advantage`

    def settle(self, verdict) -> None:
        """Take the grader's verdict (rewards.Verdict), unless the environment rewarded the trace."""
        self.reward = verdict.reward if self.env_reward is None else self.env_reward
        self.grader_failed, self.extracted, self.details = (bool(verdict.failure), verdict.answer,
                                                            {**self.details, **verdict.details})

    def chunk_texts(self, tokenizer) -> list[str]:
        """What each chunk wrote, for logs (a Markovian trace's `text` is only its tail)."""
        return [tokenizer.decode(ch.response_ids, skip_special_tokens=True) for ch in self.chunks]

    def rows(self) -> list[Chunk]:
        """What the update trains on: each chunk with its exact prompt; a hand-made episode
        without chunks is one row, its prompt and whole response."""
        return self.chunks or [Chunk(self.prompt_ids, self.response_ids)]

    def row_advantage(self, row: Chunk) -> float:
        """What `row` trains with: its own advantage under a turn credit rule (algos/credit.py), else the
        trace's (every single-turn response, every outcome-credited trace)."""
        return next((a for c, a in zip(self.chunks, self.turn_advantages) if c is row), self.advantage)


def warn_ignored_kwargs(tokenizer, chat_kwargs: dict) -> list[str]:
    """Warns of each keyword argument the chat template renders alike with and without (a template that
    never reads enable_thinking: ["enable_thinking"]), and returns their names. Each is tried against the
    render of one system and one user turn with the generation prompt, the others kept as given."""
    def render(kwargs):
        return tokenizer.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}],
                                             add_generation_prompt=True, tokenize=False, **kwargs)

    given = render(chat_kwargs)
    ignored = [name for name in chat_kwargs if render({k: v for k, v in chat_kwargs.items() if k != name}) == given]
    for name in ignored:
        warnings.warn(f"--chat-template-kwargs: the tokenizer's chat template ignores {name!r}", stacklevel=2)
    return ignored


def encode_prompts(tokenizer, problems: list[Problem], chat_template: bool, tools: list[dict] | None = None,
                   chat_kwargs: dict | None = None) -> list[list[int]]:
    """Token ids of each prompt, through the tokenizer's chat template when it has one and
    chat_template is on: "Add 1+2" -> ids of "<|user|>Add 1+2<|assistant|>" for the tiny model; the
    problem's turns (a system turn: "<|system|>Be brief.<|user|>Add 1+2<|assistant|>") come first.
    tools: JSON schemas the template lists in the prompt (--env's tools: a built-in tool's, or those a
    user's class declares; a template that has no tool list ignores them). chat_kwargs: more keyword
    arguments of apply_chat_template (--chat-template-kwargs, e.g. {"enable_thinking": false})."""
    out = []
    for p in problems:
        if chat_template and tokenizer.chat_template:
            text = tokenizer.apply_chat_template([*p.turns, {"role": "user", "content": p.prompt}], tools=tools,
                                                 add_generation_prompt=True, tokenize=False, **(chat_kwargs or {}))
            out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
        elif p.turns:  # without a template a system turn would be lost (config.check_prompts_fit asks first)
            raise ValueError(f"a prompt with chat turns before it ({p.prompt[:40]!r}) needs the tokenizer's chat "
                             f"template: set chat_template true with a model that has one, or drop the turns")
        else:
            out.append(tokenizer(p.prompt)["input_ids"])
    return out


def stop_ids(tokenizer) -> list[int]:
    """The ids that end a response: model.load_tokenizer's list (the tokenizer's EOS and those of
    the checkpoint's generation_config), or the tokenizer's EOS alone."""
    return getattr(tokenizer, "stop_ids", None) or [tokenizer.eos_token_id]


# ----------------------------------------------------------------------------- the rollout and its shapes

class Shape:
    """What `generate` asks to write a batch of traces: the rollout's shape, built once from the config
    (config.rollout_shapes). `Plain` below, Markovian chunks (environments/markovian.py) or turns with an
    environment (environments/rollout.py); a shape of your own subclasses this one."""
    tools = None  # JSON schemas the chat template lists in the prompt (None: none)
    warnings = ()  # notes to say once before a run (a sandbox weaker than bubblewrap)

    def write(self, lm, tokenizer, queries: list[list[int]], problems: list[Problem], groups: list[int],
              sampling: Sampling) -> list[Episode]:
        """The Episode of each query (repeated G times: its problem, its group id), in order."""
        raise NotImplementedError

    def check(self, episodes: list[Episode]) -> None:
        """After a training step's rollouts (every rank's episodes, gathered): raise RolloutError when
        the run cannot go on (an environment that fails every trace), before the next rollout."""


class RolloutError(Exception):
    """A run whose rollouts cannot go on; train.py stops with its message, one line."""


class Plain(Shape):
    """The rollout's shape by default: each query's trace is one chunk of up to max_new_tokens tokens,
    all in one `sample` call."""

    def write(self, lm, tokenizer, queries: list[list[int]], problems: list[Problem], groups: list[int],
              sampling: Sampling) -> list[Episode]:
        return episodes(tokenizer, queries, plain(lm, tokenizer, queries, sampling), groups, problems)


PLAIN = Plain()


def generate(lm, tokenizer, problems: list[Problem], prompt_ids: list[list[int]], *,
             group_size: int, sampling: Sampling, shape=PLAIN, first_group: int = 0, batch_size: int = 0
             ) -> list[Episode]:
    """Sample group_size responses for each prompt, batch_size sequences (whole groups, at least
    one) per generate call; 0: all at once. A cap bounds the KV cache and the prefill's memory.
    `shape` writes each response: one chunk (Plain), a Markovian trace or a multi-turn trace.

    Returns len(problems) * group_size Episodes, group-major: the G responses of problem j are
    consecutive and carry group id first_group + j.
    """
    per_call = max(1, batch_size // group_size) if batch_size else max(1, len(problems))
    out = []
    for s in range(0, len(problems), per_call):
        queries = [ids for ids in prompt_ids[s:s + per_call] for _ in range(group_size)]
        owners = [problems[s + i // group_size] for i in range(len(queries))]
        groups = [first_group + s + i // group_size for i in range(len(queries))]
        out += shape.write(lm, tokenizer, queries, owners, groups, sampling)
    return out


def plain(lm, tokenizer, queries: list[list[int]], sampling: Sampling) -> list[list[Chunk]]:
    """Each query's trace, one chunk of up to max_new_tokens tokens, all in one `sample` call."""
    return [[Chunk(q, tokens, logp)] for q, (tokens, logp) in zip(queries, sample(lm, tokenizer, queries, sampling))]


def sample(lm, tokenizer, rows: list[list[int]], sampling: Sampling, *, width: int = 0,
           cache=None) -> list[tuple[list[int], list[float]]]:
    """One batched generation over prompts left-padded to at least `width` (`cache`: the KV cache of their
    first columns, then not re-read) -> each row's new tokens, cut after the first stop id (else max_new_tokens
    of them), each with its log-prob under the sampler: log_softmax(logits / τ), untruncated, as the trainer
    recomputes it (docs/math.md §0). Who generates: sampling.sampler (Generate: HF generate; config.SAMPLERS)."""
    return sampling.sampler.sample(lm, tokenizer, rows, sampling, width=width, cache=cache)


def episodes(tokenizer, queries: list[list[int]], traces: list[list[Chunk]], groups: list[int],
             problems: list[Problem], strings: StopStrings | None = None) -> list[Episode]:
    """The Episode of each trace written in its chunks from its query; the grader reads what the last
    chunk's prompt carried past the query ⧺ the last chunk (of a plain rollout: its response)."""
    stops = stop_ids(tokenizer)
    return [Episode(prompt_ids=q, response_ids=written(chunks), group=group, problem=problem,
                    truncated=not ends(chunks[-1].response_ids, stops, strings), chunks=chunks,
                    text=tokenizer.decode(chunks[-1].prompt_ids[len(q):] + chunks[-1].response_ids,
                                          skip_special_tokens=True))
            for q, chunks, group, problem in zip(queries, traces, groups, problems)]


def written(chunks: list[Chunk]) -> list[int]:
    """A trace's generated tokens, chunk after chunk: responses [5, 6], [7] -> [5, 6, 7]."""
    return [t for ch in chunks for t in ch.response_ids]


# ----------------------------------------------------------------------------- who samples: the run's sampler

class Generate:
    """Who samples a run's rollouts and evals: HF generate (--engine hf), the reference, and the base of
    every other sampler (config.SAMPLERS: engine.Fast, extras.vllm_engine.VLLM; a fourth is a subclass in a
    file of its own and one line there). `auto` is generate on every device: tutorial/grpo.py's sampler, so that
    the default run is the lesson's run; on a CPU the engine saved a tenth of a default step, on CUDA its
    decode is measured faster but its whole training steps not yet (docs/measured.md). A run builds its
    sampler once (`start`); every `sample` call reaches it as Sampling.sampler. What the loop asks of one:

      check(cfg, hf_config)              before any weight loads: a ValueError if it cannot run here
      start(cfg, lm, world, optimizer)   the run's sampler, once the policy has loaded (eval.py: no optimizer)
      serving(policy, autocast)          around a block of rollouts or evals, entered on every rank: the
                                         trainer's current weights where the sampler reads them
      sample(lm, tokenizer, rows, ...)   rollout.sample's rows -> new tokens and their log-probs
      cache_model(lm)                    the model whose forward continues a KV cache handed to `sample`
                                         (Markovian chunks); None: the sampler keeps its own
      metrics()                          its numbers for the step's log
    """
    alone = True  # eval.py may sample with it (vLLM takes its weights from train.py's optimizer steps)

    @classmethod
    def check(cls, cfg, hf_config) -> None:
        """Before any weight loads: generate runs whatever transformers loads."""

    @classmethod
    def start(cls, cfg, lm, world: int, optimizer=None) -> Generate:
        return cls()

    @contextmanager
    def serving(self, policy, autocast):
        """generate runs the policy itself: under FSDP its weights gathered once for the block
        (parallel.full_weights), its forwards in the run's autocast."""
        with full_weights(policy), autocast():
            yield

    def sample(self, lm, tokenizer, rows: list[list[int]], sampling: Sampling, *, width: int = 0,
               cache=None) -> list[tuple[list[int], list[float]]]:
        """`sample` by HF generate, each drawn token's log-prob recorded by SamplerLogProbs."""
        device = next(lm.parameters()).device
        input_ids, attention_mask = left_pad(rows, tokenizer.pad_token_id, device, width)
        chunk = sampling.prefill_chunk or None
        if cache is not None and chunk:
            # transformers < 5.21 chunks a prefill from column 0 even when `cache` holds the first
            # columns, feeding them twice; so the uncached columns but the last are fed here, `chunk`
            # a forward (as the cache itself was, by prefill), and generate reads the last one
            start = cache.get_seq_length()
            if start < input_ids.shape[1] - 1:
                with inference(lm):
                    forward_columns(lm, input_ids[:, :-1], attention_mask[:, :-1], cache, start, chunk)
            chunk = None
        greedy = sampling.temperature == 0
        config = GenerationConfig(
            do_sample=not greedy, temperature=None if greedy else sampling.temperature,
            top_p=None if greedy else sampling.top_p, top_k=None if greedy else sampling.top_k,
            max_new_tokens=sampling.max_new_tokens, eos_token_id=stop_ids(tokenizer),
            pad_token_id=tokenizer.pad_token_id, use_cache=True, prefill_chunk_size=chunk)
        recorder, strings = SamplerLogProbs(sampling.temperature), stop_strings(tokenizer, sampling)
        criteria = StoppingCriteriaList([StringsStop(strings, input_ids.shape[1])] if strings else [])
        with inference(lm):
            # synced_gpus off: HF would otherwise step every FSDP rank in lock-step, as if weights were
            # gathered per forward; ours are gathered once per rollout (parallel.full_weights)
            out = lm.generate(input_ids=input_ids, attention_mask=attention_mask, generation_config=config,
                              synced_gpus=False, logits_processor=[recorder], stopping_criteria=criteria,
                              **{cache_kwarg(lm): cache})
        new = out[:, input_ids.shape[1]:]
        tokens = [cut_at_stop(resp, stop_ids(tokenizer), sampling.max_new_tokens, strings) for resp in new.tolist()]
        return [(t, lp[:len(t)]) for t, lp in zip(tokens, recorder.per_token(new))]

    def cache_model(self, lm):
        return lm

    def metrics(self) -> dict:
        return {}


class StringsStop(StoppingCriteria):
    """HF generate's rows end once their last token completes a stop string (StopStrings), as the
    engine's rows do at its host check; cut_at_stop then cuts both alike."""

    def __init__(self, strings: StopStrings, width: int):
        self.strings, self.width = strings, width

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        rows = input_ids[:, self.width:].tolist()
        return torch.tensor([self.strings.end(row, len(row) - 1) is not None for row in rows], device=input_ids.device)


class SamplerLogProbs(LogitsProcessor):
    """Records, while HF generate samples, each drawn token's log_softmax(z/τ) from the logits it
    was drawn with: generate hands a processor the model's logits before its temperature, top-k and
    top-p (which it applies after every processor it is given), and the token drawn from them in
    the next call's input_ids."""

    def __init__(self, temperature: float):
        self.temperature, self.steps, self.last = temperature or 1.0, [], None

    def __call__(self, input_ids, scores):
        if self.last is not None:
            self.steps.append(self.last.gather(-1, input_ids[:, -1:])[:, 0])
        self.last = (scores.float() / self.temperature).log_softmax(-1)
        return scores

    def per_token(self, new_tokens: torch.Tensor) -> list[list[float]]:
        """[rows, columns] log-probs of the columns generate wrote (new_tokens: those columns)."""
        if self.last is None:
            return [[] for _ in new_tokens]
        steps = self.steps + [self.last.gather(-1, new_tokens[:, -1:])[:, 0]]
        return torch.stack(steps, 1).tolist()


OBSERVATION_FRAME = 16  # tokens a chat template puts around a tool message, assumed (Qwen2.5's: 12)


def prompt_tokens(cfg) -> int:
    """The longest prompt of a generate call: plan_prompt_tokens, or with --env a last turn's (the
    query, every earlier turn and observation: observations add context, never loss), capped by
    max_trace_tokens − max_new_tokens. P 512, 3 turns of C 256, observations of 256 ->
    512 + 2 × (256 + 256 + 16) = 1568."""
    p = cfg.plan_prompt_tokens
    if not cfg.env:
        return p
    longest = p + (cfg.max_turns - 1) * (cfg.max_new_tokens + cfg.max_observation_tokens + OBSERVATION_FRAME)
    # the first turn's prompt is the query's, whatever the cap
    return max(p, min(longest, cfg.max_trace_tokens - cfg.max_new_tokens)) if cfg.max_trace_tokens else longest


def call_rows(cfg, world: int) -> tuple[int, int]:
    """(sequences of a rollout's generate call on a rank, of an eval's; 0 without evals): whole
    groups, rollout_batch_size of them at most, never more than the rank's share of a step; an
    eval call holds eval_batch_size // eval_samples problems' samples. 64 prompts × 8 on 8 ranks,
    rollout_batch_size 32 -> 32 (4 groups)."""
    share = cfg.prompts_per_step // world
    groups = min(share, max(1, cfg.rollout_batch_size // cfg.group_size) if cfg.rollout_batch_size else share)
    held_out = max(1, cfg.eval_batch_size // cfg.eval_samples) * cfg.eval_samples if cfg.eval_every else 0
    return groups * cfg.group_size, held_out


class StopStrings:
    """Text that ends a response where it first appears, kept in it, as a stop id is: the end of a tool
    call for a base model that writes its calls in plain text ("</calc>", Qwen2.5-Math's "```output").
    Read off the decoded tokens a `window` at a time: a string of c characters spans at most c tokens
    (a token decodes to a character or more) and one more that it starts inside. Both engines cut a
    response with it (cut_at_stop), so they cut alike. On a tokenizer that decodes [1, 3, 4, 5] as
    "1 3 4 5", strings ("3 4",) end it after its third token: end([1, 3, 4, 5]) -> 3."""

    def __init__(self, tokenizer, strings):
        self.tokenizer, self.strings = tokenizer, tuple(strings)
        self.window = max(map(len, self.strings)) + 1

    def end(self, tokens: list[int], start: int = 0) -> int | None:
        """How many tokens reach the first, from index `start` on, that completes a string: the
        string is in the text up to it and not in the text before it. None when none does."""
        for i in range(start + 1, len(tokens) + 1):
            window = tokens[max(0, i - self.window):i]
            text, before = self.tokenizer.decode(window), self.tokenizer.decode(window[:-1])
            if any(s in text and s not in before for s in self.strings):
                return i
        return None


def stop_strings(tokenizer, sampling: Sampling) -> StopStrings | None:
    return StopStrings(tokenizer, sampling.stop_strings) if sampling.stop_strings else None


def ends(tokens: list[int], stops: list[int], strings: StopStrings | None = None) -> bool:
    """Whether a response ended itself: a stop id as its last token, [5, 2], stops [2, 7] -> True;
    or a stop string its last token completed."""
    return bool(tokens) and (tokens[-1] in stops or strings is not None
                             and strings.end(tokens, len(tokens) - 1) == len(tokens))


def cut_at_stop(tokens: list[int], stops: list[int], limit: int, strings: StopStrings | None = None) -> list[int]:
    """Up to and including the first stop id, else the first `limit`: [5, 7, 3, 2], [2, 7] -> [5, 7];
    or up to the token that first completes a stop string, if that comes first."""
    end = next((i + 1 for i, t in enumerate(tokens) if t in stops), limit)
    found = strings.end(tokens[:end]) if strings is not None else None
    return tokens[:found or end]


def left_pad(rows: list[list[int]], pad_id: int, device, width: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """[[5, 6], [7]] -> ids [[5, 6], [pad, 7]], mask [[1, 1], [0, 1]]."""
    width = max(width, *map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r, dtype=torch.long)
        mask[i, width - len(r):] = 1
    return ids.to(device), mask.to(device)


# ----------------------------------------------------------------------------- collation

@dataclass
class Batch:
    """Training tensors for N episodes; response-aligned arrays have Tr columns (docs/math.md §0)."""
    input_ids: torch.Tensor  # [N, P + Tr] left-padded prompt ⧺ right-padded response
    attention_mask: torch.Tensor  # [N, P + Tr]
    position_ids: torch.Tensor  # [N, P + Tr] 0 at each row's first real token
    response_mask: torch.Tensor  # [N, Tr] float, 1 for response tokens (EOS included)
    sampler_logp: torch.Tensor | None = None  # [N, Tr] the sampler's log-probs; None unless every row has them


def collate(episodes: list[Episode] | list[Chunk], pad_id: int, device) -> Batch:
    """Episodes (or chunks: anything with prompt_ids and response_ids) -> Batch. Prompts [[5, 6], [7]]
    with responses [[8, 2], [9]] -> input_ids [[5, 6, 8, 2], [pad, 7, 9, pad]], response_mask [[1, 1], [1, 0]]."""
    prompt_ids, prompt_mask = left_pad([e.prompt_ids for e in episodes], pad_id, "cpu")
    tr = max(max(len(e.response_ids) for e in episodes), 1)
    resp = torch.full((len(episodes), tr), pad_id, dtype=torch.long)
    resp_mask = torch.zeros((len(episodes), tr))
    for i, e in enumerate(episodes):
        resp[i, :len(e.response_ids)] = torch.tensor(e.response_ids, dtype=torch.long)
        resp_mask[i, :len(e.response_ids)] = 1
    input_ids = torch.cat([prompt_ids, resp], dim=1)
    attention_mask = torch.cat([prompt_mask, resp_mask.long()], dim=1)
    position_ids = (attention_mask.cumsum(1) - 1).clamp(min=0)
    sampler_logp = None
    if all(len(getattr(e, "sampler_logp", ())) == len(e.response_ids) > 0 for e in episodes):
        sampler_logp = torch.zeros((len(episodes), tr))
        for i, e in enumerate(episodes):
            sampler_logp[i, :len(e.response_ids)] = torch.tensor(e.sampler_logp)
        sampler_logp = sampler_logp.to(device)
    return Batch(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                 position_ids=position_ids.to(device), response_mask=resp_mask.to(device),
                 sampler_logp=sampler_logp)


# ----------------------------------------------------------------------------- sampler vs trainer

def sampler_correction(trainer_logp, sampler_logp, mask, *, tis_cap: float = 0.0, mis_cap: float = 0.0):
    """Per-token importance weights for the gap between the policy that sampled (the engine's
    logits, possibly another kernel or dtype) and the same weights in the trainer, π_old.

    ratio w = exp(trainer_logp − sampler_logp), detached; tokens outside `mask` get weight 1.
      tis_cap c > 0  truncated IS: w ← min(w, c)  (the Delethink recipe uses c = 2)
      mis_cap c > 0  masked IS: a token with w > c or w < 1/c gets weight 0 (it stays in the
                     loss's denominator, like any token the loss multiplies by 0)
    The policy-gradient term of the loss is multiplied by the weight (KL terms are not). A run with
    neither cap never calls this (train.loss_inputs): its loss is not weighted, the gap only measured.

    trainer [[-1.0, -2.0]], sampler [[-1.5, -2.0]], mask [[1, 1]], tis_cap 1.5 ->
    w = [[e^0.5 = 1.6487, 1.0]] -> [[1.5, 1.0]]; with mis_cap 1.5 instead -> [[0.0, 1.0]].
    """
    w = torch.exp(trainer_logp - sampler_logp).detach()
    if tis_cap:
        w = w.clamp(max=tis_cap)
    if mis_cap:
        w = torch.where((w > mis_cap) | (w < 1 / mis_cap), torch.zeros_like(w), torch.ones_like(w))
    return torch.where(mask > 0, w, torch.ones_like(w))


def mismatch_stats(diffs: list) -> dict:
    """Sampler-vs-trainer metrics from d = trainer_logp − sampler_logp of the valid tokens:
    mismatch/kl is k3 = e^d − d − 1, an estimate of KL(sampler ‖ trainer) per token (≥ 0, 0 iff
    equal); max_abs the largest |d|; the ratio e^d at the 1st / 50th / 99th percentile.
    d [0, ln 2] -> kl (2 − ln 2 − 1)/2 = 0.1534, max_abs 0.6931."""
    d = np.concatenate([np.asarray(x, dtype=np.float64).ravel() for x in diffs] or [np.zeros(1)])
    ratio = np.exp(d)
    q = np.quantile(ratio, [0.01, 0.5, 0.99])
    return {"mismatch/kl": float((ratio - d - 1).mean()), "mismatch/max_abs": float(np.abs(d).max()),
            "mismatch/ratio_p01": q[0], "mismatch/ratio_p50": q[1], "mismatch/ratio_p99": q[2]}
