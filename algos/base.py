"""What an algorithm is: its knobs, its registry entry, and the inputs its loss receives.

Every file in algos/ builds on these three records; algos/__init__.py lists the files.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from bounds import out_of_bounds


@dataclass(frozen=True)
class Knob:
    """One setting an algorithm reads, declared next to its loss. config.py turns every knob of the
    registry into a Config field, a --flag and a YAML key, with `help` as its --help line; a value
    off `default` for an algorithm that does not read the knob is an error (config.validate).
    The bounds, when given, are checked for every run: above (>), at_least (≥), at_most (≤); `off`
    is a value that switches the knob off, allowed besides them (dual_clip: 0 or > 1).
    """
    name: str
    default: object
    help: str
    choices: tuple = ()
    above: float | None = None
    at_least: float | None = None
    at_most: float | None = None
    off: object = None

    def problem(self, value) -> str:
        """What is wrong with `value` for this knob, or "". Knob("rho", 1.0, "", above=0).problem(0.0)
        -> "must be > 0"; Knob("c", 0.0, "", above=1, off=0.0).problem(0.5) -> "must be > 1 (or 0.0: off)"."""
        if self.off is not None and value == self.off:
            return ""
        wrong = out_of_bounds(value, choices=self.choices, above=self.above, at_least=self.at_least,
                              at_most=self.at_most)
        return f"{wrong} (or {self.off}: off)" if wrong and self.off is not None else wrong


@dataclass(frozen=True)
class Algorithm:
    """A registry entry, `--algo name`. Each algos/*.py file defines its entries in ALGORITHMS.

    preset       Config values it starts from (a YAML file and the command line override them)
    advantages   (scores [n_groups, G] of the whole global batch, cfg) -> advantages, same shape;
                 None: the loss reads no advantage (PACS classifies the labels instead)
    loss         (LossInputs of one micro-batch, cfg, totals) -> (loss, metrics), both already
                 divided by the mini-batch's global counts (totals: "seqs", "tokens", "max_len";
                 see policy_gradient.aggregate)
    knobs        every Knob it reads, its own and shared ones (policy_gradient.AGGREGATE_KNOBS, ...)
    refuses      knob name -> why it does not read it, added to that knob's error
    check        (cfg) -> "" or a message: a rule its knobs or the run must follow
    and what train.update must compute for it:
    group_baseline  the advantage compares each response with the rest of its group (its mean,
                 std or leave-one-out mean), so a group needs G ≥ 2 (config.batch_checks)
    vocab_mean   the loss reads vocab_mean and old_vocab_mean (ROVER)
    whole_groups every group sits whole inside one micro-batch (PACS compares a group's rows)
    response_tokens  advantages also gets tokens [n_groups, G], the tokens of each response the
                 loss trains on (REINFORCE++ whitens over the batch's tokens, not its responses)
    reward_terms advantages also gets the batch's episodes, whose details hold each reward term
                 (--reward-terms: GDPO normalises the terms apart)
    norm         (cfg) -> the settings (adv_norm, std_estimator, eps) of policy_gradient.advantages
                 that `advantages` applies, so that a turn credit rule (--turn-credit, algos/credit.py)
                 can apply them to each turn's rows of a group; None: the advantage is not a
                 group normalisation of rewards (NSR's ±1 labels, REINFORCE++'s token whitening, PACS),
                 or a response is one row (GSPO): it cannot take per-row advantages
    select_tokens  (tokens, cfg, generator) -> bool [N]: a choice of tokens that needs the whole
                 mini-batch (Clip-Cov, KL-Cov). tokens: flat [N] tensors of the mini-batch on all
                 ranks, response after response: logp at the current weights, old_logp, entropy,
                 adv, mask; the generator is seeded alike on every rank. The loss reads the choice
                 as LossInputs.selected (algos/select.py token_flags).
    """
    name: str
    preset: dict
    advantages: Callable | None
    loss: Callable
    knobs: tuple[Knob, ...] = ()
    refuses: dict = field(default_factory=dict)
    check: Callable | None = None
    group_baseline: bool = False
    vocab_mean: bool = False
    whole_groups: bool = False
    response_tokens: bool = False
    reward_terms: bool = False
    select_tokens: Callable | None = None
    norm: Callable | None = None


@dataclass
class LossInputs:
    """What a loss receives for one micro-batch: n rows (a response, or one chunk of a Markovian
    trace) × T response positions, response-aligned (docs/math.md §0). Built by train.loss_inputs."""
    logp: torch.Tensor  # [n, T] log π_θ of each taken token (float32, z/τ), with gradient
    old_logp: torch.Tensor  # [n, T] log π_old, no gradient
    mask: torch.Tensor  # [n, T] float, 1 on the tokens the loss trains on
    adv: torch.Tensor  # [n] the row's advantage: its response's, or its turn's (--turn-credit); 0 without advantages
    labels: torch.Tensor | None = None  # [n] 1.0 if the response is correct (score > 0), else 0.0 (PACS)
    group: torch.Tensor | None = None  # [n] group id: rows of one prompt share it
    seq_tokens: torch.Tensor | None = None  # [n] trained tokens of the row's whole response (its trace)
    entropy: torch.Tensor | None = None  # [n, T] entropy of π_θ at each position
    ref_logp: torch.Tensor | None = None  # [n, T] log π_ref, when cfg.beta > 0; --algo opd: the teacher's
    vocab_mean: torch.Tensor | None = None  # [n, T] M_θ: mean over the vocabulary of log π_θ (ROVER)
    old_vocab_mean: torch.Tensor | None = None  # [n, T] M_old, the same for π_old (ROVER)
    is_weight: torch.Tensor | None = None  # [n, T] sampler/trainer importance weight (rollout.sampler_correction)
    selected: torch.Tensor | None = None  # [n, T] bool, Algorithm.select_tokens's choice (Clip-Cov, KL-Cov)
    high_entropy: torch.Tensor | None = None  # [n, T] bool, --top-entropy-quantile's kept tokens; None: off


# the 80/20 rule's ρ (algos/high_entropy.py), a knob of every algorithm here; batch_wide reads it
TOP_ENTROPY_QUANTILE = Knob("top_entropy_quantile", 1.0, "ρ: policy loss only on the top ρ of tokens by entropy "
                            "(80/20 paper: 0.2); 1 = off", above=0, at_most=1)


def batch_wide(algo: Algorithm, cfg) -> bool:
    """Whether the run chooses tokens from the whole mini-batch before its first micro-batch (algos/select.py,
    which only such a run imports)."""
    return algo.select_tokens is not None or cfg.top_entropy_quantile < 1


def several_rows(cfg) -> bool:
    """Whether a response may be several training rows (a Markovian or a multi-turn trace), which a
    loss that scores a whole response in one row (PACS, GSPO) cannot take."""
    return cfg.max_chunks > 1 or bool(cfg.env)
