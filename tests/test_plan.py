"""The memory plan (extras/plan.py): its estimate against the measured peak, the paper configs, the
state rows by hand, and the shipped shapes."""
import re
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig

from config import Config, parse_config
from extras.plan import (Target, decode_repeats_kv, estimate, find_shape, layer_activations, print_plan,
                         shape_from_config, suggestions, tensor_budget)
from rewards import DataError

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
import plan_check  # noqa: E402

PAPER_CONFIGS = ["qwen2.5-1.5b_gsm8k_grpo", "qwen2.5-7b_deepscaler_pacs", "qwen2.5-math-7b_math_nsr",
                 "qwen3-8b-base_math_rover", "r1-distill-1.5b_delethink"]


@pytest.mark.parametrize("arch,checkpointing,engine,lora", [
    ("qwen2", False, "hf", 0), ("qwen3", True, "hf", 0), ("qwen2", True, "fast", 0),
    pytest.param("qwen2", False, "hf", 16, marks=pytest.mark.needs("peft"))])
@pytest.mark.slow
@pytest.mark.extended  # seconds of measured training a case; the plan's arithmetic is checked by hand below
def test_estimate_within_25_percent_of_measured_peak(arch, checkpointing, engine, lora, tmp_path):
    """The acceptance check: rollout and update peaks of the project's own code path on CPU
    (fp32, one rank), measured by counting live tensor storages, against the plan for the same
    Config planned for CPU; also what each phase adds to the resident weights and AdamW moments,
    on its own. Measured 2026-11-22: peaks within 3%, the added parts within 10%."""
    torch.set_num_threads(1)
    path = plan_check.build_model(tmp_path / arch, plan_check.MODELS[arch])
    cfg = Config(algo="grpo", **plan_check.RUN, gradient_checkpointing=checkpointing, parallel="ddp", engine=engine,
                 lora_rank=lora, beta=0.04 if lora else 0.0)
    peaks, resident = plan_check.compare(path, cfg, torch.device("cpu"))
    for phase, (est, got) in peaks.items():
        what = f"{arch} {phase}: estimate {est / 2**20:.1f} MiB, measured {got / 2**20:.1f} MiB"
        assert abs(est - got) / got <= 0.25, what
        assert abs(est - got) / (got - resident) <= 0.25, f"{what}, resident {resident / 2**20:.1f} MiB"


def test_live_tensor_count_sees_parameters_gradients_and_frees():
    """The CPU measurement itself: a backward's gradient is counted, a freed tensor is not."""
    w = torch.zeros(1000, requires_grad=True)  # 4000 B
    with plan_check.LiveTensors([w]) as mode:
        y = w.exp().sum()  # + 4000 (exp, saved for backward) + 4 (the sum)
        y.backward()  # + w.grad 4000 while exp is alive; exp is freed with the graph
        del y
    assert mode.peak >= 12_004 and mode.now == 8_000


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_paper_config_fits_8_gpus(name, capsys):
    """`train.py --config X --plan --world-size 8` on each paper recipe: it fits 8 × 80 GB (exit 0,
    docs/gpus-and-memory.md's table), planned from the shipped shape since the model folder is not here."""
    import train
    with pytest.raises(SystemExit) as done:
        train.main(["--config", str(ROOT / "configs" / f"{name}.yaml"), "--plan", "--world-size", "8"])
    out = capsys.readouterr().out
    peak = float(re.search(r"^peak ([\d.]+) GiB", out, re.M).group(1))
    assert done.value.code == 0 and "fits" in out and 10 < peak < 80
    assert "shape from" in out and "assets/shapes" in out


def test_state_rows_by_hand_qwen2_5_7b_on_8_gpus():
    """Qwen2.5-7B (28 layers, hidden 3584, MLP 18944, 28 heads, 4 KV heads of 128, vocab 152064,
    untied head): P counted by hand, then the FSDP rows of one of 8 ranks."""
    layer = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
    params = 28 * layer + 2 * 152064 * 3584 + 3584  # + embeddings, LM head, final norm
    assert (layer, params) == (233_057_792, 7_615_616_512)
    shape, source = find_shape("models/Qwen2.5-7B")
    assert (shape.params, shape.layer_params, shape.root_params) == (params, layer, params - 28 * layer)
    assert "assets/shapes/Qwen2.5-7B" in source
    cfg = parse_config(["--config", str(ROOT / "configs/qwen2.5-7b_deepscaler_pacs.yaml")])
    resident, phases = estimate(cfg, shape, 8, "cuda")
    rows = dict(resident)
    assert rows["policy weights, fp32 (1/8 each)"] == params * 4 / 8
    assert rows["AdamW moments exp_avg + exp_avg_sq, fp32"] == params * 8 / 8
    decode = dict(next(p for p in phases if p.name == "rollout: last decode step").rows)
    assert decode["all weights gathered, bf16"] == params * 2
    # rollout_batch_size 128 of each rank's 1024 prompts / 8 ranks × 8 samples, each 512 + 4096
    # tokens; K and V of 28 layers, bf16
    assert decode["KV cache, 128 sequences × 4608 tokens"] == 128 * 4608 * 28 * 2 * 4 * 128 * 2
    update = dict(next(p for p in phases if p.name.startswith("update: start")).rows)
    assert update["gradients, fp32 (1/8 each)"] == params * 4 / 8
    assert update["gathered decoder layers: current + prefetched"] == 2 * layer * 2


def test_opd_teacher_is_counted_at_its_own_size():
    """--algo opd: a Qwen2.5-0.5B student and a Qwen2.5-7B teacher (both shipped shapes, no folder read) on 8
    GPUs: the teacher's bf16 weights, 1/8 each, are resident; it is loaded whole before it is sharded; its no-grad
    forward is a phase with its root group and two of its layers gathered (P = 7,615,616,512, 28 layers of
    233,057,792, counted by hand above)."""
    params, layer = 7_615_616_512, 233_057_792
    cfg = parse_config(["--algo", "opd", "--model", "models/Qwen2.5-0.5B", "--teacher", "models/Qwen2.5-7B"])
    student, _ = find_shape("models/Qwen2.5-0.5B")
    resident, phases = estimate(cfg, student, 8, "cuda")
    assert dict(resident)["teacher Qwen2.5-7B, bf16, frozen (1/8 each)"] == params * 2 / 8
    without, _ = estimate(parse_config(["--algo", "grpo", "--model", "models/Qwen2.5-0.5B"]), student, 8, "cuda")
    assert [row for row in resident if row not in without] == [("teacher Qwen2.5-7B, bf16, frozen (1/8 each)",
                                                                params * 2 / 8)]
    forward = dict(next(p for p in phases if p.name == "update: the teacher's forward (no grad)").rows)
    assert forward["teacher: gathered root group + 2 layers, bf16"] == (params - 28 * layer + 2 * layer) * 2
    load = dict(next(p for p in phases if p.name == "load: the teacher whole, before sharding").rows)
    assert load == {"teacher weights, bf16, unsharded": params * 2}


def test_layer_activations_formula_matches_its_docstring():
    shape, _ = find_shape("models/Qwen2.5-7B")
    assert layer_activations(shape, 2) == 16 * 3584 + 2 * 4 * 3584 + 4 * 28 + 8 * 18944 == 237_680


def test_cpu_plan_is_fp32_ddp_and_gpu_plan_bf16_fsdp():
    from extras.plan import target_for
    cfg = Config()
    assert target_for(cfg, 1, "cpu") == Target("cpu", 1, "ddp", 4, "hf")  # --engine auto: generate everywhere
    assert target_for(cfg, 8, "cuda") == Target("cuda", 8, "fsdp", 2, "hf")


def test_engine_auto_is_planned_as_the_generator_it_runs():
    """--engine auto is planned as rollout.sample resolves it: generate's KV cache on CPU and on CUDA (no
    engine slab), and --engine fast is planned with the slab."""
    shape, _ = find_shape("models/Qwen2.5-1.5B-Instruct")
    def slab(plan) -> list:
        return [row for phase in plan[1] for row, _ in phase.rows if row.startswith("engine KV slab")]

    for device in ("cpu", "cuda"):
        auto, hf, fast = (estimate(Config(engine=e), shape, 1, device) for e in ("auto", "hf", "fast"))
        assert auto == hf and not slab(auto)
        assert slab(fast)


def test_vllm_rows_by_hand_qwen2_5_1_5b_on_8_gpus():
    """--engine vllm on 8 GPUs (FSDP, bf16), 64 prompts × 8 (64 rows a rank), prompts of 512 + 1024 new tokens,
    no eval, for Qwen2.5-1.5B (hidden 1536, MLP 8960, 12 heads, 2 KV heads of 128, 28 layers, vocab 151,936),
    by hand. vLLM holds, beside every phase after loading: its bf16 weights; a KV cache of 64 rows of 1536/16
    blocks + its null block, 16 tokens × 28 layers × K, V × 2 heads × 128 × 2 B; CUDA graphs at 1, 2, 4, 8..128
    (19 sizes, FULL and PIECEWISE: 38 graphs), one layer's activations at 128 tokens, 2 × (4·1536 + 3·8960) B a
    token. A rollout holds no gathered copy of the weights: the push's largest bucket is 5 decoder layers of
    2 × 46,797,824 B (6 are over 512 MiB; the embeddings, 466,747,392 B, go alone), beside the embeddings'
    fp32 gather; generating, a step's 8192 tokens of activations (vLLM's step budget on CUDA) and the sampler's
    3 fp32 [64, vocab]. With --vllm-memory 0.3, that share of the GPU's 80 GiB instead."""
    cfg = Config(engine="vllm", prompts_per_step=64, group_size=8, plan_prompt_tokens=512, max_new_tokens=1024,
                 eval_every=0, model="models/Qwen2.5-1.5B-Instruct")
    shape, _ = find_shape(cfg.model)
    assert shape.layer_params == 2 * 1536 * 1536 + 1536 + 2 * (1536 * 256 + 256) + 3 * 1536 * 8960 + 2 * 1536
    token = 2 * (4 * 1536 + 3 * 8960)
    held = {"vLLM: its weights, bf16": 2 * shape.params,
            "vLLM: KV cache, 64 rows × 1536 tokens in blocks of 16": (64 * 96 + 1) * 16 * 28 * 2 * 2 * 128 * 2,
            "vLLM: CUDA graphs, one layer's activations at 128 tokens + 1 MiB × 38 graphs": 128 * token + 38 * 2**20}
    _, phases = estimate(cfg, shape, 8, "cuda")
    by_name = {p.name: dict(p.rows) for p in phases}
    assert by_name["rollout: weights pushed to vLLM"] == {
        **held, "a push: whole layers up to 512 MiB (or one layer), bf16": 5 * 2 * shape.layer_params,
        "its largest tensor gathered in fp32, before the cast": 4 * 151_936 * 1536}
    assert by_name["rollout: vLLM generates"] == {
        **held, "vLLM: one layer's activations, 8192 tokens a step": 8192 * token,
        "vLLM sampler: fp32 [requests, vocab] × 3": 64 * 151_936 * 12}
    assert all(held.items() <= rows.items() for name, rows in by_name.items() if not name.startswith("load"))
    assert not any("gathered, bf16" in what for rows in by_name.values() for what in rows if "root" not in what)
    _, phases = estimate(Config(**{**cfg.__dict__, "vllm_memory": 0.3}), shape, 8, "cuda")
    assert dict(phases[0].rows)["vLLM: 0.3 of the GPU's 80 GiB (weights, KV cache, CUDA graphs)"] == 0.3 * 80 * 2**30


def test_vllm_takes_the_default_share_where_the_rows_do_not_fit_it_and_a_fitting_share_is_suggested():
    """The 7B PACS recipe with --engine vllm on 8 × 80 GB: a KV cache for a call's 128 rows of 512 + 4096 tokens
    (128 × 4608 tokens × 28 layers × K, V × 4 heads × 128 × 2 B, 33.8 GB) beside the weights (15.2 GB) is over
    the default share, 0.3 × 80 GiB = 25.8 GB, so vLLM gets the share (and holds fewer rows at once), and the
    recipe fits. With --vllm-memory 0.5 it does not, and the plan names the largest share that does (it
    fits; one point more does not)."""
    cfg = parse_config(["--config", str(ROOT / "configs/qwen2.5-7b_deepscaler_pacs.yaml"), "--engine", "vllm",
                        "--world-size", "8"])
    shape, _ = find_shape(cfg.model)
    assert 128 * 4608 * 28 * 2 * 4 * 128 * 2 + 2 * shape.params > 0.3 * 80 * 2**30
    budget = tensor_budget(cfg)

    def fits(**change) -> bool:
        resident, phases = estimate(Config(**{**cfg.__dict__, **change}), shape, 8, "cuda")
        assert ("vLLM: 0.3 of the GPU's 80 GiB (weights, KV cache, CUDA graphs)" in dict(phases[0].rows)) == (
            not change)
        return all(sum(v for _, v in resident) + p.total <= budget for p in phases)

    assert fits() and not fits(vllm_memory=0.5)
    lines = suggestions(Config(**{**cfg.__dict__, "vllm_memory": 0.5}), shape, 8, budget)
    share = float(re.search(r"update: vllm_memory ≤ ([\d.]+)", "\n".join(lines)).group(1))
    assert fits(vllm_memory=share) and not fits(vllm_memory=round(share + 0.01, 2))


@pytest.mark.parametrize("name,params,layers,tied", [
    ("Qwen2.5-0.5B", 494_032_768, 24, True), ("Qwen2.5-1.5B-Instruct", 1_543_714_304, 28, True),
    ("Qwen2.5-3B", 3_085_938_688, 36, True), ("Qwen2.5-7B", 7_615_616_512, 28, False),
    ("Qwen2.5-Math-7B", 7_615_616_512, 28, False), ("DeepSeek-R1-Distill-Qwen-1.5B", 1_777_088_000, 28, False),
    ("Qwen3-8B-Base", 8_190_735_360, 36, False)])
def test_shipped_shapes(name, params, layers, tied):
    """The published sizes (Qwen2.5: 0.49B, 1.54B, 3.09B, 7.62B; R1-Distill-1.5B untied: 1.78B;
    Qwen3-8B: 8.19B)."""
    shape, _ = find_shape(f"models/{name}")
    assert (shape.params, shape.layers, shape.tied) == (params, layers, tied)


def test_model_folder_config_wins_and_unknown_model_is_a_clear_error(tmp_path, capsys):
    shape, source = find_shape(str(ROOT / "assets/tiny-running-sum"))
    assert source.endswith("tiny-running-sum") and shape.vocab == 100
    assert print_plan(Config(world_size=2, prompts_per_step=16)) == 0  # the tiny model fits 80 GiB
    assert "fits" in capsys.readouterr().out
    with pytest.raises(DataError, match="no shipped shape named 'Llama-70B'.*Qwen2.5-7B"):
        find_shape(str(tmp_path / "Llama-70B"))


def test_suggested_values_fit(capsys):
    """Each suggested value, applied alone, makes its phases fit (the numbers are not guesses)."""
    # the ROVER recipe before its generate calls were capped: every rank's 128 sequences at once
    cfg = parse_config(["--config", str(ROOT / "configs/qwen3-8b-base_math_rover.yaml"), "--world-size", "8",
                        "--rollout-batch-size", "0", "--eval-batch-size", "256"])
    assert print_plan(cfg) == 1
    shape, _ = find_shape(cfg.model)
    budget = tensor_budget(cfg)
    lines = suggestions(cfg, shape, 8, budget)
    n = int(re.search(r"rollout_batch_size ≤ (\d+)", "\n".join(lines)).group(1))
    assert n % cfg.group_size == 0
    resident, phases = estimate(Config(**{**cfg.__dict__, "rollout_batch_size": n}), shape, 8, "cuda")
    base = sum(v for _, v in resident)
    assert all(base + p.total <= budget for p in phases if p.group == "rollout")
    resident, phases = estimate(Config(**{**cfg.__dict__, "rollout_batch_size": n + cfg.group_size}), shape, 8, "cuda")
    assert any(sum(v for _, v in resident) + p.total > budget for p in phases if p.group == "rollout")


def test_shape_from_config_counts_layers_and_qk_norm():
    config = AutoConfig.for_model("qwen3", vocab_size=64, hidden_size=32, intermediate_size=48,
                                  num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                  tie_word_embeddings=True)
    s = shape_from_config(config, "x")
    assert (s.layers, s.head_dim, s.kv_heads, s.tied, s.qk_norm) == (3, 16, 2, True, True)
    assert s.params == s.root_params + 3 * s.layer_params and s.root_params == 64 * 32 + 32  # embedding + norm


def test_lora_rows_by_hand_qwen2_5_1_5b_on_one_gpu():
    """LoRA r 32 on all 7 linear layers of Qwen2.5-1.5B (hidden 1536, MLP 8960, 2 KV heads of 128):
    r · (in + out) per layer, by hand; one GPU (FSDP, bf16) holds the base in bf16, the adapters,
    their gradients and AdamW moments in fp32, and no reference copy even with beta > 0."""
    per_layer = 2 * (1536 + 1536) + 2 * (1536 + 256) + 3 * (1536 + 8960)  # q, o; k, v; gate, up, down
    lora = 28 * 32 * per_layer
    assert (per_layer, lora) == (41_216, 36_929_536)
    cfg = parse_config(["--config", str(ROOT / "configs/qwen2.5-1.5b_gsm8k_grpo.yaml"), "--lora-rank", "32",
                        "--beta", "0.04"])
    shape, _ = find_shape(cfg.model)
    resident, phases = estimate(cfg, shape, 1, "cuda")
    assert dict(resident) == {"base weights, frozen, bf16": shape.params * 2,
                              "LoRA adapters, rank 32, fp32": lora * 4,
                              "AdamW moments exp_avg + exp_avg_sq, fp32": lora * 8}
    update = dict(next(p for p in phases if p.name.startswith("update: start")).rows)
    assert update["gradients, fp32"] == lora * 4
    assert not any("LM head gradient" in what for what in update)
    rollout = dict(next(p for p in phases if p.name == "rollout: prefill").rows)
    assert rollout["all weights gathered, bf16"] == (shape.params + lora) * 2
    with pytest.raises(ValueError, match="lm_head is not a linear layer"):
        estimate(Config(**{**cfg.__dict__, "lora_targets": "q_proj,lm_head"}), shape, 1, "cuda")


@pytest.mark.parametrize("config,flags,gpu,fits", [
    ("qwen2.5-1.5b_gsm8k_grpo", [], 24, False),  # full fine-tune: weights, gradients, AdamW alone are 23 GiB
    ("qwen2.5-1.5b_gsm8k_grpo", ["--lora-rank", "32"], 24, False),  # 1024 sequences in one generate call
    ("qwen2.5-1.5b_gsm8k_grpo", ["--lora-rank", "32", "--rollout-batch-size", "256"], 24, True),
    ("qwen2.5-7b_deepscaler_pacs", [], 80, False),
    ("qwen2.5-7b_deepscaler_pacs", ["--lora-rank", "32"], 80, True)])
def test_one_gpu_verdicts_of_the_readme(config, flags, gpu, fits, capsys):
    """docs/gpus-and-memory.md's one-GPU rows: `--plan --world-size 1 --gpu-memory G` exits 0 when it fits."""
    cfg = parse_config(["--config", str(ROOT / "configs" / f"{config}.yaml"), *flags, "--world-size", "1",
                        "--gpu-memory", str(gpu)])
    assert print_plan(cfg) == (0 if fits else 1)
    out = capsys.readouterr().out
    if flags == ["--lora-rank", "32"] and gpu == 24:  # 264 where generate repeats keys/values (extras/plan.py)
        n = 264 if decode_repeats_kv(find_shape(cfg.model)[0]) else 304
        assert f"rollout: rollout_batch_size ≤ {n}" in out
