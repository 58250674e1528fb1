"""Hajek aggregation and the prompt-cluster percentile bootstrap (paper App. B.2)."""


import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.estimators.aggregate import (
    bootstrap_transform,
    cluster_index,
    cluster_resample,
    hajek_mean,
    paired_difference,
    percentile_interval,
    prompt_bootstrap,
    weighted_ratio,
)

D = torch.float64


def _data(n_anchors=40, n_prompts=15, n_stats=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.rand(n_anchors, n_stats, dtype=D, generator=g)
    pi = torch.rand(n_anchors, dtype=D, generator=g) * 0.9 + 0.05
    clusters = torch.randint(0, n_prompts, (n_anchors,), generator=g)
    return y, pi, clusters


def test_hajek_mean_formula():
    y, pi, _ = _data()
    expect = (y / pi[:, None]).sum(0) / (1 / pi).sum()
    torch.testing.assert_close(hajek_mean(y, pi), expect)
    torch.testing.assert_close(hajek_mean(y), y.mean(0))


def test_weighted_ratio_and_hajek_special_case():
    y, pi, _ = _data()
    den = torch.rand(y.shape[0], 1, dtype=D) + 0.5
    torch.testing.assert_close(weighted_ratio(y, den, pi), (y / pi[:, None]).sum(0) / (den[:, 0] / pi).sum())
    torch.testing.assert_close(weighted_ratio(y, torch.ones(1, dtype=D), pi), hajek_mean(y, pi))


def test_counts_rows_sum_to_prompts_and_are_deterministic():
    _, _, clusters = _data()
    rs = cluster_resample(clusters, n_boot=500, seed=7)
    n_prompts = int(torch.unique(clusters).numel())
    assert rs.counts.shape == (500, n_prompts)
    assert torch.all(rs.counts.sum(1) == n_prompts)
    again = cluster_resample(clusters, n_boot=500, seed=7)
    assert torch.equal(rs.counts, again.counts)
    other = cluster_resample(clusters, n_boot=500, seed=8)
    assert not torch.equal(rs.counts, other.counts)


def test_replicates_match_explicit_resampling():
    """The count-matrix replicate equals recomputing the statistic on the resampled anchors."""
    y, pi, clusters = _data(n_anchors=25, n_prompts=9, n_stats=2)
    den = torch.rand(25, 2, dtype=D) + 0.1
    res = prompt_bootstrap(y, clusters, pi, den=den, n_boot=50, seed=3, return_replicates=True)
    rs = cluster_resample(clusters, n_boot=50, seed=3)
    idx, _ = cluster_index(clusters)
    for b in range(5):
        counts = rs.counts[b]
        mult = counts[idx]  # anchors of a prompt drawn c times appear c times
        num = (mult[:, None] * y / pi[:, None]).sum(0)
        dd = (mult[:, None] * den / pi[:, None]).sum(0)
        torch.testing.assert_close(res.replicates[b], num / dd)
    torch.testing.assert_close(res.estimate, weighted_ratio(y, den, pi))


def test_string_prompt_ids():
    y, pi, clusters = _data()
    names = [f"gsm8k:{int(c):04d}" for c in clusters]
    a = prompt_bootstrap(y, names, pi, n_boot=300, seed=1)
    b = prompt_bootstrap(y, clusters, pi, n_boot=300, seed=1)
    torch.testing.assert_close(a.lower, b.lower)
    torch.testing.assert_close(a.upper, b.upper)


def test_percentile_matches_numpy():
    x = torch.randn(1001, 4, dtype=D, generator=torch.Generator().manual_seed(0))
    lo, hi = percentile_interval(x, 0.9)
    np.testing.assert_allclose(lo.numpy(), np.percentile(x.numpy(), 5, axis=0))
    np.testing.assert_allclose(hi.numpy(), np.percentile(x.numpy(), 95, axis=0))


def test_paired_difference_and_transform():
    y, pi, clusters = _data(n_stats=4)
    r = prompt_bootstrap(y[:, :2], clusters, pi, n_boot=400, seed=5, return_replicates=True)
    t = prompt_bootstrap(y[:, 2:], clusters, pi, n_boot=400, seed=5, return_replicates=True)
    diff = paired_difference(r, t)
    direct = prompt_bootstrap(y[:, :2] - y[:, 2:], clusters, pi, n_boot=400, seed=5, return_replicates=True)
    # same Hajek denominators, so the paired difference is the bootstrap of the difference
    torch.testing.assert_close(diff.replicates, direct.replicates)
    torch.testing.assert_close(diff.lower, direct.lower)
    ratio = bootstrap_transform(torch.div, r, t)
    torch.testing.assert_close(ratio.estimate, r.estimate / t.estimate)
    unpaired = prompt_bootstrap(y[:, 2:], clusters, pi, n_boot=400, seed=6, return_replicates=True)
    with pytest.raises(ValueError):
        paired_difference(r, unpaired)


def test_result_unpacks_and_level():
    y, pi, clusters = _data()
    est, lo, hi = prompt_bootstrap(y, clusters, pi, n_boot=500, seed=2, level=0.8)
    wide = prompt_bootstrap(y, clusters, pi, n_boot=500, seed=2, level=0.99)
    assert torch.all(lo <= est) and torch.all(est <= hi)
    assert torch.all(wide.lower <= lo) and torch.all(wide.upper >= hi)


def test_headline_size_runs_in_one_call():
    """384 anchors x 7 slots x B = 10^4 in one vectorised call (timing: floorgap bench)."""
    g = torch.Generator().manual_seed(0)
    y = torch.rand(384, 7, dtype=D, generator=g)
    pi = torch.rand(384, dtype=D, generator=g) + 0.1
    clusters = torch.randint(0, 170, (384,), generator=g)
    res = prompt_bootstrap(y, clusters, pi, n_boot=10_000, seed=0, return_replicates=True)
    assert res.replicates.shape == (10_000, 7)
    assert torch.all(res.lower <= res.estimate) and torch.all(res.estimate <= res.upper)


# ------------------------------------------------------------------------------ properties

finite = st.floats(min_value=-5, max_value=5, allow_nan=False)


@settings(max_examples=40, deadline=None)
@given(
    ys=st.lists(finite, min_size=2, max_size=12),
    scale=st.floats(min_value=1e-3, max_value=1e3),
    seed=st.integers(0, 1000),
)
def test_hajek_invariant_to_scaling_pi(ys, scale, seed):
    y = torch.tensor(ys, dtype=D)
    pi = torch.rand(len(ys), dtype=D, generator=torch.Generator().manual_seed(seed)) + 0.01
    torch.testing.assert_close(hajek_mean(y, pi * scale), hajek_mean(y, pi))
    clusters = torch.arange(len(ys)) // 2
    a = prompt_bootstrap(y, clusters, pi, n_boot=200, seed=seed)
    b = prompt_bootstrap(y, clusters, pi * scale, n_boot=200, seed=seed)
    torch.testing.assert_close(a.lower, b.lower)
    torch.testing.assert_close(a.upper, b.upper)


@settings(max_examples=40, deadline=None)
@given(n=st.integers(2, 20), seed=st.integers(0, 1000))
def test_permutation_invariance(n, seed):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(n, 3, dtype=D, generator=g)
    pi = torch.rand(n, dtype=D, generator=g) + 0.05
    clusters = torch.randint(0, max(1, n // 2), (n,), generator=g)
    perm = torch.randperm(n, generator=g)
    a = prompt_bootstrap(y, clusters, pi, n_boot=300, seed=seed, return_replicates=True)
    b = prompt_bootstrap(y[perm], clusters[perm], pi[perm], n_boot=300, seed=seed, return_replicates=True)
    torch.testing.assert_close(a.estimate, b.estimate)
    torch.testing.assert_close(a.replicates, b.replicates)


@settings(max_examples=30, deadline=None)
@given(ys=st.lists(finite, min_size=2, max_size=15), seed=st.integers(0, 1000))
def test_one_anchor_per_prompt_equal_pi_is_ordinary_bootstrap(ys, seed):
    y = torch.tensor(ys, dtype=D)
    n = len(ys)
    res = prompt_bootstrap(y, torch.arange(n), torch.full((n,), 0.3, dtype=D), n_boot=300, seed=seed,
                           return_replicates=True)
    counts = cluster_resample(torch.arange(n), n_boot=300, seed=seed).counts
    # ordinary bootstrap: the mean of n draws with replacement
    torch.testing.assert_close(res.replicates, counts @ y / n)
    torch.testing.assert_close(res.estimate, y.mean())


# ------------------------------------------------------------------------------ coverage


def _clustered_population_sample(g: torch.Generator, n_prompts: int):
    """Prompts iid; 3 position strata per prompt with 10 positions each, Poisson-sampled.

    Stratum means differ and sampling rates differ, so the unweighted mean is biased and the
    Hajek mean targets the population mean (0 + 1 + 3) / 3 = 4/3.  Prompt random effects make
    anchors of a prompt dependent.
    """
    mu = torch.tensor([0.0, 1.0, 3.0], dtype=D)
    rate = torch.tensor([0.05, 0.15, 0.4], dtype=D)
    effect = torch.randn(n_prompts, dtype=D, generator=g)
    stratum = torch.arange(3).repeat_interleave(10).repeat(n_prompts)
    prompt = torch.arange(n_prompts).repeat_interleave(30)
    keep = torch.rand(stratum.shape, dtype=D, generator=g) < rate[stratum]
    y = mu[stratum] + effect[prompt] + 0.5 * torch.randn(stratum.shape, dtype=D, generator=g)
    return y[keep], rate[stratum][keep], prompt[keep]


def test_bootstrap_coverage():
    g = torch.Generator().manual_seed(2026)
    truth = 4.0 / 3.0
    hits = 0
    n_sets = 200
    for rep in range(n_sets):
        y, pi, prompt = _clustered_population_sample(g, 60)
        res = prompt_bootstrap(y, prompt, pi, n_boot=2000, seed=rep)
        hits += int(res.lower <= truth <= res.upper)
    coverage = hits / n_sets
    assert 0.88 <= coverage <= 0.99, coverage
