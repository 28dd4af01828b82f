"""Delethink — Markovian thinking: reason in fixed-size chunks with the context reset in between.

docs/math.md §5. Paper: "The Markovian Thinker" (Aghajohari et al. 2025, arXiv 2510.06557); official
code McGill-NLP/the-markovian-thinker @ 4478839 (`delethink_agent_loop.py`, `delethink_trimmers.py`,
`delethink_ppo/ray_trainer.py`).

Delethink is an environment plus a loss, and the two live apart so that either can be swapped:

    environment  rollout.generate with a Markovian shape (knobs max_chunks I, carryover m, chunk_head h;
                 the chunk size C is max_new_tokens): chunk 1 is the query q -> ≤ C tokens;
                 chunk k ≥ 2 is q ⧺ first h tokens of chunk 1 ⧺ last m − h tokens -> ≤ C − m;
                 the trace stops at EOS or after I chunks. Any algorithm can run in it
                 (`--max-chunks 5 --algo rover`), except PACS.
    rows         each chunk is a training row: its exact prompt (positions from 0), its own
                 generated tokens, the trace's advantage; carried tokens are only conditioning,
                 so every generated token is trained exactly once (train.split_minibatches)
    advantage    per trace, GRPO group z-score over the G traces of a prompt
    per token    PPO clip ε_low 0.2 / ε_high 0.26 with dual clip 3 (algos/grpo.py)
    aggregate    each trace: Σ ℓ over all tokens of all its chunks / L_τ (its generated tokens);
                 traces averaged. This is seq-mean-token-mean with the trace as the sequence:
                 train.update passes each row its trace's L_τ (LossInputs.seq_tokens) and counts
                 traces, not rows. With max_chunks = 1 it is LongCoT GRPO, the same code.

Where we differ from the official code, and why:
- Mini-batches: the official actor cuts the flat list of chunk rows into K = 2 blocks of equal row
  count (dp_actor.py, fixed_num_optim_steps), so a trace's chunks can fall into two optimizer
  steps; ours holds whole groups, so every chunk of a trace is in one mini-batch (the rows are
  balanced across mini-batches by count). The loss scale is the same: the official mean over rows
  of Σ ℓ / (L_τ · B/N) (ray_trainer.py rescales L_τ by traces B over rows N) is (K/B) · Σ ℓ/L_τ
  over a block of N/K rows; ours is Σ ℓ/L_τ over the block's B/K traces divided by B/K.
- The recipe's truncated importance sampling (actor.tis_imp_ratio_cap 2: the clipped per-token
  loss × min(π_old/π_sampler, 2)) is the preset's `tis_cap`; its answer gate (the reward reads
  only what follows "</think>", else 0) is `answer_after` in the paper config, not the preset,
  since a model that never writes "</think>" (the tiny ones) would then score 0 on every trace.
- The official training prompt YAML is single-quoted, so its "\\n\\n" reaches the model as
  literal backslash-n; `--prompt-template delethink` uses real newlines, as its demo script does.

The preset sets the loss knobs and I = 5; C, m and h depend on the model (the official recipe,
C 8192, m 4096, h 100, τ 0.6, lr 1e-6, 128 × 8, is configs/r1-distill-1.5b_delethink.yaml).
The preset's K = 2 follows the official two optimizer steps per rollout batch.
"""
from __future__ import annotations

from algos import grpo, policy_gradient
from algos.base import Algorithm

PRESET = dict(max_chunks=5, adv_norm="group", clip_low=0.2, clip_high=0.26, dual_clip=3.0,
              loss_agg="seq-mean-token-mean", mini_batches=2, tis_cap=2.0)
# Markovian thinking is the rollout (environments.markovian.Markovian); the loss is GRPO's with trace-level
# aggregation, which train.update provides for every algorithm through LossInputs.seq_tokens
ALGORITHMS = [Algorithm("delethink", PRESET, policy_gradient.batch_advantages, grpo.loss, knobs=grpo.KNOBS,
                         group_baseline=True, norm=policy_gradient.batch_norm)]
