"""Single-slot best response, cross-fitting and coordinate sweeps (paper App. F.4-F.6)."""

import itertools

import numpy as np
import pytest
import torch
from scipy.optimize import linprog

from floorgap.estimators.best_response import (
    continuation_value,
    coordinate_sweep,
    expected_length,
    single_slot_gain,
    tau_slot_decomposition,
    water_fill,
)
from floorgap.estimators.serving import accept_factors, reach

D = torch.float64


# ------------------------------------------------------------------------------ helpers


def _lp_value(tok, p, c):
    """max sum_r c_r s_r s.t. s_r <= 1, p_r s_r <= q(z_r), sum_v q(v) <= 1 (HiGHS)."""
    tok, p, c = np.asarray(tok), np.asarray(p), np.asarray(c)
    v, r = int(tok.max()) + 1, len(tok)
    cost = np.concatenate([np.zeros(v), -c])
    rows = []
    for i in range(r):
        row = np.zeros(v + r)
        row[v + i] = p[i]
        row[tok[i]] = -1.0
        rows.append(row)
    rows.append(np.concatenate([np.ones(v), np.zeros(r)]))
    b = np.zeros(r + 1)
    b[-1] = 1.0
    res = linprog(cost, A_ub=np.array(rows), b_ub=b, bounds=[(0, None)] * v + [(0, 1)] * r, method="highs",
                  options={"primal_feasibility_tolerance": 1e-10, "dual_feasibility_tolerance": 1e-10})
    assert res.status == 0
    return -res.fun


def _naive_fill(tok, p, c):
    """Reference water fill with plain Python loops: {token: mass}, leftover."""
    segs = []
    for v in sorted(set(int(t) for t in tok)):
        rows = sorted((float(pp), float(cc)) for t, pp, cc in zip(tok, p, c) if int(t) == v and cc > 0 and pp > 0)
        prev = 0.0
        for j, (pp, _) in enumerate(rows):
            slope = sum(cc / qq for qq, cc in rows[j:])
            segs.append((slope, pp - prev, v))
            prev = pp
    segs.sort(key=lambda s: -s[0])
    mass, used = {}, 0.0
    for slope, length, v in segs:
        take = max(0.0, min(length, 1.0 - used))
        mass[v] = mass.get(v, 0.0) + take
        used += length
    return mass, max(0.0, 1.0 - sum(mass.values()))


def _objective(q_at, p, c):
    return float(np.sum(c * np.minimum(1.0, q_at / p)))


def _synthetic(n_anchors, m, gamma, v, seed, drafter_order=0, target_sharp=2.0, drafter_noise=1.0):
    """Order-1 Markov target per anchor and slot; a drafter of order 0 or 1 that is a noisy
    copy.  Returns per-path scalars plus the tables."""
    g = torch.Generator().manual_seed(seed)
    logits = target_sharp * torch.randn(n_anchors, gamma, v, v, dtype=D, generator=g)
    p_tab = torch.softmax(logits, -1)  # [a, k, pred, next]
    if drafter_order == 0:
        q_tab = torch.softmax(logits.mean(2) + drafter_noise * torch.randn(n_anchors, gamma, v, dtype=D, generator=g), -1)
    else:
        q_tab = torch.softmax(logits + drafter_noise * torch.randn(n_anchors, gamma, v, v, dtype=D, generator=g), -1)
    prev = torch.randint(0, v, (n_anchors,), generator=g)
    tokens = torch.zeros(n_anchors, m, gamma, dtype=torch.long)
    p_tok = torch.zeros(n_anchors, m, gamma, dtype=D)
    q_tok = torch.zeros(n_anchors, m, gamma, dtype=D)
    pred = prev[:, None].expand(n_anchors, m)
    ai = torch.arange(n_anchors)[:, None].expand(n_anchors, m)
    for k in range(gamma):
        dist = p_tab[ai, k, pred]  # (A, M, V)
        z = torch.multinomial(dist.reshape(-1, v), 1, generator=g).view(n_anchors, m)
        tokens[..., k] = z
        p_tok[..., k] = dist.gather(-1, z[..., None])[..., 0]
        q_tok[..., k] = q_tab[ai, k, z] if drafter_order == 0 else q_tab[ai, k, pred, z]
        pred = z
    return dict(p_tok=p_tok, q_tok=q_tok, tokens=tokens, prev=prev, p_tab=p_tab, q_tab=q_tab)


# ------------------------------------------------------------------------------ water fill


def test_water_fill_matches_lp():
    g = torch.Generator().manual_seed(0)
    cells, toks, ps, cs = [], [], [], []
    n_cells = 60
    for cell in range(n_cells):
        r = int(torch.randint(1, 15, (1,), generator=g))
        v = int(torch.randint(1, 6, (1,), generator=g))
        toks.append(torch.randint(0, v, (r,), generator=g))
        scale = 0.3 if cell % 3 == 0 else 1.0  # some cells leave mass over
        ps.append(torch.rand(r, dtype=D, generator=g) * scale + 1e-3)
        cs.append(torch.rand(r, dtype=D, generator=g) * (torch.rand(r, generator=g) > 0.2))
        cells.append(torch.full((r,), cell))
    cell, tok, p, c = map(torch.cat, (cells, toks, ps, cs))
    fill = water_fill(cell, tok, p, c, n_cells=n_cells)
    x = fill.prob(cell, tok, torch.zeros_like(p))  # poured mass at each entry's token
    for j in range(n_cells):
        sel = cell == j
        lp = _lp_value(tok[sel].numpy(), p[sel].numpy(), c[sel].numpy())
        assert abs(fill.objective[j].item() - lp) < 1e-9
        assert abs(_objective(x[sel].numpy(), p[sel].numpy(), c[sel].numpy()) - lp) < 1e-9
        # q is a distribution: poured mass on distinct tokens plus leftover is 1
        uniq = {int(t): float(xx) for t, xx in zip(tok[sel], x[sel])}
        assert all(val >= 0 for val in uniq.values())
        assert abs(sum(uniq.values()) + fill.leftover[j].item() - 1.0) < 1e-12


def test_water_fill_matches_naive_reference_and_grid():
    g = torch.Generator().manual_seed(1)
    for trial in range(30):
        r = int(torch.randint(1, 10, (1,), generator=g))
        tok = torch.randint(0, 3, (r,), generator=g)
        p = torch.rand(r, dtype=D, generator=g) * (0.4 if trial % 2 else 1.0) + 1e-3
        c = torch.rand(r, dtype=D, generator=g)
        fill = water_fill(torch.zeros(r, dtype=torch.long), tok, p, c)
        mass, left = _naive_fill(tok.tolist(), p.tolist(), c.tolist())
        x = fill.prob(torch.zeros(r, dtype=torch.long), tok, torch.zeros_like(p))
        for t, xx in zip(tok.tolist(), x.tolist()):
            assert abs(xx - mass[t]) < 1e-12
        assert abs(fill.leftover.item() - left) < 1e-12
        # no point of a fine simplex grid over the 3 tokens does better
        best = fill.objective.item()
        grid = np.linspace(0, 1, 61)
        pn, cn, tn = p.numpy(), c.numpy(), tok.numpy()
        for q0, q1 in itertools.product(grid, grid):
            if q0 + q1 > 1 + 1e-12:
                continue
            q = np.array([q0, q1, max(0.0, 1 - q0 - q1)])
            assert _objective(q[tn], pn, cn) <= best + 1e-12


def test_leftover_goes_to_base_and_unseen_cells_keep_base():
    # one path, token 2 with p = 0.3: 0.3 is poured, 0.7 is spread along q_base
    fill = water_fill(torch.tensor([0]), torch.tensor([2]), torch.tensor([0.3], dtype=D),
                      torch.tensor([1.0], dtype=D), n_cells=2)
    torch.testing.assert_close(fill.leftover, torch.tensor([0.7, 1.0], dtype=D))
    q = fill.prob(torch.tensor([0, 0, 1]), torch.tensor([2, 5, 2]), torch.tensor([0.1, 0.2, 0.4], dtype=D))
    torch.testing.assert_close(q, torch.tensor([0.3 + 0.07, 0.14, 0.4], dtype=D))
    with pytest.raises(ValueError):
        water_fill(torch.tensor([0]), torch.tensor([0]), torch.tensor([0.5], dtype=D), torch.tensor([-1.0], dtype=D))


# ------------------------------------------------------------------------------ tau pieces


def test_tau_slot_decomposition_identity():
    data = _synthetic(4, 32, 7, 5, seed=2)
    a = accept_factors(data["p_tok"], data["q_tok"])
    tau = expected_length(a)
    for k in range(7):
        kappa, term = tau_slot_decomposition(a, k)
        torch.testing.assert_close(1 + kappa + term, tau, rtol=0, atol=1e-12)
    f = continuation_value(a)
    torch.testing.assert_close(f[..., -1], torch.ones_like(f[..., -1]))
    torch.testing.assert_close(f[..., 0], 1 + torch.cumprod(a[..., 1:], -1).sum(-1))


def test_perfect_drafter_has_no_gain():
    data = _synthetic(3, 40, 7, 4, seed=3)
    # order-1 drafter equal to the order-1 target: every a_i = 1
    g1 = single_slot_gain(data["p_tok"], data["p_tok"], data["tokens"], data["prev"], order=1)
    torch.testing.assert_close(g1.tau_base, torch.full((3,), 8.0, dtype=D))
    assert g1.in_sample.abs().max() < 1e-12
    assert torch.all(g1.cross_fitted <= 1e-12)
    # order-0 target (independent of the prefix) with q = p
    g = torch.Generator().manual_seed(4)
    p_tab = torch.softmax(torch.randn(2, 7, 6, dtype=D, generator=g), -1)
    tokens = torch.multinomial(p_tab.reshape(-1, 6), 50, replacement=True, generator=g).view(2, 7, 50).transpose(1, 2)
    p_tok = p_tab.gather(-1, tokens.transpose(1, 2)).transpose(1, 2)
    g0 = single_slot_gain(p_tok, p_tok, tokens)
    assert g0.in_sample.abs().max() < 1e-12
    torch.testing.assert_close(g0.tau_base, torch.full((2,), 8.0, dtype=D))


@pytest.mark.parametrize("order", [0, 1])
def test_in_sample_gain_nonnegative_and_matches_lp(order):
    data = _synthetic(3, 24, 4, 4, seed=5 + order, drafter_order=order)
    p_tok, q_tok, tokens, prev = data["p_tok"], data["q_tok"], data["tokens"], data["prev"]
    res = single_slot_gain(p_tok, q_tok, tokens, prev, order=order)
    assert torch.all(res.in_sample >= -1e-12)
    torch.testing.assert_close(res.optimism, res.in_sample - res.cross_fitted)
    a = accept_factors(p_tok, q_tok)
    c_all = reach(a) * continuation_value(a) / p_tok.shape[1]
    for i in range(3):
        for k in range(4):
            # cells: all paths (order 0) or paths sharing the predecessor (order 1)
            pred = prev[i].expand(24) if k == 0 else tokens[i, :, k - 1]
            keys = torch.zeros(24, dtype=torch.long) if order == 0 else pred
            gain = 0.0
            for key in torch.unique(keys):
                sel = keys == key
                z, pp, cc = tokens[i, sel, k], p_tok[i, sel, k], c_all[i, sel, k]
                best = _lp_value(z.numpy(), pp.numpy(), cc.numpy())
                base = _objective(q_tok[i, sel, k].numpy(), pp.numpy(), cc.numpy())
                assert best >= base - 1e-12  # the best response never loses in sample
                gain += best - base
            assert abs(res.in_sample[i, k].item() - gain) < 1e-9


def test_cross_fit_matches_naive_two_fold():
    data = _synthetic(2, 20, 3, 4, seed=9)
    p_tok, q_tok, tokens = data["p_tok"], data["q_tok"], data["tokens"]
    q_tab = data["q_tab"]  # order 0: [a, k, v]
    res = single_slot_gain(p_tok, q_tok, tokens)
    a = accept_factors(p_tok, q_tok)
    wf = reach(a) * continuation_value(a)
    folds = torch.arange(20) % 2
    for i in range(2):
        for k in range(3):
            held = []
            for f in (0, 1):
                fit, score = folds == f, folds != f
                c = wf[i, fit, k] / fit.sum()
                mass, left = _naive_fill(tokens[i, fit, k].tolist(), p_tok[i, fit, k].tolist(), c.tolist())
                z = tokens[i, score, k]
                q_new = torch.tensor([mass.get(int(t), 0.0) for t in z], dtype=D) + left * q_tab[i, k, z]
                a_new = torch.clamp(q_new / p_tok[i, score, k], max=1.0)
                held.append((wf[i, score, k] * (a_new - a[i, score, k])).mean().item())
            assert abs(res.cross_fitted[i, k].item() - np.mean(held)) < 1e-12


def test_order1_slot0_is_one_cell():
    data = _synthetic(3, 30, 4, 5, seed=12, drafter_order=1)
    args = (data["p_tok"], data["q_tok"], data["tokens"], data["prev"])
    g0 = single_slot_gain(*args, order=0)
    g1 = single_slot_gain(*args, order=1)
    torch.testing.assert_close(g1.in_sample[:, 0], g0.in_sample[:, 0])
    torch.testing.assert_close(g1.cross_fitted[:, 0], g0.cross_fitted[:, 0])
    # finer cells can only help in sample
    assert torch.all(g1.in_sample >= g0.in_sample - 1e-12)


# ------------------------------------------------------------------------------ sweeps


def test_sweeps_in_sample_ascend():
    data = _synthetic(3, 32, 5, 4, seed=13)
    args = (data["p_tok"], data["q_tok"], data["tokens"], data["prev"])
    sw = coordinate_sweep(*args, cross_fit=False)
    iso = single_slot_gain(*args).in_sample
    torch.testing.assert_close(sw.isolated, iso)
    # coordinate ascent on the in-sample objective: never below the best single refit
    assert torch.all(sw.forward >= iso.max(-1).values - 1e-12)
    assert torch.all(sw.backward >= iso.max(-1).values - 1e-12)
    assert torch.all(sw.forward <= 5 + 1 - single_slot_gain(*args).tau_base + 1e-12)
    # the first refit of the forward sweep is the isolated slot-0 refit
    one = coordinate_sweep(data["p_tok"][..., :1], data["q_tok"][..., :1], data["tokens"][..., :1], cross_fit=False)
    first = single_slot_gain(data["p_tok"][..., :1], data["q_tok"][..., :1], data["tokens"][..., :1])
    torch.testing.assert_close(one.forward, first.in_sample[:, 0])


def test_sweeps_cross_fitted_shapes_and_single_slot_reduction():
    data = _synthetic(2, 40, 4, 4, seed=14, drafter_order=1)
    args = (data["p_tok"], data["q_tok"], data["tokens"], data["prev"])
    sw = coordinate_sweep(*args, order=1)
    assert sw.forward.shape == (2,) and sw.isolated.shape == (2, 4)
    torch.testing.assert_close(sw.isolated, single_slot_gain(*args, order=1).cross_fitted)
    torch.testing.assert_close(sw.isolated_sum, sw.isolated.sum(-1))
    # with one slot both sweep directions are the single-slot held-out gain
    one = [x[..., :1] for x in args[:3]]
    s1 = coordinate_sweep(*one, data["prev"], order=1)
    g1 = single_slot_gain(*one, data["prev"], order=1)
    torch.testing.assert_close(s1.forward, g1.cross_fitted[:, 0])
    torch.testing.assert_close(s1.backward, g1.cross_fitted[:, 0])
