"""``floorgap drafter_data --spec JSON --model-dir DIR --corpus C1 [C2 ...] --out OUT``

Drafter training data of one target (see floorgap.data.drafter_data): training prompts per
domain, disjoint from the evaluation corpora given with ``--corpus`` (one file per domain of the
spec; the domain is read from each file's metadata), the target's responses under the training
law, and the top-K target distribution at every slot of the cut blocks. Writes ``OUT``
(``torch.save``, atomically). The spec holds ``target``, ``domains``, ``training_data``,
``corpus``, ``gamma`` and ``seed``.

Resumable: each finished batch of responses (the long part at paper scale) is journalled in
``--journal`` (default ``OUT`` + ``.journal.jsonl``, its targets and features in the folder
``<journal>.batches``; neither is a rule output, so a killed or timed-out job keeps them); a
rerun decodes only the rest with the same batches and so writes the same record. Both are
removed once the record is written.
"""

from __future__ import annotations

import argparse
import copy
import logging
import shutil
from pathlib import Path

import torch

from floorgap.data.drafter_data import batch_folder, build_drafter_data
from floorgap.errors import StageError
from floorgap.models.targets import load_target, read_model_info, torch_dtype
from floorgap.records import (Journal, atomic_path, fingerprint, read_metadata, read_table,
                              sha256_file)
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap drafter_data",
                          "Generate drafter training blocks with the target.")
    add_files(parser, "--model-dir", "--corpus+", "--out",
              help={"--corpus": "evaluation corpus of every domain (its prompts are excluded)"})
    parser.add_argument("--journal", type=Path, default=None,
                        help="journal of finished response batches (default: beside --out)")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    excluded: dict[str, set[str]] = {}
    sources = {}
    for path in args.corpus:
        domain = read_metadata(path).get("domain")
        if domain is None:
            raise StageError(f"{path}: corpus file without a domain in its metadata")
        if domain in excluded:
            raise StageError(f"two corpus files for domain {domain}")
        excluded[domain] = set(read_table(path)["prompt_id"].astype(str))
        sources[domain] = {"path": str(path), "sha256": sha256_file(path)}
    missing = [d["name"] for d in spec["domains"] if d["name"] not in excluded]
    if missing:
        raise StageError(f"no evaluation corpus for domains {missing}")
    target = spec["target"]
    model, tokenizer = load_target(args.model_dir, target["dtype"], target["device"])
    # the data pass may run the target in another precision (training_data.dtype): a cast copy
    # decodes, the target in its own precision is the reference its law is compared with
    dtype = spec["training_data"].get("dtype", target["dtype"])
    reference = None
    if torch_dtype(dtype) != next(model.parameters()).dtype:
        reference, model = model, copy.deepcopy(model).to(torch_dtype(dtype))
        logger.info("the data pass runs the target in %s (its own dtype: %s)", dtype,
                    target["dtype"])
    info = read_model_info(args.model_dir)
    journal_file = args.journal or args.out.with_name(args.out.name + ".journal.jsonl")
    journal = Journal(journal_file, fingerprint({"spec": spec, "corpora": sources,
                                                "model": info.get("source")}))
    data = build_drafter_data(spec, model, tokenizer, excluded, info, journal, reference)
    data["metadata"]["evaluation_corpora"] = sources
    with atomic_path(args.out) as tmp:
        torch.save(data, tmp)
    journal_file.unlink(missing_ok=True)
    shutil.rmtree(batch_folder(journal_file), ignore_errors=True)
    meta = data["metadata"]
    if meta["resumed_batches"]:
        logger.info("%d response batches read back from the journal of an earlier job",
                    meta["resumed_batches"])
    decode = meta["seconds"]["decode"]
    logger.info("wrote %s: %d sequences, %d blocks of %d slots, top-%d targets", args.out,
                len(data["seq_prompt_ids"]), sum(c["blocks"] for c in meta["counts"].values()),
                meta["gamma"], data["target_ids"].shape[-1])
    if decode:
        # the stage's pace: response tokens with their targets (and features) per second
        logger.info("decoded %d response tokens with their targets in %.1f s: %.1f tokens/s",
                    meta["decoded_response_tokens"], decode,
                    meta["decoded_response_tokens"] / decode)
