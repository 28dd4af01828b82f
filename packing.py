"""Packed rows for the update's forwards (--pack): the update pays for tokens, not for padding.

rollout.collate lays a micro-batch out as N padded rows of W = longest prompt + longest response
tokens, so its forward costs N·W tokens whatever the rows hold. Under --pack the scorer
(model.ResponseLogProbs) takes the same padded tensors, lays their real tokens end to end into as
few rows as fit W each (`plan`), runs the decoder on those, and puts each token's hidden state back
where the padded layout has it (`hidden`): everything after the decoder — log-probs, entropy, the
vocabulary mean, every loss, mask, Delethink chunk, multi-turn turn and sampler correction — reads
the padded layout as before. Position ids restart at each sequence; with no attention mask,
transformers (≥ 5) reads the restarts as sequence boundaries (masking_utils.find_packed_sequence_indices)
and no token attends across one. A token's hidden state is the padded one's up to fp32 rounding (the
matmuls see other shapes): tests/test_pack.py holds them, the losses and the gradients to 1e-5.

Why rows of at most W: attention costs a row its length squared where the kernel does not skip the
masked blocks (sdpa with a mask, on CPU), so R ≤ N packed rows of ≤ W tokens never cost more
attention than the N padded rows of W, and their MLPs see R·L ≤ N·W tokens. On CUDA the packed
forward runs flex attention, whose document mask skips the blocks across sequences (unmeasured
here: no GPU in the session that wrote it).

Ranks and micro-batches (`share`): units (a row, or a whole group where the algorithm needs one)
go to ranks by real tokens, largest first to the rank with fewest so far, then into micro-batches of
at most micro_batch_size rows and max_tokens_per_micro_batch real tokens, in runs of one length or
spread so that short rows fill long rows' packed rows, whichever packs into fewer tokens.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch


def first_fit(order: list[int], lengths: list[int], cap: int) -> list[list[int]]:
    """Sequences, in `order`, each into the first row with room for it (rows of at most `cap` tokens)."""
    rows, room = [], []
    for i in order:
        k = next((k for k, r in enumerate(room) if r >= lengths[i]), len(rows))
        if k == len(rows):
            rows.append([])
            room.append(cap)
        rows[k].append(i)
        room[k] -= lengths[i]
    return rows


def plan(lengths: list[int], width: int) -> list[list[int]]:
    """Sequences of these token counts -> packed rows (lists of sequence indices) of at most `width`
    tokens: as few rows as first-fit decreasing finds, then the shortest row length that still needs
    no more rows, so that the last row is not a mostly empty one as long as the others.
    lengths [5, 3, 3, 2], width 8: first fit gives [[0, 1], [2, 3]] (rows of 8 and 5), and rows of 7
    still need only two -> [[0, 3], [1, 2]] (7 and 6)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    best = first_fit(order, lengths, width)
    lo = max(max(lengths), -(-sum(lengths) // len(best)))
    hi = max(sum(lengths[i] for i in row) for row in best)
    while lo < hi:  # first-fit is not monotone in its cap: keep the shortest cap seen to fit
        mid = (lo + hi) // 2
        rows = first_fit(order, lengths, mid)
        if len(rows) <= len(best):
            best, hi = rows, mid
        else:
            lo = mid + 1
    return best


def packed_size(lengths: list[int], width: int) -> int:
    """Tokens of the packed tensor (rows × longest row) of sequences this long, padded to `width`:
    5, 3, 3 and 2 in rows of 8 -> 14 (`plan`)."""
    rows = plan(lengths, width)
    return len(rows) * max(sum(lengths[i] for i in row) for row in rows)


def packed_tokens(attention_mask: torch.Tensor) -> int:
    """Tokens of the packed tensor of the padded rows whose real tokens `attention_mask` marks."""
    return packed_size(attention_mask.sum(1).tolist(), attention_mask.shape[1])


def layout(attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(source, positions), each [R, L] long, of the padded rows whose real tokens `attention_mask`
    marks: the flat index in the padded layout of each packed token (−1 for the tail of a row), and
    its position in its own sequence. Masks [[0, 1, 1], [1, 1, 1]] -> rows of 3 -> source
    [[3, 4, 5], [1, 2, -1]], positions [[0, 1, 2], [0, 1, 0]]."""
    lengths = attention_mask.sum(1).tolist()
    real = attention_mask.flatten().nonzero().squeeze(1).cpu()  # sequence by sequence, in order
    first = [0]
    for n in lengths:
        first.append(first[-1] + n)
    rows = plan(lengths, attention_mask.shape[1])
    length = max(sum(lengths[i] for i in row) for row in rows)
    source = torch.full((len(rows), length), -1, dtype=torch.long)
    positions = torch.zeros((len(rows), length), dtype=torch.long)
    for k, row in enumerate(rows):
        col = 0
        for i in row:
            source[k, col:col + lengths[i]] = real[first[i]:first[i + 1]]
            positions[k, col:col + lengths[i]] = torch.arange(lengths[i])
            col += lengths[i]
        # the tail restarts too, a sequence of its own that nothing reads; causal attention keeps it
        # out of the tokens before it
        positions[k, col:] = torch.arange(length - col)
    return source.to(attention_mask.device), positions.to(attention_mask.device)


def hidden(decoder, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """The decoder's last hidden states [N, W, H] of padded rows (rollout.collate: input_ids and
    attention_mask [N, W]), computed on packed rows (`layout`); zero at padding, which nothing reads."""
    source, positions = layout(attention_mask)
    real = source >= 0
    ids = input_ids.flatten()[source.clamp(min=0)]  # a row's tail repeats some token: nothing reads it
    with kernel(decoder, input_ids.device):
        h = decoder(input_ids=ids, attention_mask=None, position_ids=positions, use_cache=False).last_hidden_state
    flat = h.new_zeros(input_ids.numel(), h.shape[-1]).index_copy(0, source[real], h[real])
    return flat.view(*input_ids.shape, h.shape[-1])


@contextmanager
def kernel(decoder, device: torch.device):
    """On CUDA, flex attention for the packed forward: its document mask skips the blocks between
    sequences, where sdpa would get a dense mask and compute them. Elsewhere the model's own attention.
    (transformers' layers and mask builder read the config's choice at each call.)"""
    was = decoder.config._attn_implementation
    if device.type == "cuda":
        decoder.set_attn_implementation("flex_attention")
    try:
        yield
    finally:
        decoder.set_attn_implementation(was)


def row_tokens(unit: list) -> int:
    """Real (prompt + response) tokens of a unit's (episode, chunk) rows."""
    return sum(len(c.prompt_ids) + len(c.response_ids) for _, c in unit)


def micro_size(rows: list) -> int:
    """Packed tokens of a micro-batch of (episode, chunk) rows, whose padded width is the longest
    prompt + the longest response (rollout.collate)."""
    width = max(len(c.prompt_ids) for _, c in rows) + max(len(c.response_ids) for _, c in rows)
    return packed_size([len(c.prompt_ids) + len(c.response_ids) for _, c in rows], width)


def share(units: list[list], world: int, cfg) -> list[list[list]]:
    """Units of (episode, chunk) rows -> each rank's micro-batches of rows. Units go to ranks by real
    tokens, the largest first, each to the rank with the fewest so far (LPT: within 4/3 of the best
    split; verl's balance_batch is Karmarkar–Karp); then a rank's micro-batches (`fill`) hold at most
    cfg.micro_batch_size rows and, with cfg.max_tokens_per_micro_batch, that many real tokens (a unit
    is never split; one over the budget goes alone). Units of 9, 5, 4 and 2 tokens on 2 ranks ->
    rank 0 [9, 2], rank 1 [5, 4] (11 and 9 tokens)."""
    tokens = [row_tokens(u) for u in units]
    ranks, load = [[] for _ in range(world)], [0] * world
    for i in sorted(range(len(units)), key=lambda i: -tokens[i]):
        r = load.index(min(load))
        ranks[r].append(i)
        load[r] += tokens[i]
    return [fill([units[i] for i in mine], [tokens[i] for i in mine], cfg) for mine in ranks]


def fill(units: list[list], tokens: list[int], cfg) -> list[list]:
    """A rank's units (largest first) -> micro-batches, the layout of the two below whose packed
    tensors are smaller. In runs (consecutive units) a micro-batch holds rows of about one length and
    packs to its own narrow width: the better one where two rows rarely share a packed row. Spread
    over as many micro-batches, each unit to the one with the fewest tokens that has room, every
    micro-batch gets long rows and short ones to fill their packed rows: the better one on a long tail
    (long-tailed lengths, 1 rank, 128 rows in micro-batches of 64: 7-13% more tokens than real in runs,
    3-5% spread: tests/test_pack.py)."""
    cap, max_tokens = cfg.micro_batch_size, cfg.max_tokens_per_micro_batch
    runs, held = [], 0
    for unit, n in zip(units, tokens):
        if runs and len(runs[-1]) + len(unit) <= cap and (not max_tokens or held + n <= max_tokens):
            runs[-1] += unit
            held += n
        else:
            runs.append(list(unit))
            held = n
    spread, load = [[] for _ in runs], [0] * len(runs)
    for unit, n in zip(units, tokens):
        room = [k for k in range(len(spread)) if len(spread[k]) + len(unit) <= cap
                and (not max_tokens or load[k] + n <= max_tokens or not spread[k])]
        k = min(room, key=load.__getitem__) if room else len(spread)
        if k == len(spread):
            spread.append([])
            load.append(0)
        spread[k] += unit
        load[k] += n
    spread = [m for m in spread if m]
    return min(runs, spread, key=lambda micro: sum(micro_size(m) for m in micro))
