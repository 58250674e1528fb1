"""Weighted quantiles, top-decile shares and weighted correlations (paper Sec. 3.1, D.1, D.2)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.aggregate import cluster_resample, prompt_bootstrap
from floorgap.estimators.concentration import (
    percentile_interval_finite,
    replicate_weights,
    top_share,
    weighted_bootstrap,
    weighted_correlation,
    weighted_quantile,
)

D = torch.float64


# -- weighted quantile ------------------------------------------------------------------------

def test_quantile_equal_weights_closed_forms():
    y = torch.tensor([5.0, 1.0, 3.0], dtype=D)
    assert float(weighted_quantile(y, torch.ones(3, dtype=D), 0.5)) == 3.0
    y4 = torch.tensor([4.0, 1.0, 3.0, 2.0], dtype=D)
    assert float(weighted_quantile(y4, torch.ones(4, dtype=D), 0.5)) == 2.5  # mean of middle two
    assert float(weighted_quantile(y4, torch.ones(4, dtype=D), 1.0)) == 4.0
    assert float(weighted_quantile(y4, torch.ones(4, dtype=D), 0.1)) == 1.0


def test_quantile_heavy_weight_dominates():
    y = torch.tensor([0.0, 1.0, 2.0], dtype=D)
    w = torch.tensor([1.0, 10.0, 1.0], dtype=D)
    assert float(weighted_quantile(y, w, 0.5)) == 1.0
    assert float(weighted_quantile(y, w, 0.9)) == 1.0
    assert float(weighted_quantile(y, w, 0.95)) == 2.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=2, max_size=12),
       st.sampled_from([0.1, 0.25, 0.5, 0.75, 0.9, 1.0]), st.integers(0, 10_000))
def test_quantile_matches_numpy_on_repeated_sample(counts, q, seed):
    """Integer weights = each value repeated; numpy's averaged inverted CDF is type 2."""
    if sum(counts) == 0:
        counts[0] = 1
    rng = np.random.default_rng(seed)
    y = np.round(rng.random(len(counts)), 2)  # ties allowed
    expanded = np.repeat(y, counts)
    expect = np.quantile(expanded, q, method="averaged_inverted_cdf")
    got = weighted_quantile(torch.tensor(y, dtype=D), torch.tensor(counts, dtype=D), q)
    assert float(got) == pytest.approx(float(expect), abs=1e-12)


def test_quantile_batched_and_scale_free():
    g = torch.Generator().manual_seed(0)
    y = torch.rand(9, dtype=D, generator=g)
    W = torch.rand(5, 9, dtype=D, generator=g)
    batched = weighted_quantile(y, W, 0.5)
    single = torch.stack([weighted_quantile(y, W[b], 0.5) for b in range(5)])
    torch.testing.assert_close(batched, single)
    torch.testing.assert_close(weighted_quantile(y, 7.0 * W, 0.5), batched)
    assert torch.isnan(weighted_quantile(y, torch.zeros(9, dtype=D), 0.5))


# -- top share --------------------------------------------------------------------------------

def test_top_share_closed_forms():
    y = torch.arange(1.0, 11.0, dtype=D)  # 1..10, total 55
    w = torch.ones(10, dtype=D)
    assert float(top_share(y, w, 0.1)) == pytest.approx(10 / 55)
    assert float(top_share(y, w, 0.2)) == pytest.approx(19 / 55)
    assert float(top_share(y, w, 0.15)) == pytest.approx((10 + 0.5 * 9) / 55)  # half an anchor
    assert float(top_share(y, w, 1.0)) == pytest.approx(1.0)
    assert float(top_share(torch.full((10,), 0.3, dtype=D), w, 0.1)) == pytest.approx(0.1)
    assert torch.isnan(top_share(torch.zeros(4, dtype=D), torch.ones(4, dtype=D)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 3), min_size=2, max_size=10), st.integers(0, 10_000))
def test_top_share_matches_repeated_sample(counts, seed):
    """Integer weights: the top decile of the repeated sample (size a multiple of 10)."""
    counts = [c * 10 for c in counts]
    if sum(counts) == 0:
        counts[0] = 10
    rng = np.random.default_rng(seed)
    y = rng.random(len(counts))
    expanded = np.sort(np.repeat(y, counts))[::-1]
    expect = expanded[: len(expanded) // 10].sum() / expanded.sum()
    got = top_share(torch.tensor(y, dtype=D), torch.tensor(counts, dtype=D), 0.1)
    assert float(got) == pytest.approx(float(expect), rel=1e-12)


# -- correlation ------------------------------------------------------------------------------

def test_correlation_equal_weights_matches_numpy_and_bounds():
    g = torch.Generator().manual_seed(1)
    x = torch.rand(20, dtype=D, generator=g)
    y = 2 * x + 0.1 * torch.rand(20, dtype=D, generator=g)
    w = torch.ones(20, dtype=D)
    assert float(weighted_correlation(x, y, w)) == pytest.approx(np.corrcoef(x, y)[0, 1], abs=1e-12)
    assert float(weighted_correlation(x, 3 * x + 1, w)) == pytest.approx(1.0)
    assert float(weighted_correlation(x, -x, w)) == pytest.approx(-1.0)
    assert torch.isnan(weighted_correlation(x, torch.full((20,), 0.2, dtype=D), w))


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=3, max_size=10), st.integers(0, 10_000))
def test_correlation_matches_repeated_sample(counts, seed):
    rng = np.random.default_rng(seed)
    x, y = rng.random(len(counts)), rng.random(len(counts))
    ex, ey = np.repeat(x, counts), np.repeat(y, counts)
    got = weighted_correlation(torch.tensor(x, dtype=D), torch.tensor(y, dtype=D),
                               torch.tensor(counts, dtype=D))
    if len(np.unique(ex)) < 2:
        assert torch.isnan(got)
    else:
        assert float(got) == pytest.approx(float(np.corrcoef(ex, ey)[0, 1]), abs=1e-10)


# -- bootstrap weights ------------------------------------------------------------------------

def test_replicate_weights_reproduce_prompt_bootstrap():
    g = torch.Generator().manual_seed(2)
    n = 30
    y = torch.rand(n, dtype=D, generator=g)
    pi = torch.rand(n, dtype=D, generator=g) * 0.5 + 0.1
    clusters = torch.randint(0, 11, (n,), generator=g)
    rs = cluster_resample(clusters, n_boot=400, seed=5)
    ref = prompt_bootstrap(y, clusters, pi, resample=rs, return_replicates=True)
    W = replicate_weights(rs, pi)
    torch.testing.assert_close((W * y).sum(-1) / W.sum(-1), ref.replicates)
    res = weighted_bootstrap(lambda w: (w * y).sum(-1) / w.sum(-1), rs, pi)
    torch.testing.assert_close(res.estimate, ref.estimate)
    torch.testing.assert_close(res.lower, ref.lower)
    torch.testing.assert_close(res.upper, ref.upper)


def test_constant_values_collapse_the_interval():
    y = torch.full((12,), 0.25, dtype=D)
    clusters = torch.arange(12) // 3
    rs = cluster_resample(clusters, n_boot=300, seed=1)
    res = weighted_bootstrap(lambda w: weighted_quantile(y, w, 0.5), rs)
    assert float(res.estimate) == float(res.lower) == float(res.upper) == 0.25


def test_finite_interval_skips_undefined_replicates():
    reps = torch.tensor([[1.0], [float("nan")], [2.0], [3.0]], dtype=D)
    lo, hi, n = percentile_interval_finite(reps, 0.5)
    assert int(n) == 3
    assert float(lo) == pytest.approx(1.5) and float(hi) == pytest.approx(2.5)
    lo, hi, n = percentile_interval_finite(torch.full((3, 2), float("nan"), dtype=D))
    assert torch.isnan(lo).all() and int(n.sum()) == 0
