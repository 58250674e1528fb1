"""``floorgap check_report --spec JSON --gaps DECOMPOSE.parquet --floors SUMMARY.parquet
[--fidelity F.json ...] [--replay ROUNDS.parquet ...] [--served REQUESTS RUNS ...]
--out-html index.html --out-md summary.md [--log LOG]``

One check of the config's ``check`` section (see :mod:`floorgap.reports.check`): for the drafters
it names (decompose drafters of one target), their floor and model gap by slot beside the lookup
tables, offline tau, the single-slot best-response gain, the export and served checks
(export_fidelity records; serving_replay records of the folders it served), the verdict lines and,
for several drafters, their paired differences; written as a page (``index.html``, figures inline)
and a markdown summary. The spec is ``WorkflowSpec.check_spec``. ``floorgap check FOLDER ...``
runs the workflow up to this stage.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from floorgap.analysis.serving import load_rounds, served_check
from floorgap.errors import StageError
from floorgap.records import read_metadata, read_table
from floorgap.reports.check import ServedCheck, build_check
from floorgap.reports.check_page import write_check
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap check_report",
                          "One check of drafters: verdicts, figures and tables as a page.")
    add_files(parser, "--gaps", "--floors", "--out-html", "--out-md",
              help={"--out-html": "the page (results/check/<name>/index.html)",
                    "--out-md": "the markdown summary (results/check/<name>/summary.md)"})
    parser.add_argument("--fidelity", type=Path, nargs="*", default=[],
                        help="export_fidelity records of the drafters with a reference")
    parser.add_argument("--replay", type=Path, nargs="*", default=[],
                        help="serving_replay records of the drafters the check serves")
    parser.add_argument("--served", type=Path, nargs="*", default=[],
                        help="their serving records: requests.parquet and runs.parquet (the "
                             "engine's own counts) of each")
    return parser


def served_records(paths: list[Path]) -> dict:
    """(requests, runs) of each served system, from the serving stage's records (paired by the
    system their metadata names)."""
    found: dict = {}
    for path in paths:
        kind = "runs" if "wall_s" in read_table(path).columns else "requests"
        found.setdefault(str(read_metadata(path)["system"]), {})[kind] = read_table(path)
    broken = sorted(n for n, f in found.items() if set(f) != {"requests", "runs"})
    if broken:
        raise StageError(f"--served: {broken} lack their requests or runs record; give both "
                         "serving records of each served drafter")
    return {n: (f["requests"], f["runs"]) for n, f in found.items()}


def served_checks(paths: list[Path], spec: dict, logger: logging.Logger,
                  records: dict | None = None) -> dict:
    """The served check of each drafter from its serving_replay record (rounds replayed with
    its reference, or floorgap's import of its folder) and, in ``records``, its serving records
    (:func:`served_records`: what the engine counted itself)."""
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
                             seed=int(spec["seed"]), served=(records or {}).get(name),
                             gamma=meta.get("gamma"))
        out[name] = ServedCheck(engine=str(meta.get("engine")),
                                replayed_with=str(meta.get("replayed_with",
                                                           meta.get("drafter_dir"))), **stats)
        logger.info("%s served in %s: %s", name, meta.get("engine"), stats["by_temperature"])
    return out


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    if not spec.get("drafters"):
        raise StageError("--spec names no drafters (the check entry's drafters)")
    for path in (args.gaps, args.floors):
        if not path.exists():
            raise StageError(f"{path} does not exist; run the gaps and floors stages first")
    records = [json.loads(path.read_text()) for path in args.fidelity]
    fidelity = {str(record["drafter"]): record for record in records}
    try:
        report = build_check(args.gaps, args.floors, spec, fidelity=fidelity,
                             served=served_checks(args.replay, spec, logger,
                                                  served_records(args.served)))
    except ValueError as exc:
        raise StageError(str(exc)) from exc
    write_check(report, args.out_html, args.out_md)
    for verdict in report.verdicts:
        (logger.warning if verdict.flag else logger.info)("%s", verdict.text)
    logger.info("check %s on %s: %d drafter(s), %d comparison(s); wrote %s, %s", report.name,
                report.target, len(report.drafters), len(report.comparisons), args.out_html,
                args.out_md)
