"""Weighted distribution summaries across anchors (paper Sec. 3.1, App. D.1, D.2).

The floor statistics of Sec. 3.1 that are not means or ratios of Hajek sums: a Hajek-weighted
quantile (the median floor, the p90 of the effective support or of the K-median restart
spread), the share of a slot's total floor carried by the top decile of anchors, and the
Hajek-weighted Pearson correlation of two anchor-level quantities (log N_eff and T^(0)).

Every function takes the anchor values (``[n]``) and anchor weights ``[..., n]``: the point
estimate uses w_i = 1 / pi_i; a prompt-cluster bootstrap replicate b uses
w_bi = counts[b, prompt(i)] / pi_i (:func:`replicate_weights`), which is exactly the
replicate that :func:`floorgap.estimators.aggregate.prompt_bootstrap` forms for a Hajek mean.
Leading weight dimensions are batched, so all B replicates are one call.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from floorgap.estimators.aggregate import BootstrapResult, ClusterResample

__all__ = [
    "percentile_interval_finite",
    "replicate_weights",
    "top_share",
    "weighted_bootstrap",
    "weighted_correlation",
    "weighted_quantile",
]

#: Relative tolerance under which a cumulative weight share counts as hitting a quantile level.
_TIE_TOL = 1e-12


def _prepare(values: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    values = torch.as_tensor(values)
    if not values.is_floating_point():
        values = values.double()
    weights = torch.as_tensor(weights, dtype=values.dtype, device=values.device)
    if values.dim() != 1:
        raise ValueError("values must have shape [n]")
    if weights.shape[-1:] != values.shape:
        raise ValueError(f"weights must end in the anchor dimension {values.shape[0]}, "
                         f"got {tuple(weights.shape)}")
    if bool((weights < 0).any()) or not bool(torch.isfinite(weights).all()):
        raise ValueError("weights must be finite and non-negative")
    if not bool(torch.isfinite(values).all()):
        raise ValueError("values must be finite")
    return values, weights


def weighted_quantile(values: Tensor, weights: Tensor, q: float) -> Tensor:
    """Hajek-weighted quantile of ``values`` at level ``q`` in (0, 1].

    The weighted empirical CDF F puts mass w_i / sum(w) on y_i. The quantile is the smallest
    y with F(y) >= q, averaged with the next larger supported value when F hits q exactly
    (the averaged inverse CDF, Hyndman-Fan type 2, numpy's ``averaged_inverted_cdf``): equal
    weights give the usual median of an even-sized sample. ``weights``: ``[..., n]``;
    returns ``[...]`` (NaN where all weights are zero).

    Used for the median floor (paper Sec. 3.1), the p90 of the effective support (paper
    App. D.1) and the p90 of the K-median restart spread (paper App. D.2).

    Parameters
    ----------
    values : Tensor
        ``[n]`` finite anchor-level values y_i.
    weights : Tensor
        ``[..., n]`` non-negative anchor weights, e.g. 1 / pi_i or the rows of
        :func:`replicate_weights`.
    q : float
        Quantile level in (0, 1].

    Returns
    -------
    Tensor
        ``[...]`` weighted quantile for each row of weights; NaN where all weights are zero.
    """
    if not 0.0 < q <= 1.0:
        raise ValueError("q must lie in (0, 1]")
    values, weights = _prepare(values, weights)
    n = values.shape[0]
    order = torch.argsort(values)
    y = values[order]
    w = weights[..., order]
    total = w.sum(-1, keepdim=True)
    share = torch.cumsum(w, -1) / torch.where(total > 0, total, torch.ones_like(total))
    lead = share.shape[:-1]
    lo_level = torch.full(lead + (1,), q - _TIE_TOL, dtype=share.dtype, device=share.device)
    hi_level = torch.full(lead + (1,), q + _TIE_TOL, dtype=share.dtype, device=share.device)
    j_lo = torch.searchsorted(share.contiguous(), lo_level, side="left").clamp(max=n - 1)
    j_hi = torch.searchsorted(share.contiguous(), hi_level, side="right").clamp(max=n - 1)
    # Past the last positive weight (q = 1) j_hi would land on a zero-weight value: keep j_lo.
    w_hi = w.gather(-1, j_hi)
    j_hi = torch.where(w_hi > 0, j_hi, j_lo)
    out = 0.5 * (y[j_lo.squeeze(-1)] + y[j_hi.squeeze(-1)])
    return torch.where(total.squeeze(-1) > 0, out, torch.full_like(out, float("nan")))


def top_share(values: Tensor, weights: Tensor, frac: float = 0.1) -> Tensor:
    """Share of the weighted total sum_i w_i y_i carried by the top ``frac`` of anchor mass.

    Anchors are ranked by y (largest first) and taken until their weights make up ``frac`` of
    the total weight; the anchor on the boundary enters with the fraction of its weight that
    completes it (the Lorenz curve, read at 1 - frac). With n equal weights and frac = j/n
    this is the sum of the j largest values over the sum of all. ``values`` must be
    non-negative; returns ``[...]``, NaN where the weighted total is zero.

    This gives the share of a slot's total floor carried by the top decile of anchors
    (paper Sec. 3.1).

    Parameters
    ----------
    values : Tensor
        ``[n]`` non-negative anchor-level values y_i (e.g. the floor T_k^(0) per anchor).
    weights : Tensor
        ``[..., n]`` non-negative anchor weights.
    frac : float, optional
        Fraction of the total anchor weight counted as the top, in [0, 1].

    Returns
    -------
    Tensor
        ``[...]`` share in [0, 1] of sum_i w_i y_i carried by the top ``frac``; NaN where that
        total is zero.
    """
    if not 0.0 <= frac <= 1.0:
        raise ValueError("frac must lie in [0, 1]")
    values, weights = _prepare(values, weights)
    if bool((values < 0).any()):
        raise ValueError("top_share needs non-negative values")
    order = torch.argsort(values, descending=True)
    y = values[order]
    w = weights[..., order]
    total_w = w.sum(-1, keepdim=True)
    before = torch.cumsum(w, -1) - w  # weight ranked ahead of each anchor
    taken = torch.minimum((frac * total_w - before).clamp(min=0), w)
    top = (taken * y).sum(-1)
    total = (w * y).sum(-1)
    return torch.where(total > 0, top / torch.where(total > 0, total, torch.ones_like(total)),
                       torch.full_like(total, float("nan")))


def weighted_correlation(x: Tensor, y: Tensor, weights: Tensor) -> Tensor:
    """Hajek-weighted Pearson correlation of two anchor-level quantities.

    r = sum w (x - mx)(y - my) / sqrt(sum w (x - mx)^2 * sum w (y - my)^2) with weighted
    means mx, my; integer weights give the correlation of the sample with each anchor repeated
    w_i times. ``weights``: ``[..., n]``; returns ``[...]``, NaN where either quantity is
    constant under the weights.

    Used for the correlation of log N_eff with T^(0) across anchors (paper App. D.1).

    Parameters
    ----------
    x : Tensor
        ``[n]`` first anchor-level quantity (finite).
    y : Tensor
        ``[n]`` second anchor-level quantity (finite).
    weights : Tensor
        ``[..., n]`` non-negative anchor weights.

    Returns
    -------
    Tensor
        ``[...]`` weighted Pearson correlation in [-1, 1]; NaN where it is undefined.
    """
    x, weights = _prepare(x, weights)
    y, _ = _prepare(torch.as_tensor(y, dtype=x.dtype), weights)
    if x.shape != y.shape:
        raise ValueError("x and y must have the same shape")
    total = weights.sum(-1, keepdim=True)
    safe = torch.where(total > 0, total, torch.ones_like(total))
    dx = x - (weights * x).sum(-1, keepdim=True) / safe
    dy = y - (weights * y).sum(-1, keepdim=True) / safe
    sxy = (weights * dx * dy).sum(-1)
    sxx = (weights * dx * dx).sum(-1)
    syy = (weights * dy * dy).sum(-1)
    den = torch.sqrt(sxx * syy)
    # A spread below rounding level (e.g. a constant column) leaves the correlation undefined.
    scale = (weights * (x * x)).sum(-1) * (weights * (y * y)).sum(-1)
    ok = den > 1e-12 * torch.sqrt(scale).clamp(min=torch.finfo(x.dtype).tiny)
    r = sxy / torch.where(ok, den, torch.ones_like(den))
    return torch.where(ok, r.clamp(-1.0, 1.0), torch.full_like(r, float("nan")))


def replicate_weights(resample: ClusterResample, pi: Tensor | None = None) -> Tensor:
    """``[B, n]`` anchor weights of the prompt-bootstrap replicates: counts[b, prompt(i)] / pi_i.

    A Hajek mean with these weights equals the replicate of
    :func:`~floorgap.estimators.aggregate.prompt_bootstrap` drawn from the same ``resample``.

    Replicates follow the prompt bootstrap of paper App. B.2.

    Parameters
    ----------
    resample : ClusterResample
        The prompt-resampling count matrix and the anchor-to-prompt index.
    pi : Tensor or None, optional
        ``[n]`` positive inclusion probabilities pi_i; ``None`` means pi_i = 1.

    Returns
    -------
    Tensor
        ``[B, n]`` float64 weights counts[b, prompt(i)] / pi_i.
    """
    counts = resample.counts.to(torch.float64)
    w = counts[:, resample.index.to(counts.device)]
    if pi is not None:
        pi = torch.as_tensor(pi, dtype=w.dtype, device=w.device)
        if pi.shape != (w.shape[1],):
            raise ValueError(f"pi must have shape ({w.shape[1]},)")
        if not bool((pi > 0).all()):
            raise ValueError("inclusion probabilities must be positive")
        w = w / pi
    return w


def percentile_interval_finite(replicates: Tensor, level: float = 0.95
                               ) -> tuple[Tensor, Tensor, Tensor]:
    """Equal-tailed percentile interval over dim 0, using only the finite replicates.

    A replicate can be undefined (a resample with no anchor in a subset, a constant column in
    a correlation); those are left out and counted. Same interpolation as
    :func:`~floorgap.estimators.aggregate.percentile_interval`. Returns ``(lower, upper,
    n_finite)`` with the trailing shape of the statistic; NaN bounds where nothing is finite.

    The interval is the percentile interval of paper App. B.2, as reported in paper
    App. C.8 and for the distribution summaries of paper App. D.1 and D.2.

    Parameters
    ----------
    replicates : Tensor
        ``[B, ...]`` bootstrap replicates, possibly with non-finite entries.
    level : float, optional
        Coverage level in (0, 1).

    Returns
    -------
    lower : Tensor
        ``[...]`` lower percentile of the finite replicates (NaN where none is finite).
    upper : Tensor
        ``[...]`` upper percentile of the finite replicates (NaN where none is finite).
    n_finite : Tensor
        ``[...]`` int64 count of finite replicates.
    """
    if not 0.0 < level < 1.0:
        raise ValueError("level must lie in (0, 1)")
    flat = replicates.reshape(replicates.shape[0], -1)
    alpha = (1.0 - level) / 2.0
    lo = torch.full(flat.shape[1:], float("nan"), dtype=flat.dtype)
    hi = lo.clone()
    n_finite = torch.zeros(flat.shape[1:], dtype=torch.long)
    for j in range(flat.shape[1]):
        col = flat[:, j]
        col = torch.sort(col[torch.isfinite(col)]).values
        b = col.numel()
        n_finite[j] = b
        if b == 0:
            continue

        def at(q: float, col: Tensor = col, b: int = b) -> Tensor:
            h = (b - 1) * q
            i = int(h // 1)
            k = min(i + 1, b - 1)
            return col[i] + (col[k] - col[i]) * (h - i)

        lo[j], hi[j] = at(alpha), at(1.0 - alpha)
    shape = replicates.shape[1:]
    return lo.reshape(shape), hi.reshape(shape), n_finite.reshape(shape)


def weighted_bootstrap(stat: Callable[[Tensor], Tensor], resample: ClusterResample,
                       pi: Tensor | None = None, *, level: float = 0.95) -> BootstrapResult:
    """Prompt-cluster percentile bootstrap of any statistic of the anchor weights.

    ``stat(weights)`` maps ``[..., n]`` anchor weights to ``[..., *shape]`` (e.g.
    ``lambda w: weighted_quantile(y, w, 0.5)``). The estimate uses w = 1 / pi; the replicates
    use :func:`replicate_weights`. Undefined replicates are left out of the interval
    (:func:`percentile_interval_finite`). The result shares ``resample``'s seed, so it pairs
    with every other statistic drawn from it.

    This is the prompt bootstrap of paper App. B.2 applied to the statistics of paper
    Sec. 3.1 and App. D.1, D.2 that are not Hajek means or ratios.

    Parameters
    ----------
    stat : Callable[[Tensor], Tensor]
        Statistic of the anchor weights, mapping ``[..., n]`` to ``[..., *shape]``.
    resample : ClusterResample
        The prompt-resampling count matrix; its seed pairs the result with other statistics.
    pi : Tensor or None, optional
        ``[n]`` inclusion probabilities pi_i; ``None`` means equal weights.
    level : float, optional
        Coverage level in (0, 1).

    Returns
    -------
    BootstrapResult
        ``estimate`` ``[*shape]``, the percentile interval ``lower`` / ``upper`` over the
        finite replicates, ``replicates`` ``[B, *shape]`` and the resample's ``seed``,
        ``n_boot`` and ``n_clusters``.
    """
    n = resample.index.shape[0]
    base = torch.ones(n, dtype=torch.float64)
    if pi is not None:
        base = base / torch.as_tensor(pi, dtype=torch.float64)
    estimate = stat(base)
    reps = stat(replicate_weights(resample, pi))
    lo, hi, _ = percentile_interval_finite(reps, level)
    return BootstrapResult(estimate=estimate, lower=lo, upper=hi, level=level, replicates=reps,
                           seed=resample.seed, n_boot=resample.n_boot,
                           n_clusters=resample.n_clusters)
