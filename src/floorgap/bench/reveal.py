"""``floorgap bench reveal``: the importance route of T^(1) on real anchors, its interval width
against the revealed paths J."""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from floorgap.analysis.reveal import reveal_stats
from floorgap.bench.timing import Row
from floorgap.data.anchors import anchor_contexts, check_anchors_gamma
from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED
from floorgap.models.targets import load_target
from floorgap.probes.rollouts import revealed_floors, sample_block
from floorgap.records import atomic_path, read_metadata, read_table
from floorgap.sampling import SamplingLaw


def reveal_floors(block: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``[gamma, J]`` importance-route floors of each revealed predecessor j at each slot, and
    the Kish ESS of their weights (float64, CPU): the probe's
    :func:`floorgap.probes.rollouts.revealed_floors`, kept per j instead of averaged. Slot 0
    (no predecessor) and a j whose weights are all zero are NaN."""
    if block.revealed is None:
        raise ValueError("the block was sampled without revealed predecessors")
    gamma, J = block.probs.shape[0], block.revealed.shape[1]
    values = torch.full((gamma, J), float("nan"), dtype=torch.float64)
    ess = torch.full((gamma, J), float("nan"), dtype=torch.float64)
    for k in range(1, gamma):
        rw = revealed_floors(block, k)
        values[k] = rw.value.double().cpu()
        ess[k] = rw.ess.double().cpu()
    return values, ess


def _reveal_rows(J: int, st: dict[str, Any], ref: tuple[int, dict[str, Any]], *, last: int,
                 n_anchors: int, n_boot: int, n_prompts: int, level: float) -> list[Row]:
    """The rows of one J (``st``: its statistics from
    :func:`floorgap.analysis.reveal.reveal_stats`; ``ref`` = (J, statistics) of the reference J
    of the width ratios)."""
    rows: list[Row] = []
    for key, label in (("last", f"slot {last}"), ("mean", f"slots 1-{last} mean")):
        est, lo, hi, n_used, _ = st[key]
        ref_width = ref[1][key][2] - ref[1][key][1]
        rows += [Row(f"J={J} {label}: T1 reweighted", est, "",
                     f"Hajek; {level:.0%} [{lo:.4f}, {hi:.4f}], width {hi - lo:.4f}; "
                     f"{n_used} anchors"),
                 Row(f"J={J} {label}: interval width", hi - lo, "",
                     f"prompt bootstrap B={n_boot}, {n_prompts} prompts"),
                 Row(f"J={J} {label}: width ratio vs J={ref[0]}", (hi - lo) / ref_width, "x")]
    sd_all, sd_last = st["sd"]
    rows.append(Row(f"J={J} within-anchor sd over j", None if J < 2 else sd_all, "",
                    "needs J >= 2" if J < 2 else
                    f"mean over anchor x slots 1-{last}; slot {last}: {sd_last:.4f}"))
    rows.append(Row(f"J={J} within-j variance share", st["mean"][4], "",
                    f"approx., of the slot mean's bootstrap variance; slot {last}: "
                    f"{st['last'][4]:.3f}"))
    rows.append(Row(f"J={J} decode forwards per step", float(1 + J), "x",
                    "(1+J)/(1+0), relative to no reveal"))
    cells, empty = st["undefined"]
    rows.append(Row(f"J={J} undefined (j, slot, anchor) cells", float(cells), "n",
                    f"of {J * (last) * n_anchors}; anchor-slots with no defined j: {empty}"))
    return rows


def reveal_summary(floors: torch.Tensor, pi: torch.Tensor, prompts: list[str],
                   grid: list[int], *, n_boot: int, seed: int | None = None,
                   level: float = 0.95) -> list[Row]:
    """Per-J summary rows of the importance route from per-j floors
    (:func:`floorgap.analysis.reveal.reveal_stats`, which says what each number is): for the
    last slot and for the mean over slots 1..gamma-1 the Hajek mean with its interval, the
    width and its ratio to the first J of the grid; then the within-anchor sd over j, the
    within-j variance share, the decode forwards per step relative to no reveal, and the count
    of undefined cells."""
    floors = torch.as_tensor(floors, dtype=torch.float64)
    stats, n_clusters = reveal_stats(floors, pi, prompts, grid, n_boot=n_boot, seed=seed,
                                     level=level)
    n, gamma, _ = floors.shape
    first = min(stats)
    rows: list[Row] = []
    for J in sorted(stats):
        rows += _reveal_rows(J, stats[J], (first, stats[first]), last=gamma - 1,
                             n_anchors=n, n_boot=n_boot, n_prompts=n_clusters, level=level)
    return rows


def _reveal_anchors(args: argparse.Namespace) -> tuple[list[Any], list[list[int]], list[str],
                                                        int]:
    """The first ``--anchors-per-domain`` anchor rows of every domain file (file order), their
    contexts, the domains and gamma (``--gamma``, else the anchors' metadata, else 7)."""
    base = Path(args.results, args.target)
    files = sorted((base / "anchors").glob("*.parquet"))
    if not files:
        raise SystemExit(f"no anchors under {base / 'anchors'}")
    gamma = args.gamma
    anchor_rows, contexts, domains = [], [], []
    for path in files:
        meta = read_metadata(path)
        if gamma is None:
            gamma = int(meta.get("gamma", 7))
        check_anchors_gamma(path, meta, gamma)
        anchors = read_table(path).head(args.anchors_per_domain)  # file order
        contexts += anchor_contexts(read_table(base / "corpus" / path.name), anchors)
        anchor_rows += list(anchors.itertuples(index=False))
        domains.append(path.stem)
    assert gamma is not None
    if gamma < 2:
        raise SystemExit("the importance route needs gamma >= 2")
    return anchor_rows, contexts, domains, gamma


def _save_reveal_floors(path: str, floors: torch.Tensor, ess: torch.Tensor, pi: torch.Tensor,
                        prompts: list[str], anchor_ids: list[str], seconds: list[float]) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, floors=floors.numpy(), ess=ess.numpy(), pi=pi.numpy(),
                 prompts=np.array(prompts), anchor_ids=np.array(anchor_ids),
                 seconds=np.array(seconds))


def run_reveal(args: argparse.Namespace) -> list[Row]:
    """The importance route of T^(1) at the first anchors of every domain: one
    ``sample_block(reveal_paths=max_reveal)`` per anchor, the floor of every revealed
    predecessor at every slot, and the interval of the Hajek mean for each J of the grid."""
    start = time.perf_counter()
    if not Path(args.model_dir, "floorgap_model.json").is_file():
        raise SystemExit(f"{args.model_dir} is not a materialised target; build it with "
                         f"`snakemake --cores all {args.model_dir}`")
    J_max = args.max_reveal
    if not 1 <= J_max <= min(args.forward_batch, args.paths):
        raise SystemExit("--max-reveal must lie in 1..min(--forward-batch, --paths)")
    grid = sorted({int(x) for x in args.reveal_grid.split(",") if x.strip()})
    if not grid or grid[0] < 1 or grid[-1] > J_max:
        raise SystemExit(f"--reveal-grid must hold values in 1..{J_max}")
    anchor_rows, contexts, domains, gamma = _reveal_anchors(args)
    model, _ = load_target(args.model_dir, args.dtype, torch.device(args.device))
    law = SamplingLaw()  # the evaluation law: temperature 1, no truncation
    n = len(anchor_rows)
    floors = torch.empty((n, gamma, J_max), dtype=torch.float64)
    ess = torch.empty_like(floors)
    t_sample, t_floor = [], []
    for i, (a, ctx) in enumerate(zip(anchor_rows, contexts)):
        block = sample_block(model, ctx, n_paths=args.paths, gamma=gamma, law=law,
                             anchor_seed=int(a.anchor_seed), forward_batch=args.forward_batch,
                             reveal_paths=J_max)
        t0 = time.perf_counter()
        floors[i], ess[i] = reveal_floors(block)
        t_floor.append(time.perf_counter() - t0)
        t_sample.append(block.seconds)
        del block
        print(f"[{i + 1}/{n}] {a.anchor_id}: context {len(ctx)}, sample {t_sample[-1]:.1f} s, "
              f"floors {t_floor[-1]:.1f} s; mean over j by slot "
              + " ".join(f"{float(v):.3f}" for v in floors[i, 1:].nanmean(-1)),
              file=sys.stderr, flush=True)
    pi = torch.tensor([float(a.pi) for a in anchor_rows], dtype=torch.float64)
    prompts = [str(a.prompt_id) for a in anchor_rows]
    if args.save_floors:
        _save_reveal_floors(args.save_floors, floors, ess, pi, prompts,
                            [str(a.anchor_id) for a in anchor_rows], t_sample)
    ess_ok = ess[:, 1:][torch.isfinite(floors[:, 1:])]
    rows = [
        Row("anchors", float(n), "n", f"first {args.anchors_per_domain} of each of "
            f"{', '.join(domains)} (file order); {len(set(prompts))} prompts"),
        Row("paths x gamma", float(args.paths * gamma), "", f"M={args.paths}, gamma={gamma}, "
            f"forward_batch={args.forward_batch}, max reveal {J_max}, law T={law.temperature} "
            f"top_p={law.top_p} top_k={law.top_k}, {args.dtype}"),
        Row(f"sample_block per anchor (J={J_max})", statistics.mean(t_sample), "s",
            f"min {min(t_sample):.1f}, max {max(t_sample):.1f}"),
        Row("per-j floors per anchor", statistics.mean(t_floor), "s",
            f"{gamma - 1} slots x {J_max} j"),
        Row("Kish ESS of the weights (mean)", float(ess_ok.mean()) if ess_ok.numel() else None,
            "", f"over defined (anchor, slot, j) cells; at most M-1 = {args.paths - 1}"),
        Row("Kish ESS of the weights (min)", float(ess_ok.min()) if ess_ok.numel() else None,
            ""),
    ]
    rows += reveal_summary(floors, pi, prompts, grid, n_boot=args.bootstrap,
                           seed=DEFAULT_BOOT_SEED)
    rows.append(Row("bench wall time", time.perf_counter() - start, "s"))
    return rows
