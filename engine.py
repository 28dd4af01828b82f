"""The rollout engine (`--engine fast`): a decode step that is one fixed-shape function of device
tensors, so that on a GPU a whole step (every layer and the sampler) replays as one captured CUDA
graph instead of hundreds of kernel launches from Python.

How an inference engine works, top to bottom:

- **KV slab.** Each layer's keys and values live in one buffer [rows, kv_heads, capacity,
  head_dim] in the compute dtype. Row r holds its prompt left-padded to the batch's width w, then
  its generated tokens: token t of every row sits in column w + t. Row r's context is columns
  start[r] .. col, where start[r] is its first real column and col the column being written.
  The slab is allocated once, at the first call, at least as large as the run's largest call
  (`Engine.reserve`: Fast.start, from the config), and kept for the model's life
  (`Engine.of(lm)`): later calls find it at the same address. A call larger than any before grows
  it (a move, counted in Engine.moves); nothing shrinks or frees it between calls, so the update
  runs beside it (extras/plan.py counts it resident).
- **Prefill** (`Engine.prefill`): the model's usual forward over the distinct prompts (a group's
  G samples share one), `prefill_chunk` columns a forward, into a DynamicCache whose columns are
  then copied into the slab, each prompt to its G rows. The first token is drawn from its logits.
- **The step** (`Engine.step`): embed each row's last token → every decoder layer → the last
  position's logits → temperature, top-k, top-p → a draw on the device (an exponential race:
  argmax p_i / E_i with E_i ~ Exp(1) picks token i with probability p_i) → the token's
  log_softmax(z/τ) (what the trainer recomputes) and whether it is a stop id → all written into
  preallocated buffers; col and t advance on the device. No host read, no Python branch on data,
  no allocation whose shape depends on data: the same step replays every time.
- **Layers.** Llama, Qwen2 and Qwen3 layers (FUSED) the engine runs itself (`fused_logits`): a
  layer is RMSNorm, one q|k|v GEMM, rotary, attention, o_proj, RMSNorm, one gate|up GEMM, the
  gated activation, down_proj, in HF's op order; in the engine's own copy of the weights q|k|v and
  gate|up are each one weight (`Stacked`), so a layer is four GEMMs and a few fused kernels. Other
  models run HF's layers, their attention `slab_attention` (registered with HF's
  AttentionInterface, switched on while the engine decodes).
- **Attention** (`attend`): writes the new key and value into column col, in place, by explicit
  (row, head, column) indices into the whole slab buffer, then attends to start[r] .. col (and the
  layer's sliding window) as two matmuls over the slab's first `view` columns, a kv head read once
  for the query heads that share it, float32 scores under a mask built from start and col. One
  path compiled or not: only `view` differs (below). Not flex_attention: its decoding kernel wants
  a static batch (rows are symbolic here) and, in torch 2.13, a power-of-two head ratio (Qwen2.5's
  are 6 and 7), so a decode step got its prefill kernel, a 64-128-row query tile for one row.
- **Buckets.** A graph has fixed shapes, so compiled steps run on (rows, view): rows a power of
  two ≥ the live rows (at least 2), view a multiple of BLOCK ≥ col + 1 (`view_columns`; the slab
  has one column more, so a view never spans it whole). Eager steps use the exact sizes.
- **Around the step** (`Engine.decode`, plain Python): every `check` steps (8 on CUDA, 1 on CPU)
  the host reads the stop flags, the only device-to-host read. When every row has stopped, the
  call ends; when the live rows fit a smaller bucket, they move to the top of the slab and the
  finished ones leave, so the cost follows the live rows. A row that stopped between two checks
  runs on and is cut at its stop id afterwards.
- **Capture.** On CUDA the step is compiled by inductor with CUDA graphs (`--engine-compile`,
  `Engine.__init__`): `fullgraph=True` (a graph break would raise), rows and view the only
  symbols (one graph serves every bucket; inductor's CUDA graph trees record one CUDA graph per
  bucket, in one memory pool), floats constant, the sampling values (temperature, top-p) in
  device buffers: one graph per `Mode` (greedy, top-k, top-p on), three in a run that evaluates
  greedily at another temperature. The slab, the step's buffers and the stacked weights are
  static inputs (`mark_static_address`), read and written in place, and their shapes are static:
  held by modules (`Stacked`) or marked (`mark_static`), never read off a plain object, whose
  ints and tensor sizes dynamo would make symbols, 3 a layer with ~140 guards, which grew a
  28-layer trace to minutes. On CPU the step runs eagerly unless asked; `--engine-compile eager`
  traces it with exactly CUDA's dynamo options.
- **The weights it runs** (`Engine.runner`): the model itself when it is a plain model holding its
  weights in the dtype it computes in; else a hook-free inference copy in the compute dtype,
  refreshed in place before each rollout (under FSDP, from the gathered layers, which are then
  resharded; with LoRA, the adapters merged in). An optimizer step writes the model's weights in
  place, and the copy never moves: a recorded graph reads the addresses it was recorded with.
  When a plain model's weight went to new storage, torch records the CUDA graphs anew (the
  compiled code stays); when the slab grows (a call larger than the reserve), its static shapes
  change and the step compiles anew. Engine.moves counts both.

What it cannot run (attention that is not HF's AttentionInterface, layers other than full or
sliding-window attention) is named by `Engine.unsupported`, and Fast samples it with HF generate.
"""
from __future__ import annotations

import copy
import math
import sys
import time
import warnings
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache

from model import forward_columns, inference
from rollout import Generate, call_rows, cut_at_stop, left_pad, prompt_tokens, stop_ids, stop_strings

ATTENTION = "rlvr_slab"  # our AttentionInterface name
BLOCK = 128  # compiled steps: attention reads a multiple of this many columns (a column bucket)
LAYER_TYPES = {"full_attention", "sliding_attention"}
FUSED = {"LlamaAttention", "Qwen2Attention", "Qwen3Attention"}  # layers the engine runs itself, projections stacked


def graph_rows(live: int) -> int:
    """Rows a compiled step runs for `live` live rows: the next power of two (few graphs), at least
    2 (a size of 1 is a special case to the compiler: a graph of its own). 5 -> 8, 1 -> 2."""
    return max(2, 1 << (live - 1).bit_length()) if live else 0


def view_columns(columns: int) -> int:
    """Columns a compiled step's attention reads for `columns` columns of context: the next multiple
    of BLOCK (few column buckets: a CUDA graph each, per rows bucket). 300 -> 384."""
    return -(-columns // BLOCK) * BLOCK


def graph_columns(columns: int) -> int:
    """Columns of a compiled engine's slab for `columns` columns of context: view_columns and one
    spare, so that no view spans the whole slab (dynamo would specialise a view equal to the slab's
    static width: a graph of its own). 300 -> 385."""
    return view_columns(columns) + 1


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


def attend(slab, layer: int, query, key, value, *, rows: int, view: int, scaling: float, window=None,
           softcap=None):
    """Attention over the engine's slab for one new column of every row.

    query [rows, heads, 1, head_dim], key/value [rows, kv_heads, 1, head_dim] (rotary applied) ->
    output [rows, 1, heads, head_dim]. The key and value are written into column slab.col; the
    query attends to the columns c < view with start[r] ≤ c ≤ col (and col − c < window on
    sliding-window layers): the mask comes from the slab's per-row start, not from the caller.
    Heads share kv heads as HF's repeat_kv pairs them (head h reads kv head h // (heads / kv_heads)),
    each kv head read once for its group, as two matmuls; scores and softmax in float32 (HF eager's
    softmax dtype); Gemma's soft-capping before the mask. view: the columns so far (eager), or
    their column bucket (compiled: view_columns, so that one graph and few CUDA graphs serve
    every length; the columns past col are masked).

    The write names every (row, kv head, column) it sets in the whole slab buffer. Writing through
    a slice, slab[:rows].index_copy_(...), is an in-place op on a view of a graph input, which the
    compiler turns into a copy of the whole slice (all `capacity` columns of those rows) every step
    whenever rows < slab rows; indices into the buffer itself stay one in-place write."""
    heads, dim = query.shape[1], query.shape[3]
    where = (torch.arange(rows, device=key.device)[:, None], torch.arange(key.shape[1], device=key.device), slab.col)
    slab.keys[layer].index_put_(where, key[:, :, 0])
    slab.values[layer].index_put_(where, value[:, :, 0])
    keys, values = slab.keys[layer][:rows, :, :view], slab.values[layer][:rows, :, :view]
    grouped = query.reshape(rows, keys.shape[1], heads // keys.shape[1], dim)
    scores = (grouped @ keys.transpose(-1, -2)).float() * scaling  # [rows, kv_heads, group, view]
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    column = torch.arange(view, device=query.device)
    visible = (column >= slab.start[:rows, None]) & (column <= slab.col)
    if window is not None:
        visible &= column > slab.col - window
    scores = scores.masked_fill(~visible[:, None, None, :], -math.inf)
    out = scores.softmax(-1).to(values.dtype) @ values
    return out.reshape(rows, heads, 1, dim).transpose(1, 2)


def slab_attention(module, query, key, value, attention_mask, *, scaling, slab=None, slab_rows=0,
                   slab_view=0, sliding_window=None, softcap=None, dropout=0.0, **kwargs):
    """`attend` as HF's AttentionInterface calls an attention function, for the layers the engine
    does not run itself (not in FUSED): -> (output, no weights)."""
    unknown = {k for k in kwargs if k not in ("position_ids", "use_cache", "cache_position")}
    if unknown:
        raise NotImplementedError(f"the engine's attention does not implement {sorted(unknown)}")
    return attend(slab, module.layer_idx, query, key, value, rows=slab_rows, view=slab_view, scaling=scaling,
                  window=sliding_window, softcap=softcap), None


AttentionInterface.register(ATTENTION, slab_attention)


# ----------------------------------------------------------------------------- layers it runs itself

class Stacked(torch.nn.Module):
    """Several projections of one input as one GEMM: their weights (and biases) are consecutive rows
    of one matrix, and each projection's own parameter becomes a view of its rows, so that whatever
    writes the parameters (the inference copy's refresh) writes the stack. q|k|v, gate|up.

    A module holding buffers and a tuple of sizes, not a plain object: under `dynamic=True` dynamo
    makes every int and every tensor dimension it reads off a plain object a symbol (3 a layer,
    with ~140 guards, which grew the trace of a 28-layer copy to minutes), while a module's buffers
    and int attributes stay static."""

    def __init__(self, *modules: torch.nn.Linear):
        super().__init__()
        self.sizes = tuple(m.out_features for m in modules)
        biased = [m.bias is not None for m in modules]
        if any(biased) and not all(biased):
            raise ValueError("a stacked projection needs a bias on all of its parts or on none")
        self.register_buffer("weight", torch.cat([m.weight.detach() for m in modules]))
        self.register_buffer("bias", torch.cat([m.bias.detach() for m in modules]) if all(biased) else None)
        for m, w, b in zip(modules, self.weight.split(self.sizes), self.bias.split(self.sizes) if all(biased)
                           else [None] * len(modules)):
            m.weight.data = w
            if b is not None:
                m.bias.data = b

    def forward(self, x):
        return F.linear(x, self.weight, self.bias).split(self.sizes, -1)

    def tensors(self) -> list[torch.Tensor]:
        return list(self.buffers())


class Apart:
    """Projections of one input run one by one, as HF runs them: a model the engine does not own
    (the model itself, when it holds its weights in the dtype it computes in) keeps its storage."""

    def __init__(self, *modules: torch.nn.Linear):
        self.modules = modules

    def __call__(self, x):
        return [m(x) for m in self.modules]

    def tensors(self) -> list[torch.Tensor]:
        return []


def fused_layers(lm, stack: bool) -> list | None:
    """(q|k|v, gate|up) of each decoder layer, Stacked (`stack`: lm is the engine's own copy) or
    Apart, when every layer is one the engine runs itself (FUSED: Llama, Qwen2, Qwen3 attention with
    a gated MLP); None: HF's layers run, with `slab_attention`."""
    layers = getattr(getattr(lm, "model", None), "layers", None)
    if layers is None or not all(type(layer.self_attn).__name__ in FUSED and hasattr(layer.mlp, "gate_proj")
                                 for layer in layers):
        return None
    kind = Stacked if stack else Apart
    return [(kind(layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj),
             kind(layer.mlp.gate_proj, layer.mlp.up_proj)) for layer in layers]


def fused_logits(lm, projections: list, token, position, *, slab, rows: int, view: int) -> torch.Tensor:
    """lm's last-position logits for one new token of every row, its decoder layers run here with
    each layer's projections from `projections` (fused_layers), HF's modules for the rest (norms,
    rotary, o_proj, down_proj, LM head) and `attend` for attention: a layer is RMSNorm, one q|k|v
    GEMM, (Qwen3: q and k RMSNorm per head), rotary, attention, o_proj, residual, RMSNorm, one
    gate|up GEMM, act(gate) · up, down_proj, residual: HF's op order, so an Apart step computes what
    HF's layers compute."""
    base = lm.model
    h = base.embed_tokens(token[:, None])
    cos, sin = base.rotary_emb(h, position[:, None])
    for layer, (qkv, gate_up) in zip(base.layers, projections):
        attn = layer.self_attn
        q, k, v = (x.view(rows, 1, -1, attn.head_dim) for x in qkv(layer.input_layernorm(h)))
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        q, k = rotate(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
        out = attend(slab, attn.layer_idx, q, k, v.transpose(1, 2), rows=rows, view=view, scaling=attn.scaling,
                     window=getattr(attn, "sliding_window", None))
        h = h + attn.o_proj(out.reshape(rows, 1, -1))
        gate, up = gate_up(layer.post_attention_layernorm(h))
        h = h + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
    return lm.lm_head(base.norm(h))[:, -1]


class Engine:
    """The KV slab, the step's buffers, the compiled steps and (when needed) the inference copy of
    one model (see the module docstring). `Engine.of(lm)` keeps one per model, so that its graphs
    outlive a rollout."""

    _per_model: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
    compiles = 0  # graphs compiled for engine steps in this process, every engine together
    compile_seconds = 0.0  # host seconds of the step calls that compiled one

    @classmethod
    def of(cls, lm, compile: str = "auto") -> "Engine":
        if lm not in cls._per_model or cls._per_model[lm].mode != compile:
            cls._per_model[lm] = cls(lm, compile=compile)
        return cls._per_model[lm]

    def __init__(self, lm, *, compile: str = "auto"):
        """compile: auto = inductor on CUDA (its CUDA graphs), off elsewhere | off: the eager step at
        the exact sizes | eager: traced whole (fullgraph=True) and run as traced: proof on a CPU
        that the CUDA path traces, with its exact dynamo options | inductor: compiled, with CUDA
        graphs on CUDA | untraced: the compiled path's buckets and attention, step untraced (the
        tests' reference for a trace)."""
        if compile not in COMPILE_MODES:
            raise ValueError(f"engine compile mode {compile!r}: choose one of {', '.join(COMPILE_MODES)}")
        self._model = weakref.ref(lm)  # Engine.of's cache must not keep the model alive
        self.mode, self.device = compile, next(lm.parameters()).device
        kind = ("inductor" if self.device.type == "cuda" else "off") if compile == "auto" else compile
        self.compiled = kind != "off"
        # The same dynamo options for every backend, so that a CPU trace with the eager backend
        # compiles exactly the graphs CUDA's does. dynamic=True: rows are symbolic from the first
        # trace (left to dynamo, each bucket would cost a static graph first, then more). Floats
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
        self.least, self.release = (0, 0), False  # the first slab's least rows and columns; given back after calls?
        self.moves = 0  # calls that found the slab, the copy or a weight at another address than the last
        self.steps, self.issue_seconds = 0, 0.0  # decode steps, and host seconds spent issuing them
        self._pointers, self._twin = None, None
        self._runs = None  # (the model the layers were read from, its fused_layers)
        self._layers = None  # the current call's, read by the step

    @staticmethod
    def unsupported(lm) -> str | None:
        """Why the engine cannot run this model (Fast then samples with HF generate), or None."""
        config = lm.config.get_text_config()
        if not getattr(type(lm), "_supports_attention_backend", False):
            return f"{type(lm).__name__} does not route attention through HF's AttentionInterface"
        kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
        if kinds - LAYER_TYPES:
            return f"{config.model_type} has {sorted(kinds - LAYER_TYPES)} layers"
        return None

    def reserve(self, rows: int, columns: int, release: bool = False) -> None:
        """The run's largest generate call, known before the first (Fast.start): the slab is
        allocated at least this large at the first call and kept, so that later calls find it where
        it was (on CUDA, their recorded graphs replay as they are). release: give its memory back
        to the allocator after each call instead, for an update that cannot fit beside it; the
        next call takes memory anew, most often at another address (a move: on CUDA every graph is
        recorded again, each call)."""
        self.least = (max(rows, self.least[0]), max(columns, self.least[1]))
        self.release = release

    # ------------------------------------------------------------------ the weights it runs

    def runner(self, lm) -> torch.nn.Module:
        """The model the engine decodes with: lm itself when it is a plain model holding the weights
        in the dtype it computes in; else the inference copy, with lm's current weights copied in.
        lm needs the copy under FSDP (its hooks cannot be traced, and its gathered weights land in
        new storage each time), with LoRA (the adapters are merged into the copy: one matmul per
        layer instead of three) and when autocast computes in another dtype than the weights are
        held in (DDP's fp32 master weights under bf16 autocast: the copy holds them in bf16 once,
        instead of a cast of every weight at every step). In the copy of a FUSED model, q|k|v and
        gate|up are each one weight (Stacked).

        Under FSDP the engine runs inside parallel.full_weights, as train.py's rollouts and evals
        do: the decoder layers arrive gathered, are copied, and are resharded at once, so that the
        copy takes the gathered weights' place rather than doubling them. A later call of the same
        block finds them resharded: nothing has changed the weights since (an optimizer step only
        comes after the block), and the copy is kept as it is (no gather: ranks may make different
        numbers of calls, and a gather would wait for all of them). So inside such a block, once
        the engine has run, nothing else may run lm's layers: their forward would gather again, a
        collective that ranks making different numbers of calls would not all join (train.py's
        rollouts and evals run every forward through the engine: its copy serves prefills too,
        Fast.cache_model)."""
        dtype = compute_dtype(lm)
        if not needs_copy(lm, dtype):
            return lm
        layers = [m for m in lm.modules() if isinstance(m, FSDPModule)]
        if self._twin is not None and any(isinstance(p, DTensor) for m in layers for p in m.parameters()):
            return self._twin
        if self._twin is None:
            self._twin = inference_copy(lm, dtype)
            self._layers_of(self._twin)  # stacks its projections before the weights are copied in
        refresh(self._twin, lm)
        for m in layers:
            m.reshard()
        return self._twin

    def _layers_of(self, runner) -> list | None:
        """fused_layers of the model the engine decodes with, read once per model: a compiled step is
        guarded on these objects, and the stacks are the copy's weights."""
        if self._runs is None or self._runs[0]() is not runner:
            layers = fused_layers(runner, stack=runner is self._twin)
            if self.compiled and layers:
                for t in [t for pair in layers for part in pair for t in part.tensors()]:
                    torch._dynamo.mark_static_address(t)
            self._runs = (weakref.ref(runner), layers)
        return self._runs[1]

    # ------------------------------------------------------------------ buffers

    def _reserve(self, rows: int, capacity: int, like: DynamicCache) -> None:
        """Slab and step buffers for at least `rows` rows (+ one scratch row that dead bucket
        rows write to) and `capacity` columns, and at least `least`; kept between calls and grown,
        never shrunk, so that a call finds them where the last one left them (a growth moves them,
        Engine.moves counts it, and a compiled step compiles anew for their static shapes). Zeroed
        when allocated only: attention multiplies the columns it masks by a probability of 0, and
        0 · NaN from uninitialised memory would be NaN; what an earlier call wrote there is finite."""
        rows, capacity = max(rows, self._bucket(self.least[0])), max(capacity, self.least[1])
        if self.compiled:
            capacity = graph_columns(capacity)
        have_rows, have_cols = (self.keys[0].shape[0], self.keys[0].shape[2]) if self.keys else (0, 0)
        if rows <= have_rows and capacity <= have_cols and self.keys[0].dtype == like.layers[0].keys.dtype:
            return
        rows, capacity = max(rows, have_rows), max(capacity, have_cols)
        let_go(self.keys + self.values)  # the old slab goes before the new one is allocated
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
        if self.compiled:  # static addresses (a CUDA graph reads them in place) and static shapes
            for t in self.buffers():
                torch._dynamo.mark_static_address(t)
                torch._dynamo.mark_static(t)

    def buffers(self) -> list[torch.Tensor]:
        """Every tensor the engine keeps between calls (the memory plan counts them)."""
        return [*self.keys, *self.values] + ([self.start, self.token, self.live, self.col, self.t, self.done,
                                              self.out_tokens, self.out_logp, self.temperature, self.top_p]
                                             if self.keys else [])

    def _fresh(self, lm) -> None:
        """Count a call that finds the slab or a weight at another address than the last one did
        (the slab grew, a plain model's weight went to new storage). A recorded CUDA graph reads the
        addresses it was recorded with: torch records such a graph anew for the new addresses
        (static inputs, mark_static_address), and the compiled code stays, since addresses are not
        among dynamo's guards (a grown slab's shapes are: its step compiles anew)."""
        pointers = tuple(t.data_ptr() for t in [*lm.parameters(), *self.buffers()])
        if pointers != self._pointers and self._pointers is not None:
            self.moves += 1
        self._pointers = pointers

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
        CUDA graph captures. rows and view (the columns attention reads) are the step's only sizes,
        mode is fixed per graph; everything else is a buffer."""
        position = self.col - self.start[:rows]
        if self._layers:
            logits = fused_logits(lm, self._layers, self.token[:rows], position, slab=self, rows=rows, view=view)
        else:
            logits = lm(input_ids=self.token[:rows, None], position_ids=position[:, None], use_cache=False,
                        logits_to_keep=1, slab=self, slab_rows=rows, slab_view=view).logits[:, -1]
        self._sample(logits.float(), rows, mode)
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
               prefill_chunk: int = 0, strings=None) -> tuple[list[list[int]], list[list[float]]]:
        """Left-padded prompts ids/mask [n, w] -> each row's `new_tokens` new tokens and their
        log-probs under the sampler (a row runs on after its stop id; the caller cuts there).
        strings: rollout.StopStrings, text that also stops a row, found at the host's check."""
        n, w = ids.shape
        lm = self._model()
        with inference(lm):
            lm = self.runner(lm)
            if hold(self.keys + self.values):  # before the prefill, whose tensors must not take the slab's place
                for t in self.keys + self.values:
                    t.zero_()
            self._layers = self._layers_of(lm)
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
                        if strings is not None:
                            self._strung(rows, t, check, strings)
                        rows = self._leave(rows)
                        if not rows:
                            break
                    self._timed_step(lm, rows, view_columns(w + t) if self.compiled else w + t, mode)
            finally:
                lm.set_attn_implementation(previous)
                if self.release:
                    let_go(self.keys + self.values)
            return self.out_tokens[:n, :new_tokens].tolist(), self.out_logp[:n, :new_tokens].tolist()

    def _timed_step(self, lm, rows: int, view, mode: Mode) -> None:
        """One step, its host time counted apart when it compiled a graph (Engine.compile_seconds)
        and else as issue time (on CUDA the step is queued, not waited for: what the host spends per
        step is what a CUDA graph saves)."""
        compiles, t0 = Engine.compiles, time.perf_counter()
        self._compiled_step(lm, rows, view, mode)
        seconds = time.perf_counter() - t0
        if Engine.compiles != compiles:
            Engine.compile_seconds += seconds
        else:
            self.steps, self.issue_seconds = self.steps + 1, self.issue_seconds + seconds

    def _strung(self, rows: int, t: int, check: int, strings) -> None:
        """Stop the rows whose tokens since the last check (t − check .. t − 1) completed a stop
        string: their tails (a string's window before those tokens too) read to the host and decoded."""
        since = max(0, t - check - strings.window)
        tails = self.out_tokens[self.live[:rows], since:t].tolist()
        done = self.done[:rows].tolist()
        hit = [r for r, tail in enumerate(tails) if not done[r] and strings.end(tail, max(0, t - check - since))]
        if hit:
            self.done[torch.tensor(hit, device=self.device)] = True

    def _bucket(self, live: int) -> int:
        """Rows a step runs for `live` live rows: a power of two when compiled (few graphs)."""
        return graph_rows(live) if self.compiled else live

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


class Fast(Generate):
    """--engine fast: the run's sampler (config.SAMPLERS) that decodes with the model's Engine; a model the
    engine cannot run (Engine.unsupported) is named and HF generate samples it (Generate)."""

    def __init__(self, compile: str = "auto"):
        self.compile, self.since = compile, counters()  # the counts before this run (another run here)

    @classmethod
    def start(cls, cfg, lm, world: int, optimizer=None) -> Fast:
        """A training run's slab sized for its largest generate call before the first (Engine.reserve):
        call_rows by prompt_tokens + max_new_tokens; kept all run, or given back after each call
        (--engine-release). eval.py's (no optimizer) grows to its calls."""
        fast = cls(cfg.engine_compile)
        if optimizer is not None and fast.runs(lm):
            Engine.of(lm, fast.compile).reserve(max(call_rows(cfg, world)), prompt_tokens(cfg) + cfg.max_new_tokens,
                                                release=cfg.engine_release)
        return fast

    def runs(self, lm) -> bool:
        reason = Engine.unsupported(lm)
        if reason:
            warnings.warn(f"--engine fast: {reason}; rollouts use HF generate")
        return reason is None

    def sample(self, lm, tokenizer, rows: list[list[int]], sampling, *, width: int = 0,
               cache=None) -> list[tuple[list[int], list[float]]]:
        """The model's Engine decodes the padded rows, and each row is cut after its first stop id."""
        if not self.runs(lm):
            return super().sample(lm, tokenizer, rows, sampling, width=width, cache=cache)
        ids, mask = left_pad(rows, tokenizer.pad_token_id, next(lm.parameters()).device, width)
        stops, most, strings = stop_ids(tokenizer), sampling.max_new_tokens, stop_strings(tokenizer, sampling)
        tokens, logps = Engine.of(lm, self.compile).decode(ids, mask, sampling=sampling, new_tokens=most, stops=stops,
                                                           prefix=cache, prefill_chunk=sampling.prefill_chunk,
                                                           strings=strings)
        cut = [cut_at_stop(t, stops, most, strings) for t in tokens]
        return [(t, lp[:len(t)]) for t, lp in zip(cut, logps)]

    def cache_model(self, lm):
        """The engine's inference copy where it keeps one: the KV cache handed to `sample` must come from
        the model that continues it."""
        return Engine.of(lm, self.compile).runner(lm) if self.runs(lm) else lm

    def metrics(self) -> dict:
        return run_counters(self.since)


COMPILE_MODES = ("auto", "off", "eager", "inductor", "untraced")


def compile_count() -> int:
    """Graphs compiled for engine steps so far in this process."""
    return Engine.compiles


def counters() -> dict:
    """This process's engine counts so far (train.py logs their growth over a run: run_counters):
    graphs compiled and the host seconds of the steps that compiled them; calls that found the slab
    or a weight at a new address (on CUDA, their graphs recorded anew); decode steps and the host
    seconds spent issuing them (on CUDA with graphs, the launch of one graph each)."""
    engines = list(Engine._per_model.values())
    return {"compiles": Engine.compiles, "compile_s": Engine.compile_seconds,
            "moves": sum(e.moves for e in engines), "steps": sum(e.steps for e in engines),
            "issue_s": sum(e.issue_seconds for e in engines)}


def run_counters(since: dict) -> dict:
    """A run's engine metrics since `since` (counters() at its start): graphs compiled, the host
    seconds they took, slab or weight moves, and the host milliseconds a decode step took to issue
    (the run's mean; absent before the first step). Timings go under time/, with the others."""
    now = counters()
    grew = {k: now[k] - since[k] for k in now}
    out = {"engine/compiles": grew["compiles"], "engine/moves": grew["moves"], "time/engine_compile": grew["compile_s"]}
    if grew["steps"]:
        out["time/engine_issue_ms"] = 1000 * grew["issue_s"] / grew["steps"]
    return out


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
    """Free the storage of each tensor now, keeping the tensor (its shape, dtype, device), whoever
    else holds it (a compiled step's static inputs): FSDP2 does the same with its gathered weights
    between forwards."""
    for t in tensors:
        t.untyped_storage().resize_(0)


def hold(tensors) -> bool:
    """Give each tensor freed by let_go its storage back, uninitialised. -> whether any was freed."""
    freed = [t for t in tensors if t.untyped_storage().nbytes() == 0]
    for t in freed:
        t.untyped_storage().resize_(t.numel() * t.element_size())
    return bool(freed)
