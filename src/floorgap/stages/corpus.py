"""``floorgap corpus --spec JSON --model-dir DIR --out CORPUS.parquet --log LOG``

Generate the target's corpus for one domain: select prompts (seeded), sample one response per
prompt under the evaluation law, and write them as a Parquet record (see floorgap.data.corpus).
The spec holds ``target`` (a config target entry with its ``name``), ``domain`` (``name``,
``prompts``, optional ``source`` / ``text_field``), ``corpus``, ``law`` and ``seed``. A censored
share above ``corpus.censored_share_max`` fails the stage and writes nothing.
"""

from __future__ import annotations

import argparse
import logging

from floorgap.data.corpus import build_corpus
from floorgap.models.targets import load_target, read_model_info
from floorgap.records import write_table
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap corpus", "Generate the target-sampled corpus of one domain.")
    add_files(parser, "--model-dir", "--out", help={"--out": "output Parquet file"})
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    target = spec["target"]
    info = read_model_info(args.model_dir)
    model, tokenizer = load_target(args.model_dir, target.get("dtype", "float32"),
                                   target["device"])
    result = build_corpus(spec, model, tokenizer, info)
    write_table(args.out, result.table, result.metadata)
    logger.info("wrote %s (%d responses)", args.out, result.table.num_rows)

