"""Markovian thinking (Delethink, docs/math.md §5): the rollout's shape that writes each trace in chunks.

    torchrun --nproc_per_node 2 train.py --config configs/tiny_delethink.yaml      # --algo delethink
    python train.py --algo grpo --max-chunks 4 --max-new-tokens 32                   # any algorithm but PACS, GSPO

A trace is written in chunks of at most C = max_new_tokens tokens, and the context is reset at every
chunk boundary: chunk k + 1 is prompted with the query, the first h tokens of chunk 1 and the trace's
last m − h tokens, so no context exceeds |q| + C however long the trace. Every chunk is a training
row with the exact prompt it was written from (rollout.Chunk); the loss and its normalisers treat
the trace's chunks as one response (train.py, docs/math.md §5). config.rollout_shapes builds a
`Markovian` when max_chunks > 1 (eval_max_chunks at eval: test-time scaling); rollout.generate calls
its `write`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import torch

import rollout
from model import forward_columns, inference
from rewards import Problem
from rollout import Chunk, Episode, Sampling, Shape, ends, episodes, left_pad, plain, stop_ids, written


@dataclass
class Markovian(Shape):
    """Markovian thinking: chunks of at most C = Sampling.max_new_tokens tokens, the context reset at
    every chunk boundary. max_chunks = 1 is a plain rollout (LongCoT)."""
    carryover: int = 0  # m: tokens carried into the next chunk's prompt (m < C)
    head: int = 0  # h ≤ m: of those, the first h tokens of chunk 1; the rest is the latest tail
    max_chunks: int = 1  # I: chunks per trace at most

    def max_tokens(self, chunk_size: int) -> int:
        """Generated tokens a trace can reach: C + (I − 1)(C − m). C 8, m 4, I 3 -> 16."""
        return chunk_size + (self.max_chunks - 1) * (chunk_size - self.carryover)

    def write(self, lm, tokenizer, queries: list[list[int]], problems: list[Problem], groups: list[int],
              sampling: Sampling) -> list[Episode]:
        return episodes(tokenizer, queries, markovian(lm, tokenizer, queries, sampling, self), groups, problems)


def chunking(cfg, evaluation: bool = False) -> Markovian:
    """A config's Markovian shape: m and h as the config resolves them (Config.chunk_carryover,
    chunk_head_tokens), I = max_chunks, at eval eval_max_chunks when set (more than max_chunks:
    test-time scaling). C 32, carryover 0, chunk_head −1, max_chunks 7 -> Markovian(16, 16, 7)."""
    return Markovian(carryover=cfg.chunk_carryover, head=cfg.chunk_head_tokens,
                     max_chunks=(cfg.eval_max_chunks or cfg.max_chunks) if evaluation else cfg.max_chunks)


def markovian(lm, tokenizer, queries: list[list[int]], sampling: Sampling, chunking: Markovian) -> list[list[Chunk]]:
    """Each query's Markovian trace (docs/math.md §5), in one `sample` call per chunk round over the
    traces still going. Chunk 1 is the plain rollout, q -> up to C tokens. A trace whose chunk ends
    without EOS goes on, until chunk I: its next prompt is q ⧺ the first h tokens of chunk 1 ⧺ the
    trace's last m − h tokens (token ids, no re-tokenisation), and it writes up to C − m more, so no
    context exceeds |q| + C. C 8, m 4, h 1: chunk 1 writes t1..t8, chunk 2 is q ⧺ t1 t6 t7 t8 -> t9..t12.
    A trace's later prompts all start with the same q ⧺ head at the same positions, so its KV
    cache is computed once, after chunk 1, and each round prefills only the m − h tail tokens.
    """
    stops, h, tail = stop_ids(tokenizer), chunking.head, chunking.carryover - chunking.head
    traces = plain(lm, tokenizer, queries, sampling)
    going = [i for i, chunks in enumerate(traces)  # I = 1: the plain rollout, nothing more
             if chunking.max_chunks > 1 and not ends(chunks[-1].response_ids, stops)]
    width = max(map(len, queries)) + h  # the padded q ⧺ head block, the same in every round
    # (with no tail, the prompt is all prefix, and generate needs a token to read); the model whose forward the
    # sampler continues (None: a sampler that keeps its own cache, vLLM)
    runner = sampling.sampler.cache_model(lm) if going and tail else None
    cached = runner is not None
    if cached:
        with inference(lm):
            prefix = prefill(runner, [queries[i] + traces[i][0].response_ids[:h] for i in going],
                             tokenizer.pad_token_id, width, sampling.prefill_chunk)
        row = {i: r for r, i in enumerate(going)}
    more = replace(sampling, max_new_tokens=sampling.max_new_tokens - chunking.carryover)
    for _ in range(chunking.max_chunks - 1):
        if not going:
            break
        # A trace still going has written ≥ C > m tokens, so its head and tail never overlap.
        tokens = {i: written(traces[i]) for i in going}
        prompts = [queries[i] + tokens[i][:h] + tokens[i][len(tokens[i]) - tail:] for i in going]
        cache = cache_rows(prefix, [row[i] for i in going]) if cached else None
        new_tokens = rollout.sample(lm, tokenizer, prompts, more, width=width + tail, cache=cache)
        for i, prompt, (new, logp) in zip(going, prompts, new_tokens):
            traces[i].append(Chunk(prompt, new, logp))
        going = [i for i in going if not ends(traces[i][-1].response_ids, stops)]
    return traces


def prefill(lm, rows: list[list[int]], pad_id: int, width: int, chunk: int = 0):
    """The KV cache of the rows left-padded to `width`, with the positions generate gives them
    (0 at each row's first real token), for generate to continue from; `chunk` columns a forward."""
    ids, mask = left_pad(rows, pad_id, next(lm.parameters()).device, width)
    with inference(lm):
        return forward_columns(lm, ids, mask, None, 0, chunk)[0]


def cache_rows(cache, rows: list[int]):
    """A copy of a KV cache with only the given batch rows (generate appends to the cache it gets)."""
    cache = copy.deepcopy(cache)
    cache.batch_select_indices(torch.tensor(rows))
    return cache
