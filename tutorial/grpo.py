"""GRPO in one file: the whole of what `train.py --algo grpo` does by default, top to bottom.

    python tutorial/grpo.py                          # one process
    torchrun --nproc_per_node 2 tutorial/grpo.py     # two ranks, data parallel over gloo

Each step: every rank samples G = 8 responses for its share of B = 16 running-sum prompts ("Add
98+54+6+34") with HF `generate`, grades them, turns each group's rewards into advantages (a
z-score), scores the responses' tokens under the policy, and takes one AdamW step on GRPO's
clipped surrogate. Every 25 steps it samples the held-out problems and prints the accuracy.

This is train.py's default path with the options taken out; the math is docs/math.md's, and each
block below names its section. Left out (each is one flag of train.py): the other algorithms,
K > 1 mini-batches and μ > 1 epochs, a reference model (β > 0), FSDP, bf16, LoRA, the engine,
Markovian chunks, environments and tools, data files, checkpoints and resume, TensorBoard.
tests/test_student.py runs this file and `train.py --algo grpo` (the default run) with the same seed and
holds them equal: rewards, losses, gradient norms and the final weights, on 1, 2 and 3 ranks.
"""
import argparse
import json
import math
import os
import sys
from functools import reduce
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the task's module sits at the repository's root
from tasks import RunningSumTask  # noqa: E402  the problems and their grader: the task is not the lesson

# train.py's defaults (config.py's RunConfig and algos/grpo.py's preset); each is a --flag here too
SETTINGS = dict(
    steps=150,  # rollout batches; each is one optimizer step
    prompts=16,  # B: prompts per step, over all ranks
    group=8,  # G: responses sampled per prompt
    micro_batch=64,  # responses per forward/backward on a rank; their gradients add up
    max_new_tokens=80,  # the response budget
    temperature=1.0,  # τ: sampling, and the log-probs of the loss (docs/math.md §0)
    clip=0.2,  # ε: the ratio is clipped to [1 − ε, 1 + ε]
    adv_eps=1e-6,  # added to the group's std
    lr=3e-4,  # AdamW, after warm-up
    warmup=5,  # steps of linear warm-up; then linear decay to 0 at the last step
    grad_clip=1.0,  # max gradient norm
    eval_every=25,  # steps between held-out evals (and one before the first step); 0 = none
    eval_problems=200,  # held-out problems per eval
    eval_samples=4,  # samples per held-out problem
    eval_batch=256,  # sequences per generate call at eval
    seed=0,
    out="",  # a folder for metrics.jsonl and the final weights; "" = print only
)
MODEL = ROOT / "assets" / "tiny-running-sum"  # a 0.35M-parameter Llama, its pre-training stopped at 55.3% on the task
LOGIT_CHUNK = 512  # response tokens whose logits are formed at once (docs/math.md §0: never all of them)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in SETTINGS.items():
        parser.add_argument("--" + name.replace("_", "-"), type=type(default), default=default)
    return parser.parse_args()


def setup_ranks() -> tuple[int, int]:
    """(rank, world size): one process, or a gloo process group under torchrun."""
    if "RANK" not in os.environ:
        return 0, 1
    # the ranks share the machine's cores: one thread pool each, sized to its share, not all of them
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ["LOCAL_WORLD_SIZE"])))
    dist.init_process_group("gloo")
    return dist.get_rank(), dist.get_world_size()


def global_sum(values: list[float], world: int) -> list[float]:
    """Each value summed over the ranks (in float64)."""
    t = torch.tensor(values, dtype=torch.float64)
    if world > 1:
        dist.all_reduce(t)
    return t.tolist()


# ---------------------------------------------------------------------------- rollout (docs/math.md §0)

def encode(tokenizer, prompt: str) -> list[int]:
    """The prompt as the model saw it in pre-training: "<|user|>Add 1+2<|assistant|>"."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[[5, 6], [7]] -> ids [[5, 6], [pad, 7]], mask [[1, 1], [0, 1]]: every prompt ends in the same column."""
    width = max(map(len, rows))
    ids = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@torch.no_grad()
def sample(lm, tokenizer, queries: list[list[int]], temperature: float, max_new_tokens: int) -> list[list[int]]:
    """Each query's response: the tokens generated up to and including the first EOS (emitting EOS is an
    action, so it is trained), or all max_new_tokens of them (a truncated response)."""
    ids, mask = left_pad(queries, tokenizer.pad_token_id)
    lm.eval()  # in train mode HF turns the KV cache off under gradient checkpointing; dropout is 0 here anyway
    # every knob explicit: top_k 0, not HF's default of 50, so that we sample the policy itself
    out = lm.generate(input_ids=ids, attention_mask=mask, generation_config=GenerationConfig(
        do_sample=True, temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id))
    lm.train()
    eos = tokenizer.eos_token_id
    return [row[:row.index(eos) + 1] if eos in row else row for row in out[:, ids.shape[1]:].tolist()]


# ---------------------------------------------------------------------------- log-probs (docs/math.md §0)

def token_logprobs(lm, prompts: list[list[int]], responses: list[list[int]], temperature: float, pad_id: int):
    """(logp, mask), both [N, T] float32 with T the longest response: logp[i, t] = log_softmax(z/τ)[y_i,t]
    from the logits z that predict response token t, 0 past the response; mask 1 on its tokens.

    One row is a left-padded prompt ⧺ its right-padded response: prompts [[5, 6], [7]] with responses
    [[8, 1], [9]] -> [[5, 6, 8, 1], [pad, 7, 9, pad]], so the logits predicting response token t sit
    in column P − 1 + t of every row (P = 2 here)."""
    p, t = max(map(len, prompts)), max(map(len, responses))
    ids = torch.tensor([[pad_id] * (p - len(q)) + q + r + [pad_id] * (t - len(r)) for q, r in zip(prompts, responses)])
    attention = torch.tensor([[0] * (p - len(q)) + [1] * (len(q) + len(r)) + [0] * (t - len(r))
                              for q, r in zip(prompts, responses)])
    positions = (attention.cumsum(1) - 1).clamp(min=0)  # 0 at each row's first real token
    mask = attention[:, p:].float()
    hidden = lm.get_decoder()(input_ids=ids, attention_mask=attention, position_ids=positions,
                              use_cache=False).last_hidden_state
    valid = mask.bool()
    h, targets = hidden[:, p - 1:p - 1 + t][valid], ids[:, p:][valid]  # [n_valid, H]: predicting positions only
    head, parts = lm.get_output_embeddings(), []
    # the chosen logit minus a logsumexp, a chunk of tokens at a time: a float32 [N, T, V] log-softmax
    # of a real vocabulary (152k for Qwen) would not fit
    for s in range(0, len(h), LOGIT_CHUNK):
        z = F.linear(h[s:s + LOGIT_CHUNK], head.weight, head.bias) / temperature
        parts.append(z.gather(-1, targets[s:s + LOGIT_CHUNK, None]).squeeze(-1) - torch.logsumexp(z, dim=-1))
    return hidden.new_zeros(len(ids), t).masked_scatter(valid, torch.cat(parts)), mask


# ---------------------------------------------------------------------------- the loss (docs/math.md §1)

def group_advantages(rewards: list[float], group: int, eps: float) -> torch.Tensor:
    """A_i = (R_i − mean_g R) / (std_g R + eps), the std unbiased (n − 1, as TRL and verl), one per
    response, from its own group of G: [1, 0, 0, 1] -> [0.866, −0.866, −0.866, 0.866]. A group whose
    rewards are all equal gets 0: it says nothing about which response was better."""
    r = torch.tensor(rewards, dtype=torch.float64).view(-1, group)
    return ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + eps)).flatten().float()


def grpo_loss(logp, old_logp, adv, mask, n_seqs: int, clip: float) -> torch.Tensor:
    """This micro-batch's share of GRPO's loss over the whole batch.

    Per token, PPO's clipped surrogate with the ratio r = exp(logp − logp_old):
        ℓ = max(−A·r, −A·clip(r, 1 − ε, 1 + ε))
    then GRPO's aggregation, "seq-mean-token-mean": each response's mean over its tokens, then the mean
    over the batch's n_seqs responses on all ranks, so that micro-batches and ranks just add up.
    Here the ratio is exactly 1 (logp_old is this very forward's, detached), so the clip never acts
    and the gradient is −A ∇logp / (L_i · n_seqs): the clip matters only once the policy has moved
    before the last pass over a batch (train.py's --epochs or --mini-batches above 1). The loss itself
    is then 0 up to rounding (a group's advantages sum to 0, and so does −Σ A_i / n_seqs); its gradient is not."""
    ratio = torch.exp(logp - old_logp)
    a = adv[:, None]
    per_token = torch.maximum(-a * ratio, -a * ratio.clamp(1 - clip, 1 + clip))
    weights = mask / mask.sum(1, keepdim=True).clamp(min=1) / n_seqs
    return (weights * per_token).sum()


# ---------------------------------------------------------------------------- eval (docs/math.md §6)

def evaluate(lm, tokenizer, task, problems, args, rank: int, world: int) -> dict:
    """eval/accuracy: the fraction of eval_samples samples per held-out problem that are correct (avg@n),
    and its standard error over problems (§6.1: each problem's fraction x_i is one unit,
    SE = sqrt(sum (x_i - mean)^2 / (P (P - 1)))). The ranks take turns by generate call; each call is
    seeded by its index, so any number of ranks draws the same samples."""
    per_call, correct = args.eval_batch // args.eval_samples, [0] * len(problems)
    for call, start in enumerate(range(0, len(problems), per_call)):
        if call % world != rank:
            continue
        torch.manual_seed(args.seed + 7919 + call)
        batch = [p for p in problems[start:start + per_call] for _ in range(args.eval_samples)]
        responses = sample(lm, tokenizer, [encode(tokenizer, p.prompt) for p in batch], args.temperature,
                           args.max_new_tokens)
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        for i, (p, text) in enumerate(zip(batch, texts)):
            correct[start + i // args.eval_samples] += task.grade(p, text).reward >= 1
    counts = global_sum(correct, world)  # every problem's count, on every rank
    metrics = {"eval/accuracy": sum(counts) / (len(problems) * args.eval_samples)}
    x = [c / args.eval_samples for c in counts]
    if len(x) > 1:  # one problem shows no spread
        mean = sum(x) / len(x)
        metrics["eval/accuracy_se"] = math.sqrt(sum((v - mean) ** 2 for v in x) / (len(x) * (len(x) - 1)))
    return metrics


# ---------------------------------------------------------------------------- the loop

def main():
    args = parse_args()
    rank, world = setup_ranks()
    if args.prompts % world:
        sys.exit(f"--prompts {args.prompts} must be divisible by the {world} ranks")
    task = RunningSumTask()
    train_problems, heldout = task.splits()
    heldout = heldout[:args.eval_problems]
    stream = task.stream(train_problems, args.seed)  # the training prompts, shuffled with the seed
    tokenizer = AutoTokenizer.from_pretrained(MODEL)
    lm = AutoModelForCausalLM.from_pretrained(MODEL, dtype=torch.float32).train()
    lm.generation_config = GenerationConfig()  # sampling knobs come from here, never from the checkpoint
    optimizer = torch.optim.AdamW(lm.parameters(), lr=args.lr, weight_decay=0.0)

    def lr_factor(s: int) -> float:  # warm-up, then a straight line from 1 to 0 just past the last step
        return min((s + 1) / args.warmup, 1.0, max(0.0, (args.steps - s) / max(args.steps - args.warmup, 1)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    log = None
    if args.out and rank == 0:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        log = open(Path(args.out) / "metrics.jsonl", "w")

    def report(step: int, metrics: dict):
        if rank == 0:
            print(f"step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()), flush=True)
            if log:
                log.write(json.dumps({"step": step, **{k: round(v, 6) for k, v in metrics.items()}}) + "\n")

    if args.eval_every:
        report(0, evaluate(lm, tokenizer, task, heldout, args, rank, world))
    share = args.prompts // world
    for step in range(1, args.steps + 1):
        # one seed per (step, rank): the ranks sample differently, and a rerun samples alike
        torch.manual_seed(args.seed * 1_000_003 + step * 1_009 + rank)

        # 1. rollout: this rank's prompts, each G times; a group is one prompt's G responses (§0)
        problems = stream.get((step - 1) * args.prompts, args.prompts)[rank * share:(rank + 1) * share]
        problems = [p for p in problems for _ in range(args.group)]
        prompts = [encode(tokenizer, p.prompt) for p in problems]
        responses = sample(lm, tokenizer, prompts, args.temperature, args.max_new_tokens)

        # 2. reward: 1 if the last <answer> is the sum, else 0 (rewards.grade_running_sum)
        texts = tokenizer.batch_decode(responses, skip_special_tokens=True)
        rewards = [task.grade(p, text).reward for p, text in zip(problems, texts)]

        # 3. advantage: each response against the rest of its group (§1); a group never spans ranks
        adv = group_advantages(rewards, args.group, args.adv_eps)

        # 4. loss and gradient, micro-batch by micro-batch; each loss is already a share of the whole
        #    batch's on all ranks (§0), so the gradients of micro-batches and ranks simply add
        loss_sum = 0.0
        for s in range(0, len(problems), args.micro_batch):
            rows = slice(s, s + args.micro_batch)
            logp, mask = token_logprobs(lm, prompts[rows], responses[rows], args.temperature, tokenizer.pad_token_id)
            loss = grpo_loss(logp, logp.detach(), adv[rows], mask, n_seqs=args.prompts * args.group, clip=args.clip)
            loss.backward()
            loss_sum += float(loss)
        if world > 1:  # each rank's gradient, added in rank order: the same bits on any number of ranks
            for param in lm.parameters():
                parts = [torch.empty_like(param.grad) for _ in range(world)]
                dist.all_gather(parts, param.grad)
                param.grad = reduce(torch.add, parts)  # (g_0 + g_1) + g_2 ...; an all_reduce's order varies

        # 5. the optimizer step: clip the gradient's global norm, AdamW, the schedule
        grad_norm = float(torch.nn.utils.clip_grad_norm_(lm.parameters(), args.grad_clip))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        # 6. log: the batch's mean reward on all ranks, the loss, the norm; held-out accuracy (§6)
        reward_sum, loss_total = global_sum([sum(rewards), loss_sum], world)
        metrics = {"reward/mean": reward_sum / (args.prompts * args.group), "loss/total": loss_total,
                   "grad/norm": grad_norm}
        if args.eval_every and step % args.eval_every == 0:
            metrics.update(evaluate(lm, tokenizer, task, heldout, args, rank, world))
        report(step, metrics)
    if args.out and rank == 0:
        lm.save_pretrained(args.out)  # config.json and model.safetensors: from_pretrained loads it
        log.close()
    if world > 1:
        dist.barrier()  # no rank tears the group down while another still uses it (gloo may abort it)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
