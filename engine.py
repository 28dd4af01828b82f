"""The rollout engine (`--engine fast`): HF's own decoder layers, driven by a decode step that is
one fixed-shape function of device tensors, so that on a GPU a whole step (every layer and the
sampler) replays as one captured CUDA graph instead of hundreds of kernel launches from Python.

How an inference engine works, top to bottom:

- **KV slab.** Each layer's keys and values live in one buffer [rows, kv_heads, capacity,
  head_dim] in the compute dtype. Row r holds its prompt left-padded to the batch's width w, then
  its generated tokens: token t of every row sits in column w + t. Row r's context is columns
  start[r] .. col, where start[r] is its first real column and col the column being written.
  The slab's tensors are kept for the model's life (`Engine.of(lm)`), grown and never shrunk;
  between calls their memory goes back to the allocator (`Engine.release`), for the update.
- **Prefill** (`Engine.prefill`): the model's usual forward over the distinct prompts (a group's
  G samples share one), `prefill_chunk` columns a forward, into a DynamicCache whose columns are
  then copied into the slab, each prompt to its G rows. The first token is drawn from its logits.
- **The step** (`Engine.step`): embed each row's last token → every decoder layer, whose
  attention is `slab_attention` (registered with HF's AttentionInterface and switched on while
  the engine decodes): it writes the new key and value into column col, in place, by explicit
  (row, head, column) indices into the whole slab buffer, and attends to the slab's first `view`
  columns under a mask made from start, col and the layer's sliding window → the last position's
  logits → temperature, top-k, top-p → a draw on the device (an exponential race: argmax p_i / E_i
  with E_i ~ Exp(1) picks token i with probability p_i) → the token's log_softmax(z/τ) (what the
  trainer recomputes) and whether it is a stop id → all written into preallocated buffers; col
  and t advance on the device. No host read, no Python branch on data, no allocation whose shape
  depends on data: the same step replays every time.
- **Buckets.** A graph has fixed shapes, so compiled steps run on (rows, view): rows a power of
  two ≥ the live rows (at least 2), view a multiple of VIEW_STEP ≥ col + 1 (the columns attention
  reads; the slab has one spare column, so a view never spans it whole). Eager steps use the
  exact sizes.
- **Around the step** (`Engine.decode`, plain Python): every `check` steps (8 on CUDA, 1 on CPU)
  the host reads the stop flags, the only device-to-host read. When every row has stopped, the
  call ends; when the live rows fit a smaller bucket, they move to the top of the slab and the
  finished ones leave, so the cost follows the live rows. A row that stopped between two checks
  runs on and is cut at its stop id afterwards.
- **Capture.** On CUDA the step is compiled by inductor with CUDA graphs (`--engine-compile`,
  `Engine.__init__`): `fullgraph=True` (a graph break would raise), rows and view symbolic (one
  graph serves every bucket; CUDA graphs are recorded per bucket), floats constant, the sampling
  values (temperature, top-p) in device buffers: one graph per `Mode` (greedy, top-k, top-p on),
  three in a run that evaluates greedily at another temperature. The slab and the step's buffers
  are static inputs (`mark_static_address`), read and written in place. On CPU the step runs
  eagerly unless asked; `--engine-compile eager` traces it with exactly CUDA's dynamo options.
- **The weights it runs** (`Engine.runner`): the model itself when it is a plain model holding its
  weights in the dtype it computes in; else a hook-free inference copy in the compute dtype,
  refreshed in place before each rollout (under FSDP, from the gathered layers, which are then
  resharded; with LoRA, the adapters merged in). An optimizer step writes the model's weights in
  place, and the copy never moves: a recorded graph reads the addresses it was recorded with.
  When the slab comes back from the allocator elsewhere, or a plain model's weight went to new
  storage, torch records the CUDA graphs anew (the compiled code stays); Engine.moves counts it.

What it cannot run (attention that is not HF's AttentionInterface, layers other than full or
sliding-window attention) is named by `Engine.unsupported`, and rollout.sample uses HF generate.
"""
from __future__ import annotations

import copy
import inspect
import math
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache

ATTENTION = "rlvr_slab"  # our AttentionInterface name
VIEW_STEP = 256  # compiled steps: attention reads a multiple of this many columns
LAYER_TYPES = {"full_attention", "sliding_attention"}


def graph_rows(live: int) -> int:
    """Rows a compiled step runs for `live` live rows: the next power of two (few graphs), at least
    2 (a size of 1 is a special case to the compiler: a graph of its own). 5 -> 8, 1 -> 2."""
    return max(2, 1 << (live - 1).bit_length()) if live else 0


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


@dataclass(frozen=True)
class Mode:
    """What a decode step branches on in Python, so one traced graph each: greedy or sampled, the
    top-k cut (its k sizes a tensor) and whether top-p is on. The values that vary from call to
    call, temperature and top-p, are device tensors (Engine.temperature, Engine.top_p): a Python
    float would be a constant of the graph, and its second value a recompile whose lifted scalar
    lives on the CPU, which turns CUDA graphs off for that graph."""
    greedy: bool = False
    top_k: int = 0
    nucleus: bool = False

    @classmethod
    def of(cls, sampling) -> "Mode":
        greedy = sampling.temperature == 0
        return cls(greedy, 0 if greedy else sampling.top_k, not greedy and sampling.top_p < 1)


def truncated(z: torch.Tensor, *, top_k: int = 0, top_p=None) -> torch.Tensor:
    """Temperature-scaled logits with what top-k, then top-p, removes set to -inf (HF's order and
    rules: top-p drops the tokens whose higher-ranked mass already reaches top_p, never the top
    one). top_p: a float or a 0-d/[1] tensor; None = off."""
    if top_k:
        kth = z.topk(min(top_k, z.shape[-1])).values[:, -1:]
        z = z.masked_fill(z < kth, -math.inf)
    if top_p is not None:
        sorted_z, order = z.sort(-1, descending=True)
        probs = sorted_z.softmax(-1)
        z = z.scatter(-1, order, sorted_z.masked_fill(probs.cumsum(-1) - probs >= top_p, -math.inf))
    return z


def draw(logits: torch.Tensor, mode: Mode, temperature=1.0, top_p=1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """(the next token of each row, its log_softmax(z/τ) over the whole vocabulary), on the device.
    A draw is an exponential race, argmax p_i / E_i with E_i ~ Exp(1): token i wins with
    probability p_i, as torch.multinomial's one draw, with no host check. Compiled, the noise costs
    no [rows, vocab] tensor: inductor decomposes exponential_ into −log of rand_like and fuses it
    into the argmax's kernel (checked on CPU: one kernel either way)."""
    if mode.greedy:
        token = logits.argmax(-1)
        return token, logits.log_softmax(-1).gather(-1, token[:, None])[:, 0]
    z = logits / temperature
    probs = truncated(z, top_k=mode.top_k, top_p=top_p if mode.nucleus else None).softmax(-1)
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
    soft-capping before the mask.

    The write names every (row, kv head, column) it sets in the whole slab buffer. Writing through
    a slice, slab[:rows].index_copy_(...), is an in-place op on a view of a graph input, which the
    compiler turns into a copy of the whole slice (all `capacity` columns of those rows) every step
    whenever rows < slab rows; indices into the buffer itself stay one in-place write."""
    unknown = {k for k in kwargs if k not in ("position_ids", "use_cache", "cache_position")}
    if unknown:
        raise NotImplementedError(f"the engine's attention does not implement {sorted(unknown)}")
    rows, heads, length, dim = query.shape
    where = (torch.arange(rows, device=key.device)[:, None], torch.arange(key.shape[1], device=key.device), slab.col)
    slab.keys[module.layer_idx].index_put_(where, key[:, :, 0])
    slab.values[module.layer_idx].index_put_(where, value[:, :, 0])
    keys = slab.keys[module.layer_idx][:rows, :, :slab_view]
    values = slab.values[module.layer_idx][:rows, :, :slab_view]
    grouped = query.reshape(rows, keys.shape[1], heads // keys.shape[1] * length, dim)
    scores = (grouped @ keys.transpose(-1, -2)).float() * scaling  # [rows, kv_heads, group, view]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    column = torch.arange(slab_view, device=query.device)
    visible = (column >= slab.start[:rows, None]) & (column <= slab.col)
    if sliding_window is not None:
        visible &= column > slab.col - sliding_window
    scores = scores.masked_fill(~visible[:, None, None, :], -math.inf)
    out = scores.softmax(-1).to(values.dtype) @ values
    return out.reshape(rows, heads, length, dim).transpose(1, 2), None


AttentionInterface.register(ATTENTION, slab_attention)


class Engine:
    """The KV slab, the step's buffers, the compiled steps and (when needed) the inference copy of
    one model (see the module docstring). `Engine.of(lm)` keeps one per model, so that its graphs
    outlive a rollout."""

    _per_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    compiles = 0  # graphs compiled for engine steps in this process, every engine together

    @classmethod
    def of(cls, lm, compile: str = "auto") -> "Engine":
        if lm not in cls._per_model or cls._per_model[lm].mode != compile:
            cls._per_model[lm] = cls(lm, compile=compile)
        return cls._per_model[lm]

    def __init__(self, lm, *, compile: str = "auto"):
        """compile: auto = inductor on CUDA (its CUDA graphs), off elsewhere | off: the eager step at
        the exact sizes | eager: traced whole (fullgraph=True) and run as traced: proof on a CPU
        that the CUDA path traces, with its exact dynamo options | inductor: compiled, with CUDA
        graphs on CUDA | untraced: the compiled path's buckets, step untraced (the tests' reference
        for a trace)."""
        if compile not in COMPILE_MODES:
            raise ValueError(f"engine compile mode {compile!r}: choose one of {', '.join(COMPILE_MODES)}")
        self._model = weakref.ref(lm)  # Engine.of's cache must not keep the model alive
        self.mode, self.device = compile, next(lm.parameters()).device
        kind = ("inductor" if self.device.type == "cuda" else "off") if compile == "auto" else compile
        self.compiled = kind != "off"
        # The same dynamo options for every backend, so that a CPU trace with the eager backend
        # compiles exactly the graphs CUDA's does. dynamic=True: rows and view are symbolic from
        # the first trace (left to dynamo, each would cost a static graph first, then more). Floats
        # stay constants (the model's eps and scaling): a symbolic float is a CPU scalar input,
        # and a graph with one is never captured as a CUDA graph.
        self._compiled_step = self.step
        if kind in ("eager", "inductor"):
            # every engine's step is one code object to dynamo, whose recompile limit would also
            # count the graphs of engines before this one (a process has one engine per model)
            torch.compiler.reset()
            step = torch.compile(self.step, fullgraph=True, dynamic=True, backend=counted_backend(kind, self.device))
            self._compiled_step = torch._dynamo.config.patch(specialize_float=True)(step)
        self.keys, self.values = [], []  # per layer [rows, kv_heads, capacity, head_dim]
        self.moves = 0  # calls that found the slab, the copy or a weight at another address than the last
        self._pointers, self._twin = None, None

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

    # ------------------------------------------------------------------ the weights it runs

    def runner(self, lm) -> torch.nn.Module:
        """The model the engine decodes with: lm itself when it is a plain model holding the weights
        in the dtype it computes in; else the inference copy, with lm's current weights copied in.
        lm needs the copy under FSDP (its hooks cannot be traced, and its gathered weights land in
        new storage each time), with LoRA (the adapters are merged into the copy: one matmul per
        layer instead of three) and when autocast computes in another dtype than the weights are
        held in (DDP's fp32 master weights under bf16 autocast: the copy holds them in bf16 once,
        instead of a cast of every weight at every step).

        Under FSDP the engine runs inside parallel.full_weights, as train.py's rollouts and evals
        do: the decoder layers arrive gathered, are copied, and are resharded at once, so that the
        copy takes the gathered weights' place rather than doubling them. A later call of the same
        block finds them resharded: nothing has changed the weights since (an optimizer step only
        comes after the block), and the copy is kept as it is (no gather: ranks may make different
        numbers of calls, and a gather would wait for all of them). So inside such a block, once
        the engine has run, nothing else may run lm's layers: their forward would gather again, a
        collective that ranks making different numbers of calls would not all join (train.py's
        rollouts and evals run every forward through the engine: its copy serves prefills too,
        rollout.forward_model)."""
        dtype = compute_dtype(lm)
        if not needs_copy(lm, dtype):
            return lm
        layers = [m for m in lm.modules() if isinstance(m, FSDPModule)]
        if self._twin is not None and any(isinstance(p, DTensor) for m in layers for p in m.parameters()):
            return self._twin
        if self._twin is None:
            self._twin = inference_copy(lm, dtype)
        refresh(self._twin, lm)
        for m in layers:
            m.reshard()
        return self._twin

    # ------------------------------------------------------------------ buffers

    def _reserve(self, rows: int, capacity: int, like: DynamicCache) -> None:
        """Slab and step buffers for at least `rows` rows (+ one scratch row that dead bucket
        rows write to) and `capacity` columns; grown, never shrunk, so that the same sizes are
        asked of the allocator call after call (and the same addresses most often come back)."""
        if self.compiled:  # one spare column: a view never spans the whole buffer, which the
            capacity = graph_columns(capacity) + 1  # compiler would trace as a graph of its own
        have_rows, have_cols = (self.keys[0].shape[0], self.keys[0].shape[2]) if self.keys else (0, 0)
        if rows <= have_rows and capacity <= have_cols and self.keys[0].dtype == like.layers[0].keys.dtype:
            for t in self.keys + self.values:
                t.zero_()
            return
        rows, capacity = max(rows, have_rows), max(capacity, have_cols)
        let_go(self.keys + self.values)  # the old slab goes before the new one is allocated
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
        self.temperature, self.top_p = torch.ones(1, device=self.device), torch.ones(1, device=self.device)
        if self.compiled:
            for t in self.buffers():
                torch._dynamo.mark_static_address(t)

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor the engine keeps between calls (the memory plan counts them)."""
        return [*self.keys, *self.values] + ([self.start, self.token, self.live, self.col, self.t, self.done,
                                              self.out_tokens, self.out_logp, self.temperature, self.top_p]
                                             if self.keys else [])

    def _fresh(self, lm) -> None:
        """Count a call that finds the slab or a weight at another address than the last one did
        (the slab came back elsewhere from the allocator, a plain model's weight went to new
        storage). A recorded CUDA graph reads the addresses it was recorded with: torch records
        such a graph anew for the new addresses (static inputs, mark_static_address), and the
        compiled code stays, since addresses are not among dynamo's guards."""
        pointers = tuple(t.data_ptr() for t in [*lm.parameters(), *self.keys, *self.values])
        if pointers != self._pointers and self._pointers is not None:
            self.moves += 1
        self._pointers = pointers

    def release(self) -> None:
        """Give the slab's memory back to the allocator (its tensors stay, empty, with their
        shapes): between calls it holds nothing that is needed (the next call zeroes it), and the
        update that runs meanwhile reuses that memory. The next call takes it back (`hold`). The
        inference copy stays: under FSDP a later call of the same gathered block reuses it."""
        let_go(self.keys + self.values)

    # ------------------------------------------------------------------ the step

    def _sample(self, logits: torch.Tensor, rows: int, mode: Mode) -> None:
        """Draw each row's next token from its logits and write it, its log-prob and its stop
        flag into the buffers, at output column t (then t + 1)."""
        token, logp = draw(logits, mode, self.temperature, self.top_p)
        live = self.live[:rows]
        self.out_tokens.index_put_((live, self.t.expand(rows)), token)
        self.out_logp.index_put_((live, self.t.expand(rows)), logp)
        self.done[:rows] |= torch.isin(token, self.stops)
        self.token[:rows] = token
        self.t += 1

    def step(self, lm, rows: int, view: int, mode: Mode) -> None:
        """Feed every row's last token (into column col), then sample the next: the function a
        CUDA graph captures. rows, view and mode are fixed per graph; everything else is a buffer."""
        position = self.col - self.start[:rows]
        logits = lm(input_ids=self.token[:rows, None], position_ids=position[:, None], use_cache=False,
                    logits_to_keep=1, slab=self, slab_rows=rows, slab_view=view).logits[:, -1].float()
        self._sample(logits, rows, mode)
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

    def decode(self, ids, mask, *, sampling, new_tokens: int, stops: list[int], prefix=None,
               prefill_chunk: int = 0) -> tuple[list[list[int]], list[list[float]]]:
        """Left-padded prompts ids/mask [n, w] -> each row's `new_tokens` new tokens and their
        log-probs under the sampler (a row runs on after its stop id; the caller cuts there)."""
        n, w = ids.shape
        lm = self._model()
        hold(self.keys + self.values)  # first: the prefill's tensors must not take the slab's place
        with inference(lm):
            lm = self.runner(lm)
            cache, copies, logits = self.prefill(lm, ids, mask, prefix=prefix, chunk=prefill_chunk)
            self._reserve(self._bucket(n), w + new_tokens, cache)
            for layer, k, v in zip(cache.layers, self.keys, self.values):
                k[:n, :, :w], v[:n, :, :w] = layer.keys[copies], layer.values[copies]
            del cache
            self._fresh(lm)
            mode = Mode.of(sampling)
            self.temperature.fill_(sampling.temperature or 1.0)
            self.top_p.fill_(sampling.top_p)
            self.stops = torch.tensor(stops, device=self.device)
            self.start[:n] = w - mask.sum(1)
            self.live[:n] = torch.arange(n, device=self.device)
            self.done[:n] = False
            self.col.fill_(w)
            self.t.zero_()
            self._sample(logits, n, mode)
            rows = self._bucket(n)
            self._kill(n, rows)
            check = 8 if self.device.type == "cuda" else 1
            previous = lm.config._attn_implementation
            lm.set_attn_implementation(ATTENTION)
            try:
                for t in range(1, new_tokens):
                    if t % check == 0:
                        rows = self._leave(rows)
                        if not rows:
                            break
                    self._compiled_step(lm, rows, self._view(w + t), mode)
            finally:
                lm.set_attn_implementation(previous)
                self.release()
            return self.out_tokens[:n, :new_tokens].tolist(), self.out_logp[:n, :new_tokens].tolist()

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


COMPILE_MODES = ("auto", "off", "eager", "inductor", "untraced")


def compile_count() -> int:
    """Graphs compiled for engine steps so far in this process (train.py logs engine/compiles).
    Engine.moves counts, per engine, the calls that found the slab or a weight at a new address (on
    CUDA, their graphs are recorded anew; bench/gpu_check.py reports it)."""
    return Engine.compiles


def counted_backend(kind: str, device: torch.device):
    """The compiler backend of the engine's step, counting each graph it is handed: eager (run the
    trace as it is), inductor (on CUDA with CUDA graphs: what mode="reduce-overhead" turns on), or
    untraced (the step is not compiled at all: None)."""
    if kind == "untraced":
        return None

    def compile_graph(gm, example_inputs):
        Engine.compiles += 1
        if kind == "eager":
            return gm.forward
        from torch._inductor.compile_fx import compile_fx
        return compile_fx(gm, example_inputs, config_patches={"triton.cudagraphs": device.type == "cuda"})
    return compile_graph


# ----------------------------------------------------------------------------- the inference copy

def compute_dtype(lm) -> torch.dtype:
    """The dtype lm's matmuls run in here: autocast's when it is on, else its weights' (under
    FSDP's mixed precision, the gathered weights are already in the compute dtype)."""
    device = next(lm.parameters()).device.type
    if torch.is_autocast_enabled(device):
        return torch.get_autocast_dtype(device)
    return next(p for p in lm.parameters() if p.is_floating_point()).dtype


def needs_copy(lm, dtype: torch.dtype) -> bool:
    """Whether the engine decodes from an inference copy of lm (Engine.runner says why)."""
    sharded = any(isinstance(m, FSDPModule) for m in lm.modules())
    adapters = any(hasattr(m, "lora_A") for m in lm.modules())
    held = {p.dtype for p in lm.parameters() if p.is_floating_point()}
    return sharded or adapters or held != {dtype}


def inference_copy(lm, dtype: torch.dtype) -> torch.nn.Module:
    """A plain model of lm's class and config, its weights in `dtype` (uninitialised until
    `refresh`), its buffers (rotary frequencies) in theirs: no hooks, no adapters, no grad."""
    base = lm.get_base_model() if hasattr(lm, "get_base_model") else lm
    with torch.device("meta"):
        twin = type(base)(copy.deepcopy(base.config))
    twin.to_empty(device=next(lm.parameters()).device)
    twin.tie_weights()  # to_empty gave the tied LM head and embeddings a tensor each
    for p in twin.parameters():
        p.data = p.data.to(dtype)
    return twin.eval().requires_grad_(False)


@torch.no_grad()
def refresh(twin, lm) -> None:
    """Copy lm's current weights into its inference copy, in place (so that addresses never move):
    a sharded weight gathered (every rank calls, in the same order), a LoRA layer merged,
    W + scale · B A in float32 (Hu et al. 2021)."""
    sources, copied = dict(lm.named_modules()), set()
    for name, module in twin.named_modules():
        source = sources[name]
        for key, p in module.named_parameters(recurse=False):
            weight = getattr(source, key)
            copied.add(id(weight))
            weight = whole(weight)
            if key == "weight" and hasattr(source, "lora_A"):
                copied |= {id(t) for t in [*source.lora_A.parameters(), *source.lora_B.parameters()]}
            if key == "weight" and hasattr(source, "lora_A") and not getattr(source, "disable_adapters", False):
                weight = weight.float()
                for adapter in source.active_adapters:
                    a, b = source.lora_A[adapter].weight, source.lora_B[adapter].weight
                    weight = weight + source.scaling[adapter] * (whole(b).float() @ whole(a).float())
            p.copy_(weight)
        for key, b in module.named_buffers(recurse=False):
            b.copy_(whole(getattr(source, key)))
    left = [name for name, p in lm.named_parameters() if id(p) not in copied]
    if left:  # a module added to the model after loading: the copy, built from the config, would decode without it
        raise ValueError(f"the engine's inference copy of {type(twin).__name__} (built from its config) has no place "
                         f"for {', '.join(left[:3])}{' ...' if len(left) > 3 else ''}: generate with --engine hf")


def whole(t: torch.Tensor) -> torch.Tensor:
    """A tensor's full value: a DTensor (a sharded FSDP weight outside a gather) all-gathered."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def let_go(tensors) -> None:
    """Free the storage of each tensor, keeping the tensor (its shape, dtype, device): FSDP2 does the
    same with its gathered weights between forwards."""
    for t in tensors:
        t.untyped_storage().resize_(0)


def hold(tensors) -> None:
    """Give each tensor freed by let_go its storage back (uninitialised: the caller fills it)."""
    for t in tensors:
        if t.untyped_storage().nbytes() == 0:
            t.untyped_storage().resize_(t.numel() * t.element_size())
