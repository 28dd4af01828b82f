"""Chunked float32 log-probs and entropy against a naive full log-softmax, row by row."""
import torch

from model import ResponseLogProbs, load_model
from rewards import Problem
from rollout import Episode, collate


def naive(lm, prompt, response, tau):
    ids = torch.tensor([prompt + response])
    z = lm(input_ids=ids).logits[0, len(prompt) - 1:-1].float() / tau  # predicts each response token
    logsm = torch.log_softmax(z, -1)
    logp = logsm.gather(-1, torch.tensor(response)[:, None]).squeeze(-1)
    entropy = -(logsm.exp() * logsm).sum(-1)
    return logp, entropy


def test_matches_naive_with_padding_and_chunks(random_model_dir):
    lm = load_model(random_model_dir)
    rows = [([5, 6, 7, 8], [9, 10, 1]), ([11, 12], [13, 14, 15, 16, 1]), ([17, 18, 19], [20])]
    eps = [Episode(prompt_ids=p, response_ids=r, text="", truncated=False, group=0,
                   problem=Problem("x", "0")) for p, r in rows]
    b = collate(eps, pad_id=0, device="cpu")
    scorer = ResponseLogProbs(lm, chunk=3)  # 9 tokens -> 3 chunks, each recomputed in backward
    out = scorer(b.input_ids, b.attention_mask, b.position_ids, b.response_mask, 0.7)
    logp, entropy = out["logp"], out["entropy"]
    assert logp.dtype == torch.float32 and logp.shape == (3, 5)
    assert (logp[b.response_mask == 0] == 0).all()
    grads_ours = torch.autograd.grad(logp.sum(), list(lm.parameters()))
    total = 0
    for i, (p, r) in enumerate(rows):
        ref_logp, ref_ent = naive(lm, p, r, 0.7)
        assert torch.allclose(logp[i, :len(r)], ref_logp, atol=1e-5)
        assert torch.allclose(entropy[i, :len(r)], ref_ent, atol=1e-5)
        total = total + ref_logp.sum()
    grads_ref = torch.autograd.grad(total, list(lm.parameters()))
    for a, b_ in zip(grads_ours, grads_ref):
        assert torch.allclose(a, b_, atol=1e-5)


def test_entropy_gradient_only_when_asked(random_model_dir):
    """An entropy bonus needs d(entropy)/dθ: it matches the naive full softmax, and without
    entropy_grad the entropy is a constant to autograd."""
    lm = load_model(random_model_dir)
    rows = [([5, 6], [9, 10, 1]), ([11, 12, 13], [14, 1])]
    eps = [Episode(prompt_ids=p, response_ids=r, text="", truncated=False, group=0,
                   problem=Problem("x", "0")) for p, r in rows]
    b = collate(eps, pad_id=0, device="cpu")
    args = (b.input_ids, b.attention_mask, b.position_ids, b.response_mask, 0.8)
    assert not ResponseLogProbs(lm)(*args)["entropy"].requires_grad
    entropy = ResponseLogProbs(lm, chunk=2)(*args, entropy_grad=True)["entropy"]
    ours = torch.autograd.grad(entropy.sum(), list(lm.parameters()))
    ref = torch.autograd.grad(sum(naive(lm, p, r, 0.8)[1].sum() for p, r in rows), list(lm.parameters()))
    for a, b_ in zip(ours, ref):
        assert torch.allclose(a, b_, atol=1e-5)
