"""The memory plan (extras/plan.py) against the measured peak of tensor memory, on CPU or on one GPU.

    python bench/plan_check.py            # two small random models on CPU (fp32), ~15 s
    python bench/plan_check.py --gpu      # the same through FSDP + bf16 on one CUDA GPU (world 1)

Each model runs the project's own code path once per phase: a rollout (rollout.generate on
model.load_model's model, under parallel.full_weights, prompts of ragged length) and one update
(train.update on that rollout's episodes, in several micro-batches, so that a later one starts
with every gradient allocated). AdamW's moments are created first, by a zero-gradient step, so
that both phases see the steady state the plan describes. Variants: gradient checkpointing on
and off, and Markovian chunks with a reference model.

Measuring on CPU: a TorchDispatchMode sees every tensor an op returns, forward and backward,
and adds its storage's bytes until the storage is freed (a weakref finalizer); the tensors that
exist before (weights, AdamW moments) are added by hand. The peak of that sum is what
torch.cuda.max_memory_allocated measures on a GPU, without the allocator's rounding. On a GPU
the script reads torch.cuda.max_memory_allocated instead.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import tempfile
import weakref
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "assets")]

import algos  # noqa: E402
from config import Config, rollout_shapes, sampler_class  # noqa: E402
from engine import Engine  # noqa: E402
from extras.lora import AdaptersOff, add_lora  # noqa: E402
from model import ResponseLogProbs, load_model, load_tokenizer  # noqa: E402
from parallel import autocast_context, compute_dtype, full_weights, parallel_mode, weights_dtype, wrap  # noqa: E402
from extras.plan import estimate, shape_from_config  # noqa: E402
from rewards import Problem  # noqa: E402
from rollout import Sampling, generate  # noqa: E402

MiB = 2 ** 20

# Two architectures of different shapes: Qwen2 with grouped-query attention, biases and an untied
# head; Qwen3 with q/k norms, a head_dim that is not hidden / heads and a tied head.
MODELS = {
    "qwen2": dict(model_type="qwen2", vocab_size=4096, hidden_size=192, intermediate_size=512,
                  num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2, tie_word_embeddings=False),
    "qwen3": dict(model_type="qwen3", vocab_size=3072, hidden_size=128, intermediate_size=384,
                  num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=48,
                  tie_word_embeddings=True),
}
# Sizes chosen so that weights + AdamW, the KV cache, the activations and the log-prob head are
# each a visible share of a peak, and each model runs in a few seconds on 2 CPU cores. G = 8 <
# micro-batch 16: a micro-batch holds prompts of two lengths, so rows are padded as in a real run.
RUN = dict(prompts_per_step=4, group_size=8, micro_batch_size=16, plan_prompt_tokens=24, max_new_tokens=104,
           logprob_chunk=512, lr=1e-6, weight_decay=0.0, eval_every=0)
# On a GPU: two real shapes (random weights): Qwen2.5-0.5B as shipped, and a Qwen3 of 0.6B size.
GPU_MODELS = {
    "Qwen2.5-0.5B": json.loads((ROOT / "assets/shapes/Qwen2.5-0.5B/config.json").read_text()),
    "qwen3-0.6b": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                       num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                       tie_word_embeddings=True),
}
# Checkpointing on and off; the engine (--engine fast: its slab is resident); Markovian chunks (C = max_new_tokens / 2, m = C / 2, h = m / 4, I = 3)
# with a reference model (beta > 0), which adds the prefix cache and the frozen model's rows; LoRA
# adapters with the base as the reference (a frozen base, gradients and AdamW for the adapters only).
VARIANTS = [("checkpointing", dict(gradient_checkpointing=True)), ("no checkpointing", dict()),
            ("markovian + reference", dict(gradient_checkpointing=True, beta=0.04, max_chunks=3)),
            ("engine", dict(gradient_checkpointing=True, engine="fast")),
            ("lora + reference", dict(gradient_checkpointing=True, lora_rank=16, beta=0.04))]
GPU_RUN = dict(prompts_per_step=8, group_size=8, micro_batch_size=8, plan_prompt_tokens=256, max_new_tokens=512,
               logprob_chunk=512, lr=1e-6, weight_decay=0.0, eval_every=0)


def build_model(path: Path, arch: dict, seed: int = 0, device: str = "cpu") -> str:
    """A random-initialised HF model with the shipped character tokenizer, saved to path."""
    from build_tiny_model import build_tokenizer
    from transformers import AutoConfig, AutoModelForCausalLM
    build_tokenizer().save_pretrained(path)
    torch.manual_seed(seed)
    arch = {k: v for k, v in arch.items() if k not in ("architectures", "torch_dtype", "transformers_version")}
    config = AutoConfig.for_model(**{"max_position_embeddings": 512, **arch, "pad_token_id": 0, "eos_token_id": 1,
                                     "bos_token_id": None})
    with torch.device(device):
        AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


class LiveTensors(TorchDispatchMode):
    """Bytes of every live storage made by an op under this mode, plus those add()-ed: now and peak."""

    def __init__(self, tensors=()):
        super().__init__()
        self.live, self.now, self.peak = {}, 0, 0
        for t in tensors:
            self.add(t)

    def add(self, t) -> None:
        if isinstance(t, DTensor):  # FSDP's sharded parameters: count the local shard
            t = t.to_local()
        if not isinstance(t, torch.Tensor) or t.device.type == "meta":
            return
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in self.live or not storage.nbytes():
            return  # a view of a storage already counted
        self.live[key] = storage.nbytes()
        self.now += storage.nbytes()
        self.peak = max(self.peak, self.now)
        weakref.finalize(storage, self._free, key)

    def _free(self, key) -> None:
        self.now -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            self.add(t)
        return out


class Peak:
    """Peak tensor bytes of a block: the dispatch-mode count on CPU; on CUDA the allocator's,
    less `offset` (tensors of an earlier run still allocated), and its reserved peak too."""

    def __init__(self, device, existing, offset: int = 0):
        self.device, self.existing, self.offset, self.reserved = device, existing, offset, 0

    def __enter__(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the reserved peak then shows this block's fragmentation
            torch.cuda.reset_peak_memory_stats()
            self.mode = None
        else:
            self.mode = LiveTensors(self.existing()).__enter__()
        return self

    def __exit__(self, *exc):
        if self.mode is not None:
            self.mode.__exit__(*exc)
            self.bytes = self.mode.peak
        else:
            torch.cuda.synchronize()
            self.bytes = torch.cuda.max_memory_allocated() - self.offset
            self.reserved = torch.cuda.max_memory_reserved() - self.offset


def setup(model_dir: str, cfg: Config, device) -> dict:
    """What train.main builds, for one rank: policy, scorer, AdamW with its moments created,
    and the reference model when beta > 0; `existing` lists the tensors alive before a phase."""
    dtype, mode = compute_dtype(cfg, device), parallel_mode(cfg, device)
    lm = load_model(model_dir, device=device, gradient_checkpointing=cfg.gradient_checkpointing)
    adapters = None
    if cfg.lora_rank:
        adapters = add_lora(lm, rank=cfg.lora_rank, alpha=cfg.lora_alpha, targets=cfg.lora_targets, base=model_dir,
                            dtype=weights_dtype(cfg, device), seed=cfg.seed)
    scorer = wrap(ResponseLogProbs(lm, cfg.logprob_chunk), mode=mode, world=1, device=device, dtype=dtype)
    trained = [p for p in lm.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=cfg.lr, weight_decay=cfg.weight_decay)
    for p in trained:  # a zero-gradient step creates the moments without moving weights
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    ref, frozen = None, []
    if cfg.beta > 0 and adapters is not None:  # LoRA: the base, adapters off (no frozen copy)
        ref = AdaptersOff(scorer, adapters)
    elif cfg.beta > 0:
        ref_lm = load_model(model_dir, dtype=dtype, device=device, trainable=False)
        ref = wrap(ResponseLogProbs(ref_lm, cfg.logprob_chunk), mode=mode, world=1, device=device, dtype=dtype,
                   trainable=False)
        frozen = [*ref_lm.parameters(), *ref_lm.buffers()]

    def existing():
        moments = [v for state in optimizer.state.values() for v in state.values()]
        kept = Engine.of(lm).buffers() if cfg.engine == "fast" else []  # the slab, once made
        return [*lm.parameters(), *lm.buffers(), *moments, *frozen, *kept]
    return dict(lm=lm, scorer=scorer, optimizer=optimizer, ref=ref, existing=existing)


def measure(model_dir: str, cfg: Config, device) -> dict:
    """Measured peak bytes of one rollout and one update of cfg in this process (world 1)."""
    from train import Learner, update
    gc.collect()  # an earlier run's modules may hold tensors in reference cycles
    offset = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    torch.manual_seed(0)
    tok, run = load_tokenizer(model_dir), setup(model_dir, cfg, device)
    autocast, rng, n = autocast_context(cfg, device), random.Random(0), cfg.prompts_per_step
    prompts = [[rng.randint(4, 99) for _ in range(cfg.plan_prompt_tokens - i % 3)] for i in range(n)]
    sampling = Sampling(cfg.temperature, cfg.top_p, cfg.top_k, cfg.max_new_tokens, cfg.prefill_chunk,
                        sampler=sampler_class(cfg).start(cfg, run["lm"], 1))
    with Peak(device, run["existing"], offset) as rollout, full_weights(run["scorer"]), autocast():
        episodes = generate(run["lm"], tok, [Problem("p", "0")] * n, prompts, group_size=cfg.group_size,
                            sampling=sampling, shape=rollout_shapes(cfg, tok)[0], batch_size=cfg.rollout_batch_size)
    for i, e in enumerate(episodes):  # half right, half wrong: every group has an advantage
        e.reward = e.score = float(i % 2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(run["optimizer"], lambda s: 1.0)
    with Peak(device, run["existing"], offset) as step:
        update(Learner(scorer=run["scorer"], lm=run["lm"], ref_scorer=run["ref"], optimizer=run["optimizer"],
                       scheduler=scheduler, algo=algos.get(cfg.algo), cfg=cfg, autocast=autocast,
                       pad_id=tok.pad_token_id, rank=0, world=1, device=device), episodes)
    if device.type == "cuda":
        print(f"  allocator reserved at peak: rollout {rollout.reserved / MiB:.0f} MiB, update "
              f"{step.reserved / MiB:.0f} MiB; before the run {offset / MiB:.0f} MiB still allocated")
    return {"rollout": rollout.bytes, "update": step.bytes}


def planned(model_dir: str, cfg: Config, device_type: str) -> tuple[float, list]:
    """(resident bytes, phases) of the plan for cfg on one rank of device_type."""
    from transformers import AutoConfig
    shape = shape_from_config(AutoConfig.from_pretrained(model_dir), Path(model_dir).name)
    resident, phases = estimate(cfg, shape, 1, device_type)
    return sum(n for _, n in resident), phases


def compare(model_dir: str, cfg: Config, device) -> tuple[dict, float]:
    """({"rollout" | "update": (estimated peak, measured peak)}, the estimated resident bytes
    both peaks include), in bytes."""
    base, phases = planned(model_dir, cfg, device.type)
    got = measure(model_dir, cfg, device)
    return {k: (base + max(ph.total for ph in phases if ph.group == k), got[k]) for k in got}, base


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--gpu", action="store_true", help="FSDP + bf16 on cuda:0 (world 1)")
    ap.add_argument("--phases", action="store_true", help="also print every estimated phase")
    ap.add_argument("--models", default="", help="comma-separated names to run (default: all)")
    args = ap.parse_args()
    device = torch.device("cuda" if args.gpu else "cpu")
    models, run = (GPU_MODELS, GPU_RUN) if args.gpu else (MODELS, RUN)
    models = {k: v for k, v in models.items() if not args.models or k in args.models.split(",")}
    if args.gpu:
        import torch.distributed as dist
        dist.init_process_group("nccl", store=dist.HashStore(), rank=0, world_size=1)
    else:
        torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        for name, arch in models.items():
            path = build_model(Path(tmp) / name, arch, device=device.type)
            for label, over in VARIANTS:
                chunk_head = run["max_new_tokens"] // 8  # h = m / 4 when m = C / 2
                cfg = Config(algo="grpo", **{**run, **over}, chunk_head=chunk_head,
                             parallel="fsdp" if args.gpu else "ddp", precision="auto")
                peaks, base = compare(path, cfg, device)
                for phase, (est, got) in peaks.items():
                    print(f"{name:12s} {label:22s} {phase:8s} estimate {est / MiB:9.1f} MiB  measured "
                          f"{got / MiB:9.1f} MiB  error {(est - got) / got:+6.1%}  (above the resident "
                          f"{base / MiB:.1f} MiB: {(est - got) / (got - base):+6.1%})", flush=True)
                if args.phases:
                    print_phases(path, cfg, device.type)
                if args.gpu:
                    free, total = torch.cuda.mem_get_info()
                    print(f"  outside PyTorch (CUDA context, NCCL): "
                          f"{(total - free - torch.cuda.memory_reserved()) / MiB:.0f} MiB")


def print_phases(model_dir: str, cfg: Config, device_type: str) -> None:
    """Every estimated phase, total and rows, in MiB."""
    base, phases = planned(model_dir, cfg, device_type)
    print(f"  {base / MiB:9.1f}  resident")
    for ph in phases:
        print(f"  {(base + ph.total) / MiB:9.1f}  {ph.name}")
        for what, n in ph.rows:
            print(f"    {n / MiB:9.1f}  {what}")


if __name__ == "__main__":
    main()
