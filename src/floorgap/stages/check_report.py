"""``floorgap check_report --spec JSON --gaps DECOMPOSE.parquet --floors SUMMARY.parquet
[--fidelity F.json ...] [--replay ROUNDS.parquet ...] --out-html index.html --out-md summary.md
[--log LOG]``

One check of the config's ``check`` section (see :mod:`floorgap.reports.check`): for the
drafters it names (decompose drafters of one target), their floor and model gap by slot beside
the lookup tables, offline tau, the single-slot best-response gain, the export and served
checks (export_fidelity records; serving_replay records of the folders it served), the verdict
lines and, for several drafters, their paired differences; written as a page (``index.html``,
figures inline) and a markdown summary. The spec is ``WorkflowSpec.check_spec``. ``floorgap check FOLDER ...``
runs the workflow up to this stage.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from floorgap.errors import StageError
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap check_report",
                          "One check of drafters: verdicts, figures and tables as a page.")
    add_files(parser, "--gaps", "--floors", "--out-html", "--out-md",
              help={"--gaps": "the gaps summary of the decompose group (gaps/decompose.parquet)",
                    "--floors": "the floors summary of the same target (floors/summary.parquet)",
                    "--out-html": "the page (results/check/<name>/index.html)",
                    "--out-md": "the markdown summary (results/check/<name>/summary.md)"})
    parser.add_argument("--fidelity", type=Path, nargs="*", default=[],
                        help="export_fidelity records of the drafters with a reference")
    parser.add_argument("--replay", type=Path, nargs="*", default=[],
                        help="serving_replay records of the drafters the check serves")
    return parser


def served_checks(paths: list[Path], spec: dict, logger: logging.Logger) -> dict:
    """The served check of each drafter from its serving_replay record (rounds replayed with
    its reference, or floorgap's import of its folder)."""
    from floorgap.analysis.serving import load_rounds, served_check
    from floorgap.records import read_metadata
    from floorgap.reports.check import ServedCheck

    out = {}
    for path in paths:
        meta = read_metadata(path)
        name = str(meta["system"])
        rounds = load_rounds([path])
        if rounds is None:
            # SGLang reports per-request totals only: nothing to replay
            out[name] = ServedCheck(engine=str(meta.get("engine")), replayed_with="",
                                    by_temperature={},
                                    note=str(meta.get("note") or "no replayed round"))
            logger.warning("%s: %s", path, out[name].note)
            continue
        stats = served_check(rounds, tasks=list(spec.get("tasks") or
                                                dict.fromkeys(rounds["task"])),
                             n_boot=int(spec["bootstrap"]), level=float(spec["level"]),
                             seed=int(spec["seed"]))
        out[name] = ServedCheck(engine=str(meta.get("engine")),
                                replayed_with=str(meta.get("replayed_with",
                                                           meta.get("drafter_dir"))), **stats)
        logger.info("%s served in %s: %s", name, meta.get("engine"), stats["by_temperature"])
    return out


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    from floorgap.reports.check import build_check
    from floorgap.reports.check_page import write_check

    spec = args.spec
    if not spec.get("drafters"):
        raise StageError("--spec names no drafters (the check entry's drafters)")
    for path in (args.gaps, args.floors):
        if not path.exists():
            raise StageError(f"{path} does not exist; run the gaps and floors stages first")
    fidelity = {}
    for path in args.fidelity:
        record = json.loads(path.read_text())
        fidelity[str(record["drafter"])] = record
    try:
        report = build_check(args.gaps, args.floors, spec, fidelity=fidelity,
                             served=served_checks(args.replay, spec, logger))
    except ValueError as exc:
        raise StageError(str(exc)) from exc
    write_check(report, args.out_html, args.out_md)
    for verdict in report.verdicts:
        (logger.warning if verdict.flag else logger.info)("%s", verdict.text)
    logger.info("check %s on %s: %d drafter(s), %d comparison(s); wrote %s, %s", report.name,
                report.target, len(report.drafters), len(report.comparisons), args.out_html,
                args.out_md)
