"""LoRA adapters through peft: one GPU is enough (`--lora-rank r`).

    python train.py --config configs/tiny_grpo_lora.yaml                  # the shipped model, CPU
    python train.py --config configs/qwen2.5-1.5b_gsm8k_grpo.yaml --lora-rank 32 --plan --world-size 1

Every targeted nn.Linear of the decoder layers computes W x + (α/r)·B A x (Hu et al. 2021); W is
frozen, only A [r, in] and B [out, r] train, and AdamW holds only their state. Default targets:
all linear layers of the decoder, as "LoRA Without Regret" (Schulman et al., Thinking Machines,
2025) and the peers (verl, EasyR1) do; never the LM head, whose weight model.ResponseLogProbs
reads directly. Dropout is 0: π_old and π_θ must be one function of the weights.

peft injects its LoRA layers into the HF model in place, so the one `lm` object serves HF
generate, the engine, the scorer, DDP and FSDP2 as before: rollouts see the adapted policy with
no merge, and the base weights are never written to. What else changes with LoRA:
  - the frozen base is held in the dtype the forward sees (bf16 under FSDP on a GPU): no fp32
    master copy, no gradient, no AdamW moments for it;
  - the reference policy (β > 0) is the base itself: the policy's scorer with the adapters
    disabled (`AdaptersOff`), never a second copy of the weights;
  - the learning rate is lr × lora_lr_scale (10 by default: the best LoRA learning rate is about
    10× the full fine-tune's in LoRA Without Regret, with α = 32 fixed and the 1/r scale; Tinker's
    get_lora_lr_over_full_finetune_lr returns that 10), so a recipe's full fine-tune lr carries over;
  - a checkpoint is an adapter folder (adapter_config.json + adapter_model.safetensors, for
    PeftModel.from_pretrained) and, at the end of a run or with lora_save_merged, holds merged/:
    the weights W + (α/r)·B A as a plain HF folder, computed into a new state dict
    (parallel.full_state_dict): the live weights are never merged and unmerged. checkpoint.lora_files
    writes it, and model.py reads it, as they do every checkpoint: the core knows the layout, this
    file only makes the adapters. The fp32 train
    state (DCP) holds the adapters and AdamW only; a resume loads the base from --model again.
"""
from __future__ import annotations

import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM

from parallel import decoder_layers


def linear_names(lm) -> tuple[list[str], set[str]]:
    """(leaf names of the nn.Linear layers inside the decoder layers, in order of first use; leaf
    names of those outside them). Qwen2 -> ([q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    down_proj], {lm_head})."""
    inside = {id(m) for layer in decoder_layers(lm) for m in layer.modules()}
    names, outside = [], set()
    for name, m in lm.named_modules():
        if isinstance(m, nn.Linear):
            leaf = name.rsplit(".", 1)[-1]
            if id(m) not in inside:
                outside.add(leaf)
            elif leaf not in names:
                names.append(leaf)
    return names, outside


def target_names(lm, targets: str) -> list[str]:
    """--lora-targets -> the leaf names peft matches, checked against the model (chosen)."""
    names, outside = linear_names(lm)
    return chosen(targets, [n for n in names if n not in outside], type(lm).__name__)


def chosen(targets: str, allowed: list[str], model: str) -> list[str]:
    """The names of --lora-targets, each one of `allowed` (the decoder's linear layers whose name
    names nothing outside the decoder layers: never the LM head); "" -> all of them. Anything else
    is a ValueError listing the choices."""
    given = [n.strip() for n in targets.split(",") if n.strip()]
    wrong = [n for n in given if n not in allowed]
    if not allowed:
        raise ValueError(f"--lora-rank: {model} has no nn.Linear layer in its decoder layers to adapt "
                         f"(LoRA here adapts nn.Linear only); train it without --lora-rank")
    if wrong:
        raise ValueError(f"--lora-targets {targets}: {', '.join(wrong)} is not a linear layer of {model}'s decoder "
                         f"layers; choose from {', '.join(allowed)} (default: all of them; never the LM head)")
    return given or allowed


def check_targets(config, targets: str) -> list[str]:
    """target_names on the model built from its config on the meta device: before any weight is read."""
    with torch.device("meta"):
        return target_names(AutoModelForCausalLM.from_config(config), targets)


def add_lora(lm, *, rank: int, alpha: float, targets: str, base: str, dtype: torch.dtype, seed: int):
    """Inject rank-`rank` LoRA layers into `lm` in place and freeze the rest; hold the frozen
    weights in `dtype`. Returns the PeftModel around lm (for disable_adapter and saving);
    everything else keeps using lm. A is drawn from `seed` alone (the same on every rank and on
    resume), B is 0, so the policy starts as the base."""
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=target_names(lm, targets),
                        task_type="CAUSAL_LM", base_model_name_or_path=str(Path(base).resolve()))
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(seed)
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*")  # peft asks HF's old name
        adapters = get_peft_model(lm, config)  # adapters in fp32 (peft's autocast_adapter_dtype)
    for p in lm.parameters():
        if not p.requires_grad:  # the base: no master copy to keep, so the dtype its forward runs in
            p.data = p.data.to(dtype)
    return adapters


class AdaptersOff:
    """The reference policy of a LoRA run: the policy's own scorer (DDP or FSDP as it is) called
    with peft's adapters disabled, so it computes the base model's log-probs from the same
    weights. Called like the scorer; train.update runs it without gradient."""

    def __init__(self, scorer, adapters):
        self.scorer, self.adapters = scorer, adapters

    def __call__(self, *args, **kwargs) -> dict:
        with self.adapters.disable_adapter():
            return self.scorer(*args, **kwargs)

