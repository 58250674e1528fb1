"""Benchmarks of the project's hot paths.

    python -m floorgap.bench estimators [--json [PATH]] [--device cpu] [--threads N]

Each subcommand is a function registered in ``BENCHMARKS``; it returns a list of result rows
(name, value, unit, note) that are printed as a table and optionally written as JSON. Inputs
are drawn with fixed seeds so runs are comparable.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True)
class Row:
    """One benchmark result."""

    name: str
    value: float | None
    unit: str
    note: str = ""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], Any], repeats: int, device: torch.device,
                warmup: int = 1) -> float:
    """Median wall time in seconds of ``repeats`` calls of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _dirichlet(M: int, V: int, alpha: float, seed: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.dirichlet(np.full(V, alpha), size=M))
    return (x / x.sum(-1, keepdim=True)).to(dtype=dtype, device=device)


# ------------------------------------------------------------------------- estimators

def bench_barycentre_vs_lp(args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Exact barycentre vs the HiGHS linear programme at M=64, V=1024 (float64)."""
    from floorgap.estimators.barycentre import tv_barycentre, tv_barycentre_lp

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
    from floorgap.estimators.barycentre import tv_barycentre

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
    try:
        from floorgap.estimators.aggregate import prompt_bootstrap
    except (ImportError, AttributeError) as exc:
        return [Row("prompt bootstrap (384x7, B=1e4)", None, "ms", f"unavailable: {exc}")]
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


BENCHMARKS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                            Callable[[argparse.Namespace], list[Row]]]] = {}


def _estimators_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement")
    p.add_argument("--lp-instances", type=int, default=1,
                   help="random instances for the LP comparison")
    p.add_argument("--lp-method", default="highs-ipm",
                   choices=["highs", "highs-ipm", "highs-ds"],
                   help="HiGHS solver for the reference LP (highs-ipm is the fastest here)")


BENCHMARKS["estimators"] = ("barycentre vs LP and sort; prompt bootstrap",
                            _estimators_options, run_estimators)


# ------------------------------------------------------------------------- driver

def format_table(rows: list[Row]) -> str:
    width = max(len(r.name) for r in rows)
    lines = []
    for r in rows:
        if r.value is None:
            val = "n/a"
        elif r.unit == "" and abs(r.value) < 1e-3:
            val = f"{r.value:.3e}"
        else:
            val = f"{r.value:,.3f}"
        lines.append(f"{r.name:<{width}}  {val:>14} {r.unit:<3} {r.note}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m floorgap.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_options, run) in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                       help="also write the results as JSON to PATH (stdout if no PATH)")
        p.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
        p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
        add_options(p)
        p.set_defaults(run=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = args.run(args)
    print(f"floorgap bench {args.command}  (torch {torch.__version__}, device {args.device}, "
          f"threads {torch.get_num_threads()})")
    print(format_table(rows))
    if args.json is not None:
        payload = {"command": args.command, "device": args.device,
                   "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "results": [asdict(r) for r in rows]}
        text = json.dumps(payload, indent=2)
        if args.json == "-":
            print(text)
        else:
            with open(args.json, "w", encoding="utf-8") as fh:
                fh.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
