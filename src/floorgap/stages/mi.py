"""``floorgap mi --spec JSON --model-dir DIR --corpus C --anchors A --out MI.parquet
--log LOG``

Mutual-information recovery at every anchor of one domain (see floorgap.probes.mi): an
independent screening pass of ``screen_paths`` fresh paths estimates the final-slot missing
information; anchors above ``threshold_nats`` get the measurement with ``paths`` fresh paths
(one scored path, the rest prefixes). One row per anchor x slot x order; screened-out anchors
keep their rows (with their screen value and NaN losses), so they are counted, not dropped.

The spec holds ``target`` (config entry with ``name``), ``mi`` (``screen_paths``, ``paths``,
``threshold_nats``, ``orders``, ``ess_gates``), ``law``, ``gamma`` and ``forward_batch`` (the
fixed rows of every forward, as in the rollouts).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from floorgap.errors import StageError
from floorgap.stages._cli import run_stage, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap mi", "Measure mutual-information recovery at one domain's "
                                         "anchors.")
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--anchors", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    from floorgap.progress import progress
    from floorgap.data.anchors import anchor_contexts
    from floorgap.estimators.mi import screen_anchors
    from floorgap.models.targets import load_target
    from floorgap.probes.mi import anchor_cells, measure_anchor, screen_anchor
    from floorgap.records import dataclass_rows, read_metadata, read_table, write_table
    from floorgap.sampling import SamplingLaw

    import numpy as np
    import torch

    spec = args.spec
    cfg, target = spec["mi"], spec["target"]
    gamma = int(spec["gamma"])
    orders = [int(m) for m in cfg["orders"]]
    forward_batch = int(spec["forward_batch"])
    threshold = float(cfg["threshold_nats"])
    if gamma < 2:
        raise StageError(f"mutual-information recovery needs gamma >= 2 (got {gamma})")
    anchors = read_table(args.anchors).sort_values("anchor_id", kind="stable")
    anchors = anchors.reset_index(drop=True)
    if not len(anchors):
        raise StageError(f"{args.anchors} holds no anchors")
    anchor_meta = read_metadata(args.anchors)
    if int(anchor_meta.get("gamma", gamma)) != gamma:
        raise StageError(f"{args.anchors} was drawn for gamma={anchor_meta.get('gamma')}, "
                         f"not {gamma}; rebuild the anchors")
    corpus = read_table(args.corpus)
    law = SamplingLaw.from_spec(spec["law"])
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    contexts = anchor_contexts(corpus, anchors)
    rows, screen_seconds, measure_seconds = [], [], []
    n_screened = 0
    bar = progress(total=len(anchors), desc=f"mi {anchor_meta.get('domain', '')}", unit="anchor")
    for a, ctx in zip(anchors.itertuples(index=False), contexts):
        seed = int(a.anchor_seed)
        screen = screen_anchor(model, ctx, n_paths=int(cfg["screen_paths"]), gamma=gamma,
                               law=law, anchor_seed=seed, forward_batch=forward_batch)
        screen_seconds.append(screen.seconds)
        keep = bool(screen_anchors(torch.tensor(screen.value), threshold))
        measured = None
        if keep:
            n_screened += 1
            measured = measure_anchor(model, ctx, n_paths=int(cfg["paths"]), gamma=gamma,
                                      orders=orders, law=law, anchor_seed=seed,
                                      forward_batch=forward_batch)
            measure_seconds.append(measured.seconds)
            L = measured.losses
            d = (L.c_k0 - L.c_kk)[1:]
            logger.info("anchor %s: context %d tokens, screen %.3f nats (%.2f s), measured "
                        "(%.2f s): d by slot %s, min ESS %.1f", a.anchor_id, len(ctx),
                        screen.value, screen.seconds, measured.seconds,
                        " ".join(f"{float(x):.3f}" for x in d),
                        float(torch.nan_to_num(L.ess, nan=float("inf")).min()))
        else:
            logger.info("anchor %s: context %d tokens, screen %.3f nats <= %.3f: screened out "
                        "(%.2f s)", a.anchor_id, len(ctx), screen.value, threshold,
                        screen.seconds)
        rows += anchor_cells(a, screen, measured, screened=keep, gamma=gamma, orders=orders)
        bar.update()
    bar.close()
    table = dataclass_rows(rows)
    measured_rows = table[table.screened & table.slot.gt(table.order)]
    losses = measured_rows[["c_k0", "c_km", "c_kk"]].to_numpy(dtype=float)
    bad = int((~np.isfinite(losses).all(axis=1)).sum())
    if bad:
        logger.warning("%d measured cells have non-finite losses (e.g. a scored token outside "
                       "the law's support along every prefix); the estimators leave them out",
                       bad)
    meta = {"target": target["name"], "domain": anchor_meta.get("domain"), "mi": cfg,
            "law": spec["law"], "gamma": gamma, "forward_batch": forward_batch,
            "anchors": len(anchors), "screened": n_screened, "non_finite_cells": bad,
            "dtype": target["dtype"], "device": target["device"],
            "stand_in_for": anchor_meta.get("stand_in_for")}
    write_table(args.out, table, meta)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    logger.info("wrote %d rows: %d of %d anchors screened in (threshold %.3f nats); mean %.2f s "
                "screening, %.2f s measuring per anchor", len(table), n_screened, len(anchors),
                threshold, mean(screen_seconds), mean(measure_seconds))

