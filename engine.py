"""The rollout engine (`--engine fast`): HF's own decoder layers, driven by a decode step that is
one fixed-shape function of device tensors, so that on a GPU a whole step (every layer and the
sampler) replays as one captured CUDA graph instead of hundreds of kernel launches from Python.

How an inference engine works, top to bottom:

- **KV slab.** Each layer's keys and values live in one buffer [rows, kv_heads, capacity,
  head_dim] in the compute dtype, allocated once and kept for the model's life (`Engine.of(lm)`),
  so a graph captured in one rollout replays in the next. Row r holds its prompt left-padded to
  the batch's width w, then its generated tokens: token t of every row sits in column w + t.
  Row r's context is columns start[r] .. col, where start[r] is its first real column and col
  the column being written.
- **Prefill** (`Engine.prefill`): the model's usual forward over the distinct prompts (a group's
  G samples share one), `prefill_chunk` columns a forward, into a DynamicCache whose columns are
  then copied into the slab, each prompt to its G rows. The first token is drawn from its logits.
- **The step** (`Engine.step`): embed each row's last token → every decoder layer, whose
  attention is `slab_attention` (registered with HF's AttentionInterface and switched on while
  the engine decodes): it writes the new key and value into column col and attends to the slab's
  first `view` columns under a mask made from start, col and the layer's sliding window → the
  last position's logits → temperature, top-k, top-p → a draw on the device (an exponential race:
  argmax p_i / E_i with E_i ~ Exp(1) picks token i with probability p_i) → the token's
  log_softmax(z/τ) (what the trainer recomputes) and whether it is a stop id → all written into
  preallocated buffers; col and t advance on the device. No host read, no Python branch on data,
  no allocation whose shape depends on data: the same step replays every time.
- **Buckets.** A graph has fixed shapes, so compiled steps are specialised on (rows, view): rows
  a power of two ≥ the live rows, view a multiple of VIEW_STEP ≥ col + 1 (the columns attention
  reads). Eager steps use the exact sizes.
- **Around the step** (`Engine.decode`, plain Python): every `check` steps (8 on CUDA, 1 on CPU)
  the host reads the stop flags, the only device-to-host read. When every row has stopped, the
  call ends; when the live rows fit a smaller bucket, they move to the top of the slab and the
  finished ones leave, so the cost follows the live rows. A row that stopped between two checks
  runs on and is cut at its stop id afterwards.
- **Capture.** On CUDA the step is `torch.compile(mode="reduce-overhead", fullgraph=True)`:
  PyTorch traces it once, then records and replays one CUDA graph per bucket; the slab and the
  step's buffers are static addresses (`mark_static_address`), so nothing is copied in or out.
  On CPU the step runs eagerly; the tests compile it with fullgraph=True, which fails on any
  graph break, to prove it capturable without a GPU.
- **Weights change between rollouts.** An optimizer step writes in place (same addresses: the
  graphs read the new values); FSDP's gather or a resume can put a weight in new storage, which a
  graph would never see. Before each call the engine compares every parameter's data_ptr with
  those its steps were compiled for and, when one moved, starts the compiled steps afresh
  (torch.compiler.reset: the next steps trace and capture again; under FSDP, whose gather may
  allocate anew at every rollout, that cost recurs — to be measured on a GPU).

What it cannot run (attention that is not HF's AttentionInterface, layers other than full or
sliding-window attention) is named by `Engine.unsupported`, and rollout.sample uses HF generate.
"""
from __future__ import annotations

import inspect
import math
import weakref
from contextlib import contextmanager

import torch
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache

ATTENTION = "rlvr_slab"  # our AttentionInterface name
VIEW_STEP = 256  # compiled steps: attention reads a multiple of this many columns
LAYER_TYPES = {"full_attention", "sliding_attention"}


def graph_rows(live: int) -> int:
    """Rows a compiled step runs for `live` live rows: the next power of two (few graphs). 5 -> 8."""
    return 1 << (live - 1).bit_length() if live else 0


def graph_columns(columns: int) -> int:
    """Columns a compiled step's attention reads: the next multiple of VIEW_STEP. 300 -> 512."""
    return -(-columns // VIEW_STEP) * VIEW_STEP


@contextmanager
def inference(lm):
    """Dropout off while generating; HF also turns the KV cache off in train mode with checkpointing."""
    was_training = lm.training
    lm.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        lm.train(was_training)


def cache_kwarg(lm) -> str:
    """The keyword under which `lm`'s forward and generate take a KV cache: `cache` where its forward
    names it (transformers 5.24 does, deprecating `past_key_values`, which forward drops in 5.40),
    else `past_key_values`. A peft model is asked about the model it wraps."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def forward_columns(lm, ids, mask, cache, start: int, chunk: int = 0):
    """Feed columns start: of left-padded ids into `cache` (which holds the columns before; None:
    a new DynamicCache with every layer kept whole, sliding-window ones too, so that its columns
    line up with the padded ids), `chunk` columns a forward (0: all at once). Returns (the cache,
    float32 logits of the last column)."""
    cache = DynamicCache() if cache is None else cache
    positions, step, kwarg = (mask.cumsum(1) - 1).clamp(min=0), chunk or ids.shape[1], cache_kwarg(lm)
    for s in range(start, ids.shape[1], step):
        out = lm(input_ids=ids[:, s:s + step], attention_mask=mask[:, :s + step],
                 position_ids=positions[:, s:s + step], use_cache=True, logits_to_keep=1, **{kwarg: cache})
        logits = out.logits[:, -1].float()
    return cache, logits


def truncated(z: torch.Tensor, sampling) -> torch.Tensor:
    """Temperature-scaled logits with what top-k, then top-p, removes set to -inf (HF's order and
    rules: top-p drops the tokens whose higher-ranked mass already reaches top_p, never the top one)."""
    if sampling.top_k:
        kth = z.topk(min(sampling.top_k, z.shape[-1])).values[:, -1:]
        z = z.masked_fill(z < kth, -math.inf)
    if sampling.top_p < 1:
        sorted_z, order = z.sort(-1, descending=True)
        probs = sorted_z.softmax(-1)
        z = z.scatter(-1, order, sorted_z.masked_fill(probs.cumsum(-1) - probs >= sampling.top_p, -math.inf))
    return z


def draw(logits: torch.Tensor, sampling) -> tuple[torch.Tensor, torch.Tensor]:
    """(the next token of each row, its log_softmax(z/τ) over the whole vocabulary), on the device.
    Temperature 0 is greedy. A draw is an exponential race, argmax p_i / E_i with E_i ~ Exp(1):
    token i wins with probability p_i, as torch.multinomial's one draw, with no host check."""
    z = logits / (sampling.temperature or 1.0)
    if sampling.temperature == 0:
        token = z.argmax(-1)
    else:
        probs = truncated(z, sampling).softmax(-1)
        race = torch.empty_like(probs).exponential_().clamp_(min=torch.finfo(probs.dtype).tiny)
        token = (probs / race).argmax(-1)
    return token, z.log_softmax(-1).gather(-1, token[:, None])[:, 0]


def slab_attention(module, query, key, value, attention_mask, *, scaling, slab=None, slab_rows=0,
                   slab_view=0, sliding_window=None, softcap=None, dropout=0.0, **kwargs):
    """HF attention over the engine's slab for one new column of every row.

    query [rows, heads, 1, head_dim], key/value [rows, kv_heads, 1, head_dim] (rotary applied) ->
    output [rows, 1, heads, head_dim]. The key and value are written into column slab.col; the
    query attends to the columns c < slab_view with start[r] ≤ c ≤ col (and col − c < window on
    sliding-window layers): the mask comes from the slab's per-row start, not from the caller.
    Heads share kv heads as HF's repeat_kv pairs them (head h reads kv head h // (heads / kv_heads)),
    without repeating the keys. Scores and softmax in float32 (HF eager's softmax dtype); Gemma's
    soft-capping before the mask."""
    unknown = {k for k in kwargs if k not in ("position_ids", "use_cache", "cache_position")}
    if unknown:
        raise NotImplementedError(f"the engine's attention does not implement {sorted(unknown)}")
    keys, values = slab.keys[module.layer_idx][:slab_rows], slab.values[module.layer_idx][:slab_rows]
    keys.index_copy_(2, slab.col, key)
    values.index_copy_(2, slab.col, value)
    keys, values = keys[:, :, :slab_view], values[:, :, :slab_view]
    rows, heads, length, dim = query.shape
    grouped = query.reshape(rows, keys.shape[1], heads // keys.shape[1] * length, dim)
    scores = (grouped @ keys.transpose(-1, -2)).float() * scaling  # [rows, kv_heads, group, view]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    column = torch.arange(slab_view, device=query.device)
    visible = (column >= slab.start[:slab_rows, None]) & (column <= slab.col)
    if sliding_window is not None:
        visible &= column > slab.col - sliding_window
    scores = scores.masked_fill(~visible[:, None, None, :], -math.inf)
    out = scores.softmax(-1).to(values.dtype) @ values
    return out.reshape(rows, heads, length, dim).transpose(1, 2), None


AttentionInterface.register(ATTENTION, slab_attention)


class Engine:
    """The KV slab, the step's buffers and the compiled steps of one model (see the module
    docstring). `Engine.of(lm)` keeps one per model, so that its graphs outlive a rollout."""

    _per_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, lm) -> "Engine":
        if lm not in cls._per_model:
            cls._per_model[lm] = cls(lm)
        return cls._per_model[lm]

    def __init__(self, lm, *, compile: bool | None = None, backend: str | None = "inductor"):
        """compile: None = on CUDA only (inductor, reduce-overhead: CUDA graphs). The tests pass
        compile=True with backend="eager", which traces the step with fullgraph=True and runs the
        trace as it is (proof that it is capturable, on CPU), and backend=None, which keeps the
        compiled engine's buckets but runs the step untraced (the reference for that trace)."""
        self._model = weakref.ref(lm)  # Engine.of's cache must not keep the model alive
        self.device = next(lm.parameters()).device
        self.compiled = self.device.type == "cuda" if compile is None else compile
        options = {"fullgraph": True, "backend": backend}
        if self.device.type == "cuda" and backend == "inductor":
            options["mode"] = "reduce-overhead"
        else:
            options["dynamic"] = False  # one trace per bucket, as the graphs are
        self._compiled_step = torch.compile(self.step, **options) if self.compiled and backend else self.step
        self.keys, self.values = [], []  # per layer [rows, kv_heads, capacity, head_dim]
        self.compilations = 0  # how many times compiled steps were started afresh (weights moved)
        self._pointers = None

    @staticmethod
    def unsupported(lm) -> str | None:
        """Why the engine cannot run this model (rollout.sample then uses HF generate), or None."""
        config = lm.config.get_text_config()
        if not getattr(type(lm), "_supports_attention_backend", False):
            return f"{type(lm).__name__} does not route attention through HF's AttentionInterface"
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds - LAYER_TYPES:
            return f"{config.model_type} has {sorted(kinds - LAYER_TYPES)} layers"
        return None

    # ------------------------------------------------------------------ buffers

    def _reserve(self, rows: int, capacity: int, like: DynamicCache) -> None:
        """Slab and step buffers for at least `rows` rows (+ one scratch row that dead bucket
        rows write to) and `capacity` columns; grown, never shrunk, so addresses stay put."""
        if self.compiled:
            capacity = graph_columns(capacity)
        have_rows, have_cols = (self.keys[0].shape[0], self.keys[0].shape[2]) if self.keys else (0, 0)
        if rows <= have_rows and capacity <= have_cols and self.keys[0].dtype == like.layers[0].keys.dtype:
            return
        rows, capacity = max(rows, have_rows), max(capacity, have_cols)
        self.keys = self.values = None  # free the old slab before the new one is allocated
        # zeros, not empty: attention multiplies the unfilled columns it reads by a probability
        # of 0, and 0 · NaN from uninitialised memory would be NaN
        self.keys = [layer.keys.new_zeros(rows, layer.keys.shape[1], capacity, layer.keys.shape[3])
                     for layer in like.layers]
        self.values = [layer.values.new_zeros(rows, layer.values.shape[1], capacity, layer.values.shape[3])
                       for layer in like.layers]
        long = dict(dtype=torch.long, device=self.device)
        self.start, self.token, self.live = (torch.zeros(rows, **long) for _ in range(3))
        self.col, self.t = torch.zeros(1, **long), torch.zeros(1, **long)
        self.done = torch.zeros(rows, dtype=torch.bool, device=self.device)
        self.out_tokens = torch.zeros(rows + 1, capacity, **long)  # row `rows`: the scratch row
        self.out_logp = torch.zeros(rows + 1, capacity, device=self.device)
        if self.compiled:
            for t in self.buffers():
                torch._dynamo.mark_static_address(t)

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor the engine keeps between calls (the memory plan counts them)."""
        return [*self.keys, *self.values] + ([self.start, self.token, self.live, self.col, self.t, self.done,
                                              self.out_tokens, self.out_logp] if self.keys else [])

    def _fresh(self, lm) -> None:
        """Start the compiled steps afresh if a weight or the slab moved since they were compiled:
        a captured graph reads the addresses it was captured with."""
        if not self.compiled:
            return
        pointers = tuple(p.data_ptr() for p in lm.parameters()) + tuple(k.data_ptr() for k in self.keys)
        if pointers != self._pointers:
            torch.compiler.reset()
            self.compilations += 1
        self._pointers = pointers

    # ------------------------------------------------------------------ the step

    def _sample(self, logits: torch.Tensor, rows: int, sampling) -> None:
        """Draw each row's next token from its logits and write it, its log-prob and its stop
        flag into the buffers, at output column t (then t + 1)."""
        token, logp = draw(logits, sampling)
        live = self.live[:rows]
        self.out_tokens.index_put_((live, self.t.expand(rows)), token)
        self.out_logp.index_put_((live, self.t.expand(rows)), logp)
        self.done[:rows] |= torch.isin(token, self.stops)
        self.token[:rows] = token
        self.t += 1

    def step(self, lm, rows: int, view: int, sampling) -> None:
        """Feed every row's last token (into column col), then sample the next: the function a
        CUDA graph captures. rows and view are fixed per graph; everything else is a buffer."""
        position = self.col - self.start[:rows]
        logits = lm(input_ids=self.token[:rows, None], position_ids=position[:, None], use_cache=False,
                         logits_to_keep=1, slab=self, slab_rows=rows, slab_view=view).logits[:, -1].float()
        self._sample(logits, rows, sampling)
        self.col += 1

    # ------------------------------------------------------------------ around the step

    def prefill(self, lm, ids, mask, *, prefix=None, chunk: int = 0):
        """The model's forward over left-padded prompts ids/mask [rows, w] -> (a DynamicCache of
        w columns, which of its rows each prompt row is, the last column's logits [rows, vocab]).
        Identical rows (a group) are prefilled once: ids [[5, 6], [5, 6], [7, 8]] -> a cache of 2
        rows, copies [0, 0, 1]. `prefix`: a DynamicCache of every row's first columns (Markovian
        rounds after the first), extended here."""
        if prefix is None:
            keys = list(map(tuple, ids.tolist()))
            slot = {}  # a distinct padded prompt -> its row in the prefill
            copies = torch.tensor([slot.setdefault(k, len(slot)) for k in keys], device=self.device)
            unique = torch.tensor([keys.index(k) for k in slot], device=self.device)
            cache, logits = forward_columns(lm, ids[unique], mask[unique], None, 0, chunk)
        else:
            copies = torch.arange(len(ids), device=self.device)
            cache, logits = forward_columns(lm, ids, mask, prefix, prefix.get_seq_length(), chunk)
        return cache, copies, logits[copies]

    def decode(self, ids, mask, *, sampling, budget: int, stops: list[int], prefix=None,
               prefill_chunk: int = 0) -> tuple[list[list[int]], list[list[float]]]:
        """Left-padded prompts ids/mask [n, w] -> each row's `budget` new tokens and their
        log-probs under the sampler (a row runs on after its stop id; the caller cuts there)."""
        n, w = ids.shape
        lm = self._model()
        with inference(lm):
            cache, copies, logits = self.prefill(lm, ids, mask, prefix=prefix, chunk=prefill_chunk)
            self._reserve(self._bucket(n), w + budget, cache)
            for layer, k, v in zip(cache.layers, self.keys, self.values):
                k[:n, :, :w], v[:n, :, :w] = layer.keys[copies], layer.values[copies]
            del cache
            self._fresh(lm)
            self.stops = torch.tensor(stops, device=self.device)
            self.start[:n] = w - mask.sum(1)
            self.live[:n] = torch.arange(n, device=self.device)
            self.done[:n] = False
            self.col.fill_(w)
            self.t.zero_()
            self._sample(logits, n, sampling)
            rows = self._bucket(n)
            self._kill(n, rows)
            check = 8 if self.device.type == "cuda" else 1
            previous = lm.config._attn_implementation
            lm.set_attn_implementation(ATTENTION)
            try:
                for t in range(1, budget):
                    if t % check == 0:
                        rows = self._leave(rows)
                        if not rows:
                            break
                    self._compiled_step(lm, rows, self._view(w + t), sampling)
            finally:
                lm.set_attn_implementation(previous)
            return self.out_tokens[:n, :budget].tolist(), self.out_logp[:n, :budget].tolist()

    def _bucket(self, live: int) -> int:
        """Rows a step runs for `live` live rows: a power of two when compiled (few graphs)."""
        return graph_rows(live) if self.compiled else live

    def _view(self, columns: int) -> int:
        """Columns attention reads: a multiple of VIEW_STEP when compiled."""
        return min(graph_columns(columns), self.keys[0].shape[2]) if self.compiled else columns

    def _kill(self, live: int, rows: int) -> None:
        """Rows live..rows-1 of a bucket are dead: stopped, writing to the scratch row, reading
        the whole context (finite scores, nothing uses them)."""
        self.done[live:rows] = True
        self.live[live:rows] = self.out_tokens.shape[0] - 1
        self.start[live:rows] = 0

    def _leave(self, rows: int) -> int:
        """The host's read: how many rows still run. Moves them to the top of the slab when they
        fit a smaller bucket (eagerly: when a quarter has stopped, to amortise the copy).
        Returns the new row count, 0 when every row has stopped."""
        going = (~self.done[:rows]).nonzero()[:, 0]
        live = len(going)
        target = self._bucket(live) if self.compiled else (live if live <= rows * 3 // 4 else rows)
        if live == 0 or target >= rows:
            return live and rows
        columns = int(self.col)
        for k, v in zip(self.keys, self.values):
            k[:live, :, :columns], v[:live, :, :columns] = k[going, :, :columns], v[going, :, :columns]
        for buffer in (self.start, self.token, self.live, self.done):
            buffer[:live] = buffer[going]
        self._kill(live, target)
        return target
