"""``floorgap serving_summary --spec JSON --requests R1 [R2 ...] --runs U1 [U2 ...]
[--replay P1 ...] --out S``

The serving summary of one target (see floorgap.analysis.serving): accepted length and speedup
over AR by system, task, temperature and concurrency, with task macros and row-bootstrap
intervals, and with the drafters' serving_replay records the served-vs-offline rows (served and
offline-predicted tau on the same rounds, the exact acceptance test). The spec holds ``target``,
``tasks`` (the order of the tables), ``bootstrap``, ``level`` and ``seed``.
"""

from __future__ import annotations

import argparse
import logging

import pandas as pd

from floorgap.analysis.serving import load_rounds, load_served, summarise_replay, summarise_serving
from floorgap.records import write_table
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap serving_summary",
                          "Summarise the served accepted length and speedup of one target.")
    add_files(parser, "--requests+", "--runs+", "--out")
    parser.add_argument("--replay", nargs="*", default=[],
                        help="the serving_replay records of the served drafters")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    requests, runs = load_served(args.requests, args.runs)
    summary = summarise_serving(requests, runs, n_boot=int(spec["bootstrap"]),
                                level=float(spec["level"]), seed=int(spec["seed"]),
                                task_order=spec.get("tasks"))
    rounds = load_rounds(args.replay)
    if rounds is not None:
        tasks = [t for t in summary["task"].unique() if t != "macro"]
        replay = summarise_replay(rounds, n_boot=int(spec["bootstrap"]),
                                  level=float(spec["level"]), seed=int(spec["seed"]),
                                  tasks=tasks)
        summary = pd.concat([summary, replay], ignore_index=True)
        for r in replay[replay["statistic"] == "acceptance_z"].itertuples():
            logger.info("%s T=%g: served accepted drafts against the exact offline expectation, "
                        "z = %.2f", r.system, r.temperature, r.estimate)
    engines = sorted(set(requests["engine"])) if "engine" in requests else []
    write_table(args.out, summary, {"stage": "serving_summary", "target": spec["target"]["name"],
                                    "engines": engines, "device": spec["target"]["device"],
                                    "bootstrap": spec["bootstrap"], "level": spec["level"]})
    macro = summary[(summary["task"] == "macro") & (summary["concurrency"] == 0)
                    & (summary["statistic"] == "tau")]
    for r in macro.itertuples():
        logger.info("%s T=%g: tau %.3f [%.3f, %.3f]", r.system, r.temperature, r.estimate,
                    r.lower, r.upper)
