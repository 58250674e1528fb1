"""Anchor aggregation and the prompt-cluster percentile bootstrap (paper App. B.2).

Anchor-level values y_i are combined with Hajek weights 1/pi_i, where pi_i is the anchor's
inclusion probability:

    y_bar = sum_i y_i / pi_i  /  sum_i 1 / pi_i.

Every reported quantity that is a ratio (G/R, shares of the floor removed, R^serve, rho_{k,m})
is a ratio of two Hajek-weighted population sums, sum_i num_i / pi_i over sum_i den_i / pi_i;
the Hajek mean is the special case den_i = 1.

Uncertainty comes from resampling *prompts* with replacement: all anchors of a drawn prompt
move together, which keeps the dependence among anchors of one prompt.  A replicate is fully
described by how often each prompt was drawn, so B replicates are one (B x n_prompts) count
matrix C, and the replicate sums of any statistic are C @ (per-prompt sums).  Numerator and
denominator of a ratio are resampled with the same counts, and any two statistics computed
with the same seed share their replicates, so paired contrasts (R - T, R^serve - R) are
formed replicate by replicate.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = [
    "BootstrapResult",
    "ClusterResample",
    "bootstrap_transform",
    "cluster_index",
    "cluster_resample",
    "cluster_sums",
    "hajek_mean",
    "paired_difference",
    "percentile_interval",
    "prompt_bootstrap",
    "weighted_ratio",
]

DEFAULT_N_BOOT = 10_000
DEFAULT_BOOT_SEED = 20260818


def _as_2d(x: Tensor) -> tuple[Tensor, tuple[int, ...]]:
    """View anchors x statistics; remember the trailing statistic shape."""
    trailing = tuple(x.shape[1:])
    return x.reshape(x.shape[0], -1), trailing


def _inverse_pi(pi: Tensor | None, n: int, like: Tensor) -> Tensor:
    if pi is None:
        return torch.ones(n, dtype=like.dtype, device=like.device)
    pi = torch.as_tensor(pi, dtype=like.dtype, device=like.device)
    if pi.shape != (n,):
        raise ValueError(f"pi must have shape ({n},), got {tuple(pi.shape)}")
    if not bool(torch.all(pi > 0)):
        raise ValueError("inclusion probabilities must be positive")
    return 1.0 / pi


def hajek_mean(y: Tensor, pi: Tensor | None = None) -> Tensor:
    """Hajek mean over anchors (paper App. B.2): sum_i y_i/pi_i / sum_i 1/pi_i.

    ``y`` has anchors on dim 0 and any number of statistic dims after it; ``pi`` has shape
    (n_anchors,).  ``pi=None`` means equal inclusion probabilities (the plain mean).

    Parameters
    ----------
    y : Tensor
        Anchor-level values y_i, shape ``[n_anchors, ...]`` (e.g. ``[n_anchors, gamma]`` for
        one value per slot).
    pi : Tensor or None, optional
        Inclusion probabilities pi_i of the anchors, shape ``[n_anchors]``, all positive.
        ``None`` gives every anchor the same weight.

    Returns
    -------
    Tensor
        The Hajek mean of each statistic, with the trailing shape ``[...]`` of ``y``.
    """
    w = _inverse_pi(pi, y.shape[0], y).reshape((-1,) + (1,) * (y.dim() - 1))
    return (y * w).sum(0) / w.sum(0)


def weighted_ratio(num: Tensor, den: Tensor, pi: Tensor | None = None) -> Tensor:
    """Ratio of Hajek-weighted population sums: sum_i num_i/pi_i / sum_i den_i/pi_i.

    Used for G/R, shares of the floor removed, R^serve_k (num = E[W_{k-1} TV_k],
    den = E[W_{k-1}] per anchor) and rho_{k,m} (paper eq. for rho-hat in App. B.2).
    ``den`` broadcasts against ``num``.

    Parameters
    ----------
    num : Tensor
        Per-anchor numerators num_i, shape ``[n_anchors, ...]``.
    den : Tensor
        Per-anchor denominators den_i, broadcastable to the shape of ``num``.
    pi : Tensor or None, optional
        Inclusion probabilities pi_i, shape ``[n_anchors]``, all positive; ``None`` means
        equal weights.

    Returns
    -------
    Tensor
        The ratio of the two Hajek-weighted sums, with the trailing shape ``[...]`` of ``num``.
    """
    den = torch.broadcast_to(den, num.shape)
    w = _inverse_pi(pi, num.shape[0], num).reshape((-1,) + (1,) * (num.dim() - 1))
    return (num * w).sum(0) / (den * w).sum(0)


def cluster_index(clusters: Tensor | Sequence[Hashable]) -> tuple[Tensor, int]:
    """Map arbitrary prompt ids (ints or hashables such as strings) to 0..n_prompts-1.

    The map depends only on the set of ids (sorted for tensors, first appearance is not
    used), so permuting anchors leaves every prompt's column unchanged.

    The prompt is the resampling unit of the bootstrap in paper App. B.2.

    Parameters
    ----------
    clusters : Tensor or Sequence[Hashable]
        Prompt id of every anchor, ``n_anchors`` entries (a tensor is flattened).

    Returns
    -------
    index : Tensor
        ``[n_anchors]`` int64: the prompt column (0..n_prompts-1) of each anchor.
    n_clusters : int
        Number of distinct prompts, n_prompts.
    """
    if isinstance(clusters, Tensor):
        uniq, inv = torch.unique(clusters.reshape(-1), sorted=True, return_inverse=True)
        return inv.to(torch.long), int(uniq.numel())
    ids = list(clusters)
    try:
        order = sorted(set(ids))
    except TypeError:  # mixed, unorderable ids: fall back to their string form
        order = sorted(set(ids), key=repr)
    pos = {c: j for j, c in enumerate(order)}
    return torch.tensor([pos[c] for c in ids], dtype=torch.long), len(order)


def cluster_sums(x: Tensor, index: Tensor, n_clusters: int) -> Tensor:
    """Per-cluster sums of the rows of ``x`` (anchors x statistics) -> (n_clusters x ...).

    These per-prompt sums are what the prompt bootstrap of paper App. B.2 resamples.

    Parameters
    ----------
    x : Tensor
        Anchor rows to add up, shape ``[n_anchors, ...]``.
    index : Tensor
        ``[n_anchors]`` integer prompt column of each anchor (from :func:`cluster_index`).
    n_clusters : int
        Number of prompts, i.e. the number of output rows.

    Returns
    -------
    Tensor
        ``[n_clusters, ...]`` sums of the rows of each prompt, with ``x``'s dtype and device.
    """
    out = torch.zeros((n_clusters,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    return out.index_add_(0, index.to(x.device), x)


@dataclass(frozen=True)
class ClusterResample:
    """B prompt-bootstrap replicates as a count matrix.

    counts[b, j] is how many times prompt j was drawn in replicate b (each row sums to
    n_prompts); index[i] is the prompt column of anchor i.
    """

    counts: Tensor
    index: Tensor
    n_clusters: int
    seed: int

    @property
    def n_boot(self) -> int:
        return int(self.counts.shape[0])


def cluster_resample(clusters: Tensor | Sequence[Hashable], n_boot: int = DEFAULT_N_BOOT,
                     seed: int = DEFAULT_BOOT_SEED, *, dtype: torch.dtype = torch.float64,
                     device: torch.device | str | None = None) -> ClusterResample:
    """Draw the prompt-resampling count matrix (B x n_prompts) for the percentile bootstrap.

    Each replicate draws n_prompts prompts uniformly with replacement.  The draws come from a
    CPU ``torch.Generator`` seeded with ``seed`` so the replicates are identical on every
    device; two calls with the same clusters, B and seed give the same replicates, which is
    what makes contrasts between separately computed statistics paired.

    Implements the prompt resampling of paper App. B.2 (B = 10^4 and base seed 20260818 by
    default, as in the paper).

    Parameters
    ----------
    clusters : Tensor or Sequence[Hashable]
        Prompt id of every anchor, ``n_anchors`` entries.
    n_boot : int, optional
        Number of bootstrap replicates B.
    seed : int, optional
        Seed of the CPU generator that draws the prompts.
    dtype : torch.dtype, optional
        Dtype of the returned count matrix.
    device : torch.device or str or None, optional
        Device of the count matrix and the anchor index; ``None`` leaves them on the CPU.

    Returns
    -------
    ClusterResample
        ``counts`` ``[B, n_prompts]`` (draws of each prompt per replicate), ``index``
        ``[n_anchors]`` (prompt column of each anchor), ``n_clusters`` and ``seed``.
    """
    index, n_clusters = cluster_index(clusters)
    if n_clusters == 0:
        raise ValueError("no prompts to resample")
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    draws = torch.randint(0, n_clusters, (n_boot, n_clusters), generator=gen)
    counts = torch.zeros((n_boot, n_clusters), dtype=torch.int32)
    counts.scatter_add_(1, draws, torch.ones_like(draws, dtype=torch.int32))
    return ClusterResample(counts=counts.to(dtype=dtype, device=device), index=index.to(device),
                           n_clusters=n_clusters, seed=int(seed))


def percentile_interval(replicates: Tensor, level: float = 0.95) -> tuple[Tensor, Tensor]:
    """Equal-tailed percentile interval over dim 0 of ``replicates``.

    Linear interpolation between order statistics (numpy's default "linear" method); a
    95% level gives the 2.5th and 97.5th percentiles.  Written with a sort rather than
    torch.quantile, which refuses large inputs.

    This is the percentile rule of the prompt bootstrap in paper App. B.2.

    Parameters
    ----------
    replicates : Tensor
        Bootstrap replicates of a statistic, shape ``[B, ...]``.
    level : float, optional
        Coverage level in (0, 1).

    Returns
    -------
    lower : Tensor
        The (1 - level)/2 percentile over replicates, shape ``[...]``.
    upper : Tensor
        The (1 + level)/2 percentile over replicates, shape ``[...]``.
    """
    if not 0.0 < level < 1.0:
        raise ValueError("level must lie in (0, 1)")
    b = replicates.shape[0]
    srt = torch.sort(replicates, dim=0).values
    alpha = (1.0 - level) / 2.0

    def at(q: float) -> Tensor:
        h = (b - 1) * q
        lo = int(h // 1)
        hi = min(lo + 1, b - 1)
        frac = h - lo
        return srt[lo] + (srt[hi] - srt[lo]) * frac

    return at(alpha), at(1.0 - alpha)


@dataclass(frozen=True)
class BootstrapResult:
    """Point estimate with its prompt-bootstrap percentile interval.

    ``estimate``, ``lower`` and ``upper`` have the trailing shape of the statistic;
    ``replicates`` (B x ...) is kept when asked for, for paired contrasts and transforms.
    ``seed``/``n_boot``/``n_clusters`` identify the resample so pairing can be checked.
    """

    estimate: Tensor
    lower: Tensor
    upper: Tensor
    level: float
    replicates: Tensor | None = None
    seed: int | None = None
    n_boot: int | None = None
    n_clusters: int | None = None

    def __iter__(self):  # allows ``est, lo, hi = result``
        return iter((self.estimate, self.lower, self.upper))


def prompt_bootstrap(num: Tensor, clusters: Tensor | Sequence[Hashable], pi: Tensor | None = None,
                     den: Tensor | None = None, *, n_boot: int = DEFAULT_N_BOOT,
                     seed: int = DEFAULT_BOOT_SEED, level: float = 0.95,
                     return_replicates: bool = False,
                     resample: ClusterResample | None = None) -> BootstrapResult:
    """Prompt-cluster percentile bootstrap of Hajek means or Hajek ratios (paper App. B.2).

    Statistic: sum_i num_i/pi_i / sum_i den_i/pi_i for every column of ``num``
    (anchors x statistic dims, e.g. anchors x slots); ``den=None`` gives the Hajek mean.
    ``den`` broadcasts against ``num`` (e.g. one denominator column per slot).

    All B replicates come from one product counts (B x P) @ per-prompt sums (P x S), once
    for the numerator and once for the denominator, so a ratio is the ratio of replicate sums.
    Pass ``resample`` to reuse a count matrix across calls (same result as the same seed).

    Parameters
    ----------
    num : Tensor
        Per-anchor numerators (or values, for a Hajek mean), shape ``[n_anchors, ...]``.
    clusters : Tensor or Sequence[Hashable]
        Prompt id of every anchor, ``n_anchors`` entries; ignored when ``resample`` is given.
    pi : Tensor or None, optional
        Inclusion probabilities pi_i, shape ``[n_anchors]``; ``None`` means equal weights.
    den : Tensor or None, optional
        Per-anchor denominators, broadcastable to ``num``; ``None`` gives the Hajek mean.
    n_boot : int, optional
        Number of replicates B when a new count matrix is drawn.
    seed : int, optional
        Seed of the prompt draws when a new count matrix is drawn.
    level : float, optional
        Coverage level of the percentile interval, in (0, 1).
    return_replicates : bool, optional
        Keep the ``[B, ...]`` replicates in the result (needed for paired contrasts).
    resample : ClusterResample or None, optional
        A count matrix drawn earlier for the same anchors, reused instead of a new draw.

    Returns
    -------
    BootstrapResult
        ``estimate``, ``lower`` and ``upper`` with the trailing shape ``[...]`` of ``num``;
        ``replicates`` ``[B, ...]`` or ``None``; and the resample's ``seed``, ``n_boot`` and
        ``n_clusters``.
    """
    if num.dim() == 0:
        raise ValueError("num needs an anchor dimension")
    n = num.shape[0]
    x, trailing = _as_2d(num)
    w = _inverse_pi(pi, n, x).unsqueeze(1)
    if den is None:
        d = torch.ones_like(x[:, :1])
    else:
        d = torch.broadcast_to(torch.as_tensor(den, dtype=x.dtype, device=x.device),
                               num.shape).reshape(n, -1)

    if resample is None:
        resample = cluster_resample(clusters, n_boot, seed, dtype=x.dtype, device=x.device)
    elif resample.index.shape[0] != n:
        raise ValueError("resample was drawn for a different number of anchors")
    idx = resample.index.to(x.device)
    counts = resample.counts.to(dtype=x.dtype, device=x.device)
    num_sums = cluster_sums(x * w, idx, resample.n_clusters)
    den_sums = cluster_sums(d * w, idx, resample.n_clusters)
    estimate = num_sums.sum(0) / den_sums.sum(0)
    reps = (counts @ num_sums) / (counts @ den_sums)
    lo, hi = percentile_interval(reps, level)
    return BootstrapResult(
        estimate=estimate.reshape(trailing), lower=lo.reshape(trailing),
        upper=hi.reshape(trailing), level=level,
        replicates=reps.reshape((reps.shape[0],) + trailing) if return_replicates else None,
        seed=resample.seed, n_boot=resample.n_boot, n_clusters=resample.n_clusters)


def bootstrap_transform(fn: Callable[..., Tensor], *results: BootstrapResult,
                        level: float | None = None) -> BootstrapResult:
    """Apply ``fn`` to point estimates and, replicate by replicate, to replicates.

    For smooth functions of several bootstrapped statistics that are not a single ratio,
    e.g. D_k = S_k / prod_{i<=k} E[a_i] or tau = 1 + sum_k S_k.  All inputs must carry
    replicates from the same resample (same seed, B and prompts), so the result is paired.
    ``fn`` must act on the trailing statistic dims and broadcast over a leading replicate dim.

    D_k is the dependence ratio of paper App. F.2 and tau the expected length of paper Sec. 2;
    the pairing is that of the prompt bootstrap in paper App. B.2.

    Parameters
    ----------
    fn : Callable[..., Tensor]
        Function of the statistics, one tensor argument per result, each with a leading
        replicate dimension (size 1 for the point estimate).
    *results : BootstrapResult
        Bootstrapped statistics computed with ``return_replicates=True`` from one resample.
    level : float or None, optional
        Coverage level of the new interval; ``None`` reuses the first result's level.

    Returns
    -------
    BootstrapResult
        ``fn`` of the point estimates, its percentile interval, the transformed replicates
        ``[B, ...]`` and the inputs' resample identity.
    """
    if not results:
        raise ValueError("need at least one result")
    first = results[0]
    for r in results:
        if r.replicates is None:
            raise ValueError("bootstrap_transform needs results computed with "
                             "return_replicates=True")
        if (r.seed, r.n_boot, r.n_clusters) != (first.seed, first.n_boot, first.n_clusters):
            raise ValueError("results come from different resamples; contrasts would not be "
                             "paired")

    lvl = first.level if level is None else level
    est = fn(*(r.estimate.unsqueeze(0) for r in results)).squeeze(0)
    reps = fn(*(r.replicates for r in results))
    lo, hi = percentile_interval(reps, lvl)
    return BootstrapResult(estimate=est, lower=lo, upper=hi, level=lvl, replicates=reps,
                           seed=first.seed, n_boot=first.n_boot, n_clusters=first.n_clusters)


def paired_difference(a: BootstrapResult, b: BootstrapResult,
                      level: float | None = None) -> BootstrapResult:
    """a - b with the interval from replicate-wise differences (e.g. R^serve - R, R - T).

    R^serve - R is the serving-risk contrast of paper App. F.1 and R - T the model gap of
    paper Sec. 2; pairing the replicates follows paper App. B.2.

    Parameters
    ----------
    a : BootstrapResult
        First statistic, with replicates.
    b : BootstrapResult
        Statistic to subtract, with replicates from the same resample as ``a``.
    level : float or None, optional
        Coverage level; ``None`` reuses ``a``'s level.

    Returns
    -------
    BootstrapResult
        The difference a - b: estimate, percentile interval and ``[B, ...]`` replicates.
    """
    return bootstrap_transform(torch.sub, a, b, level=level)
