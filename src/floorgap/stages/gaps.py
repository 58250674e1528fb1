"""``floorgap gaps --spec JSON --anchor-slot FLOORS --paths P... --slots S...
--out-summary summary.parquet --log LOG``

The gap half of one target (CPU): model gaps against the floors, exposure, free vs serving
risk, dependence of the accept factors, single-slot best-response gains and coordinate sweeps
of every evaluated drafter variant, with Hajek weights and prompt-cluster bootstrap intervals
(long format). See :mod:`floorgap.analysis.gaps` for the statistics.

The spec is the config's ``analysis`` section: ``bootstrap`` (B), ``level``; optional ``seed``,
``contrasts`` (required: list of [a, b] variant pairs, possibly empty), ``sweeps`` (default
true; the coordinate sweeps are the costly part) and ``labels`` (renames variants, e.g. the
final weights of a trajectory variant to ``<variant>@epoch-<E>``) and ``lookups`` (the lookup
tables among the variants: each contrast [drafter, table] is logged as a verdict, a warning
where the drafter loses to the table at some slot).
"""

from __future__ import annotations

import argparse
import logging

from floorgap.analysis.gaps import load_records, per_anchor_floor_check, summarise
from floorgap.analysis.lookup_verdicts import lookup_verdicts
from floorgap.errors import StageError
from floorgap.progress import Timer
from floorgap.records import write_table
from floorgap.stages._cli import add_files, bootstrap_settings, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap gaps", "Gaps, exposure, serving risk, dependence "
                          "and best responses of the drafters of one target.")
    add_files(parser, "--anchor-slot", "--paths+", "--slots+", "--out-summary",
              help={"--anchor-slot": "the floors stage's anchor x slot table",
                    "--paths": "drafter_eval paths-<shard>.parquet files (every variant)",
                    "--slots": "drafter_eval slots-<shard>.parquet files (every variant)"})
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    n_boot, level, seed = bootstrap_settings(spec)
    if "contrasts" not in spec:
        raise StageError("--spec lacks 'contrasts' (pairs [a, b] of variants to compare; "
                         "the workflow names ours and the order-1 baseline from drafters.roles)")
    contrasts = [tuple(c) for c in spec["contrasts"]]
    sweeps = bool(spec.get("sweeps", True))

    timer = Timer()
    # A RecordMismatch is a StageError: the stage reports it as one line naming the files.
    rec = load_records(args.anchor_slot, args.paths, args.slots, spec.get("labels"))
    for v in rec.variants.values():
        logger.info("variant %s (order %d): %d complete anchors, %d incomplete", v.name, v.order,
                    len(v.anchor_ids), len(v.incomplete))
    logger.info("records read in %.1f s", timer.seconds)
    bad = per_anchor_floor_check(rec)
    if len(bad):
        logger.warning("%d anchor x slot cells with R^oracle below T1 (e.g. %s)", len(bad),
                       bad.iloc[0].to_dict())
    timer = Timer()
    summary = summarise(rec, n_boot=n_boot, level=level, seed=seed, contrasts=contrasts,
                        sweeps=sweeps)
    logger.info("summary: %d rows (B=%d) in %.1f s", len(summary), n_boot, timer.seconds)
    tables = set(spec.get("lookups", []))
    for verdict in lookup_verdicts(summary, [c for c in contrasts if c[1] in tables]):
        (logger.warning if verdict.loses else logger.info)("%s", verdict.sentence())
    meta = {"stage": "gaps", "target": rec.target, "prompts": rec.prompts, "gamma": rec.gamma,
            "analysis": spec, "seed": seed,
            "variants": {v.name: {"order": v.order, "anchors": len(v.anchor_ids),
                                  "incomplete": len(v.incomplete)}
                         for v in rec.variants.values()},
            "floor_violations": len(bad),
            "inputs": {"anchor_slot": str(args.anchor_slot),
                       "paths": [str(p) for p in args.paths],
                       "slots": [str(p) for p in args.slots]}}
    write_table(args.out_summary, summary, meta)
    logger.info("wrote %s", args.out_summary)

