"""Divergences against a target known through its top-K (floorgap.estimators.topk)."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.barycentre import tv_distance
from floorgap.estimators.topk import logsumexp_gather, topk_divergences


def _pair(seed: int, v: int, rows: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, v, generator=g, dtype=torch.float64) * 2
    p = torch.softmax(torch.randn(rows, v, generator=g, dtype=torch.float64) * 2, -1)
    return logits, p


def test_full_support_gives_the_full_kl_and_tv() -> None:
    """K = V: no residual bucket, so both equal the textbook divergences."""
    logits, p = _pair(0, 11)
    vals, ids = p.sort(-1, descending=True)
    div = topk_divergences(logits, ids, vals)
    q = torch.softmax(logits, -1)
    kl = (p * (p.log() - q.log())).sum(-1)
    torch.testing.assert_close(div["kl"].double(), kl, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(div["tv"].double(), tv_distance(p, q, dim=-1), atol=1e-6, rtol=0)


def test_two_bucket_closed_form() -> None:
    """V = 3, K = 1: the coarsened pair is Bernoulli, whose KL and TV are closed forms."""
    logits = torch.tensor([[0.0, math.log(2.0), math.log(3.0)]])       # q = (1/6, 2/6, 3/6)
    ids, vals = torch.tensor([[2]]), torch.tensor([[0.25]])            # p(2) = 1/4, rest 3/4
    div = topk_divergences(logits, ids, vals)
    a, b = 0.25, 0.5
    kl = a * math.log(a / b) + (1 - a) * math.log((1 - a) / (1 - b))
    assert abs(float(div["kl"]) - kl) < 1e-6
    assert abs(float(div["tv"]) - abs(a - b)) < 1e-6


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), v=st.integers(3, 30), k=st.integers(1, 30))
def test_coarsening_never_exceeds_the_full_divergences(seed: int, v: int, k: int) -> None:
    """Merging tokens into one bucket can only shrink KL and TV (data processing)."""
    k = min(k, v)
    logits, p = _pair(seed, v)
    vals, ids = p.topk(k, dim=-1)
    div = topk_divergences(logits, ids, vals)
    q = torch.softmax(logits, -1)
    kl = (p * (p.log() - q.log())).sum(-1)
    # the divergences are computed in float32: allow its rounding
    assert (div["kl"].double() <= kl * (1 + 1e-5) + 1e-5).all()
    assert (div["tv"].double() <= tv_distance(p, q, dim=-1) + 1e-5).all()
    assert (div["tv"] >= -1e-7).all() and (div["kl"] >= -1e-6).all()


def test_gradient_of_the_kl_is_q_minus_p_on_full_support() -> None:
    """An independent check of the objective: d KL(p || softmax(l)) / d l = q - p."""
    logits, p = _pair(3, 7, rows=1)
    logits = logits.float().requires_grad_(True)
    vals, ids = p.float().sort(-1, descending=True)
    topk_divergences(logits, ids, vals)["kl"].sum().backward()
    torch.testing.assert_close(logits.grad, torch.softmax(logits.detach(), -1) - p.float(),
                               atol=1e-5, rtol=1e-4)


def test_logsumexp_gather_matches_autograd_in_value_and_gradient() -> None:
    """The fused function against torch.logsumexp and gather differentiated by autograd, with
    upstream gradients on both outputs (the normaliser and the picked logits)."""
    g = torch.Generator().manual_seed(5)
    logits = (torch.randn(2, 3, 50, generator=g) * 4).requires_grad_(True)
    ids = torch.stack([torch.randperm(50, generator=g)[:6] for _ in range(6)]).view(2, 3, 6)
    up_lse, up_pick = torch.randn(2, 3, generator=g), torch.randn(2, 3, 6, generator=g)
    lse, picked = logsumexp_gather(logits, ids)
    (grad,) = torch.autograd.grad((lse * up_lse).sum() + (picked * up_pick).sum(), logits)
    ref_lse, ref_pick = torch.logsumexp(logits, -1), logits.gather(-1, ids)
    (ref,) = torch.autograd.grad((ref_lse * up_lse).sum() + (ref_pick * up_pick).sum(), logits)
    torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-6)
    torch.testing.assert_close(picked, ref_pick)
    torch.testing.assert_close(grad, ref, atol=1e-6, rtol=1e-5)


def test_logsumexp_gather_reads_low_precision_logits_in_float32() -> None:
    """bf16 logits: the outputs are float32 values of the same bf16 numbers, and the gradient
    comes back in bf16 as the float32 gradient rounded once."""
    g = torch.Generator().manual_seed(9)
    logits = (torch.randn(4, 300, generator=g) * 3).bfloat16().requires_grad_(True)
    ids = torch.stack([torch.randperm(300, generator=g)[:8] for _ in range(4)])
    lse, picked = logsumexp_gather(logits, ids)
    assert lse.dtype == picked.dtype == torch.float32
    wide = logits.detach().float().requires_grad_(True)
    torch.testing.assert_close(lse, torch.logsumexp(wide, -1), atol=1e-5, rtol=1e-6)
    lse.sum().backward()
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
    torch.testing.assert_close(logits.grad, torch.softmax(wide.detach(), -1).bfloat16())


def test_gradient_of_the_coarsened_kl_in_closed_form() -> None:
    """With a residual bucket the gradient is q_j - p_j on the stored tokens and
    q_j (1 - r_p / r_q) elsewhere (derived by hand from the two-bucket KL)."""
    logits, p = _pair(11, 9, rows=2)
    logits = logits.float().requires_grad_(True)
    vals, ids = p.float().topk(4, dim=-1)
    topk_divergences(logits, ids, vals)["kl"].sum().backward()
    q = torch.softmax(logits.detach(), -1)
    r_p = 1 - vals.sum(-1, keepdim=True)
    r_q = 1 - q.gather(-1, ids).sum(-1, keepdim=True)
    expected = q * (1 - r_p / r_q)
    expected.scatter_(-1, ids, q.gather(-1, ids) - vals)
    torch.testing.assert_close(logits.grad, expected, atol=1e-6, rtol=1e-4)


def test_a_trimmed_support_charges_the_mass_outside_it() -> None:
    """q on a draft vocabulary D (logits over D, ids mapped into D, ``valid`` marking the
    stored tokens inside it): with the whole of p stored, TV equals the dense TV against q
    scattered into the full vocabulary with zeros outside D, and KL is infinite when p has
    mass outside D."""
    v, draft = 13, torch.tensor([0, 2, 3, 7, 8, 12])
    g = torch.Generator().manual_seed(4)
    logits_d = torch.randn(2, len(draft), generator=g, dtype=torch.float64)
    p = torch.softmax(torch.randn(2, v, generator=g, dtype=torch.float64), -1)
    vals, ids = p.sort(-1, descending=True)
    t2d = torch.full((v,), -1, dtype=torch.long)
    t2d[draft] = torch.arange(len(draft))
    mapped = t2d[ids]
    div = topk_divergences(logits_d, mapped.clamp_min(0), vals, mapped >= 0)
    q = torch.zeros(2, v, dtype=torch.float64)
    q[:, draft] = torch.softmax(logits_d, -1)
    torch.testing.assert_close(div["tv"].double(), tv_distance(p, q, dim=-1), atol=1e-6, rtol=0)
    assert torch.isinf(div["kl"]).all()
    # p restricted to D and renormalised: the KL is finite and the textbook one
    inside = torch.where(mapped >= 0, vals, torch.zeros_like(vals))
    p_d = inside / inside.sum(-1, keepdim=True)
    div_d = topk_divergences(logits_d, mapped.clamp_min(0), p_d, mapped >= 0)
    pd_dense = p[:, draft] / p[:, draft].sum(-1, keepdim=True)
    qd = torch.softmax(logits_d, -1)
    kl = (pd_dense * (pd_dense.log() - qd.log())).sum(-1)
    torch.testing.assert_close(div_d["kl"].double(), kl, atol=1e-5, rtol=1e-5)
