"""Policy / reference / tokenizer loading, token log-probs, entropy and vocab-mean, checkpoints, and the
forwards a rollout runs outside training (`inference`, `forward_columns`: both engines share them).

Log-probs (docs/math.md §0) are float32 and temperature-scaled: logp = z/τ[y] − logsumexp(z/τ). They are
computed only at completion positions, from the decoder's last hidden state, in chunks of
`chunk` tokens; each chunk is recomputed in backward (activation checkpointing) so that no
[N, T, V] tensor — neither logits nor a float32 log-softmax — ever exists, forward or backward.
"""
from __future__ import annotations

import copy
import importlib.util
import inspect
import json
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from torch.utils.checkpoint import checkpoint
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, DynamicCache, GenerationConfig



def check_model_folder(path: str, trust_remote_code: bool = False, flag: str = "--model"):
    """(tokenizer, HF config) of a local model folder, before any weight is read; every problem
    is a ValueError naming the flag, the folder and what it lacks (HF would say it tried the hub). A LoRA
    adapter folder (extras/lora.py) gives its base model's."""
    base = adapter_base(path)
    if base is not None:
        if not Path(base, "config.json").is_file():
            raise ValueError(f"{flag} {path}: its adapter_config.json names the base model {base!r}, which is not "
                             f"a model folder here; set base_model_name_or_path there to the base model's folder")
        return check_model_folder(base, trust_remote_code, flag)
    folder = Path(path)
    needs = "a local HF model folder (config.json, model.safetensors or its index, tokenizer files)"
    if not folder.is_dir():
        raise ValueError(f"{flag} {path}: no such folder; give {needs}")
    if not (folder / "config.json").is_file():
        raise ValueError(f"{flag} {path}: no config.json there; give {needs}")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        raise ValueError(f"{flag} {path}: no .safetensors weights there (.bin weights are not loaded: "
                         f"save the model again with save_pretrained)")
    for file in weights:  # a truncated copy fails here, not mid-load
        problem = unreadable(file)
        if problem:
            raise ValueError(f"{flag} {path}: {problem}; copy or save the model again")
    try:
        config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
        tokenizer = load_tokenizer(path, trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(f"{flag} {path}: cannot load its config or tokenizer ({first})") from None
    return tokenizer, config


def adapter_base(path: str) -> str | None:
    """The base model folder that a LoRA adapter folder (adapter_config.json, no config.json; see
    extras/lora.py) names; None for any other folder."""
    folder = Path(path)
    if (folder / "config.json").is_file() or not (folder / "adapter_config.json").is_file():
        return None
    require_peft(f"--model {path} (a LoRA adapter folder)")
    return json.loads((folder / "adapter_config.json").read_text()).get("base_model_name_or_path") or ""


def require_peft(flag: str) -> None:
    """Stop with the pip command when peft (LoRA, extras/lora.py) is not installed."""
    if importlib.util.find_spec("peft") is None:
        raise ValueError(f"{flag} needs peft, which is not installed here: pip install peft")


def merged(lm, path: str):
    """lm (a fresh copy of the base, not a training policy) with the adapter folder's weights merged in."""
    from peft import PeftModel
    return PeftModel.from_pretrained(lm, path).merge_and_unload()


def unreadable(file: Path) -> str:
    """What is wrong with a safetensors file's header and length ("" when nothing), without
    reading its tensors: "model.safetensors is truncated or corrupt (... incomplete metadata ...)"."""
    try:
        with safe_open(str(file), "pt"):
            return ""
    except Exception as e:  # noqa: BLE001 - SafetensorError names no file
        return f"{Path(file).name} is truncated or corrupt ({e})"


def check_context(tokenizer, config, problems: list, encode, new_tokens: int) -> None:
    """Every problem's prompt plus `new_tokens` must fit the model's context (max_position_embeddings).
    encode(problems) -> token id lists. A prompt is tokenized only when the UTF-8 length of its text and
    its turns' plus the template's tokens could exceed the limit: no tokenizer makes more tokens than bytes."""
    limit = getattr(config.get_text_config(), "max_position_embeddings", None)
    if not limit or not problems:
        return
    overhead = len(encode([replace(problems[0], prompt="", turns=())])[0])
    suspects = [i for i, p in enumerate(problems)
                if len("".join([p.prompt, *(t["content"] for t in p.turns)]).encode("utf-8", "replace"))
                + overhead + new_tokens > limit]
    lengths = dict(zip(suspects, map(len, encode([problems[i] for i in suspects]))))
    too_long = [i for i, n in lengths.items() if n + new_tokens > limit]
    if too_long:
        i = max(too_long, key=lengths.get)
        turns = " with its chat turns before it (--system-prompt's or the data row's)" if problems[i].turns else ""
        raise ValueError(f"{len(too_long)} prompt(s) do not fit the model's context of {limit} tokens with "
                         f"{new_tokens} new tokens: the longest, number {i + 1} ({problems[i].prompt[:60]!r}...), has "
                         f"{lengths[i]} tokens{turns}; lower max_new_tokens, shorten the turns, or drop such "
                         f"prompts from the data")


def load_tokenizer(path: str, trust_remote_code: bool = False):
    tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    if tok.eos_token_id is None:
        raise ValueError(f"{path}: the tokenizer has no eos_token; set one in tokenizer_config.json")
    if tok.pad_token_id is None:
        # Safe here: masks come from response lengths, never from pad == eos comparisons.
        tok.pad_token = tok.eos_token
    # Generation stops at the tokenizer's EOS and at every EOS id of the checkpoint's
    # generation_config (end-of-turn ids of chat checkpoints often differ from the tokenizer's).
    # Only the stop ids are taken from it: sampling knobs come from our Config alone.
    stops = [tok.eos_token_id]
    if (Path(path) / "generation_config.json").is_file():
        listed = GenerationConfig.from_pretrained(path).eos_token_id
        stops += [i for i in (listed if isinstance(listed, list) else [listed]) if i is not None and i not in stops]
    tok.stop_ids = stops
    return tok


def load_model(path: str, *, dtype: torch.dtype = torch.float32, device="cpu",
               trust_remote_code: bool = False, gradient_checkpointing: bool = False,
               trainable: bool = True):
    """A causal LM on `device`. Trainable: in train mode, so that HF's gradient checkpointing
    engages (it only does in train mode), with every dropout rate of its config set to 0, so
    that the π_old and π_θ forwards of the same weights are the same function. Frozen: eval
    mode, no gradients. A LoRA adapter folder (extras/lora.py): its base model with the adapters merged."""
    base = adapter_base(path)
    if base:
        lm = load_model(base, dtype=dtype, device=device, trust_remote_code=trust_remote_code,
                        gradient_checkpointing=gradient_checkpointing, trainable=trainable)
        return merged(lm, path).requires_grad_(trainable)  # peft froze the base it merged into
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    if trainable:  # every dropout rate a config names (dropout, attention_dropout, attn_pdrop, layerdrop, ...)
        for key, value in config.to_dict().items():
            if isinstance(value, float) and "drop" in key:
                setattr(config, key, 0.0)
    model = AutoModelForCausalLM.from_pretrained(
        path, config=config, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=True)
    model.to(device)
    # Sampling settings come only from our Config: a checkpoint's generation_config
    # (top_k=50, repetition_penalty, ...) would otherwise fill every knob we leave unset.
    model.generation_config = GenerationConfig()
    model.config.use_cache = True
    if gradient_checkpointing:  # the new name (transformers 5.24 has it); the old one goes in v6
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if not trainable:
        return model.eval().requires_grad_(False)
    return model.train()


# How a model type's CausalLM forward turns lm_head(h) into its logits, beyond Gemma-2-style
# soft-capping (any config with final_logit_softcapping): a factor from a config field, read off
# transformers 5.23's modeling files. (field, power): logits = lm_head(h) · field^power.
LOGIT_SCALES = {
    **dict.fromkeys(["granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "granite_swa",
                     "granitemoe_swa", "minicpm3"], ("logits_scaling", -1)),
    **dict.fromkeys(["cohere", "cohere2", "cohere2_moe"], ("logit_scale", 1)),
    "hyperclovax": ("logits_scaling", 1),
    "falcon_h1": ("lm_head_multiplier", 1),
    "muse_spark": ("output_multiplier", 1),
}


# ----------------------------------------------------------------------------- forwards outside training

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
class LogitTransform:
    """logits = softcap(scale · lm_head(h)): what the model's own forward returns (docs/math.md §0: the
    log-probs are those of the distribution that is sampled). Llama: scale 1, no soft-cap."""
    scale: float = 1.0
    softcap: float | None = None

    @classmethod
    def of(cls, config) -> "LogitTransform":
        text = config.get_text_config()
        field, power = LOGIT_SCALES.get(text.model_type, (None, 1))
        scale = float(getattr(text, field)) ** power if field else 1.0
        return cls(scale, getattr(text, "final_logit_softcapping", None) or None)

    def __call__(self, z: torch.Tensor) -> torch.Tensor:
        if self.scale != 1.0:
            z = z * self.scale
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z


def _chunk_stats(h, weight, bias, targets, temperature, transform, vocab_mean, entropy_grad):
    """h [c, H], targets [c] -> (logp, entropy, vocab-mean or an empty tensor), each [c] float32.

    Only logp always carries a gradient: entropy does when entropy_grad (an entropy bonus), the
    vocab-mean M = mean(z/τ) − logsumexp(z/τ) never does (ROVER uses it inside a stop-gradient
    target, docs/math.md §3)."""
    # float32 logits (docs/math.md §0) even under bf16 autocast: a bf16 logit of 20 is only good to 0.125,
    # far coarser than the log-ratios that PPO, ROVER and PACS take at small learning rates
    with torch.autocast(h.device.type, enabled=False):
        z = F.linear(h.float(), weight.float(), None if bias is None else bias.float())
    z = transform(z) / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets[:, None]).squeeze(-1) - lse
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    with torch.no_grad():
        mean = z.mean(-1) - lse if vocab_mean else z.new_empty(0)
    return logp, entropy, mean


LOGITS_CHUNK_BYTES = 32 * 2**20  # float32 logits of one log-prob chunk, when the chunk is chosen for you


def logprob_chunk(chunk: int, vocab: int) -> int:
    """Tokens per chunk of the log-prob computation: `chunk`, or for 0 as many as keep a chunk's
    float32 logits within 32 MiB, from 16 to 512 tokens: 55 at vocabulary 151,936 (Qwen), 256 at
    32,768, 512 below 16,385. A chunk's forward + backward peaks at about 1.4 × its logits, so at
    Qwen's vocabulary and 1,024 response tokens a micro-batch needs under 1/8 of a naive float32
    log-softmax."""
    return chunk or max(16, min(512, LOGITS_CHUNK_BYTES // (4 * vocab)))


class ResponseLogProbs(nn.Module):
    """Wraps a causal LM so that forward returns response-token log-probs and entropies.

    DDP wraps this module (not the LM) so that its forward — and so its gradient hooks — covers
    exactly the computation the loss uses. Input layout (rollout.collate):
    input_ids [N, P + Tr] = left-padded prompt ⧺ right-padded response; response_mask [N, Tr].
    Output: a dict of [N, Tr] float32 tensors, zero where response_mask is 0 — "logp" and
    "entropy", plus "vocab_mean" when asked. Index t belongs to the logits at position P − 1 + t,
    the ones that predict response token t (docs/math.md §0 alignment).
    """

    def __init__(self, lm, chunk: int = 0, pack: bool = False):
        super().__init__()
        self.lm, self.chunk, self.pack = lm, logprob_chunk(chunk, lm.get_output_embeddings().weight.shape[0]), pack
        self.transform = LogitTransform.of(lm.config)

    def forward(self, input_ids, attention_mask, position_ids, response_mask, temperature: float,
                vocab_mean: bool = False, entropy_grad: bool = False) -> dict:
        n, tr = response_mask.shape
        p = input_ids.shape[1] - tr
        # --pack: the same hidden states, from the real tokens laid end to end (packing.py)
        hidden = (importlib.import_module("packing").hidden(self.lm.get_decoder(), input_ids, attention_mask)
                  if self.pack else self.lm.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                                          position_ids=position_ids, use_cache=False).last_hidden_state)
        valid = response_mask.bool()
        h = hidden[:, p - 1:p - 1 + tr][valid]  # [n_valid, H], predicting positions only
        targets = input_ids[:, p:][valid]
        head = self.lm.get_output_embeddings()
        parts = []
        for s in range(0, h.shape[0], self.chunk):
            args = (h[s:s + self.chunk], head.weight, head.bias, targets[s:s + self.chunk],
                    temperature, self.transform, vocab_mean, entropy_grad)
            if torch.is_grad_enabled():
                parts.append(checkpoint(_chunk_stats, *args, use_reentrant=False))
            else:
                parts.append(_chunk_stats(*args))
        names = ("logp", "entropy", "vocab_mean") if vocab_mean else ("logp", "entropy")
        out = {}
        for i, name in enumerate(names):
            full = hidden.new_zeros(n, tr, dtype=torch.float32)
            out[name] = full.masked_scatter(valid, torch.cat([part[i] for part in parts])) if parts else full
        return out


class ModelError(Exception):
    """The model computes something this code does not reproduce; training would be wrong."""


def check_logprobs(lm, ids: list[int], temperature: float, tol: float = 1e-3) -> float:
    """The largest gap, in nats, between our log-probs of `ids` (every token after the first,
    teacher-forced) and log_softmax(model(ids).logits / τ), computed in the model's own dtype.
    A gap over `tol` raises ModelError naming the model type: its forward transforms the logits
    in a way LogitTransform does not know, so every ratio, entropy and ROVER's vocab-mean would
    describe a distribution other than the one sampled. fp32 gaps are ~1e-6; a Granite model
    (logits / 8) unknown to the table gave 0.33 on random weights."""
    x = torch.tensor([ids], device=next(lm.parameters()).device)
    ones = torch.ones_like(x)
    with torch.no_grad():
        ours = ResponseLogProbs(lm)(x, ones, ones.cumsum(1) - 1, ones[:, 1:].float(), temperature)["logp"]
        z = lm(input_ids=x, attention_mask=ones).logits[:, :-1].float() / temperature
        theirs = z.log_softmax(-1).gather(-1, x[:, 1:, None])[..., 0]
    gap = float((ours - theirs).abs().max())
    if not gap <= tol:  # also catches a NaN
        model_type = lm.config.get_text_config().model_type
        raise ModelError(f"model type {model_type!r}: our log-probs differ from the model's own "
                         f"(log_softmax of its logits) by up to {gap:.3g} nats: its forward transforms the "
                         f"logits in a way model.LOGIT_SCALES does not know; add {model_type!r} there")
    return gap


def save_hf(path: Path, *, config, tokenizer, weights: dict) -> None:
    """config.json, model.safetensors with `weights` and the tokenizer: what from_pretrained loads."""
    path.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(config)
    config.dtype = next(iter(weights.values())).dtype  # what from_pretrained(dtype="auto") loads
    config.save_pretrained(path)
    save_file(weights, str(path / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(path)


def save_checkpoint(path: Path, *, config, tokenizer, weights: dict, trainer_state: dict, run_config: dict) -> None:
    """An HF-loadable folder (save_hf) plus what --resume reads: the trainer state (step, data
    position, scheduler, ranks) and the run's Config (train_config.yaml). No weights: a LoRA
    checkpoint, whose adapter folder checkpoint.lora_files writes here (the tokenizer goes with it)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "train_config.yaml").write_text(yaml.safe_dump(run_config, sort_keys=False))
    if weights:
        save_hf(path, config=config, tokenizer=tokenizer, weights=weights)
    else:
        tokenizer.save_pretrained(path)
    torch.save(trainer_state, path / "trainer_state.pt")


def load_trainer_state(path: Path) -> dict:
    return torch.load(Path(path) / "trainer_state.pt", map_location="cpu", weights_only=True)


def count_parameters(model, trainable: bool = False) -> str:
    n = sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable)
    return f"{n / 1e6:.2f}M" if n < 1e9 else f"{n / 1e9:.2f}B"


