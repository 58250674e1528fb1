"""``floorgap anchors --spec JSON --corpus CORPUS --out ANCHORS --log LOG``

Draw the stratified anchor sample of one domain from its corpus (see floorgap.data.anchors).
The spec holds ``domain`` (name), ``anchors`` (``per_domain``, ``gamma``, ``context_buckets``)
and ``seed``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from floorgap.errors import StageError
from floorgap.stages._cli import run_stage, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap anchors", "Sample the anchors of one domain.")
    parser.add_argument("--corpus", required=True, type=Path, help="corpus Parquet file")
    parser.add_argument("--out", required=True, type=Path, help="output Parquet file")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    from floorgap.data.anchors import sample_anchors
    from floorgap.records import read_metadata, read_table, sha256_file, write_table

    spec = args.spec
    cfg = spec["anchors"]
    corpus = read_table(args.corpus)
    corpus_meta = read_metadata(args.corpus)
    special = corpus_meta.get("special_token_ids", corpus_meta.get("all_special_ids"))
    if special is None:
        raise StageError(f"{args.corpus} records no special token ids; regenerate the corpus")
    if corpus_meta.get("domain") not in (None, spec["domain"]):
        raise StageError(f"{args.corpus} holds domain {corpus_meta.get('domain')!r}, "
                         f"not {spec['domain']!r}")
    result = sample_anchors(corpus, domain=spec["domain"], per_domain=int(cfg["per_domain"]),
                            gamma=int(cfg["gamma"]), context_buckets=cfg["context_buckets"],
                            seed=int(spec["seed"]), special_ids=special)
    meta = result.metadata | {
        "corpus": {"path": str(args.corpus), "sha256": sha256_file(args.corpus),
                   "counts": corpus_meta.get("counts")},
        "stand_in_for": corpus_meta.get("stand_in_for"),
        "provenance": corpus_meta.get("provenance"),
        "target": corpus_meta.get("target"),
        "law": corpus_meta.get("law"),
    }
    write_table(args.out, result.table, meta)
    counts = meta["counts"]
    logger.info("wrote %s: %d anchors over %d prompts from %d eligible positions in %d strata",
                args.out, counts["anchors"], counts["prompts"], counts["eligible"],
                counts["strata_nonempty"])
    for s in meta["strata"]:
        logger.info("  stratum %-16s N_s %6d  n_s %3d  pi %.4g", s["stratum"], s["N_s"],
                    s["n_s"], s["pi"])

