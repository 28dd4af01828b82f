"""Distributed set-up and data parallelism: DDP, or FSDP2 with sharded fp32 master weights.

torchrun sets RANK and WORLD_SIZE (global, over every node) and LOCAL_RANK (the GPU on this
node); a plain `python train.py` is one process. `--parallel fsdp` uses FSDP2 (`fully_shard`,
in torch itself):
  - every decoder layer is one shard group, and the scorer (model.ResponseLogProbs: embeddings,
    final norm, LM head) is the root group; each rank keeps 1/world of every fp32 weight,
    gradient and AdamW moment;
  - with a bf16 compute dtype, forward and backward all-gather bf16 copies of one layer at a time
    and reduce-scatter fp32 gradients (MixedPrecisionPolicy);
  - a rollout gathers all weights once (`full_weights`), not once per generated token, so
    generate runs a bf16 model with a bf16 KV cache.
Gradients of the ranks are summed, never averaged: every loss is already its share of the global
mini-batch (docs/math.md §0). DDP adds them in rank order (`sum_in_rank_order`), FSDP2 reduce-scatters
with a divide factor of 1; neither multiplies a loss by the world size to undo an average.
Checkpoints: the HF weights are all-gathered one tensor at a time and only global rank 0 keeps a
CPU copy (one full copy in the saved dtype, never two); the fp32 weights and AdamW state go to
torch.distributed.checkpoint as they are sharded (every rank writes its part), so a run saved on
N ranks resumes on M.
Several nodes are the same program: ranks are global, devices node-local, and only global rank 0
writes single files (the run directory must be on a filesystem every node sees).
"""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager, nullcontext
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

# DCP says so every time a run without a process group (one process) saves or loads: we mean it.
warnings.filterwarnings("ignore", message="torch.distributed is (disabled, )?unavailable or uninitialized")


def compute_dtype(cfg, device) -> torch.dtype:
    """bf16 when asked, or on CUDA by default; fp32 otherwise (the CPU default)."""
    bf16 = cfg.precision == "bf16" or (cfg.precision == "auto" and device.type == "cuda")
    return torch.bfloat16 if bf16 else torch.float32


def weights_dtype(cfg, device) -> torch.dtype:
    """The dtype a model's weights are held in when nothing trains them (a reference model, eval.py):
    the one the policy's forward sees, so their log-probs match — bf16 under FSDP's mixed precision,
    fp32 under DDP (autocast casts only matmul inputs; norms, embeddings and rotary stay fp32)."""
    return compute_dtype(cfg, device) if parallel_mode(cfg, device) == "fsdp" else torch.float32


def autocast_context(cfg, device):
    """A factory of the context the forwards run in: bf16 autocast, or nothing (fp32)."""
    if compute_dtype(cfg, device) == torch.bfloat16:
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    return nullcontext


def peak_memory(device, phase: str) -> dict:
    """{"memory/<phase>_peak_gib": the most GPU memory this rank allocated since the last call};
    {} on CPU, which has no such counter."""
    if device.type != "cuda":
        return {}
    peak = torch.cuda.max_memory_allocated(device) / 2**30
    torch.cuda.reset_peak_memory_stats(device)
    return {f"memory/{phase}_peak_gib": peak}


def parallel_mode(cfg, device) -> str:
    """auto: FSDP on CUDA (sharded state, bf16 compute: the path for real models), DDP on CPU."""
    if cfg.parallel != "auto":
        return cfg.parallel
    return "fsdp" if device.type == "cuda" else "ddp"


# A process group that was initialised before train.main or eval.main ran (a notebook, a test
# harness running several runs in one launch) is used as it is and outlives the run.
_OWNED = []
_CLOSERS = []  # what teardown closes after the last collective (at_teardown)


def setup_distributed(cfg):
    """(global rank, world size, this process's device), with the process group initialised
    whenever there is more than one rank or FSDP is asked for (FSDP needs one, even of size 1)."""
    # Generation grows the KV cache a token at a time: without expandable segments, CUDA's caching
    # allocator reserved up to 46% more than the live tensors in a rollout (H100), against 4-8%.
    if "PYTORCH_ALLOC_CONF" not in os.environ:  # (torch ≥ 2.9's name; the CUDA one still works)
        os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if "RANK" not in os.environ:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if parallel_mode(cfg, device) == "fsdp" and not dist.is_initialized():
            init_group(cfg, store=dist.HashStore(), rank=0, world_size=1)
        return 0, 1, device
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
        # CPU ranks share the node's cores: oversubscribed threads make every rank slower.
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    if not dist.is_initialized():
        init_group(cfg)
    return dist.get_rank(), dist.get_world_size(), device


def init_group(cfg, **store) -> None:
    """The default process group (nccl on CUDA, else gloo), this run's: teardown destroys it."""
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                            timeout=timedelta(minutes=cfg.dist_timeout), **store)
    _OWNED.append(dist.group.WORLD)


def at_teardown(close) -> None:
    """Have teardown call close() after the run's last collective, before the group goes."""
    _CLOSERS.append(close)


def teardown() -> None:
    if dist.is_initialized():
        dist.barrier()  # no rank tears the group down while another still uses it
    while _CLOSERS:  # after the last collective: vLLM's shutdown destroys the default group
        _CLOSERS.pop()()
    if dist.is_initialized() and _OWNED:
        _OWNED.clear()
        dist.destroy_process_group()


def decoder_layers(lm) -> list:
    """The model's repeated blocks, by the class names HF marks as never to be split across
    devices (Qwen2DecoderLayer, LlamaDecoderLayer, ...): FSDP's natural shard groups."""
    names = set(getattr(lm, "_no_split_modules", None) or ())
    layers = [m for m in lm.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(f"{type(lm).__name__}: no decoder layers found to shard (the model's "
                         f"_no_split_modules is {sorted(names)}); use --parallel ddp")
    return layers


def wrap(scorer, *, mode: str, world: int, device, dtype: torch.dtype, trainable: bool = True):
    """The module that train.update calls: the scorer itself (one process; or a frozen
    reference under DDP), DDP around it, or the scorer sharded with FSDP2."""
    if mode == "fsdp":
        policy = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
        for layer in decoder_layers(scorer.lm):
            fully_shard(layer, mp_policy=policy)
        fully_shard(scorer, mp_policy=policy)
        for shard in (m for m in scorer.modules() if isinstance(m, FSDPModule)):  # the setters do not recurse
            # ranks' gradients add, as DDP's do (sum_in_rank_order); force_sum: factor 1 as a plain SUM
            # (a divide factor is otherwise a PREMUL_SUM, which gloo lacks)
            shard.set_gradient_divide_factor(1.0)
            shard.set_force_sum_reduction_for_comms(True)
        # FSDP takes the first module to run forward as its root. Rollouts enter the layers
        # directly (lm.generate), so the scorer claims the root role now, with one tiny forward.
        ids = torch.zeros((1, 2), dtype=torch.long, device=device)
        with torch.no_grad():
            scorer(ids, torch.ones_like(ids), torch.arange(2, device=device)[None], torch.ones((1, 1), device=device), 1.0)
        scorer.reshard()  # the root keeps its weights gathered after a forward; the optimizer needs the shards
        if not trainable:  # ... and they would stay gathered for good: a frozen model runs no backward
            scorer.set_reshard_after_forward(True, recurse=False)
        return scorer
    if trainable and world > 1:
        ddp = DistributedDataParallel(scorer, device_ids=[device.index] if device.type == "cuda" else None)
        ddp.register_comm_hook(None, sum_in_rank_order)
        return ddp
    return scorer


def sum_in_rank_order(group, bucket):
    """DDP's communication hook: a bucket's gradients of all ranks added in rank order, g_0 + g_1 + g_2 + ...

    A sum, not DDP's average, because each loss is already its share of the global mini-batch
    (docs/math.md §0). Gathered and added here rather than all-reduced because an all-reduce adds in an
    order that depends on how it splits the buffer (gloo's ring: by position in it), so a tensor reduced
    alone and the same tensor inside a bucket differ in the last bit on 3 or more ranks; added element by
    element in rank order, the result is the same bits whatever the layout (tutorial/grpo.py adds alike).
    The price: each rank receives world − 1 buckets, against an all-reduce's 2 (world − 1) / world."""
    flat = bucket.buffer()
    parts = [torch.empty_like(flat) for _ in range(dist.get_world_size(group))]
    gathered = dist.all_gather(parts, flat, group=group, async_op=True).get_future()

    def add(_):
        total = parts[0]
        for part in parts[1:]:
            total += part
        return total

    return gathered.then(add)


def grad_sync(module, sync: bool):
    """DDP all-reduces gradients only on a mini-batch's last micro-batch. FSDP2 reduce-scatters
    after every micro-batch: skipping it would keep every layer's full gradient on every rank."""
    if isinstance(module, DistributedDataParallel) and not sync:
        return module.no_sync()
    return nullcontext()


@contextmanager
def full_weights(module):
    """Under FSDP: every weight gathered (in the compute dtype) for the whole block, so that the
    many forwards of a rollout all-gather once; resharded after. Otherwise nothing to do."""
    shards = [m for m in module.modules() if isinstance(m, FSDPModule)]
    for m in shards:
        m.unshard()
        if m is not module:  # the root's own forward is not called by generate
            m.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for m in shards:
            if m is not module:
                m.set_reshard_after_forward(True, recurse=False)
            m.reshard()


def clip_grad_norm(params, max_norm: float) -> float:
    """Clip the global gradient norm (over all ranks' shards under FSDP); return it before clipping."""
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(norm.full_tensor() if isinstance(norm, DTensor) else norm)


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a (possibly FSDP-sharded) one; a collective for a DTensor: every rank calls."""
    return t.full_tensor() if isinstance(t, DTensor) else t


def nonfinite(tensors, device) -> int:
    """How many of the tensors hold a NaN or an inf on any rank: each rank checks its own shards of
    FSDP's, and one all-reduce adds the counts (every rank calls)."""
    local = sum(bool((~torch.isfinite(t.to_local() if isinstance(t, DTensor) else t)).any()) for t in tensors)
    return int(all_reduce_sum({"nonfinite": local}, device)["nonfinite"])


def full_state_dict(lm, dtype: torch.dtype, lora_scale: float = 0.0) -> dict:
    """HF parameter name -> full CPU tensor in `dtype` on global rank 0 ({} on the others).
    Gathered one tensor at a time (hf_weights: every rank gathers each), so rank 0 never holds more
    than one full copy."""
    rank0 = not dist.is_initialized() or dist.get_rank() == 0
    weights = ((name, whole_of()) for name, whole_of in hf_weights(lm.state_dict(keep_vars=True), lora_scale))
    return {name: full.detach().to("cpu", dtype).contiguous() for name, full in weights if rank0}


def hf_weights(state: dict, lora_scale: float = 0.0) -> list:
    """[(HF name, a function that returns the full tensor)] of a state_dict(keep_vars=True), in its
    order; calling one gathers a sharded weight (every rank calls, in the same order). A tied weight
    (embeddings = LM head) comes once, under its first name, as save_pretrained keeps it. With LoRA
    layers (extras/lora.py), lora_scale = α/r: each adapted weight is merged on the side, W + scale·B@A
    in float64, under the base model's name (peft's <layer>.base_layer.weight -> <layer>.weight); the
    adapters themselves are left out and the live weights are not touched."""
    def merged(name: str, t: torch.Tensor):
        stem = name.removesuffix(".base_layer.weight")
        if not lora_scale or stem == name:
            return lambda: full_tensor(t)
        a, b = (state[f"{stem}.lora_{x}.default.weight"] for x in "AB")
        return lambda: full_tensor(t).double() + lora_scale * (full_tensor(b).double() @ full_tensor(a).double())

    out, seen = [], set()
    for name, t in state.items():
        if id(t) in seen or (lora_scale and ".lora_" in name):
            continue
        seen.add(id(t))
        out.append((name.replace(".base_layer.", "."), merged(name, t)))
    return out


# Only what trains goes into the train state: all of it in a full fine-tune; with LoRA the adapters,
# since a resume loads the frozen base from --model again.
TRAINED = StateDictOptions(ignore_frozen_params=True)


def save_train_state(path, lm, optimizer) -> None:
    """fp32 trained weights and AdamW state as they lie (sharded under FSDP), every rank writing its
    part: what --resume restores exactly, on this or any other number of ranks. An optimizer that has not
    stepped yet is left out: DCP would give it a zero-gradient step to have a state to save, and
    the run's first real step would then be bias-corrected as its second."""
    state = {"model": get_model_state_dict(lm, options=TRAINED)}
    if optimizer.state:
        state["optimizer"] = get_optimizer_state_dict(lm, optimizer)
    dcp.save(state, checkpoint_id=str(path))


def load_train_state(path, lm, optimizer) -> None:
    saved = dcp.FileSystemReader(str(path)).read_metadata().state_dict_metadata
    state = {"model": get_model_state_dict(lm, options=TRAINED)}
    if any(key.startswith("optimizer.") for key in saved):
        state["optimizer"] = get_optimizer_state_dict(lm, optimizer)
    dcp.load(state, checkpoint_id=str(path))  # reshards to this run's ranks; a trained tensor it lacks is an error
    # not strict: the frozen weights are not in it (they stay as loaded from --model)
    set_model_state_dict(lm, state["model"], options=StateDictOptions(ignore_frozen_params=True, strict=False))
    if "optimizer" in state:
        set_optimizer_state_dict(lm, optimizer, state["optimizer"])


def gather_objects(obj, world: int) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank."""
    if world == 1:
        return [obj]
    out = [None] * world
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(values: dict, device) -> dict:
    if not dist.is_initialized() or not values:
        return {k: float(v) for k, v in values.items()}
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))
