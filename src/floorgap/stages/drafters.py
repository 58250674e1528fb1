"""``floorgap drafters --spec JSON --model-dir DIR --data TRAIN_DATA --out FINAL``

Train one drafter variant (or import one: see "Checkpoint variants" below) on a target's training
record (floorgap.data.drafter_data) and write ``FINAL`` (``final.pt``): the trainable weights, the
filled ``DrafterConfig``, the fingerprint of the frozen target tables and the training provenance,
atomically. Per-epoch checkpoints and the loss log (``log.jsonl``, one record per logged step and
per epoch, with tokens/s) go to ``--checkpoints`` (default ``<FINAL's folder>/checkpoints``);
``--train-log`` receives a copy of the loss log at the end.

The training itself is :func:`floorgap.models.drafter_training.train_variant`; the file formats
are those of :mod:`floorgap.models.checkpoints`.

Resumption. Training calls :func:`floorgap.models.training.train` with ``resume=True``: a job
killed mid-run continues after its newest epoch checkpoint, and a run whose checkpoints already
cover every epoch trains nothing and only rewrites ``FINAL``. ``run.json`` in the checkpoint
folder records what the checkpoints were trained on (data SHA-256, drafter and training config);
when that changes, the old checkpoints are discarded and training starts afresh. (The checkpoint
folder is deliberately not a Snakemake output: Snakemake deletes a job's outputs before running
it, which would defeat resumption.)

Features. The drafter sees the committed prefix (context without its last token, the committed
token) through the target's tap layers. Every context of the record is a prefix of one stored
sequence and the target is causal, so one forward per sequence gives the features of all its
blocks. A record written with ``training_data.store_features`` holds them at the config's taps
(from the forward that gave its targets); otherwise they are computed once, before the first
epoch. Either way they are held in memory in the training precision (``sum of sequence lengths
* n_taps * hidden`` values), unless ``train.features`` is ``stream`` (recomputed per batch on the
device, nothing held). A run that has nothing left to train skips this.

Data parallel. With ``train.processes > 1`` the command re-executes itself on ``processes``
local ranks (torch's elastic launcher, as ``torchrun --standalone``); every rank loads the
target and computes the features, ranks split each global batch (see
floorgap.models.training), rank 0 writes checkpoints and ``FINAL``.

The spec holds ``target`` (config entry with ``name``), ``variant`` (variant entry with
``name``; optional ``epochs`` and ``seed_key``), ``taps``, ``train`` (the config's
``drafters.train``), ``gamma``, ``seed`` and optional ``export_epochs`` (write every epoch's
weights to ``--epochs-dir``).

Checkpoint variants. A variant with ``checkpoint`` (``{format, path}`` or ``{format, hub,
revision?}``) is not trained: its folder is resolved and imported on the target at the spec's
``gamma`` (:func:`floorgap.models.drafter_training.import_variant`) and written as ``FINAL`` in
the same format, with ``provenance`` saying it was imported (format, path or hub id, revision);
``--train-log`` is written empty, ``--epochs-dir`` created empty, and ``--data`` is not needed.
The spec of such a variant holds only ``target``, ``variant`` and ``gamma``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import uuid
from pathlib import Path

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.launcher.api import LaunchConfig, elastic_launch

from floorgap.config import LOOKUP_KINDS
from floorgap.errors import StageError
from floorgap.models.checkpoints import (checkpoint_path, export_epochs, final_record,
                                         load_checkpoint)
from floorgap.models.drafter_training import (check_variant, fit_lookup_variant, import_variant,
                                              train_variant)
from floorgap.models.training import init_distributed
from floorgap.records import atomic_path
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap drafters", "Train one drafter variant on a target.")
    add_files(parser, "--model-dir", "--out", help={"--out": "final.pt"})
    parser.add_argument("--data", type=Path, default=None,
                        help="drafter training record (required unless the variant imports a "
                             "checkpoint)")
    parser.add_argument("--checkpoints", type=Path, default=None,
                        help="per-epoch checkpoints and log.jsonl (default: OUT's "
                             "folder/checkpoints)")
    parser.add_argument("--train-log", type=Path, default=None, help="copy of the loss log")
    parser.add_argument("--epochs-dir", type=Path, default=None,
                        help="folder for every epoch's weights as epoch-<e>.pt (final format), "
                        "written when the spec's export_epochs is true (training trajectory, "
                        "table 10); created empty otherwise")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def _torchrun(processes: int, argv: list[str]) -> int:
    """Re-execute this stage (arguments ``argv``) on ``processes`` local ranks through torch's
    elastic launcher, torchrun's engine. Not the torchrun command: its parser takes the stage's
    ``--log`` for an abbreviation of its own options and stops."""
    config = LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=processes,
                          rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                          run_id=str(uuid.uuid4()), max_restarts=0)
    try:
        elastic_launch(config, sys.executable)("-m", "floorgap", "drafters", *argv)
    except ChildFailedError as exc:
        return next(iter(exc.failures.values())).exitcode or 1
    return 0


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    target, variant = spec["target"], spec["variant"]
    if variant.get("kind") in LOOKUP_KINDS:
        _fit_table(args, logger)
        return
    if check_variant(variant):
        _import(args, logger)
        return
    if args.data is None:
        raise StageError(f"variant {variant['name']} is trained: give --data (the drafter "
                         "training record)")
    processes = int(spec["train"]["processes"])
    if processes > 1 and str(target["device"]).startswith("cuda"):
        # one rank a GPU: with fewer visible, a rank would ask for a device that is not there
        visible = torch.cuda.device_count()
        if visible < processes:
            raise StageError(f"drafters.train.processes is {processes} but this job sees "
                             f"{visible} GPU(s); each process trains on its own GPU: give the "
                             f"job {processes} GPUs or set drafters.train.processes to at most "
                             f"{max(visible, 1)}")
    rank, world = 0, 1
    if processes > 1:
        rank, world = init_distributed()
        if world == 1:  # not under torchrun yet
            code = _torchrun(processes, args.argv)
            if code != 0:
                raise StageError(f"torchrun with {processes} processes exited with status {code}")
            return
    ckpt_dir = args.checkpoints or args.out.parent / "checkpoints"
    run = train_variant(spec, args.model_dir, args.data, ckpt_dir, rank=rank, world=world,
                        progress=not args.no_progress, logger=logger)
    if rank != 0:
        return
    if run.result.checkpoint is None:
        raise StageError("training wrote no checkpoint")
    # the best held-out epoch (or the last when nothing is held out)
    final = final_record(load_checkpoint(checkpoint_path(ckpt_dir, run.kept_epoch)),
                         run.drafter_config, target["name"], variant, run.data_sha,
                         run.result.epochs, run.world)
    final["kept_epoch"] = run.kept_epoch
    _write_final(args, final, "".join(json.dumps(r) + "\n" for r in run.result.log))
    if args.epochs_dir is not None and spec.get("export_epochs"):
        export_epochs(ckpt_dir, args.epochs_dir, run.epochs, run.drafter_config,
                      target["name"], variant, run.data_sha, run.world)
    logger.info("wrote %s", args.out)


def _fit_table(args: argparse.Namespace, logger: logging.Logger) -> None:
    """A lookup-table variant: FINAL holds the fitted table."""
    if args.data is None:
        raise StageError(f"variant {args.spec['variant']['name']} is estimated from the "
                         "training record: give --data")
    _write_final(args, fit_lookup_variant(args.spec, args.data, logger))
    logger.info("wrote %s (a lookup table)", args.out)


def _import(args: argparse.Namespace, logger: logging.Logger) -> None:
    """A checkpoint variant: FINAL imported from its folder."""
    _write_final(args, import_variant(args.spec, args.model_dir, logger))
    logger.info("wrote %s (imported, not trained)", args.out)


def _write_final(args: argparse.Namespace, record: dict, train_log: str = "") -> None:
    """FINAL (``record``), the epochs folder (created; empty for a variant not trained) and the
    train log (``train_log``; empty for a variant not trained)."""
    with atomic_path(args.out) as tmp:
        torch.save(record, tmp)
    if args.epochs_dir is not None:
        args.epochs_dir.mkdir(parents=True, exist_ok=True)
    if args.train_log is not None:
        with atomic_path(args.train_log) as tmp:
            tmp.write_text(train_log)
