"""Risks, gaps, exposure and sampling-law warps (paper Secs. 2, 3.3, B.5, C.7)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.risk import (
    acceptance,
    anchor_risk,
    decompose_self_risk,
    exposure,
    model_gap,
    oracle_risk,
    self_risk,
    tv_distance,
    warp_logits,
    warp_probs,
)

D = torch.float64


def _rows(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(*shape, dtype=D, generator=g) * 2, dim=-1)


def test_tv_basic():
    p = torch.tensor([1.0, 0.0, 0.0], dtype=D)
    q = torch.tensor([0.0, 0.5, 0.5], dtype=D)
    assert tv_distance(p, q).item() == 1.0
    assert tv_distance(p, p).item() == 0.0
    a, b = _rows(5, 7), _rows(5, 7, seed=1)
    torch.testing.assert_close(acceptance(a, b), 1 - tv_distance(a, b))


def test_anchor_risk_is_path_mean_of_tv():
    p = _rows(3, 16, 11)  # anchors x paths x vocab
    q = _rows(3, 16, 11, seed=1)
    r = anchor_risk(p, q)
    assert r.shape == (3,)
    torch.testing.assert_close(r, tv_distance(p, q).mean(-1))
    # an order-0 proposal shared by all paths broadcasts
    q0 = _rows(3, 1, 11, seed=2)
    torch.testing.assert_close(anchor_risk(p, q0), tv_distance(p, q0.expand_as(p)).mean(-1))
    # paths on another dim
    torch.testing.assert_close(anchor_risk(p.transpose(0, 1), q.transpose(0, 1), path_dim=0), r)
    torch.testing.assert_close(oracle_risk(p, q), r)
    torch.testing.assert_close(self_risk(p, q), r)
    with pytest.raises(ValueError):
        anchor_risk(p, q, path_dim=-1)


def test_decomposition_identity():
    g = torch.Generator().manual_seed(0)
    floor = torch.rand(10, 7, dtype=D, generator=g) * 0.1
    r_oracle = floor + torch.rand(10, 7, dtype=D, generator=g) * 0.3
    r_self = r_oracle + torch.rand(10, 7, dtype=D, generator=g) * 0.2
    dec = decompose_self_risk(r_self, r_oracle, floor)
    torch.testing.assert_close(dec.total, r_self)
    torch.testing.assert_close(dec.floor + dec.gap + dec.exposure, r_self)
    torch.testing.assert_close(dec.gap, model_gap(r_oracle, floor))
    torch.testing.assert_close(dec.exposure, exposure(r_self, r_oracle))


def test_warp_identity_is_softmax():
    logits = torch.randn(4, 50, dtype=D)
    torch.testing.assert_close(warp_logits(logits), torch.softmax(logits, -1))
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(warp_probs(p), p)


def test_warp_temperature():
    logits = torch.randn(3, 20, dtype=D)
    torch.testing.assert_close(warp_logits(logits, temperature=0.7), torch.softmax(logits / 0.7, -1))
    torch.testing.assert_close(warp_probs(torch.softmax(logits, -1), temperature=0.7),
                               torch.softmax(logits / 0.7, -1))


def test_warp_top_k_and_top_p():
    p = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]], dtype=D)
    logits = p.log()
    k2 = warp_logits(logits, top_k=2)
    torch.testing.assert_close(k2, torch.tensor([[5 / 7, 2 / 7, 0, 0, 0]], dtype=D))
    # nucleus 0.8: 0.5 + 0.2 = 0.7 < 0.8 so the third token is still needed
    p8 = warp_probs(p, top_p=0.8)
    torch.testing.assert_close(p8, torch.tensor([[0.5, 0.2, 0.15, 0, 0]], dtype=D) / 0.85)
    p7 = warp_probs(p, top_p=0.7)
    torch.testing.assert_close(p7, torch.tensor([[0.5, 0.2, 0, 0, 0]], dtype=D) / 0.7)
    # the top token is always kept
    torch.testing.assert_close(warp_probs(p, top_p=0.1), torch.tensor([[1.0, 0, 0, 0, 0]], dtype=D))
    # training law of C.7: temperature 0.7, top-p 0.8, top-k 20 on logits and probs agree
    logits = torch.randn(6, 40, dtype=D)
    a = warp_logits(logits, 0.7, 0.8, 20)
    b = warp_probs(torch.softmax(logits, -1), 0.7, 0.8, 20)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(a.sum(-1), torch.ones(6, dtype=D))
    assert int((a > 0).sum(-1).max()) <= 20


def test_warp_rejects_bad_law():
    with pytest.raises(ValueError):
        warp_logits(torch.zeros(3), temperature=0.0)
    with pytest.raises(ValueError):
        warp_logits(torch.zeros(3), top_p=0.0)


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), v=st.integers(2, 30))
def test_tv_is_a_metric_bounded_by_one(seed, v):
    a, b, c = _rows(v, seed=seed), _rows(v, seed=seed + 1), _rows(v, seed=seed + 2)
    ab, bc, ac = tv_distance(a, b), tv_distance(b, c), tv_distance(a, c)
    assert 0 <= ab <= 1
    assert ac <= ab + bc + 1e-12
    torch.testing.assert_close(ab, tv_distance(b, a))
