"""Delethink — Markovian thinking: reason in fixed-size chunks with the context reset in between.

SPEC.md §5. Paper: "The Markovian Thinker" (Aghajohari et al. 2025, arXiv 2510.06557); official
code McGill-NLP/the-markovian-thinker @ 4478839 (`delethink_agent_loop.py`, `delethink_trimmers.py`,
`delethink_ppo/ray_trainer.py`).

Delethink is an environment plus a loss, and the two live apart so that either can be swapped:

    environment  rollout.generate with Chunking (knobs max_chunks I, carryover m, chunk_head h;
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
                 train.update passes each row its trace's L_τ (mb["seq_tokens"]) and counts
                 traces, not rows. With max_chunks = 1 it is LongCoT GRPO, the same code.

The preset sets the loss knobs and I = 5; C, m and h depend on the model (the official recipe,
C 8192, m 4096, h 100, τ 0.6, lr 1e-6, 128 × 8, is configs/r1-distill-1.5b_delethink.yaml).
The preset's K = 2 follows the official two optimizer steps per rollout batch.
"""
from __future__ import annotations

PRESET = dict(max_chunks=5, adv_norm="group", clip_low=0.2, clip_high=0.26, dual_clip=3.0,
              loss_agg="seq-mean-token-mean", mini_batches=2)
