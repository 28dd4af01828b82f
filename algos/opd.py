"""On-policy distillation (OPD): the student samples, a frozen teacher grades every token it wrote.

docs/math.md §10. Papers: Agarwal et al., "On-Policy Distillation of Language Models: Learning from
Self-Generated Mistakes" (GKD, ICLR 2024, arXiv 2306.13649); Lu et al., "On-Policy Distillation",
Thinking Machines (Oct 2025). Read from thinking-machines-lab/tinker-cookbook
`tinker_cookbook/distillation/train_on_policy.py` (incorporate_kl_penalty).

    gap        d_t = λ·(log π_T(y_t) − log π_old(y_t)), both at τ = 1: minus the per-token reverse KL
    advantage  A_t = α·A_group + Σ_{s≥t} γ^{s−t} d_s   per token (γ = 0: A_t = α·A_group + d_t);
               A_group is §1's group advantage of the reward; α = 0 (default): pure distillation
    loss       §1's clipped surrogate with these per-token advantages, token-mean by default;
               on-policy (K = μ = 1) its gradient is that of −Σ_t A_t·log π_θ(y_t) / N_tok
    logged     opd/reverse_kl = token-mean of log π_old − log π_T (tinker's teacher_kl)

A verifiable reward says one bit per response; the teacher says, at every token, how much less
likely it finds the student's choice than the student does. The teacher is loaded where the KL
reference would be (train.models: frozen, no gradient, sharded like the policy under FSDP, in the
compute dtype) and scored on the sampled tokens in the same no-grad pass (train.fixed_passes), so its
log-probs arrive as LossInputs.ref_logp. That slot is the teacher's: β > 0 is refused, since the
teacher's reverse KL already pulls the student toward a frozen model, and a reference besides it would
be a third copy of weights for a regulariser tinker's recipe does not have.

Worked example (tests/test_opd.py, docs/math.md §10): vocabulary of 3, one response y = (0, 1), student
logits [1, 0, −1], [0, 0.5, 0], teacher [0, 1, 0], [2, 0, 0]: A = [−1.1438387, −1.4451680],
opd/reverse_kl = loss = 1.2945034.

Where we differ from tinker, and why:
- π_old is §0's, the trainer's own no-grad forward, not the sampler's log-probs: the teacher is scored
  by the same code on the same tensors, so a teacher equal to the student gives A = 0 exactly.
- --temperature must be 1: the reverse KL is between the two models' own distributions, and a
  tempered student would be compared with an untempered teacher.
- γ's sum runs over one training row: a Markovian or multi-turn trace split over rows is refused with γ > 0.
"""
from __future__ import annotations

import torch

from algos import TEACHER, policy_gradient
from algos.base import Algorithm, Knob, LossInputs, several_rows

PRESET = dict(adv_norm="group", clip_low=0.2, clip_high=0.2, loss_agg="token-mean")
KNOBS = (TEACHER,
         Knob("opd_alpha", 0.0, "α: weight of the reward's group advantage added to every token's; 0 = pure "
              "distillation", at_least=0),
         Knob("opd_lambda", 1.0, "λ: weight of the teacher's per-token log-ratio log π_T − log π_old", at_least=0),
         Knob("opd_gamma", 0.0, "γ: each token's advantage also sums the later tokens' log-ratios, discounted by "
              "γ per token (tinker's kl_discount_factor); 0 = each token its own", at_least=0, at_most=1),
         *policy_gradient.ADVANTAGE_KNOBS, *policy_gradient.TURN_CREDIT_KNOBS, *policy_gradient.CLIP_KNOBS,
         policy_gradient.DUAL_CLIP, policy_gradient.LOSS_AGG,
         *(k for k in policy_gradient.AGGREGATE_KNOBS if k.name != "beta"))


def token_advantages(mb: LossInputs, cfg) -> torch.Tensor:
    """A [n, T] of docs/math.md §10, no gradient; mb.ref_logp is the teacher's log-probs.

    old [[-0.4, -0.8]], teacher [[-1.5, -2.2]], adv [0.5], α 1, λ 1, γ 0 -> [[0.5 - 1.1, 0.5 - 1.4]];
    γ 0.5 adds half the second gap to the first: [[0.5 - 1.1 - 0.7, 0.5 - 1.4]].
    """
    gap = (cfg.opd_lambda * (mb.ref_logp - mb.old_logp) * mb.mask).detach()
    if cfg.opd_gamma > 0:  # A_t = Σ_s gap_s · γ^(s−t) over the later tokens s ≥ t of the row
        t = torch.arange(gap.shape[1], device=gap.device)
        ahead = t[:, None] - t[None, :]  # [s, t]: s − t
        gap = gap @ torch.where(ahead >= 0, cfg.opd_gamma ** ahead.clamp(min=0).to(gap.dtype), 0.0)
    return cfg.opd_alpha * mb.adv[:, None] + gap


def loss(mb: LossInputs, cfg, totals: dict):
    """The clipped surrogate of per-token advantages, a share of the global aggregation `cfg.loss_agg`.

    Reads logp, old_logp, ref_logp (the teacher's), mask, adv (and what policy_gradient.aggregate reads).
    """
    per_token, was_clipped = policy_gradient.clipped_surrogate(
        mb.logp, mb.old_logp, token_advantages(mb, cfg), clip_low=cfg.clip_low, clip_high=cfg.clip_high,
        dual_clip=cfg.dual_clip)
    metrics = {"pg/clipfrac": policy_gradient.token_share(was_clipped, mb, totals),
               "opd/reverse_kl": policy_gradient.token_share(mb.old_logp - mb.ref_logp, mb, totals)}
    return policy_gradient.aggregate(per_token, mb, cfg, totals, loss_agg=cfg.loss_agg, metrics=metrics)


def check(cfg) -> str:
    """The rules of a distillation run; the teacher's folder and tokenizer last (they are read from disk)."""
    if not cfg.teacher:
        return "--algo opd distils a teacher: give --teacher PATH (a model folder with the student's tokenizer)"
    if cfg.temperature != 1:
        return (f"temperature={cfg.temperature}: --algo opd compares the student's and the teacher's own "
                f"distributions (τ = 1, docs/math.md §10): set --temperature 1")
    if cfg.opd_alpha > 0 and cfg.group_size < 2:
        return (f"opd_alpha={cfg.opd_alpha} adds the reward's group advantage, which a group of one does not have: "
                f"group_size ≥ 2, or opd_alpha 0")
    if cfg.opd_gamma > 0 and several_rows(cfg):
        return (f"opd_gamma={cfg.opd_gamma} sums a response's later log-ratios, which a Markovian or multi-turn "
                f"trace split over rows does not have in one row: opd_gamma 0, or max_chunks 1 and no --env")
    # --plan reads no model folder (a shipped shape may stand for an absent one): extras/plan.py counts the teacher
    return "" if cfg.plan else teacher_problem(cfg)


def teacher_problem(cfg) -> str:
    """What keeps --teacher from grading this student, or "": not a model folder (model.check_model_folder),
    a tokenizer that gives some token another id than the student's (the teacher scores the student's ids), or
    fewer embedding rows (config vocab_size) than the student's, whose every id it must score."""
    from model import check_model_folder

    try:
        teacher, teacher_config = check_model_folder(cfg.teacher, cfg.trust_remote_code, flag="--teacher")
        student, student_config = check_model_folder(cfg.model, cfg.trust_remote_code)
    except ValueError as e:
        return str(e)
    differs = tokenizer_difference(student, teacher)
    if differs:
        return (f"--teacher {cfg.teacher}: its tokenizer is not the student's ({differs}); the teacher scores the "
                f"student's token ids, so give a teacher of the same tokenizer as --model {cfg.model}")
    rows = [c.get_text_config().vocab_size for c in (teacher_config, student_config)]
    return "" if rows[0] >= rows[1] else (
        f"--teacher {cfg.teacher}: its embedding has {rows[0]} rows, the student's {rows[1]}: the student can sample "
        f"an id the teacher has no row for; give a teacher with at least {rows[1]} (the same vocab_size)")


def tokenizer_difference(student, teacher) -> str:
    """The first way the teacher's tokenizer differs from the student's, or "": the vocabulary (token -> id),
    then the special ids. A vocabulary of 40 against 41 -> "41 tokens, the student's 40"."""
    ours, theirs = student.get_vocab(), teacher.get_vocab()
    if len(ours) != len(theirs):
        return f"{len(theirs)} tokens, the student's {len(ours)}"
    for token in sorted(ours):
        if theirs.get(token) != ours[token]:
            return f"token {token!r} is id {theirs.get(token)} there, {ours[token]} in the student's"
    for name in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id"):
        if getattr(teacher, name) != getattr(student, name):
            return f"{name} {getattr(teacher, name)}, the student's {getattr(student, name)}"
    return ""


ALGORITHMS = [Algorithm("opd", PRESET, policy_gradient.batch_advantages, loss, knobs=KNOBS, check=check,
                        norm=policy_gradient.batch_norm,
                        refuses={"beta": "the teacher takes the reference's place: its reverse KL is the pull "
                                         "toward a frozen model (docs/math.md §10)"})]
