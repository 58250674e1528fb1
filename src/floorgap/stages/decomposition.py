"""``floorgap decomposition --spec JSON --gaps DECOMPOSE.parquet --floors SUMMARY.parquet
--out-csv NAME.csv --out-tex NAME.tex --out-md NAME.md [--log LOG]``

One drafter of the config's ``decompose`` section split into information floor and model gap by
slot (see :mod:`floorgap.reports.decomposition`): from the gaps summary of the ``decompose`` group
and the floors summary of the same target, a long csv (statistic, slot, estimate, lower, upper), a
LaTeX ``tabular`` and a markdown table. The spec holds ``target``, ``drafter`` (the name),
``entry`` (its config entry, with the resolved ``kind``), ``level`` (the bootstrap interval level)
and ``lookups`` (the lookup tables of its order beside it). ``floorgap decompose FOLDER`` runs the
workflow up to this stage for a checkpoint folder of your own.
"""

from __future__ import annotations

import argparse
import logging

from floorgap.errors import StageError
from floorgap.reports.decomposition import decompose, write_decomposition
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap decomposition",
                          "One drafter's rejection split into floor and model gap by slot.")
    add_files(parser, "--gaps", "--floors", "--out-csv", "--out-tex", "--out-md",
              help={"--out-csv": "long table: statistic, slot, estimate, lower, upper",
                    "--out-tex": "LaTeX tabular by slot",
                    "--out-md": "markdown table by slot"})
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    try:
        name = str(spec["drafter"])
    except KeyError as exc:
        raise StageError("--spec lacks 'drafter' (the decompose entry's name)") from exc
    for path in (args.gaps, args.floors):
        if not path.exists():
            raise StageError(f"{path} does not exist; run the gaps and floors stages first")
    kind = str((spec.get("entry") or {}).get("kind", ""))
    try:
        result = decompose(args.gaps, args.floors, name, kind=kind,
                           level=float(spec["level"]),
                           lookups=list(spec.get("lookups", [])))
    except ValueError as exc:
        raise StageError(str(exc)) from exc
    write_decomposition(result, {"csv": args.out_csv, "tex": args.out_tex, "md": args.out_md})
    for verdict in result.verdicts:
        (logger.warning if verdict.loses else logger.info)("%s", verdict.sentence())
    logger.info("%s (order %d) on %s: tau %.3f; wrote %s, %s, %s", name, result.order,
                result.target, result.value("tau"), args.out_csv, args.out_tex, args.out_md)
