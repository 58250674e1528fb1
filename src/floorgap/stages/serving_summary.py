"""``floorgap serving_summary --spec JSON --requests R1 [R2 ...] --runs U1 [U2 ...] --out S``

The serving summary of one target (see floorgap.analysis.serving): accepted length and speedup
over AR by system, task, temperature and concurrency, with task macros and row-bootstrap
intervals. The spec holds ``target``, ``tasks`` (the order of the tables), ``bootstrap``,
``level`` and ``seed``.
"""

from __future__ import annotations

import argparse
import logging

from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap serving_summary",
                          "Summarise the served accepted length and speedup of one target.")
    add_files(parser, "--requests+", "--runs+", "--out")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    from floorgap.analysis.serving import load_served, summarise_serving
    from floorgap.records import write_table

    spec = args.spec
    requests, runs = load_served(args.requests, args.runs)
    summary = summarise_serving(requests, runs, n_boot=int(spec["bootstrap"]),
                                level=float(spec["level"]), seed=int(spec["seed"]),
                                task_order=spec.get("tasks"))
    engines = sorted(set(requests["engine"])) if "engine" in requests else []
    write_table(args.out, summary, {"stage": "serving_summary", "target": spec["target"]["name"],
                                    "engines": engines, "device": spec["target"]["device"],
                                    "bootstrap": spec["bootstrap"], "level": spec["level"]})
    macro = summary[(summary["task"] == "macro") & (summary["concurrency"] == 0)]
    for r in macro.itertuples():
        logger.info("%s T=%g: tau %.3f [%.3f, %.3f]", r.system, r.temperature, r.estimate,
                    r.lower, r.upper)
