"""``floorgap anchors --spec JSON --corpus CORPUS --out ANCHORS --log LOG``

Draw the stratified anchor sample of one domain from its corpus (see floorgap.data.anchors).
The spec holds ``domain`` (name), ``anchors`` (``per_domain``, ``gamma``, ``context_buckets``)
and ``seed``.
"""

from __future__ import annotations

import argparse
import logging

from floorgap.data.anchors import anchors_from_corpus_file
from floorgap.records import write_table
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap anchors", "Sample the anchors of one domain.")
    add_files(parser, "--corpus", "--out",
              help={"--corpus": "corpus Parquet file", "--out": "output Parquet file"})
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    result = anchors_from_corpus_file(args.corpus, args.spec)
    meta = result.metadata
    write_table(args.out, result.table, meta)
    counts = meta["counts"]
    logger.info("wrote %s: %d anchors over %d prompts from %d eligible positions in %d strata",
                args.out, counts["anchors"], counts["prompts"], counts["eligible"],
                counts["strata_nonempty"])
    for s in meta["strata"]:
        logger.info("  stratum %-16s N_s %6d  n_s %3d  pi %.4g", s["stratum"], s["N_s"],
                    s["n_s"], s["pi"])

