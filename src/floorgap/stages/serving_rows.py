"""``floorgap serving_rows --spec JSON --model-dir DIR --corpus C1 [C2 ...] [--training-data
BLOCKS.pt] --out ROWS.parquet``

The serving benchmark's rows of one target (see floorgap.data.serving_rows): ``rows`` prompts
of every task in ``serving.tasks``, disjoint from the floors' evaluation prompts (``--corpus``),
from the drafter training prompts (``--training-data``, the drafter_data record) and from each
other, with the target-formatted prompt token ids. The spec holds ``target``, ``tasks``,
``max_prompt_tokens`` and ``seed``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import pandas as pd
import torch

from floorgap.data.serving_rows import select_serving_rows
from floorgap.models.targets import load_tokenizer
from floorgap.records import read_table, write_table
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap serving_rows", "Select the serving benchmark's rows.")
    add_files(parser, "--model-dir", "--out")
    parser.add_argument("--corpus", type=Path, nargs="*", default=[],
                        help="evaluation corpora of the floors (their prompts are excluded)")
    parser.add_argument("--training-data", type=Path, default=None,
                        help="the drafter_data record (its training prompts are excluded)")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    target = spec["target"]
    used = [str(p) for path in args.corpus for p in read_table(path)["prompt_id"]]
    if args.training_data is not None:
        # memory-mapped: only the prompt ids are read, not the targets and features
        data = torch.load(args.training_data, map_location="cpu", weights_only=True, mmap=True)
        used += [str(p) for p in data["seq_prompt_ids"]]
    tokenizer = load_tokenizer(args.model_dir)
    rows, facts = select_serving_rows(
        spec["tasks"], tokenizer, seed=int(spec["seed"]),
        max_prompt_tokens=int(spec["max_prompt_tokens"]),
        chat_template=bool(target["chat_template"]),
        enable_thinking=bool(target["enable_thinking"]), used_prompt_ids=used)
    meta = {"stage": "serving_rows", "target": target["name"], "seed": spec["seed"],
            "tasks": facts, "excluded_prompts": len(set(used)),
            "chat_template": bool(target["chat_template"])}
    write_table(args.out, pd.DataFrame(rows), meta)
    logger.info("wrote %d rows of %d tasks to %s", len(rows), len(facts), args.out)
