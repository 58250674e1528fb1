"""Single-slot best response and coordinate sweeps (paper Sec. 3.5, App. F.4-F.6).

At one anchor, with M target paths and accept factors a_i = min(1, q_i(Z_i)/p_i(Z_i)),

    tau - 1 = sum_j E[prod_{i<=j} a_i] = kappa_k + E[W_{k-1} a_k F_k],
    W_{k-1} = prod_{i<k} a_i,   F_k = 1 + sum_{j>k} prod_{k<i<=j} a_i,   kappa_k = sum_{j<k} S_j.

Holding the other slots fixed, only a_k depends on q_k, and only through the values
q_k(Z_k^(r)) at the realised tokens.  Within an information cell (order 0: all paths of the
anchor; order 1: the paths sharing the realised predecessor Z_{k-1}, slot 0 using the
committed token) the objective is

    sum_r c_r min(1, q(z_r) / p_r(z_r)),    c_r = W_{k-1}^(r) F_k^(r) / M >= 0.

Per token v, g_v(x) = sum_{r: z_r = v} c_r min(1, x / p_r(v)) is concave piecewise linear with
breakpoints at the p_r(v); on [p_(j-1), p_(j)] (sorted within v) its slope is
sum_{l >= j} c_(l) / p_(l).  The maximiser over the simplex is a water fill: take segments
in order of decreasing slope, across tokens, until unit mass is used.  Mass left once every
slope is zero goes to the shipped proposal: q^BR(v) = x_v + L q_base(v) (F.4), which needs only
per-path scalars (p_r(z_r), q_base(z_r), z_r) and never a full vocabulary row.

Two-fold cross-fitting (F.5) fits each cell on one half of the paths and scores on the other,
then swaps; coordinate sweeps (F.6) refit every slot in turn against the latest actions,
keeping the same fit/held-out split.

Per-path inputs are (A, M, gamma) (anchors, paths, slots); a 2-D (M, gamma) input is one anchor.

Size: about 500 lines, the water-filling best response and the three estimators built on it
(slot decomposition, single-slot gains, coordinate sweeps), which share its segmented sums.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from .serving import accept_factors, reach

__all__ = [
    "SingleSlotGain",
    "SweepResult",
    "WaterFill",
    "continuation_value",
    "coordinate_sweep",
    "expected_length",
    "single_slot_gain",
    "tau_slot_decomposition",
    "water_fill",
]


# ---------------------------------------------------------------------------------------
# segmented scans: sums restricted to runs of a sorted array, without a global running sum
# whose magnitude would swamp small groups


def _segmented_cumsum(x: Tensor, start: Tensor) -> Tensor:
    """Inclusive cumulative sum of ``x`` restarting wherever ``start`` is True.

    Hillis-Steele scan with the segmented-sum operator, O(n log n) vector work; each output
    is a sum over its own segment only, so precision does not depend on other segments.
    """
    y = x.clone()
    f = start.clone()
    n = x.shape[0]
    if n:
        f[0] = True
    d = 1
    while d < n:
        add = y[:-d].masked_fill(f[d:], 0.0)
        y = torch.cat([y[:d], y[d:] + add])
        f = torch.cat([f[:d], f[d:] | f[:-d]])
        d *= 2
    return y


def _segmented_suffix_sum(x: Tensor, start: Tensor) -> Tensor:
    """Sum from each element to the end of its segment (segments start where ``start``)."""
    n = x.shape[0]
    end = torch.zeros_like(start)
    if n:
        end[:-1] = start[1:]
        end[-1] = True
    return _segmented_cumsum(x.flip(0), end.flip(0)).flip(0)


def _run_starts(key: Tensor) -> Tensor:
    """True at the first element of each run of equal values in a sorted key."""
    start = torch.ones_like(key, dtype=torch.bool)
    if key.numel() > 1:
        start[1:] = key[1:] != key[:-1]
    return start


def _lexsort(primary: Tensor, secondary: Tensor) -> Tensor:
    """Permutation sorting by ``primary`` then ``secondary`` (both ascending)."""
    o = torch.argsort(secondary, stable=True)
    return o[torch.argsort(primary[o], stable=True)]


# ---------------------------------------------------------------------------------------
# water fill


@dataclass(frozen=True)
class WaterFill:
    """The best-response actions of many cells, stored sparsely.

    ``keys`` (sorted) are cell * token_span + token for every (cell, token) pair that got a
    segment; ``mass`` is the water-filled x_{cell, token}; ``leftover[c]`` = 1 - sum_v x_{c,v},
    handed to the shipped proposal.  ``objective[c]`` is the in-sample value
    sum_r c_r min(1, x(z_r)/p_r) of the fitted cell (before the leftover, which cannot lower it).
    """

    keys: Tensor
    mass: Tensor
    leftover: Tensor
    objective: Tensor
    token_span: int

    def prob(self, cell: Tensor, token: Tensor, q_base: Tensor) -> Tensor:
        """q^BR_cell(token) = x_{cell, token} + L_cell * q_base(token) at given (cell, token) pairs.

        ``q_base`` is the shipped proposal's probability of each queried token.  Tokens never
        poured into (including held-out tokens outside the fit support) get L * q_base only;
        a cell without fitting paths has L = 1, i.e. keeps the shipped proposal.
        """
        cell = cell.reshape(-1)
        token = token.reshape(-1)
        x = torch.zeros(cell.shape, dtype=self.mass.dtype, device=self.mass.device)
        if self.keys.numel():
            in_span = (token >= 0) & (token < self.token_span)
            qkey = cell * self.token_span + token.clamp(0, self.token_span - 1)
            pos = torch.searchsorted(self.keys, qkey).clamp(max=self.keys.numel() - 1)
            hit = in_span & (self.keys[pos] == qkey)
            x = torch.where(hit, self.mass[pos], x)
        return x + self.leftover[cell] * q_base.reshape(-1)


def water_fill(cell: Tensor, token: Tensor, p: Tensor, c: Tensor, n_cells: int | None = None,
               token_span: int | None = None) -> WaterFill:
    """Maximise sum_r c_r min(1, q_cell(z_r)/p_r) over one simplex per cell (paper App. F.4).

    Inputs are flat per-entry (per path) tensors: ``cell`` (cell id in 0..n_cells-1),
    ``token`` (realised token z_r, >= 0), ``p`` (target probability p_r(z_r)) and ``c``
    (weight c_r >= 0).  Entries with c_r = 0 or p_r <= 0 do not affect the fit.

    For each (cell, token), segments [p_(j-1), p_(j)] of the sorted p's carry slope
    sum_{l>=j} c_(l)/p_(l); within each cell the steepest segments are filled first until
    mass 1 is spent.  Ties among equal slopes are broken deterministically; every tie-break is
    optimal.  Vectorised over all cells at once.

    Parameters
    ----------
    cell : Tensor
        Information-cell id of every entry, integers in 0..n_cells-1 (any shape, flattened).
    token : Tensor
        Realised token z_r of every entry, integers >= 0.
    p : Tensor
        Target probability p_r(z_r) of the realised token, floating point.
    c : Tensor
        Entry weights c_r = W_{k-1}^(r) F_k^(r) / M, non-negative.
    n_cells : int or None, optional
        Number of cells; ``None`` takes one more than the largest id in ``cell``.
    token_span : int or None, optional
        Stride of the (cell, token) keys, larger than every token id; ``None`` takes one more
        than the largest token in ``token``.

    Returns
    -------
    WaterFill
        The fitted actions of all cells, stored sparsely: sorted ``keys`` and water-filled
        ``mass`` x_{cell, token} of every poured (cell, token) pair, and per cell
        (``[n_cells]``) the ``leftover`` mass L and the in-sample ``objective``.
    """
    cell = cell.reshape(-1).to(torch.long)
    token = token.reshape(-1).to(torch.long)
    p = p.reshape(-1)
    c = c.reshape(-1).to(p.dtype)
    if n_cells is None:
        n_cells = int(cell.max().item()) + 1 if cell.numel() else 0
    if token_span is None:
        token_span = int(token.max().item()) + 1 if token.numel() else 1
    if bool((c < 0).any()):
        raise ValueError("water_fill weights c_r must be non-negative")
    dtype, device = p.dtype, p.device

    active = (c > 0) & (p > 0)
    a_cell, a_tok, a_p, a_c = cell[active], token[active], p[active], c[active]
    key = a_cell * token_span + a_tok

    # entries sorted by (cell, token) and by p within it: one run per (cell, token) group
    o = _lexsort(key, a_p)
    key, a_p, a_c, a_cell = key[o], a_p[o], a_c[o], a_cell[o]
    gstart = _run_starts(key)
    gid = torch.cumsum(gstart.to(torch.long), 0) - 1
    n_groups = int(gid[-1].item()) + 1 if gid.numel() else 0

    w = a_c / a_p
    slope = _segmented_suffix_sum(w, gstart)  # slope of the segment ending at this entry's p
    prev_p = torch.zeros_like(a_p)
    if a_p.numel() > 1:
        prev_p[1:] = torch.where(gstart[1:], torch.zeros_like(a_p[1:]), a_p[:-1])
    length = a_p - prev_p

    # segments of each cell by decreasing slope; pour until mass 1 is spent
    o2 = _lexsort(a_cell, -slope)
    s_cell, s_len = a_cell[o2], length[o2]
    used_before = _segmented_cumsum(s_len, _run_starts(s_cell)) - s_len
    take = torch.clamp(torch.minimum(s_len, 1.0 - used_before), min=0.0)
    take_entry = torch.empty_like(take)
    take_entry[o2] = take

    group_mass = torch.zeros(n_groups, dtype=dtype, device=device).index_add_(0, gid, take_entry)
    poured = torch.zeros(n_cells, dtype=dtype, device=device).index_add_(0, a_cell, take_entry)
    leftover = torch.clamp(1.0 - poured, min=0.0)

    keys = key[gstart]
    x_entry = group_mass[gid]
    obj_entry = a_c * torch.clamp(x_entry / a_p, max=1.0)
    objective = torch.zeros(n_cells, dtype=dtype, device=device).index_add_(0, a_cell, obj_entry)
    return WaterFill(keys=keys, mass=group_mass, leftover=leftover, objective=objective,
                     token_span=token_span)


# ---------------------------------------------------------------------------------------
# tau and its slot decomposition


def _as_batch(x: Tensor) -> Tensor:
    if x.dim() == 2:
        return x.unsqueeze(0)
    if x.dim() != 3:
        raise ValueError("per-path inputs must be (M, gamma) or (A, M, gamma)")
    return x


def continuation_value(a: Tensor) -> Tensor:
    """F_k = 1 + sum_{j>k} prod_{k<i<=j} a_i per path (F_{gamma-1} = 1),
    via F_k = 1 + a_{k+1} F_{k+1}.

    F_k is the continuation value in the slot decomposition of tau (paper App. F.4).

    Parameters
    ----------
    a : Tensor
        Accept factors a_i = min(1, q_i(Z_i)/p_i(Z_i)), shape ``[..., gamma]`` (e.g.
        ``[A, M, gamma]``).

    Returns
    -------
    Tensor
        F_k for every slot k, same shape as ``a``.
    """
    g = a.shape[-1]
    cols = [torch.ones_like(a[..., 0])]
    for k in range(g - 2, -1, -1):  # loop over slots (gamma is small), vectorised over paths
        cols.append(1.0 + a[..., k + 1] * cols[-1])
    return torch.stack(cols[::-1], dim=-1)


def expected_length(a: Tensor, path_mask: Tensor | None = None) -> Tensor:
    """tau = 1 + mean_r sum_j prod_{i<=j} a_i over the paths in ``path_mask`` (all by default).

    ``a`` is (..., M, gamma); ``path_mask`` broadcasts to (..., M).

    tau is the expected returned length of paper Sec. 2, estimated from the joint survival
    terms as in paper App. F.2.

    Parameters
    ----------
    a : Tensor
        Accept factors a_i, shape ``[..., M, gamma]`` (paths, slots).
    path_mask : Tensor or None, optional
        Paths to average over, broadcastable to ``[..., M]`` (bool or 0/1); ``None`` uses all.

    Returns
    -------
    Tensor
        ``[...]`` expected length tau (for one anchor, 0-dim).
    """
    per_path = torch.cumprod(a, dim=-1).sum(-1)
    if path_mask is None:
        return 1.0 + per_path.mean(-1)
    per_path, m = torch.broadcast_tensors(per_path, path_mask.to(per_path.dtype))
    return 1.0 + (per_path * m).sum(-1) / m.sum(-1)


def tau_slot_decomposition(a: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """(kappa_k, E[W_{k-1} a_k F_k]) with tau - 1 = kappa_k + E[W_{k-1} a_k F_k] (paper App. F.4).

    kappa_k = sum_{j<k} E[prod_{i<=j} a_i] does not involve slot k.  Path means over dim -2.

    Parameters
    ----------
    a : Tensor
        Accept factors a_i, shape ``[..., M, gamma]``.
    k : int
        The slot to isolate, 0 <= k < gamma.

    Returns
    -------
    kappa : Tensor
        ``[...]`` kappa_k, the part of tau - 1 that does not involve slot k.
    term : Tensor
        ``[...]`` E[W_{k-1} a_k F_k], the part that slot k's proposal can change.
    """
    surv = torch.cumprod(a, dim=-1)
    kappa = surv[..., :k].sum(-1).mean(-1)
    term = (reach(a)[..., k] * a[..., k] * continuation_value(a)[..., k]).mean(-1)
    return kappa, term


# ---------------------------------------------------------------------------------------
# cells and one refit step


def _cell_keys(tokens: Tensor, prev_token: Tensor | None, order: int) -> Tensor:
    """Per (anchor, path, slot) information-cell key before fold tagging (int64, A x M x gamma)."""
    A, M, G = tokens.shape
    anchor_slot = (torch.arange(A, device=tokens.device).view(A, 1, 1) * G
                   + torch.arange(G, device=tokens.device).view(1, 1, G)).expand(A, M, G)
    if order == 0:
        return anchor_slot.clone()
    if order != 1:
        raise ValueError("order must be 0 or 1")
    if prev_token is None:
        raise ValueError("order 1 needs the committed token preceding slot 0 (prev_token)")
    prev = torch.as_tensor(prev_token, device=tokens.device).to(torch.long).reshape(-1)
    if prev.numel() == 1 and A > 1:
        prev = prev.expand(A)
    pred = torch.cat([prev.view(A, 1, 1).expand(A, M, 1), tokens[..., :-1]], dim=-1)
    span = int(max(int(tokens.max().item()), int(prev.max().item()))) + 1
    return anchor_slot * span + pred


@dataclass(frozen=True)
class _Design:
    a_base: Tensor  # (A, M, G)
    p_tok: Tensor
    q_base: Tensor
    tokens: Tensor
    cell: Tensor  # (S, A, M, G) compact cell ids; set s reads only set s's cells
    fit_mask: Tensor  # (S, A, M)
    score_mask: Tensor  # (S, A, M)
    n_cells: int
    token_span: int


def _refit_slots(d: _Design, a_sets: Tensor, slots: list[int]) -> Tensor:
    """Best-respond at ``slots`` simultaneously, each against the other slots of ``a_sets``.

    a_sets: (S, A, M, G) accept factors of S action sets; set s is fitted on paths with
    d.fit_mask[s] and its refitted factors are written for every path.  Returns the new accept
    factors at ``slots`` as (S, A, M, len(slots)).
    """
    S, A, M, G = a_sets.shape
    n_fit = d.fit_mask.to(a_sets.dtype).sum(-1, keepdim=True)  # (S, A, 1)
    c_all = reach(a_sets) * continuation_value(a_sets)  # W_{k-1} F_k, (S, A, M, G)
    c_all = c_all * (d.fit_mask.to(a_sets.dtype) / n_fit).unsqueeze(-1)
    sl = torch.as_tensor(slots, device=a_sets.device)
    tok, pp, qb = (x.unsqueeze(0).expand(S, A, M, G)[..., sl]
                   for x in (d.tokens, d.p_tok, d.q_base))
    fill = water_fill(d.cell[..., sl], tok, pp, c_all[..., sl], n_cells=d.n_cells,
                      token_span=d.token_span)
    q_new = fill.prob(d.cell[..., sl], tok, qb).view(tok.shape)
    return accept_factors(pp, q_new)


def _design(p_tok: Tensor, q_base: Tensor, tokens: Tensor, prev_token: Tensor | None,
            order: int, folds: Tensor | None, cross_fit: bool) -> _Design:
    p_tok, q_base, tokens = _as_batch(p_tok), _as_batch(q_base), _as_batch(tokens).to(torch.long)
    if not (p_tok.shape == q_base.shape == tokens.shape):
        raise ValueError("p_tok, q_base and tokens must have the same shape")
    A, M, G = p_tok.shape
    base = _cell_keys(tokens, prev_token, order)
    token_span = int(tokens.max().item()) + 1
    if cross_fit:
        if folds is None:
            folds = torch.arange(M, device=p_tok.device) % 2
        folds = torch.broadcast_to(torch.as_tensor(folds, device=p_tok.device).to(torch.long), (A, M))
        if bool(((folds != 0) & (folds != 1)).any()):
            raise ValueError("folds must be 0 or 1 per path")
        # action set s is fitted on fold s and scored on fold 1 - s
        fit_mask = torch.stack([folds == 0, folds == 1])
        score_mask = torch.stack([folds == 1, folds == 0])
        tagged = torch.stack([base * 2, base * 2 + 1])  # set s reads cells tagged s
    else:
        fit_mask = torch.ones((1, A, M), dtype=torch.bool, device=p_tok.device)
        score_mask = fit_mask
        tagged = base.unsqueeze(0)
    uniq, cell = torch.unique(tagged, return_inverse=True)  # compact ids 0..n-1
    n_cells = int(uniq.numel())
    return _Design(a_base=accept_factors(p_tok, q_base), p_tok=p_tok, q_base=q_base,
                   tokens=tokens, cell=cell, fit_mask=fit_mask, score_mask=score_mask,
                   n_cells=n_cells, token_span=token_span)


def _slot_gains(d: _Design) -> Tensor:
    """Isolated gain of every slot around the base actions, averaged over action sets -> (A, G)."""
    S = d.fit_mask.shape[0]
    G = d.a_base.shape[-1]
    a_sets = d.a_base.unsqueeze(0).expand(S, *d.a_base.shape)
    a_new = _refit_slots(d, a_sets, list(range(G)))
    # Delta tau_k = E_score[W_{k-1} F_k (a_k^BR - a_k^base)]: W and F do not involve slot k
    wf = reach(a_sets) * continuation_value(a_sets)
    m = d.score_mask.to(wf.dtype)
    per_set = (wf * (a_new - a_sets) * m.unsqueeze(-1)).sum(-2) / m.sum(-1, keepdim=True)
    return per_set.mean(0)


# ---------------------------------------------------------------------------------------
# public analyses


@dataclass(frozen=True)
class SingleSlotGain:
    """Delta tau_k^BR per anchor and slot, (A, gamma) (Sec. 3.5, F.5).

    ``cross_fitted`` is the held-out two-fold estimate the paper reports; ``in_sample`` fits
    and scores on all paths (>= 0 always); ``optimism`` = in_sample - cross_fitted.
    ``tau_base`` (A,) is the shipped drafter's tau on all paths.
    """

    in_sample: Tensor
    cross_fitted: Tensor
    optimism: Tensor
    tau_base: Tensor


def single_slot_gain(p_tok: Tensor, q_base: Tensor, tokens: Tensor,
                     prev_token: Tensor | int | None = None, *, order: int = 0,
                     folds: Tensor | None = None) -> SingleSlotGain:
    """Delta tau_k^BR = tau(q_k^BR, q_-k^base) - tau(q^base) for every slot k (paper App. F.4, F.5).

    Inputs per path and slot, (A, M, gamma) or (M, gamma): ``p_tok`` = p_k^(r)(Z_k^(r)) the
    target's probability of the realised token, ``q_base`` = the shipped proposal's probability
    of it, ``tokens`` = Z_k^(r).  ``prev_token`` (A,) is the committed token before slot 0,
    needed at ``order=1`` where each predecessor token is its own cell.  ``folds`` (M,) or
    (A, M) of 0/1 sets the cross-fitting split (default: path index parity).

    Parameters
    ----------
    p_tok : Tensor
        ``[A, M, gamma]`` or ``[M, gamma]`` target probabilities p_k^(r)(Z_k^(r)).
    q_base : Tensor
        Same shape: the shipped proposal's probabilities of the realised tokens.
    tokens : Tensor
        Same shape, integer: the realised tokens Z_k^(r).
    prev_token : Tensor or int or None, optional
        ``[A]`` (or one int) committed token before slot 0; required for ``order=1`` only.
    order : int, optional
        Information class of the proposal: 0 (one cell per anchor and slot) or 1 (one cell
        per realised predecessor token).
    folds : Tensor or None, optional
        ``[M]`` or ``[A, M]`` 0/1 fold of every path for cross-fitting; ``None`` splits by
        path index parity.

    Returns
    -------
    SingleSlotGain
        ``in_sample``, ``cross_fitted`` and ``optimism`` gains Delta tau_k^BR, each
        ``[A, gamma]`` (A = 1 for 2-D inputs), and ``tau_base`` ``[A]``.
    """
    d_in = _design(p_tok, q_base, tokens, prev_token, order, None, cross_fit=False)
    d_cf = _design(p_tok, q_base, tokens, prev_token, order, folds, cross_fit=True)
    ins = _slot_gains(d_in)
    cf = _slot_gains(d_cf)
    return SingleSlotGain(in_sample=ins, cross_fitted=cf, optimism=ins - cf,
                          tau_base=expected_length(d_in.a_base))


@dataclass(frozen=True)
class SweepResult:
    """Coordinate-sweep gains per anchor (App. F.6).

    ``forward`` (slots 0 -> gamma-1) and ``backward`` (gamma-1 -> 0) are tau(swept) - tau(base)
    per anchor (A,); ``isolated`` (A, gamma) are the single-slot gains on the same split and
    ``isolated_sum`` their sum over slots.
    """

    forward: Tensor
    backward: Tensor
    isolated: Tensor
    isolated_sum: Tensor
    cross_fit: bool


def _sweep(d: _Design, slot_order: list[int], n_passes: int) -> Tensor:
    S = d.fit_mask.shape[0]
    a_sets = d.a_base.unsqueeze(0).expand(S, *d.a_base.shape).clone()
    for _ in range(n_passes):
        for k in slot_order:  # sequential by construction: each refit sees the latest actions
            a_sets[..., k] = _refit_slots(d, a_sets, [k])[..., 0]
    tau_new = expected_length(a_sets, d.score_mask)
    tau_old = expected_length(d.a_base.unsqueeze(0), d.score_mask)
    return (tau_new - tau_old).mean(0)


def coordinate_sweep(p_tok: Tensor, q_base: Tensor, tokens: Tensor,
                     prev_token: Tensor | int | None = None, *, order: int = 0,
                     folds: Tensor | None = None, cross_fit: bool = True,
                     n_passes: int = 1) -> SweepResult:
    """Refit every slot in turn against the latest actions, both directions (paper App. F.6).

    With ``cross_fit`` the two action sets (fitted on fold 0 and on fold 1) are each swept
    using only their own fitting paths and scored on the other fold; the split is the same
    for every refit.  Without it, actions are fitted and scored on all paths.  Inputs as in
    ``single_slot_gain``.

    Parameters
    ----------
    p_tok, q_base, tokens, prev_token, order, folds
        As in ``single_slot_gain`` (``folds`` is used only with ``cross_fit``).
    cross_fit : bool, optional
        Fit and score on opposite folds (True) or on all paths (False).
    n_passes : int, optional
        Number of passes over all slots in each direction.

    Returns
    -------
    SweepResult
        ``forward`` and ``backward`` gains tau(swept) - tau(base), each ``[A]``; the
        single-slot gains ``isolated`` ``[A, gamma]`` on the same split and their sum
        ``isolated_sum`` ``[A]``; and the ``cross_fit`` flag.
    """
    d = _design(p_tok, q_base, tokens, prev_token, order, folds, cross_fit=cross_fit)
    G = d.a_base.shape[-1]
    fwd = _sweep(d, list(range(G)), n_passes)
    bwd = _sweep(d, list(range(G - 1, -1, -1)), n_passes)
    iso = _slot_gains(d)
    return SweepResult(forward=fwd, backward=bwd, isolated=iso, isolated_sum=iso.sum(-1),
                       cross_fit=cross_fit)
