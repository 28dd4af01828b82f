"""Build the shipped tiny model: a character-level tokenizer, a ~1M-parameter Llama, and a short
supervised pre-training on the built-in running-sum task, stopped as soon as held-out accuracy
(sampled at temperature 1, the RL rollout setting) reaches `--target`, so that RL has room to show.

    python assets/build_tiny_model.py            # rewrites assets/tiny-running-sum/
    python assets/build_tiny_model.py --init assets/tiny-running-sum --out assets/tiny-running-sum-long \
        --min-terms 2 --max-terms 12 --max-new-tokens 160 --lr 1e-3 --max-steps 2000 --eval-every 250 \
        --target 1.01      # the long-sum model: 2000 steps on from the first
    python assets/build_tiny_model.py --init assets/tiny-running-sum-long --out assets/tiny-running-sum-markov \
        --min-terms 2 --max-terms 12 --chunk 32 --carryover 21 --eval-terms 6,7 --max-new-tokens 100 \
        --lr 1e-3 --max-steps 750 --eval-every 250 --target 1.01    # configs/tiny_delethink.yaml's model
    python assets/build_tiny_model.py --init assets/tiny-running-sum --out assets/tiny-tool-calc \
        --env calculator --tool-share 0.3 --digits 4 --min-terms 2 --max-terms 3 --max-new-tokens 64 \
        --lr 1e-3 --max-steps 2000 --eval-every 100 --target 0.30   # configs/tiny_grpo_tool.yaml's model

With --env calculator a share --tool-share of the SFT problems is solved with the calculator, as
a multi-turn rollout with `--env calculator` writes it (environments/): turn 1 calls the tool,
the observation comes back through the chat template, turn 2 answers. "Add 4821+9377" ->

    row 1  <|user|>Add 4821+9377<|assistant|>                                -> <calc>4821+9377</calc><eos>
    row 2  <|user|>Add 4821+9377<|assistant|><calc>4821+9377</calc><eos><|tool|>14198<|assistant|>
                                                                             -> <answer>14198</answer><eos>

the rest with the plain running sum; the checks then sample multi-turn with the calculator.

Deterministic: every random choice is seeded, and the run uses one CPU thread.
"""
from __future__ import annotations

import argparse
import math
import random
import shutil
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import environments.tools  # noqa: E402
from model import ResponseLogProbs, load_tokenizer  # noqa: E402
from tasks import RunningSumTask  # noqa: E402
from environments.rollout import MultiTurn  # noqa: E402
from environments.markovian import Markovian  # noqa: E402
from rollout import PLAIN, Chunk, Sampling, collate, encode_prompts, generate  # noqa: E402

SPECIALS = ["<pad>", "<eos>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
                 "{% if m['role'] == 'assistant' %}<eos>{% endif %}{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def build_tokenizer(vocab_size: int = 0) -> PreTrainedTokenizerFast:
    """One token per printable ASCII character (and newline), plus chat/pad/eos specials; with
    vocab_size, filler tokens <unused0>, <unused1>, ... up to that size (a real model's vocabulary
    for benchmarks: no text encodes to them, but a random model writes them)."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    fillers = [f"<unused{i}>" for i in range(vocab_size - len(SPECIALS) - len(chars))]
    vocab = {tok: i for i, tok in enumerate(SPECIALS + chars + fillers)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))  # no merges: characters stay tokens
    core.add_special_tokens(SPECIALS)
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_model(vocab_size: int, seed: int, hidden: int = 96, layers: int = 3) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
        rope_theta=10000.0, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1,
        bos_token_id=None)
    return LlamaForCausalLM(config)


def markov_rows(query: list[int], solution: list[int], chunk: int, carryover: int) -> list[Chunk]:
    """The reference solution cut as a Delethink rollout would write it (docs/math.md §5, head h = 0):
    chunk 1 is q -> the first C tokens, every later chunk q ⧺ the last m tokens -> C − m more.
    q = [1], solution 1..7, C 4, m 2 -> [1]->1234, [1]34->56, [1]56->7."""
    rows, written = [Chunk(query, solution[:chunk])], solution[:chunk]
    while len(written) < len(solution):
        new = solution[len(written):len(written) + chunk - carryover]
        rows.append(Chunk(query + written[len(written) - carryover:], new))
        written = written + new
    return rows


# the calculator's bounds at the checks, as configs/tiny_grpo_tool.yaml has them (--max-turns, --max-observation-tokens)
TURNS = environments.Turns(max_turns=3, max_observation_tokens=32)


def tool_rows(tok, query: list[int], terms: list[int], render) -> list[Chunk]:
    """A calculator trace, two rows, as environments/rollout.py's interact writes them: the call, then the answer
    prompted with everything before it, the observation rendered by the rollout's own
    environments.Observations (so that SFT and RL agree token for token)."""
    ids = lambda text: tok(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    total = sum(terms)
    call = ids("<calc>" + "+".join(map(str, terms)) + "</calc>") + [tok.eos_token_id]
    observation = render(str(total), TURNS.max_observation_tokens, environments.tools.Calculator.plain)
    return [Chunk(query, call),
            Chunk(query + call + observation, ids(f"<answer>{total}</answer>") + [tok.eos_token_id])]


def heldout_accuracy(lm, tok, task, problems, prompt_ids, max_new_tokens: int, chunk: int, carryover: int,
                     environment=None) -> tuple[float, float, float]:
    """(accuracy, share of traces that call a tool, share with a correct call: one whose value is
    the answer), sampled at temperature 1; with chunk > 0 in Delethink chunks, as many as
    max_new_tokens needs; with an environment (environments.environment_for), multi-turn within TURNS."""
    shape, budget = PLAIN, max_new_tokens
    if chunk:
        chunks = 1 + math.ceil(max(0, max_new_tokens - chunk) / (chunk - carryover))
        shape, budget = Markovian(carryover, 0, chunks) if chunks > 1 else PLAIN, chunk
    if environment:
        shape = MultiTurn(environment, TURNS)
    eps = generate(lm, tok, problems, prompt_ids, group_size=1, shape=shape,
                   sampling=Sampling(temperature=1.0, max_new_tokens=budget))
    accuracy = sum(task.grade(e.problem, e.text).reward for e in eps) / len(eps)
    share = lambda key: sum(e.details.get(key, 0) > 0 for e in eps) / len(eps)  # noqa: E731
    return accuracy, share("tools/calls"), share("tools/correct")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", default=str(Path(__file__).parent / "tiny-running-sum"))
    ap.add_argument("--target", type=float, default=0.30, help="stop at this held-out accuracy")
    ap.add_argument("--max-steps", type=int, default=4000)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hidden", type=int, default=96)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--init", default="", help="start from this model folder (same tokenizer)")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-terms", type=int, default=3, help="fewest integers in a sum")
    ap.add_argument("--max-terms", type=int, default=5, help="most integers in a sum")
    ap.add_argument("--max-new-tokens", type=int, default=80, help="response budget at the checks")
    ap.add_argument("--chunk", type=int, default=0,
                    help="C > 0: train on Delethink rows of the reference (Markovian SFT), check in chunks")
    ap.add_argument("--carryover", type=int, default=0, help="m: tokens carried into each next chunk")
    ap.add_argument("--eval-terms", default="", help="min,max terms of the check problems (default: as trained)")
    ap.add_argument("--digits", type=int, default=2, help="most digits of each integer in a sum")
    ap.add_argument("--env", default="", choices=("", "calculator"),
                    help="calculator: train on tool traces too, check multi-turn with the calculator")
    ap.add_argument("--tool-share", type=float, default=0.0, help="with --env: share of problems solved with the tool")
    args = ap.parse_args()
    if args.chunk and not 0 < args.carryover < args.chunk:
        ap.error("--chunk needs 0 < --carryover < --chunk")
    if args.env and args.chunk:
        ap.error("--env and --chunk: one or the other")
    if not 0 <= args.tool_share <= 1 or (args.tool_share and not args.env):
        ap.error("--tool-share needs --env and a value in [0, 1]")
    torch.set_num_threads(1)

    tmp = Path(args.out).with_suffix(".tmp")
    build_tokenizer().save_pretrained(tmp)
    tok = load_tokenizer(str(tmp))
    lm = (LlamaForCausalLM.from_pretrained(args.init) if args.init
          else build_model(len(tok), args.seed, args.hidden, args.layers))
    task = RunningSumTask(args.min_terms, args.max_terms, args.digits)
    eval_task = RunningSumTask(*map(int, args.eval_terms.split(",")), args.digits) if args.eval_terms else task
    # with --env: the rollout's environment (for the checks), tool list (for the prompts) and observations
    environment = environments.environment_for(args.env, TURNS, tok, True) if args.env else None
    tools = environment.tools if environment else None
    render = environments.Observations(tok, chat_template=True)
    rng = random.Random(args.seed)
    # The SFT problems come from their own stream, so they overlap RL's train split only by chance
    # and never its held-out split (seeded differently, and RL's held-out is what we report).
    eval_rng = random.Random("sft-eval")
    eval_problems = [eval_task.sample(eval_rng)[0] for _ in range(300)]
    eval_ids = encode_prompts(tok, eval_problems, True, tools)
    scorer = ResponseLogProbs(lm)
    opt = torch.optim.AdamW(lm.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.99))
    acc, report = 0.0, ""
    for step in range(1, args.max_steps + 1):
        samples = [task.sample(rng) for _ in range(64)]
        problems = [p for p, _ in samples]
        rows = []
        for ids, (p, t) in zip(encode_prompts(tok, problems, True, tools), samples):
            if environment and rng.random() < args.tool_share:  # no draw without --env: older builds stay as they were
                rows += tool_rows(tok, ids, t, render)
                continue
            solution = tok(RunningSumTask.solution(t), add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            rows += markov_rows(ids, solution, args.chunk, args.carryover) if args.chunk else [Chunk(ids, solution)]
        b = collate(rows, tok.pad_token_id, "cpu")
        lm.train()
        logp = scorer(b.input_ids, b.attention_mask, b.position_ids, b.response_mask, 1.0)["logp"]
        loss = -(logp.sum() / b.response_mask.sum())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(lm.parameters(), 1.0)
        opt.step()
        if step % args.eval_every == 0:
            torch.manual_seed(args.seed + step)
            acc, calls, correct = heldout_accuracy(lm, tok, eval_task, eval_problems, eval_ids, args.max_new_tokens,
                                                   args.chunk, args.carryover, environment)
            report = f"  tool calls {calls:.3f}  correct calls {correct:.3f}" if environment else ""
            print(f"step {step}  loss {loss.item():.4f}  held-out accuracy {acc:.3f}{report}", flush=True)
            if acc >= args.target:
                break
    lm.save_pretrained(tmp, safe_serialization=True)
    shutil.rmtree(args.out, ignore_errors=True)
    tmp.rename(args.out)
    print(f"saved {args.out} after {step} steps, held-out accuracy {acc:.3f}{report}")


if __name__ == "__main__":
    main()
