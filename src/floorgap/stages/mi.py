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

from floorgap.models.targets import load_target
from floorgap.probes.mi import non_finite_cells, probe_anchors, read_mi_inputs
from floorgap.records import dataclass_rows, prompt_format, write_table
from floorgap.sampling import SamplingLaw
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap mi", "Measure mutual-information recovery at one domain's "
                                         "anchors.")
    add_files(parser, "--model-dir", "--corpus", "--anchors", "--out")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    cfg, target = spec["mi"], spec["target"]
    gamma = int(spec["gamma"])
    forward_batch = int(spec["forward_batch"])
    threshold = float(cfg["threshold_nats"])
    anchors, anchor_meta, corpus = read_mi_inputs(args.anchors, args.corpus, gamma)
    law = SamplingLaw.from_spec(spec["law"])
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    run = probe_anchors(model, anchors, corpus, cfg=cfg, gamma=gamma, law=law,
                        forward_batch=forward_batch,
                        desc=f"mi {anchor_meta.get('domain', '')}")
    table = dataclass_rows(run.rows)
    bad = non_finite_cells(table)
    if bad:
        logger.warning("%d measured cells have non-finite losses (e.g. a scored token outside "
                       "the law's support along every prefix); the estimators leave them out",
                       bad)
    meta = {"target": target["name"], "prompts": prompt_format(target),
            "domain": anchor_meta.get("domain"), "mi": cfg,
            "law": spec["law"], "gamma": gamma, "forward_batch": forward_batch,
            "anchors": len(anchors), "screened": run.n_screened, "non_finite_cells": bad,
            "dtype": target["dtype"], "device": target["device"],
            "stand_in_for": anchor_meta.get("stand_in_for")}
    write_table(args.out, table, meta)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    logger.info("wrote %d rows: %d of %d anchors screened in (threshold %.3f nats); mean %.2f s "
                "screening, %.2f s measuring per anchor", len(table), run.n_screened,
                len(anchors), threshold, mean(run.screen_seconds), mean(run.measure_seconds))
