"""Mutual-information recovery rho_{k,m} (paper App. A.3, B.2, C.5, D.3)."""

import itertools
import math

import numpy as np
import torch

from floorgap.estimators.mi import (
    ess_gate_sensitivity,
    kish_ess_log,
    leave_one_out_missing_information,
    log_mixture,
    mi_cell_losses,
    recovery_bootstrap,
    recovery_fraction,
    recovery_terms,
    screen_anchors,
)

D = torch.float64
V, GAMMA, K = 3, 4, 3  # vocabulary, block length, scored slot
ORDERS = [1, 2, 3]  # m = 3 = k reveals the whole prefix


def _chain(seed):
    """A small non-Markov block law: tables[k][z_0..z_{k-1}, v] = p(v | z_<k)."""
    rng = np.random.default_rng(seed)
    tabs = []
    for k in range(GAMMA):
        logits = 2.5 * rng.standard_normal((V,) * (k + 1))
        e = np.exp(logits - logits.max(-1, keepdims=True))
        tabs.append(e / e.sum(-1, keepdims=True))
    return tabs


def _logp(tabs, prefix, v):
    return math.log(tabs[len(prefix)][tuple(prefix) + (v,)])


def _joint(tabs):
    j = tabs[0]
    for k in range(1, GAMMA):
        j = j[..., None] * tabs[k]
    return j  # shape (V,) * GAMMA


def _exact_mi(tabs, k, m):
    """I(Z_k; Z_{k-m..k-1}) by enumeration (m = k gives I(Z_k; Z_<k))."""
    j = _joint(tabs).sum(axis=tuple(range(k + 1, GAMMA)))  # law of Z_0..Z_k
    pk = j.sum(axis=tuple(range(k)))
    window = j.sum(axis=tuple(range(k - m)))  # law of Z_{k-m}..Z_k
    cond = window / window.sum(-1, keepdims=True)
    out = 0.0
    for z in itertools.product(range(V), repeat=k + 1):
        if j[z] > 0:
            out += j[z] * math.log(cond[z[k - m:]] / pk[z[k]])
    return out


def _cell_inputs(tabs, z, prefixes, logw_prefix):
    """Probe arrays for realised block z at slot K over the given full-length prefixes."""
    zk, zpre = z[K], list(z[:K])
    logp_teacher = _logp(tabs, zpre, zk)
    logp_blind = [_logp(tabs, list(s), zk) for s in prefixes]
    logp_cond, logw_reveal = [], []
    for s in prefixes:
        row_c, row_w = [], []
        for m in ORDERS:
            head = list(s[: K - m])
            reveal = zpre[K - m:]
            lw = sum(_logp(tabs, head + reveal[:i], reveal[i]) for i in range(m))
            row_c.append(_logp(tabs, head + reveal, zk))
            row_w.append(lw)
        logp_cond.append(row_c)
        logw_reveal.append(row_w)
    t = lambda x: torch.tensor(x, dtype=D)  # noqa: E731
    return t(logp_teacher), t(logp_blind), t(logp_cond), t(logw_reveal), logw_prefix


def test_exact_enumeration_recovers_mutual_information():
    tabs = _chain(0)
    joint = _joint(tabs)
    prefixes = list(itertools.product(range(V), repeat=K))
    prefix_law = joint.sum(axis=tuple(range(K, GAMMA)))
    logw_prefix = torch.tensor([math.log(prefix_law[s]) for s in prefixes], dtype=D)
    ns, ds, mus = [], [], []
    for z in itertools.product(range(V), repeat=GAMMA):
        losses = mi_cell_losses(*_cell_inputs(tabs, z, prefixes, logw_prefix))
        n, d = recovery_terms(losses)
        ns.append(n)
        ds.append(d)
        mus.append(joint[z])
    n, d, mu = torch.stack(ns), torch.stack(ds), torch.tensor(mus, dtype=D)
    i_full = _exact_mi(tabs, K, K)
    assert abs((mu * d).sum().item() - i_full) < 1e-12
    for j, m in enumerate(ORDERS):
        assert abs((mu * n[:, j]).sum().item() - _exact_mi(tabs, K, m)) < 1e-12
    # Hajek weights 1/pi = mu turn the anchor sums into the expectations
    est = recovery_fraction(n[:, None, :], d[:, None], pi=1.0 / mu)
    for j, m in enumerate(ORDERS):
        assert abs(est.per_slot[0, j].item() - _exact_mi(tabs, K, m) / i_full) < 1e-10
    assert abs(est.per_slot[0, -1].item() - 1.0) < 1e-12  # rho_{k,k} = 1
    assert 0.0 < est.per_slot[0, 0].item() < est.per_slot[0, 1].item() < 1.0


def test_sampled_prefixes_approach_the_truth():
    tabs = _chain(0)
    joint = _joint(tabs).reshape(-1)
    prefix_law = _joint(tabs).sum(axis=tuple(range(K, GAMMA))).reshape(-1)
    rng = np.random.default_rng(1)
    n_paths, n_prefix = 400, 256
    blocks = list(itertools.product(range(V), repeat=GAMMA))
    prefixes = list(itertools.product(range(V), repeat=K))
    ns, ds = [], []
    for zi in rng.choice(len(blocks), size=n_paths, p=joint):
        pre = [prefixes[i] for i in rng.choice(len(prefixes), size=n_prefix, p=prefix_law)]
        losses = mi_cell_losses(*_cell_inputs(tabs, blocks[zi], pre, None))
        n, d = recovery_terms(losses)
        ns.append(n)
        ds.append(d)
    est = recovery_fraction(torch.stack(ns)[:, None, :], torch.stack(ds)[:, None])
    i_full = _exact_mi(tabs, K, K)
    for j, m in enumerate(ORDERS):
        truth = _exact_mi(tabs, K, m) / i_full
        assert abs(est.per_slot[0, j].item() - truth) < 0.08, (m, est.per_slot[0, j].item(), truth)
    torch.testing.assert_close(est.per_slot[0, -1], torch.tensor(1.0, dtype=D))


def test_logsumexp_stability_and_ess():
    logp = torch.tensor([-1000.0, -1001.0, -1002.0], dtype=D)
    expect = -1000.0 + math.log((1 + math.exp(-1) + math.exp(-2)) / 3)
    assert abs(log_mixture(logp).item() - expect) < 1e-12
    logw = torch.tensor([-2000.0, -2000.0, -3000.0], dtype=D)
    assert abs(log_mixture(logp, logw).item() - (-1000.0 + math.log((1 + math.exp(-1)) / 2))) < 1e-12
    torch.testing.assert_close(kish_ess_log(torch.zeros(8, dtype=D)), torch.tensor(8.0, dtype=D))
    torch.testing.assert_close(kish_ess_log(torch.tensor([0.0, -800.0, -900.0], dtype=D)), torch.tensor(1.0, dtype=D))
    torch.testing.assert_close(kish_ess_log(logw), torch.tensor(2.0, dtype=D))


def test_cell_losses_shapes_and_identity():
    g = torch.Generator().manual_seed(0)
    a, k, s, j = 5, 4, 16, 2
    teacher = -torch.rand(a, k, dtype=D, generator=g)
    blind = -torch.rand(a, k, s, dtype=D, generator=g) * 3
    cond = -torch.rand(a, k, s, j, dtype=D, generator=g) * 2
    rev = -torch.rand(a, k, s, j, dtype=D, generator=g) * 5
    out = mi_cell_losses(teacher, blind, cond, rev)
    assert out.c_kk.shape == (a, k) and out.c_k0.shape == (a, k)
    assert out.c_km.shape == (a, k, j) and out.ess.shape == (a, k, j)
    assert torch.all(out.ess <= s + 1e-9) and torch.all(out.ess >= 1 - 1e-9)
    # revealing everything: every prefix scores the teacher-forced probability
    full = mi_cell_losses(teacher, blind, teacher[..., None, None].expand(a, k, s, 1), torch.zeros(a, k, s, 1, dtype=D))
    n, d = recovery_terms(full)
    torch.testing.assert_close(n[..., 0], d)
    torch.testing.assert_close(recovery_fraction(n, d).per_slot, torch.ones(k, 1, dtype=D))


def _random_terms(seed, a=40, k=5, j=3):
    g = torch.Generator().manual_seed(seed)
    d = torch.rand(a, k, dtype=D, generator=g) + 0.05
    n = d[..., None] * torch.rand(a, k, j, dtype=D, generator=g)
    pi = torch.rand(a, dtype=D, generator=g) + 0.1
    ess = torch.rand(a, k, j, dtype=D, generator=g) * 64
    clusters = torch.randint(0, 15, (a,), generator=g)
    return n, d, pi, ess, clusters


def test_recovery_fraction_masks_and_pooling():
    n, d, pi, _, _ = _random_terms(0)
    mask = torch.ones_like(n, dtype=torch.bool)
    mask[:, :2, 1] = False  # order index 1 undefined at the first two slots
    est = recovery_fraction(n, d, pi, mask)
    w = 1 / pi
    k, j = 3, 1
    torch.testing.assert_close(est.per_slot[k, j], (n[:, k, j] * w).sum() / (d[:, k] * w).sum())
    assert torch.isnan(est.per_slot[0, 1])
    num = (n[:, 2:, 1] * w[:, None]).sum()
    den = (d[:, 2:] * w[:, None]).sum()
    torch.testing.assert_close(est.pooled[1], num / den)
    assert est.n_cells[0, 1] == 0 and est.n_cells_pooled[1] == 3 * n.shape[0]


def test_recovery_bootstrap_and_ess_gates():
    n, d, pi, ess, clusters = _random_terms(1)
    boot = recovery_bootstrap(n, d, clusters, pi, n_boot=400, seed=3)
    est = recovery_fraction(n, d, pi)
    torch.testing.assert_close(boot.per_slot.estimate, est.per_slot)
    torch.testing.assert_close(boot.pooled.estimate, est.pooled)
    assert torch.all(boot.pooled.lower <= boot.pooled.estimate) and torch.all(boot.pooled.estimate <= boot.pooled.upper)
    gates = ess_gate_sensitivity(n, d, ess, [0.0, 32.0, 1e9], pi)
    torch.testing.assert_close(gates[0][1].per_slot, est.per_slot)
    gated = recovery_fraction(n, d, pi, ess >= 32.0)
    torch.testing.assert_close(gates[1][1].pooled, gated.pooled)
    assert gates[1][1].n_cells_pooled.sum() < gates[0][1].n_cells_pooled.sum()
    assert torch.all(gates[2][1].n_cells == 0) and torch.all(torch.isnan(gates[2][1].pooled))


def test_screen():
    vals = torch.tensor([0.0, 0.05, 0.051, 1.2], dtype=D)
    assert screen_anchors(vals).tolist() == [False, False, True, True]
    assert screen_anchors(vals, 0.0).tolist() == [False, True, True, True]


def test_leave_one_out_missing_information():
    gen = torch.Generator().manual_seed(3)
    logp = torch.log(torch.rand((2, 5, 5), generator=gen, dtype=D))
    d = leave_one_out_missing_information(logp)
    assert d.shape == (2, 5)
    for b in range(2):
        for r in range(5):
            others = [math.exp(logp[b, r, s].item()) for s in range(5) if s != r]
            want = -math.log(sum(others) / 4) + logp[b, r, r].item()
            assert abs(d[b, r].item() - want) < 1e-12
    # identical prefixes carry no information about the token
    same = torch.log(torch.full((4, 4), 0.3, dtype=D))
    torch.testing.assert_close(leave_one_out_missing_information(same), torch.zeros(4, dtype=D))
