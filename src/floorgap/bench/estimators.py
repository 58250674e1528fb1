"""``floorgap bench estimators``: the TV barycentre against the LP and a sort, and the prompt
bootstrap, on seeded Dirichlet draws."""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from floorgap.bench.timing import Row, median_time
from floorgap.estimators.aggregate import prompt_bootstrap
from floorgap.estimators.barycentre import tv_barycentre, tv_barycentre_lp


def _dirichlet(M: int, V: int, alpha: float, seed: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.dirichlet(np.full(V, alpha), size=M))
    return (x / x.sum(-1, keepdim=True)).to(dtype=dtype, device=device)


def bench_barycentre_vs_lp(args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Exact barycentre vs the HiGHS linear programme at M=64, V=1024 (float64)."""
    M, V = 64, 1024
    rows: list[Row] = []
    t_bary, t_lp, diffs = [], [], []
    for i in range(args.lp_instances):
        P = _dirichlet(M, V, 0.1, seed=1000 + i, dtype=torch.float64, device=device)
        t_bary.append(median_time(lambda: tv_barycentre(P), args.repeats * 4, device))
        start = time.perf_counter()
        lp = tv_barycentre_lp(P, method=args.lp_method)
        t_lp.append(time.perf_counter() - start)
        diffs.append(abs(float(tv_barycentre(P).value) - float(lp.value)))
    tb, tl = statistics.median(t_bary), statistics.median(t_lp)
    note = f"M={M} V={V} float64, Dirichlet(0.1), {args.lp_instances} instance(s)"
    rows.append(Row("barycentre time (M=64,V=1024)", tb * 1e3, "ms", note))
    rows.append(Row(f"HiGHS LP time ({args.lp_method})", tl * 1e3, "ms", "tolerances 1e-10"))
    rows.append(Row("speed-up over HiGHS", tl / tb, "x", "goal >= 100"))
    rows.append(Row("max |value - LP value|", max(diffs), "", "goal <= 1e-9"))
    return rows


def bench_barycentre_vs_sort(args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Exact barycentre vs one torch.sort(P, dim=0) at M=256, V=49152 (float32)."""
    M, V = 256, 49152
    P = _dirichlet(M, V, 0.05, seed=2000, dtype=torch.float32, device=device)
    # Interleave the two measurements so that background load affects both alike.
    t_sort, t_bary = [], []
    for _ in range(args.repeats):
        t_sort.append(median_time(lambda: torch.sort(P, dim=0), 1, device))
        t_bary.append(median_time(lambda: tv_barycentre(P), 1, device))
    ts, tb = statistics.median(t_sort), statistics.median(t_bary)
    note = f"M={M} V={V} float32, median of {args.repeats}"
    return [Row("torch.sort(P, dim=0) time", ts * 1e3, "ms", note),
            Row("barycentre time (M=256,V=49152)", tb * 1e3, "ms", note),
            Row("barycentre / sort", tb / ts, "x", "goal <= 2")]


def bench_bootstrap(args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Prompt bootstrap of 384 anchors x 7 slots with B = 10^4 replicates."""
    n_anchors, n_prompts, n_slots, n_boot = 384, 170, 7, 10_000
    g = torch.Generator().manual_seed(3000)
    clusters = torch.cat([torch.arange(n_prompts),
                          torch.randint(0, n_prompts, (n_anchors - n_prompts,), generator=g)])
    num = torch.rand(n_anchors, n_slots, generator=g, dtype=torch.float64).to(device)
    pi = (0.2 + 0.8 * torch.rand(n_anchors, generator=g, dtype=torch.float64)).to(device)
    try:
        t = median_time(lambda: prompt_bootstrap(num, clusters, pi, n_boot=n_boot, seed=1),
                        max(3, args.repeats // 2), device)
    except TypeError as exc:  # signature differs from the one this benchmark expects
        return [Row("prompt bootstrap (384x7, B=1e4)", None, "ms", f"unavailable: {exc}")]
    return [Row("prompt bootstrap (384x7, B=1e4)", t * 1e3, "ms",
                f"{n_prompts} prompts, Hajek weights")]


def run_estimators(args: argparse.Namespace) -> list[Row]:
    device = torch.device(args.device)
    rows: list[Row] = []
    rows += bench_barycentre_vs_lp(args, device)
    rows += bench_barycentre_vs_sort(args, device)
    rows += bench_bootstrap(args, device)
    return rows
