"""``floorgap floors --spec JSON --anchors A... --paths P... --floors F...
--out-anchor-slot anchor_slot.parquet --out-summary summary.parquet --log LOG``

The floors stage of one target (CPU): reads every rollouts shard of every domain and the
anchors files, adds the top-K floor with its truncation band, the K-median objectives and the
effective support to the probe's full-vocabulary floors (one row per anchor x slot), and
aggregates them with Hajek weights and prompt-cluster bootstrap intervals (long-format
summary). See :mod:`floorgap.analysis.floors` for the statistics.

The spec is the config's ``analysis`` section: ``bootstrap`` (B), ``level``, ``kmedian_k``,
``kmedian_restarts``; optional ``seed`` (default 20260818) keys the bootstrap and the K-median
seeding, and ``reveal_undefined_max`` (default 0.05) is the largest share of revealed
predecessors at a slot whose importance weights may all be zero before the stage fails.
"""

from __future__ import annotations

import argparse
import logging

from floorgap.analysis.floors import (anchor_slot_table, check_anchor_slot_table,
                                      check_reveal_undefined, load_records, log_record_problems,
                                      summarise)
from floorgap.errors import StageError
from floorgap.progress import Timer
from floorgap.records import write_table
from floorgap.stages._cli import add_files, bootstrap_settings, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap floors", "Floors of one target: anchor x slot values and "
                          "their Hajek/bootstrap summary.")
    add_files(parser, "--anchors+", "--paths+", "--floors+", "--out-anchor-slot", "--out-summary",
              help={"--anchors": "anchors file of every domain (their order is the domain order)",
                    "--paths": "rollouts paths-<shard>.parquet files",
                    "--floors": "rollouts floors-<shard>.parquet files"})
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    n_boot, level, seed = bootstrap_settings(spec)
    try:
        ks, restarts = sorted(int(k) for k in spec["kmedian_k"]), int(spec["kmedian_restarts"])
    except KeyError as exc:
        raise StageError(f"--spec lacks analysis key {exc}") from exc

    timer = Timer()
    # A RecordMismatch is a StageError: the stage reports it as one line naming the files.
    records = load_records(args.anchors, args.paths, args.floors)
    counts = records.issue_counts()
    logger.info("records of %s: %d anchors, %d prompts, gamma=%d, M=%d, top-K=%d, J=%d; "
                "problems: %s (%.1f s)", records.target, len(records.anchors),
                records.anchors["prompt_id"].nunique(), records.gamma,
                records.paths_per_anchor, records.top_k, records.reveal_paths,
                counts or "none", timer.seconds)

    timer = Timer()
    table = anchor_slot_table(records, kmedian_k=ks, kmedian_restarts=restarts, seed=seed)
    logger.info("anchor x slot values (top-K floor, K-median K=%s x %d restarts, N_eff): "
                "%d cells in %.1f s", ks, restarts, len(table), timer.seconds)
    check_anchor_slot_table(table, ks)

    timer = Timer()
    summary = summarise(table, records, n_boot=n_boot, level=level, kmedian_k=ks, seed=seed)
    logger.info("summary: %d rows (B=%d, level=%.3f) in %.1f s", len(summary), n_boot, level,
                timer.seconds)
    log_record_problems(summary)
    check_reveal_undefined(summary, float(spec["reveal_undefined_max"]))

    meta = {"stage": "floors", "target": records.target, "prompts": records.prompts,
            "gamma": records.gamma, "paths_per_anchor": records.paths_per_anchor,
            "store_top_k": records.top_k,
            "reveal_paths": records.reveal_paths, "analysis": spec, "seed": seed,
            "domains": records.domains, "issues": counts,
            "inputs": {"anchors": [str(p) for p in args.anchors],
                       "paths": [str(p) for p in args.paths],
                       "floors": [str(p) for p in args.floors]}}
    write_table(args.out_anchor_slot, table, meta)
    write_table(args.out_summary, summary, meta)
    logger.info("wrote %s and %s", args.out_anchor_slot, args.out_summary)

