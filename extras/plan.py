"""The memory plan: what one rank holds, phase by phase, from the config alone (no weights read).

    python train.py --config configs/qwen2.5-7b_deepscaler_pacs.yaml --plan --world-size 8

The model is built on the meta device to count parameters exactly (all of them, per decoder
layer, and the rest: embeddings, final norm, LM head); widths come from its config.json, or from
a shipped `assets/shapes/<folder name>/config.json` when the folder is not on this machine.
Every row is a formula over those numbers and the Config, written against the code that
allocates it (parallel.py, rollout.py, model.py, train.update, HF generate); the tests check the
total against the measured peak of tensor memory on CPU.

A phase's total is the resident state plus what that phase adds at its worst moment; the peak
is the largest total. Counted: tensors PyTorch allocates (what torch.cuda.max_memory_allocated
reports). The verdict adds what a GPU run needs besides: the CUDA context and NCCL/cuBLAS
buffers, and the caching allocator's slack (memory reserved but not in a live tensor).
Checked against torch.cuda.max_memory_allocated on an H100 (bench/plan_check.py --gpu: FSDP,
bf16, Qwen2.5-0.5B and a 0.6B Qwen3, with and without checkpointing, Markovian + reference):
rollouts −2% to +3%, updates 2-7% over.
"""
from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.integrations import sdpa_attention

import algos
from engine import Fast, graph_columns, graph_rows
from config import sampler_class
from extras.lora import chosen
from extras.vllm_engine import KV_BLOCK, PUSH_BYTES, STEP_TOKENS, VLLM, buckets, kv_cache_bytes, memory_args
from model import logprob_chunk
from parallel import compute_dtype, parallel_mode
from rewards import DataError
from rollout import call_rows, prompt_tokens

SHAPES = Path(__file__).resolve().parent.parent / "assets" / "shapes"
GiB = 2 ** 30
CUDA_RESERVE = 1.5 * GiB  # CUDA context + NCCL outside PyTorch's allocator: 1.35-1.5 GiB measured on an H100
# Reserved / allocated at a phase's peak, measured on an H100: 1.08 with
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; up to 1.46 without, in rollouts, where the KV
# cache grows by one torch.cat per token and the freed blocks are always a little too small.
ALLOCATOR_SLACK = 0.10


# ============================================================================ the model's shape

@dataclass(frozen=True)
class Shape:
    """What the plan needs to know about a model: exact parameter counts and tensor widths."""
    name: str
    params: int  # P: every parameter once (a tied LM head is the embedding)
    layer_params: int  # one decoder layer: an FSDP shard group
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool  # LM head = input embedding
    qk_norm: bool  # an RMSNorm on every query and key head (Qwen3)
    linears: tuple = ()  # (leaf name, in, out) of each nn.Linear of one decoder layer: what LoRA can adapt

    @property
    def root_params(self) -> int:
        """FSDP's root group: embeddings, final norm and LM head (what no decoder layer holds)."""
        return self.params - self.layers * self.layer_params


def shape_from_config(config, name: str) -> Shape:
    """Count a model built on the meta device (no memory, no weights): Qwen2.5-7B's config ->
    Shape(params=7_615_616_512, layer_params=233_057_792, layers=28, hidden=3584, ...)."""
    with torch.device("meta"):
        lm = AutoModelForCausalLM.from_config(config)
    kinds = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [m for m in lm.modules() if type(m).__name__ in kinds]
    if not layers:
        raise DataError(f"{name}: no decoder layers found (_no_split_modules is {sorted(kinds)})")
    text = config.get_text_config()
    heads = text.num_attention_heads
    return Shape(
        name=name, params=sum(p.numel() for p in lm.parameters()),
        layer_params=sum(p.numel() for p in layers[0].parameters()), layers=len(layers),
        hidden=text.hidden_size, intermediate=text.intermediate_size, heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads, vocab=text.vocab_size,
        tied=lm.get_output_embeddings().weight is lm.get_input_embeddings().weight,
        qk_norm=any(n.endswith("q_norm") for n, _ in layers[0].named_modules()),
        linears=tuple((n.rsplit(".", 1)[-1], m.in_features, m.out_features) for n, m in layers[0].named_modules()
                      if isinstance(m, nn.Linear)))


def find_shape(model: str, trust_remote_code: bool = False) -> tuple[Shape, str]:
    """(shape, where its config came from): the folder's own config.json, else the shipped shape
    of the same folder name. "models/Qwen2.5-7B" (absent) -> assets/shapes/Qwen2.5-7B."""
    name = Path(model.rstrip("/")).name
    folder = Path(model) if (Path(model) / "config.json").is_file() else SHAPES / name
    if not (folder / "config.json").is_file():
        shipped = ", ".join(sorted(p.name for p in SHAPES.iterdir() if (p / "config.json").is_file()))
        raise DataError(f"--model {model}: no config.json there and no shipped shape named {name!r}; "
                        f"shipped shapes ({SHAPES}): {shipped}. Point --model at a folder with a "
                        f"config.json (the weights are not read), or add assets/shapes/{name}/config.json")
    config = AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code)
    shown = os.path.relpath(folder) if folder.is_relative_to(Path.cwd()) else str(folder)
    source = shown if folder == Path(model) else f"{shown} (no {model}/config.json here)"
    return shape_from_config(config, name), source


# ============================================================================ per-token sizes

@dataclass(frozen=True)
class Target:
    """The machine a plan is for: what parallel.py and rollout.py would pick there."""
    device: str  # cuda | cpu
    world: int  # ranks
    mode: str  # fsdp | ddp
    bytes: int  # compute dtype: 2 (bf16) or 4 (fp32)
    engine: str  # who generates: fast (engine.py) | hf (generate) | vllm; --engine auto resolved (sampler_name)

    @property
    def weight_bytes(self) -> int:
        """The weights a forward runs on (parallel.weights_dtype): the compute dtype under FSDP, fp32
        under DDP, whose bf16 autocast casts them only for its matmuls. Frozen weights (a reference
        model, a LoRA base) are held in it."""
        return 4 if self.mode == "ddp" else self.bytes

    @property
    def act_bytes(self) -> int:
        """Activations: the weights' dtype: DDP under bf16 autocast keeps its residual stream, norms
        and rotary outputs in fp32, as its weights and embeddings are."""
        return self.weight_bytes

    @property
    def kv_bytes(self) -> int:
        """KV cache: the weights' dtype (HF's cache takes the dtype of its first key; under DDP
        rotary embeddings in fp32 make that fp32 even with autocast)."""
        return self.weight_bytes


def target_for(cfg, world: int, device_type: str) -> Target:
    """cfg.parallel / cfg.precision / cfg.engine resolved as parallel.py and rollout.py resolve them
    on that device: auto, auto, auto on cuda -> fsdp, bf16, hf; on cpu -> ddp, fp32, hf."""
    device = torch.device(device_type)
    return Target(device_type, world, parallel_mode(cfg, device),
                  torch.finfo(compute_dtype(cfg, device)).bits // 8, sampler_name(cfg))


def sampler_name(cfg) -> str:
    """What --engine's sampler is to the plan: vllm, fast (engine.py) or hf (HF generate; a sampler of your own
    that subclasses neither is counted as generate)."""
    sampler = sampler_class(cfg)
    return "vllm" if issubclass(sampler, VLLM) else "fast" if issubclass(sampler, Fast) else "hf"


def kv_token_bytes(s: Shape, t: Target) -> int:
    """KV cache bytes of one token: K and V of every layer."""
    return s.layers * 2 * s.kv_heads * s.head_dim * t.kv_bytes


def layer_activations(s: Shape, b: int) -> int:
    """Bytes one decoder layer saves for backward per token, at activation width b (HF
    Qwen2/Llama/Qwen3 layer, sdpa, padded rows so GQA keys/values are repeated to every head):
    2 RMSNorms (fp32 input copy, normed in b, weight × normed) + q, k, v, attention output
    (+ its fp32 log-sum-exp) + 4 MLP tensors of the intermediate width (+ Qwen3's q/k norms).
    Qwen2.5-7B, bf16: 16·3584 + 2·(4·3584) + 4·28 + 8·18944 = 237,680 B per token."""
    hq, hk = s.heads * s.head_dim, s.kv_heads * s.head_dim
    norms = 2 * s.hidden * (4 + 2 * b)
    attention = b * 4 * hq + 4 * s.heads
    qk_norms = (4 + b) * (hq + hk) if s.qk_norm else 0
    return norms + attention + qk_norms + 4 * b * s.intermediate


def decode_repeats_kv(s: Shape) -> bool:
    """Whether HF's sdpa attention copies a layer's keys and values to every query head in a decode
    step of padded rows (repeat_kv), as transformers < 5.23 does for grouped-query models; later
    ones run that step on the key/value heads (sdpa_attention.pack_gqa)."""
    return s.kv_heads < s.heads and not hasattr(sdpa_attention, "pack_gqa")


def logits_copies(temperature: float, top_p: float, top_k: int) -> int:
    """fp32 [sequences, vocab] tensors alive at a sampling step of HF generate: the fp32 copy of
    the logits, the probabilities and multinomial's draw, plus one per warper that rewrites them
    (temperature ≠ 1, top-k, and top-p's sort/softmax/cumsum). τ 1, top-p 1 -> 3."""
    return 3 + (temperature not in (0, 1)) + (top_k > 0) + 5 * (top_p < 1)


# ============================================================================ phases

@dataclass
class Phase:
    """One moment of a step: what it adds to the resident state, row by row (bytes)."""
    name: str
    rows: list  # (what, bytes)
    group: str  # the knobs that change it: rollout | eval | update

    @property
    def total(self) -> float:
        return sum(n for _, n in self.rows)


def adapted(cfg, s: Shape) -> list:
    """(leaf name, in, out) of each linear layer LoRA adapts in one decoder layer; [] without LoRA."""
    if not cfg.lora_rank:
        return []
    names = chosen(cfg.lora_targets, list(dict.fromkeys(n for n, _, _ in s.linears)), s.name)
    return [x for x in s.linears if x[0] in names]


def lora_params(cfg, s: Shape) -> int:
    """LoRA's trained parameters: r · (in + out) for each adapted linear layer of each decoder
    layer (0 without LoRA). Qwen2.5-1.5B, r 32, all 7 layers: 28 · 32 · 41,216 = 36,929,536."""
    return s.layers * sum(cfg.lora_rank * (i + o) for _, i, o in adapted(cfg, s))


def resident_rows(cfg, s: Shape, t: Target) -> list:
    """What every phase holds: weights, AdamW moments (after the first step), the reference.
    FSDP: everything sharded 1/world; DDP: replicated, plus its gradient buckets. LoRA: a frozen
    base in the dtype its forward sees, fp32 adapters, and no reference copy (lora.AdaptersOff)."""
    shard = t.world if t.mode == "fsdp" else 1
    each = f" (1/{shard} each)" if shard > 1 else ""
    trained = lora_params(cfg, s) or s.params  # what has gradients and AdamW moments
    rows = ([(f"base weights, frozen, {_dtype(t.weight_bytes)}{each}", s.params * t.weight_bytes / shard),
             (f"LoRA adapters, rank {cfg.lora_rank}, fp32{each}", trained * 4 / shard)] if cfg.lora_rank else
            [(f"policy weights, fp32{each}", s.params * 4 / shard)])
    rows.append(("AdamW moments exp_avg + exp_avg_sq, fp32", trained * 8 / shard))
    if t.mode == "ddp" and t.world > 1:
        rows.append(("DDP gradient buckets, fp32", trained * 4))
    if cfg.beta > 0 and not cfg.lora_rank:
        rows.append((f"reference model, {_dtype(t.weight_bytes)}, frozen", s.params * t.weight_bytes / shard))
    if cfg.teacher:  # OPD's teacher (algos/opd.py): loaded as the reference is, at its own size
        teacher = find_shape(cfg.teacher, cfg.trust_remote_code)[0]
        rows.append((f"teacher {teacher.name}, {_dtype(t.weight_bytes)}, frozen{each}",
                     teacher.params * t.weight_bytes / shard))
    return rows


def gathered_rows(cfg, s: Shape, t: Target, generating: bool = False) -> list:
    """Weights a forward runs on: under FSDP every layer gathered at once (parallel.full_weights;
    while the engine generates, copied into its inference copy, counted resident, and resharded);
    DDP under bf16 autocast caches a bf16 copy of each matmul weight that requires grad (with
    LoRA: only the adapters), unless the engine generates, from its copy."""
    copied = generating and engine_copy(cfg, t)
    if t.mode == "fsdp" and copied:  # the layers are resharded once copied (Engine.runner)
        return [(f"root group gathered (embeddings, norm, LM head), {_dtype(t.bytes)}", s.root_params * t.bytes)]
    if t.mode == "fsdp":
        return [(f"all weights gathered, {_dtype(t.bytes)}", (s.params + lora_params(cfg, s)) * t.bytes)]
    if t.bytes == 2 and not copied:
        matmul = lora_params(cfg, s) or s.params - (0 if s.tied else s.vocab * s.hidden)  # all but an untied embedding
        return [("autocast's bf16 copies of the matmul weights", matmul * 2)]
    return []


def generation_phases(cfg, s: Shape, t: Target, *, label: str, seqs: int, sampling: tuple, chunks: int) -> list:
    """Two moments of the largest generate call of `seqs` sequences: its largest prefill forward
    and its last decode step. Markovian rounds after the first also keep the q ⧺ head prefix
    cache of every trace (environments/markovian.py), so their KV cache is that plus one chunk's context.
    With the engine (--engine fast) the KV cache is its slab, resident (engine_rows), and a step
    adds only its sampling temporaries."""
    p, c = prompt_tokens(cfg), cfg.max_new_tokens
    m, h = (cfg.chunk_carryover, cfg.chunk_head_tokens) if chunks > 1 else (0, 0)
    kv_token = kv_token_bytes(s, t)
    context = p + c  # a generate call never exceeds prompt + max_new_tokens (Markovian: q + C)
    cached = (p + h) + context if chunks > 1 and m > h else context
    if t.engine == "vllm":  # vLLM holds its memory all run (vllm_rows); the trainer only pushes, outside full_weights
        return [Phase(f"{label}: weights pushed to vLLM", push_rows(cfg, s, t), label),
                Phase(f"{label}: vLLM generates", vllm_step_rows(cfg, s, t, seqs), label)]
    weights = gathered_rows(cfg, s, t, generating=True)
    if t.engine == "fast":  # the KV cache is the engine's slab, counted as resident (engine_rows)
        # a group's prompt is prefilled once; a later round or turn prefills every row
        prefilled = seqs // cfg.group_size if chunks == 1 and not cfg.env else seqs
        copy = [("engine: one layer's prefill keys/values copied to every row", seqs * p * kv_token / s.layers)]
        return [Phase(f"{label}: prefill", weights + prefill_rows(cfg, s, t, prefilled, chunks) + copy, label),
                Phase(f"{label}: decode step", weights + engine_step_rows(s, t, seqs, sampling), label)]
    decode = [(f"KV cache, {seqs} sequences × {cached} tokens", seqs * cached * kv_token),
              ("KV cache growth: torch.cat copies one layer", seqs * context * kv_token / s.layers / 2),
              ("sampling: logits and fp32 copies [sequences, vocab]",
               seqs * s.vocab * (t.bytes + 4 * logits_copies(*sampling)))]
    if decode_repeats_kv(s):
        decode.append(("sdpa: one layer's keys/values repeated to every head",
                       seqs * context * 2 * s.heads * s.head_dim * t.kv_bytes))
    return [Phase(f"{label}: prefill", weights + prefill_rows(cfg, s, t, seqs, chunks), label),
            Phase(f"{label}: last decode step", weights + decode, label)]


def vllm_rows(cfg, s: Shape, t: Target, rows: int) -> list:
    """What vLLM holds from its start on, beside every later phase, as extras/vllm_engine.memory_args sizes
    it: its weights in the compute dtype, a KV cache of the run's largest call (`rows` × prompt +
    max_new_tokens, kv_cache_bytes) and on CUDA its CUDA graphs; or a share of the GPU that vLLM fills (the
    default 0.3 where those rows do not fit it, or --vllm-memory), or on a CPU at most 0.25 (or
    --vllm-memory) GiB of KV cache. The graphs share one pool: the temporaries of the largest capture (a
    decode step of min(2 × rows, 512) tokens, vLLM's default; one layer's at a time, as a step's
    activations), plus about 1 MiB for each graph, FULL and PIECEWISE at every captured size (vLLM's own
    estimate of the same memory, profile_cudagraph_memory, has this form)."""
    cuda, columns = t.device == "cuda", prompt_tokens(cfg) + cfg.max_new_tokens
    token = s.layers * 2 * s.kv_heads * s.head_dim * t.bytes  # vLLM's keys and values: the compute dtype
    kv = kv_cache_bytes(rows=rows, columns=columns, token_bytes=token, cuda=cuda)
    args = memory_args(cfg.vllm_memory, weights=s.params * t.bytes, kv=kv, total=cfg.gpu_memory * GiB, cuda=cuda)
    if "kv_cache_memory_bytes" not in args:
        share = args["gpu_memory_utilization"]
        return [(f"vLLM: {share:g} of the GPU's {cfg.gpu_memory:g} GiB (weights, KV cache, CUDA graphs)",
                 share * cfg.gpu_memory * GiB)]
    held = args["kv_cache_memory_bytes"]
    out = [(f"vLLM: its weights, {_dtype(t.bytes)}", s.params * t.bytes),
           (f"vLLM: KV cache, {rows} rows × {columns} tokens in blocks of {KV_BLOCK[t.device]}" if held == kv else
            f"vLLM: KV cache, {held / GiB:g} GiB (fewer rows at once)", held)]
    if cuda:
        sizes = graph_sizes(rows)
        graphs = 2 * len(sizes)
        out.append((f"vLLM: CUDA graphs, one layer's activations at {sizes[-1]} tokens + 1 MiB × {graphs} graphs",
                    sizes[-1] * vllm_layer_bytes(s, t) + graphs * 2**20))
    return out


def graph_sizes(rows: int) -> list[int]:
    """The decode batches vLLM 0.32 captures a CUDA graph of by default (vllm/config/vllm.py): 1, 2, 4, then
    every 8 below 256 and every 16 from 256, up to min(2 × max_num_seqs, 512), and max_num_seqs itself.
    20 rows -> [1, 2, 4, 8, 16, 20, 24, 32, 40]."""
    top = min(2 * rows, 512)
    sizes = [n for n in (1, 2, 4) if n <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    return sorted(set(sizes + [rows]))


def vllm_layer_bytes(s: Shape, t: Target) -> int:
    """Bytes a token's activations take in one of vLLM's decoder layers at their widest: the MLP's gate|up
    output, its product and the layer's input and output, or attention's q|k|v and output (as prefill_rows
    counts HF's)."""
    return t.bytes * max(4 * s.hidden + 3 * s.intermediate, 3 * s.hidden + (s.heads + 2 * s.kv_heads) * s.head_dim)


def vllm_step_rows(cfg, s: Shape, t: Target, seqs: int) -> list:
    """What a generate call of `seqs` requests adds inside vLLM, freed after it (its profile run at start
    reserves the same): one layer's activations for a step's tokens (max_num_batched_tokens) and the
    sampler's fp32 [requests, vocab] logits, processed logits and log-probs."""
    tokens = max(prompt_tokens(cfg) + cfg.max_new_tokens, STEP_TOKENS[t.device])
    return [(f"vLLM: one layer's activations, {tokens} tokens a step", tokens * vllm_layer_bytes(s, t)),
            ("vLLM sampler: fp32 [requests, vocab] × 3", seqs * s.vocab * 4 * 3)]


def push_rows(cfg, s: Shape, t: Target) -> list:
    """The trainer's side of a push (VLLM.pull), outside full_weights: its largest bucket of whole layers
    (vllm_engine.buckets over this model at PUSH_BYTES) made in the compute dtype (by FSDP's gathers, or a
    cast; none when the weights already are that dtype, DDP fp32); under FSDP in bf16, the fp32 gather of
    the largest tensor before its cast; with LoRA, W, B A and their sum in float64 for the largest adapted
    weight. Qwen2.5-7B, bf16, FSDP: one layer 466 MB (2 × 233,057,792), the embeddings' fp32 2.18 GB."""
    b, lora = t.bytes, adapted(cfg, s)
    units = ([("embed", s.vocab * s.hidden * b)] + [(f"layers.{i}.", s.layer_params * b) for i in range(s.layers)]
             + [("norm", s.hidden * b)] + ([] if s.tied else [("lm_head", s.vocab * s.hidden * b)]))
    new = t.mode == "fsdp" or t.weight_bytes != b or bool(lora)
    largest = max(sum(units[i][1] for i in push) for push in buckets(units, PUSH_BYTES)) if new else 0
    rows = [(f"a push: whole layers up to {PUSH_BYTES >> 20} MiB (or one layer), {_dtype(b)}", largest)]
    if t.mode == "fsdp" and b != 4:
        rows.append(("its largest tensor gathered in fp32, before the cast",
                     4 * max([s.vocab * s.hidden] + [i * o for _, i, o in s.linears])))
    if lora:
        rows.append(("LoRA merge: W, B A and W + B A of the largest adapted weight, float64",
                     3 * 8 * max(i * o for _, i, o in lora)))
    return rows


def engine_step_rows(s: Shape, t: Target, seqs: int, sampling: tuple) -> list:
    """A decode step of the engine (engine.draw): the logits, then fp32 [rows, vocab] tensors: the
    float copy, z/τ, the probabilities, the exponential race and its ratio, the log-softmax, plus
    the truncation's (as in HF's sampler). On CUDA these live in the CUDA graph pool."""
    return [("engine step: logits and fp32 copies [rows, vocab]",
             seqs * s.vocab * (t.bytes + 4 * (logits_copies(*sampling) + 3)))]


def engine_copy(cfg, t: Target) -> bool:
    """Whether the engine decodes from an inference copy of the weights (engine.needs_copy): under
    FSDP, with LoRA adapters, and when bf16 autocast computes from fp32 weights (DDP)."""
    return t.engine == "fast" and (t.mode == "fsdp" or cfg.lora_rank > 0 or t.weight_bytes != t.bytes)


def engine_rows(cfg, s: Shape, t: Target, seqs: int, sampling: tuple) -> tuple[list, list]:
    """(the engine's KV slab, what else it keeps) from its first call on (engine.py). The slab is
    sized before the first call for the largest generate call (rollout.reserve: `seqs` rows of
    prompt + max_new_tokens columns; a Markovian round's context is q + C too; on CUDA rows rounded
    up to a power of two and columns to a multiple of engine.BLOCK plus one spare: engine.graph_columns)
    and kept all run, so that a recorded CUDA graph replays at the same addresses, unless --engine-release gives it back after
    each call. Kept: the output buffers, the inference copy of the weights in the compute dtype
    when it has one (under FSDP it replaces the gathered decoder layers during a rollout, and stays
    through the update), and on CUDA the graph pool (one step's temporaries)."""
    rows, columns = seqs, prompt_tokens(cfg) + cfg.max_new_tokens
    if t.device == "cuda":
        rows, columns = graph_rows(rows), graph_columns(columns)
    slab = [(f"engine KV slab, {rows} rows × {columns} columns", rows * columns * kv_token_bytes(s, t))]
    kept = [("engine output buffers: token ids and log-probs", (rows + 1) * columns * (8 + 4))]
    if engine_copy(cfg, t):
        kept.append((f"engine inference copy of the weights, {_dtype(t.bytes)}", s.params * t.bytes))
    if t.device == "cuda":
        kept += [("CUDA graph pool: " + what, n) for what, n in engine_step_rows(s, t, rows, sampling)]
    return slab, kept


def prefill_rows(cfg, s: Shape, t: Target, seqs: int, chunks: int) -> list:
    """The largest prefill moment: (KV cache then, one layer's activations for the tokens of
    one forward, the attention mask over the cached length, last-position logits). A plain
    call prefills q; a Markovian round 2 prefills q ⧺ head once (environments/markovian.py's prefill) and then the
    m − h tail tokens on a copy of that cache (the prefix stays for later rounds)."""
    p, b = prompt_tokens(cfg), t.bytes
    moments = [(p, p, p)]  # (cached tokens, tokens a forward, attended length)
    if chunks > 1:
        m, h = cfg.chunk_carryover, cfg.chunk_head_tokens
        moments += ([(p + h, p + h, p + h), (3 * (p + h), 0, 0), (2 * (p + h) + m - h, m - h, p + m)] if m > h
                    else [(p + m, p + m, p + m)])  # (3 (p + h): the prefix, its deep copy, the rows kept)
    kv_token = kv_token_bytes(s, t)
    hq, repeat = s.heads * s.head_dim, s.kv_heads < s.heads  # sdpa with a padding mask repeats K, V

    def rows(cached, forward, attended):
        q = min(cfg.prefill_chunk or forward, forward)
        # one layer at a time: the MLP's three [tokens, intermediate] tensors, or attention's
        # q, output and keys/values repeated to every head over the attended length
        layer = max(q * b * (4 * s.hidden + 3 * s.intermediate),
                    q * b * (3 * s.hidden + 2 * hq) + repeat * 2 * b * hq * attended)
        return [(f"KV cache, {seqs} sequences × {cached} tokens", seqs * cached * kv_token),
                (f"prefill activations, one layer, {q} tokens a forward", seqs * layer),
                ("prefill attention mask (bool + float)", seqs * q * attended * (1 + b)),
                ("last-position logits", seqs * s.vocab * b)]
    return max((rows(*mo) for mo in moments), key=lambda r: sum(n for _, n in r))


def micro_batch(cfg, t: Target) -> tuple[int, int, int]:
    """(rows, padded row length, response tokens) of the largest micro-batch on a rank.
    A row is prompt + response, or a Markovian chunk: q ⧺ carry-over (P + m) padded with chunk 1's
    C-token response, so P + m + C, or a turn (prompt_tokens + C; max_turns rows a trace). max_tokens_per_micro_batch caps rows × length (one row
    at least). 1.5B GSM8K config (micro 8, P 512, R 1024) -> (8, 1536, 1024)."""
    p, c = prompt_tokens(cfg), cfg.max_new_tokens
    m = cfg.chunk_carryover if cfg.max_chunks > 1 else 0
    length = p + m + c
    rows_per_trace = cfg.max_turns if cfg.env else cfg.max_chunks
    share = math.ceil(cfg.prompts_per_step * cfg.group_size * rows_per_trace / (cfg.mini_batches * t.world))
    unit = cfg.group_size if _whole_groups(cfg) else 1  # train.pack never splits a unit
    rows = min(cfg.micro_batch_size // unit * unit or unit, share)
    if cfg.max_tokens_per_micro_batch:
        rows = min(rows, max(unit, cfg.max_tokens_per_micro_batch // length // unit * unit))
    return rows, length, c


def _whole_groups(cfg) -> bool:
    """Whether the algorithm keeps each group whole in a micro-batch (PACS)."""
    return algos.get(cfg.algo).whole_groups


def update_phases(cfg, s: Shape, t: Target) -> list:
    """Three moments of an optimizer step's work: the start of a micro-batch's backward (every
    saved activation, the log-prob head's backward), the backward through a decoder layer
    (recomputed with gradient checkpointing), and the AdamW step. With LoRA only the adapters
    have gradients (none for the LM head), and each adapted layer also saves its [tokens, r] A x."""
    rows, length, response = micro_batch(cfg, t)
    tokens, b, a = rows * length, t.bytes, t.act_bytes
    shard = t.world if t.mode == "fsdp" else 1
    lora = lora_params(cfg, s)
    state = [(f"gradients, fp32{' (1/%d each)' % shard if shard > 1 else ''}", (lora or s.params) * 4 / shard)]
    if t.mode == "fsdp":
        state += [(f"gathered root group (embeddings, norm, LM head), {_dtype(b)}", s.root_params * b),
                  ("gathered decoder layers: current + prefetched", 2 * (s.layer_params + lora / s.layers) * b)]
        state += [] if lora else [(f"LM head gradient, unsharded {_dtype(b)}, until the root's reduce-scatter",
                                   s.vocab * s.hidden * b)]
    else:
        state += gathered_rows(cfg, s, t)
    per_layer = (tokens * (layer_activations(s, a) + a * cfg.lora_rank * len(adapted(cfg, s)))
                 + rows * length ** 2 * a)  # + the float attention mask
    saved = ([(f"checkpointed layer inputs, {rows} rows × {length} tokens", s.layers * tokens * s.hidden * a)]
             if cfg.gradient_checkpointing else
             [(f"saved activations, all layers, {rows} rows × {length} tokens", s.layers * per_layer)])
    saved += [("final norm, hidden states, bool attention mask",
               tokens * s.hidden * (4 + 2 * a) + rows * response * s.hidden * a + rows * length ** 2)]
    chunk = min(logprob_chunk(cfg.logprob_chunk, s.vocab), rows * response)
    # model._chunk_stats casts the head weight to fp32 and gets its fp32 gradient in every
    # chunk's backward; in fp32 there is no cast, and the first chunk's gradient is .grad itself
    # (a frozen head, LoRA's: the cast only)
    head_copies = (b != 4) + (not lora and (b != 4 or rows * response > chunk))
    head = [(f"log-prob head backward: [{chunk}, vocab] fp32 tensors",
             chunk * s.vocab * 4 * (5 + 2 * (cfg.entropy_coef > 0))),
            ("LM head weight as fp32 and its fp32 gradient", s.vocab * s.hidden * 4 * head_copies)]
    layer = ([("one decoder layer recomputed", per_layer)] if cfg.gradient_checkpointing else [])
    # its backward starts with the gradients of the layer output and of the MLP's inner product;
    # later ones replace saved tensors the backward has already used
    layer += [("a layer's backward: its first activation gradients", tokens * a * (s.intermediate + s.hidden))]
    if t.mode == "fsdp":
        layer.append(("a layer's unsharded gradients + fp32 reduce-scatter input",
                      (lora / s.layers if lora else s.layer_params) * (b + 4)))
    largest = cfg.lora_rank * max((max(i, o) for _, i, o in adapted(cfg, s)), default=0) or s.vocab * s.hidden
    step = [("AdamW step temporaries (GPU foreach: one fp32 copy; CPU: two of the largest tensor)",
             (lora or s.params) * 4 / shard if t.device == "cuda" else 2 * 4 * largest)]
    return [Phase("update: start of backward (log-prob head)", state + saved + head, "update"),
            Phase("update: backward through a decoder layer", state + saved + layer, "update"),
            Phase("update: optimizer step", state[:1] + step, "update")]


def teacher_phases(cfg, t: Target) -> list:
    """OPD's teacher: under FSDP, loaded whole in its weights' dtype before fully_shard splits it (train.models);
    scoring a micro-batch before the first step (train.fixed_passes), without gradient: under FSDP its root group
    and two layers gathered; one decoder layer's tensors at a time (bounded by what a layer saves for backward);
    its log-prob chunk's fp32 logits, their exponentials and softmax."""
    teacher = find_shape(cfg.teacher, cfg.trust_remote_code)[0]
    rows, length, response = micro_batch(cfg, t)
    gathered = ([(f"teacher: gathered root group + 2 layers, {_dtype(t.bytes)}",
                  (teacher.root_params + 2 * teacher.layer_params) * t.bytes)] if t.mode == "fsdp" else [])
    chunk = min(logprob_chunk(cfg.logprob_chunk, teacher.vocab), rows * response)
    whole = (f"teacher weights, {_dtype(t.weight_bytes)}, unsharded", teacher.params * t.weight_bytes)
    load = [Phase("load: the teacher whole, before sharding", [whole], "load")]
    return (load if t.mode == "fsdp" else []) + [Phase("update: the teacher's forward (no grad)", gathered + [
        (f"teacher: one layer's tensors, {rows} rows × {length} tokens",
         rows * length * (layer_activations(teacher, t.act_bytes) + 2 * teacher.hidden * t.act_bytes)),
        (f"teacher: log-prob head, [{chunk}, vocab] fp32 tensors", 3 * chunk * teacher.vocab * 4)], "update")]


def estimate(cfg, shape: Shape, world: int, device_type: str = "cuda") -> tuple[list, list]:
    """(resident rows, phases) of one rank for this Config on `world` ranks of `device_type`
    ("cpu": the fp32 DDP path the tests measure). Phase totals exclude the resident rows."""
    t = target_for(cfg, world, device_type)
    rollout, held_out = call_rows(cfg, world)
    phases = generation_phases(cfg, shape, t, label="rollout", seqs=rollout,
                               sampling=(cfg.temperature, cfg.top_p, cfg.top_k), chunks=cfg.max_chunks)
    if cfg.eval_every:
        phases += generation_phases(cfg, shape, t, label="eval", seqs=held_out,
                                    sampling=(cfg.eval_temperature, cfg.eval_top_p, cfg.top_k),
                                    chunks=cfg.eval_max_chunks or cfg.max_chunks)
    if t.mode == "fsdp":  # every rank loads the whole fp32 model before fully_shard splits it
        phases.append(Phase("load: the whole model, fp32, before sharding", [("policy weights, fp32, unsharded",
                                                                              shape.params * 4)], "load"))
    phases += update_phases(cfg, shape, t) + (teacher_phases(cfg, t) if cfg.teacher else [])
    if t.engine == "vllm":  # taken when vLLM starts, after the model loads, and held all run
        share = vllm_rows(cfg, shape, t, max(rollout, held_out))
        phases = [ph if ph.group == "load" else Phase(ph.name, ph.rows + share, ph.group) for ph in phases]
    if t.engine == "fast":  # one engine serves rollouts and evals: the larger call sizes it (rollout.reserve)
        slab, kept = engine_rows(cfg, shape, t, max(rollout, held_out), (cfg.temperature, cfg.top_p, cfg.top_k))
        generating = ("rollout", "eval") if cfg.engine_release else ("rollout", "eval", "update")
        # from the first rollout on (loading comes before it); the slab in updates unless given back
        phases = [ph if ph.group == "load" else
                  Phase(ph.name, ph.rows + (slab if ph.group in generating else []) + kept, ph.group) for ph in phases]
        if t.mode == "fsdp":  # the moment the gathered weights are copied into the engine's copy (before a
            # given-back slab is taken again)
            phases.append(Phase("rollout: gathered weights copied into the engine's copy",
                                gathered_rows(cfg, shape, t) + kept + ([] if cfg.engine_release else slab), "rollout"))
    return resident_rows(cfg, shape, t), phases


def peak(resident: list, phases: list) -> tuple[float, Phase]:
    """(bytes, phase) of the largest phase total, resident state included."""
    top = max(phases, key=lambda ph: ph.total)
    return sum(n for _, n in resident) + top.total, top


# ============================================================================ printing

def _dtype(nbytes: int) -> str:
    return {2: "bf16", 4: "fp32"}[nbytes]


def plan_world(cfg) -> int:
    """Ranks the plan assumes: --world-size, else this launch's WORLD_SIZE, else 1."""
    world = cfg.world_size or int(os.environ.get("WORLD_SIZE", "1"))
    if cfg.prompts_per_step % world:
        raise DataError(f"prompts_per_step={cfg.prompts_per_step} must be divisible by the {world} ranks")
    return world


def format_plan(resident: list, phases: list) -> list[str]:
    """The table, GiB per GPU: resident rows once, then each phase's own rows and its total."""
    width = max(len(what) for _, rows in [(None, resident)] + [(None, ph.rows) for ph in phases]
                for what, _ in rows) + 4
    base = sum(n for _, n in resident)
    lines = ["resident in every phase:"] + [f"  {what:<{width}}{n / GiB:8.2f}" for what, n in resident]
    lines.append(f"  {'total':<{width}}{base / GiB:8.2f}")
    for ph in phases:
        lines.append(f"{ph.name}: resident +")
        lines += [f"  {what:<{width}}{n / GiB:8.2f}" for what, n in ph.rows if n]
        lines.append(f"  {'total':<{width}}{(base + ph.total) / GiB:8.2f}")
    return lines


def tensor_budget(cfg) -> float:
    """Bytes of live tensors a GPU of cfg.gpu_memory GiB can hold: less the CUDA reserve, less
    the allocator's slack. 80 GiB -> (80 − 1.5) / 1.1 = 71.4 GiB."""
    return (cfg.gpu_memory * GiB - CUDA_RESERVE) / (1 + ALLOCATOR_SLACK)


def print_plan(cfg) -> int:
    """Print the per-GPU memory plan of cfg on cfg.world_size GPUs; return 0 if its peak fits
    cfg.gpu_memory, else 1 after printing what to change."""
    world = plan_world(cfg)
    shape, source = find_shape(cfg.model, cfg.trust_remote_code)
    t = target_for(cfg, world, "cuda")
    resident, phases = estimate(cfg, shape, world, "cuda")
    top, where = peak(resident, phases)
    budget = tensor_budget(cfg)
    print(f"memory plan for {cfg.model}: {shape.params / 1e9:.2f}B parameters ({shape.layers} layers of "
          f"{shape.layer_params / 1e6:.1f}M), shape from {source}")
    turns = f", turns prompted with up to {prompt_tokens(cfg)} tokens (--env)" if cfg.env else ""
    print(f"{t.mode} on {world} GPU(s), {_dtype(t.bytes)} compute, {cfg.plan_prompt_tokens}-token prompts "
          f"(plan_prompt_tokens){turns}; GiB of tensors per GPU")
    print("\n".join(format_plan(resident, phases)))
    fits = top <= budget
    need = top * (1 + ALLOCATOR_SLACK) + CUDA_RESERVE
    print(f"peak {top / GiB:.2f} GiB ({where.name}); with {ALLOCATOR_SLACK:.0%} allocator slack and "
          f"{CUDA_RESERVE / GiB:.1f} GiB CUDA reserve {need / GiB:.2f} GiB {'≤' if fits else '>'} gpu_memory "
          f"{cfg.gpu_memory:g} GiB: {'fits' if fits else 'does not fit'}")
    alloc = os.environ.get("PYTORCH_ALLOC_CONF", os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True"))
    if "expandable_segments:True" not in alloc:
        print("(the slack assumes PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, train.py's default; "
              "without it rollouts measured up to 46% over their tensors)")
    if not fits:
        print("to fit, change (any one option of a line fixes the phases it names):")
        for line in suggestions(cfg, shape, world, budget):
            print("  " + line)
    return 0 if fits else 1


# ============================================================================ what to change

def _fits(cfg, shape: Shape, world: int, budget: float, group: str = "all") -> bool:
    """Whether every phase of `group` (or of all groups) fits the budget on `world` GPUs."""
    resident, phases = estimate(cfg, shape, world, "cuda")
    base = sum(n for _, n in resident)
    return all(base + ph.total <= budget for ph in phases if group in ("all", ph.group))


def _largest(ok, lo: int, hi: int) -> int | None:
    """The largest n in [lo, hi] with ok(n), for an ok that holds up to some n and not above;
    None if ok(lo) fails. ok = (n ≤ 300), [1, 1000] -> 300."""
    if lo > hi or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _knobs(cfg, world: int, vocab: int) -> dict:
    """Per group of phases, the fields that shrink it: (field, lowest and highest count of
    units to try, unit); rollout_batch_size counts whole groups (unit G)."""
    g, n = cfg.group_size, cfg.eval_samples
    rows, length, _ = micro_batch(cfg, target_for(cfg, world, "cuda"))
    per_call = call_rows(cfg, world)[0] // g  # groups of a generate call, as rollout.generate cuts them
    prefill = ("prefill_chunk", 1, (cfg.prefill_chunk or prompt_tokens(cfg) + cfg.max_new_tokens) - 1, 1)
    knobs = {
        "rollout": [("rollout_batch_size", 1, per_call - 1, g), prefill],  # whole groups per generate call
        "eval": [("eval_batch_size", 1, max(1, cfg.eval_batch_size // n) - 1, n), prefill],
        "update": [("max_tokens_per_micro_batch", length, rows * length - 1, 1),
                   ("micro_batch_size", cfg.group_size if _whole_groups(cfg) else 1, rows - 1, 1),
                   ("logprob_chunk", 1, logprob_chunk(cfg.logprob_chunk, vocab) - 1, 1)],
    }
    if cfg.engine == "vllm":  # a share below a KV cache for every row of a call: vLLM queues the rest
        for group in knobs.values():
            group.append(("vllm_memory", 1, 99, 0.01))
    return knobs



def suggestions(cfg, shape: Shape, world: int, budget: float) -> list[str]:
    """Concrete changes, one line per group of phases over budget, each option on its own
    enough for that group (the largest value that fits), then all first options together."""
    lines, together = [], {}
    for group, knobs in _knobs(cfg, world, shape.vocab).items():
        if _fits(cfg, shape, world, budget, group):
            continue
        options = {}
        if group == "update" and sampler_name(cfg) == "fast" and not cfg.engine_release:
            if _fits(dataclasses.replace(cfg, engine_release=True), shape, world, budget, group):
                options["engine_release"] = True  # the update without the slab beside it
        if group == "update" and not cfg.gradient_checkpointing:
            if _fits(dataclasses.replace(cfg, gradient_checkpointing=True), shape, world, budget, group):
                options["gradient_checkpointing"] = True
        for name, lo, hi, unit in knobs:
            n = _largest(lambda k: _fits(dataclasses.replace(cfg, **{name: round(k * unit, 2)}), shape, world, budget,
                                         group), lo, hi)
            if n is not None:
                options[name] = round(n * unit, 2)
        text = " or ".join(f"{k} true" if v is True else f"{k} ≤ {v}" for k, v in options.items())
        lines.append(f"{group}: {text or 'no single setting is enough'}")
        together.update(list(options.items())[:1])
    if together:
        new = dataclasses.replace(cfg, **together)
        top, _ = peak(*estimate(new, shape, world, "cuda"))
        settings = ", ".join(f"{k} {str(v).lower()}" for k, v in together.items())
        lines.append(f"together: {settings} -> peak {top / GiB:.1f} GiB"
                     f"{'' if top <= budget else ' (still over)'}")
    return lines + _global_suggestions(cfg, shape, world, budget)


def _global_suggestions(cfg, shape: Shape, world: int, budget: float) -> list[str]:
    """Changes that shrink every phase: FSDP instead of DDP; more ranks (sharded state, fewer
    prompts per rank)."""
    out = []
    if cfg.parallel == "ddp" and _fits(dataclasses.replace(cfg, parallel="fsdp"), shape, world, budget):
        out.append("parallel fsdp (shards weights, gradients and AdamW moments over the ranks)")
    more = next((w for w in range(world + 1, 257) if cfg.prompts_per_step % w == 0
                 and _fits(cfg, shape, w, budget)), None)
    out.append(f"more ranks: {more} fit as is" if more else
               "more ranks alone are not enough (tried every count up to 256 that divides prompts_per_step)")
    return out
