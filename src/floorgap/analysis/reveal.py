"""The importance route of T^(1) against the number of revealed predecessors J (``floorgap
bench reveal``, which sets ``rollouts.reveal_paths``): from per-j floors of a finished run's
anchors, for each J the Hajek estimate with its prompt-bootstrap interval (one resample for
every J, so the widths are paired), the spread over revealed predecessors, and the share of
the estimate's variance that comes from which predecessors were revealed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED, cluster_resample, prompt_bootstrap
from floorgap.estimators.concentration import percentile_interval_finite

__all__ = ["reveal_stats"]


def _nan_sd(x: torch.Tensor) -> torch.Tensor:
    """Sample standard deviation (ddof 1) over the last dim of the finite entries; NaN where
    fewer than two are finite."""
    ok = torch.isfinite(x)
    n = ok.sum(-1)
    mean = torch.nanmean(x, -1, keepdim=True)
    ss = torch.where(ok, (x - mean) ** 2, torch.zeros_like(x)).sum(-1)
    sd = (ss / (n - 1).clamp(min=1)).sqrt()
    return torch.where(n >= 2, sd, torch.full_like(sd, float("nan")))


def _finite_mean(x: torch.Tensor) -> float:
    ok = torch.isfinite(x)
    return float(x[ok].mean()) if bool(ok.any()) else float("nan")


def _one_j(sub: torch.Tensor, s2: torch.Tensor, pi: torch.Tensor, prompts: list[str],
                  rs: Any, level: float) -> dict[str, Any]:
    """Statistics of one J from ``sub`` = ``[anchors, slots 1..gamma-1, J]`` per-j floors and
    ``s2``, the within-anchor variance of one revealed predecessor (see :func:`reveal_stats`)."""
    def interval(reps: torch.Tensor) -> tuple[float, float]:
        lo, hi, _ = percentile_interval_finite(reps, level)
        return float(lo), float(hi)

    def boot_var(reps: torch.Tensor) -> float:
        r = reps[torch.isfinite(reps)]
        return float(r.var()) if r.numel() > 1 else float("nan")

    K = sub.shape[1]
    n_def = torch.isfinite(sub).sum(-1)  # [n, K]
    mask = n_def > 0
    y = torch.where(mask, torch.nanmean(sub, -1), torch.zeros(()))
    res = prompt_bootstrap(y, prompts, pi, mask.double(), resample=rs, level=level,
                           return_replicates=True)
    reps = res.replicates  # [B, K]
    assert reps is not None
    # Within-j variance of each slot's Hajek mean (linearised), then of their slot average.
    wm = (1.0 / pi).unsqueeze(1) * mask
    vw_cells = torch.where(mask & torch.isfinite(s2), wm ** 2 * s2 / n_def.clamp(min=1),
                           torch.zeros_like(s2))
    vw = vw_cells.sum(0) / wm.sum(0) ** 2  # [K]
    sd = _nan_sd(sub)  # [n, K]
    mean_reps = reps.mean(1)
    return {
        "last": (float(res.estimate[-1]), *interval(reps[:, -1]), int(mask[:, -1].sum()),
                 float(vw[-1]) / boot_var(reps[:, -1])),
        "mean": (float(res.estimate.mean()), *interval(mean_reps), int(mask.any(1).sum()),
                 float(vw.sum()) / K ** 2 / boot_var(mean_reps)),
        "sd": (_finite_mean(sd), _finite_mean(sd[:, -1])),
        "undefined": (int((~torch.isfinite(sub)).sum()), int((~mask).sum())),
    }


def reveal_stats(floors: torch.Tensor, pi: torch.Tensor, prompts: Sequence[str],
                 grid: Sequence[int], *, n_boot: int, seed: int | None = None,
                 level: float = 0.95) -> tuple[dict[int, dict[str, Any]], int]:
    """Per-J statistics of the importance route, and the number of prompt clusters.

    ``floors``: ``[anchors, gamma, J_max]``, the floor of revealed predecessor j at slot k
    (slot 0 is ignored; NaN = undefined); ``pi``: inclusion probabilities; ``prompts``: each
    anchor's prompt id (the bootstrap clusters). For each J in ``grid`` an anchor's value at a
    slot is the mean of its defined floors among the first J j's (an anchor-slot with none is
    left out of the Hajek mean). Each J maps to ``last`` and ``mean`` (the last slot, and the
    mean over slots 1..gamma-1): (estimate, lower, upper, anchors used, within-j variance
    share); ``sd``: the mean within-anchor sd over j (all slots, last slot); ``undefined``:
    (undefined j-slot-anchor cells, anchor-slots with no defined j). The within-j variance
    share is the approximate share of the estimate's bootstrap variance that comes from which
    predecessors were revealed (within-anchor variance from all J_max j's over the anchor's
    count of defined j's, linearised Hajek weights).
    """
    floors = torch.as_tensor(floors, dtype=torch.float64)
    if floors.dim() != 3 or floors.shape[1] < 2:
        raise ValueError("floors must be [anchors, gamma >= 2, J]")
    j_max = floors.shape[2]
    grid = sorted({int(j) for j in grid})
    if not grid or grid[0] < 1 or grid[-1] > j_max:
        raise ValueError(f"reveal grid must lie in 1..{j_max}")
    pi = torch.as_tensor(pi, dtype=torch.float64)
    deep = floors[:, 1:]  # [n, gamma-1, J_max]: slots 1..gamma-1
    rs = cluster_resample(list(prompts), n_boot, DEFAULT_BOOT_SEED if seed is None else seed)
    s2 = _nan_sd(deep) ** 2  # [n, gamma-1]: within-anchor variance of one revealed predecessor
    return ({J: _one_j(deep[..., :J], s2, pi, list(prompts), rs, level) for J in grid},
            rs.n_clusters)
