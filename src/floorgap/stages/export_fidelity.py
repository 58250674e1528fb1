"""``floorgap export_fidelity --spec JSON --model-dir DIR --corpus C.parquet ... --anchors
A.parquet ... --out FIDELITY.json [--log LOG]``

One drafter of a check against the weights it was exported from (see
:mod:`floorgap.probes.export_fidelity`): the folder is imported as the engines read it, the
reference (a ``final.pt`` of the drafters stage) loaded, and both run on the first
``anchors_per_domain`` anchors of every domain (the context, the target's block as the
predecessors). Writes, as JSON, per slot the largest |q_ref - q|, the mean TV and the argmax
agreement; or, when the folder cannot be read with the reference's slots or order, the error
(itself a layout fault); and the faults it names from the folder's config and weights set beside
the reference's (``causes``, :func:`floorgap.probes.export_fidelity.diagnose_folder`). The spec is
``WorkflowSpec.fidelity_spec``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
from pathlib import Path

import torch

from floorgap.data.anchors import anchor_contexts
from floorgap.errors import StageError
from floorgap.models.drafters import DrafterConfig
from floorgap.models.engine_formats import read_engine_config
from floorgap.models.targets import load_target
from floorgap.probes.drafter_eval import load_trained_drafter
from floorgap.probes.export_fidelity import compare_drafters, diagnose_folder
from floorgap.records import atomic_path, read_table
from floorgap.sampling import SamplingLaw
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap export_fidelity",
                          "A checked folder against the weights it was exported from.")
    add_files(parser, "--model-dir", "--corpus+", "--anchors+", "--out",
              help={"--corpus": "the corpus of each domain, in the anchors' order",
                    "--anchors": "the anchors of each domain",
                    "--out": "results/check/<name>/fidelity/<drafter>.json"})
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    target, n = spec["target"], int(spec["anchors_per_domain"])
    if len(args.corpus) != len(args.anchors):
        raise StageError(f"{len(args.corpus)} --corpus for {len(args.anchors)} --anchors; give "
                         "one corpus per anchors file, in the same order")
    contexts, blocks = [], []
    for corpus_path, anchors_path in zip(args.corpus, args.anchors):
        anchors = read_table(anchors_path).sort_values("anchor_id").head(n)
        contexts += anchor_contexts(read_table(corpus_path), anchors)
        blocks += [torch.tensor(list(b), dtype=torch.long) for b in anchors["block_tokens"]]
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    logger.info("comparing %s with %s on %d anchors (%s, %s)", spec["folder"], spec["reference"],
                len(contexts), target["device"], target["dtype"])
    record = {"drafter": spec["drafter"], "folder": spec["folder"],
              "reference": spec["reference"], "anchors": len(contexts),
              "device": target["device"], "dtype": target["dtype"], "error": None, "slots": []}
    reference = load_trained_drafter(spec["reference"], model)
    gamma = int(spec["gamma"])
    if int(reference.gamma) != gamma:
        raise StageError(f"{spec['reference']} drafts {reference.gamma} slots, the workflow "
                         f"{gamma}; name the weights this folder was exported from")
    try:
        candidate = load_trained_drafter(spec["folder"], model, gamma=gamma)
        record["causes"] = diagnose_folder(reference, candidate.cfg, candidate.state_dict())
        slots = compare_drafters(model, reference, candidate, contexts, blocks,
                                 law=SamplingLaw.from_spec(spec["law"]))
        record["slots"] = [dataclasses.asdict(s) for s in slots]
    except ValueError as exc:
        # the folder does not even read with the reference's structure: a layout fault, named
        # from its config where that reads
        record["error"] = str(exc)
        record["causes"] = folder_causes(reference, spec["folder"])
        logger.warning("%s does not read as %s: %s", spec["folder"], spec["reference"], exc)
    for cause in record["causes"]:
        logger.warning("%s: %s", spec["folder"], cause)
    with atomic_path(Path(args.out)) as tmp:
        tmp.write_text(json.dumps(record, indent=1))
    logger.info("wrote %s", args.out)


def folder_causes(reference: object, folder: str) -> list[str]:
    """The named faults of a folder that does not import with the reference's structure, from
    its config alone (nothing, when even that does not read)."""
    try:
        _, fields = read_engine_config(folder)
        cfg = DrafterConfig(**{k: v for k, v in fields.items() if k != "vocab_size"})
    except (ValueError, TypeError, FileNotFoundError):
        return []
    return diagnose_folder(reference, cfg)
