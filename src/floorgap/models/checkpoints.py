"""Drafter checkpoints: the trainer's per-epoch files and the exported ``final.pt`` format.

A training checkpoint (``epoch-<e>.pt``, format :data:`CHECKPOINT_FORMAT`) holds the trainable
parameters, the optimiser, scheduler and random state, the training config with its fingerprint
and the loss log so far. Frozen parameters (the target tables a drafter borrows) are not stored:
a fingerprint of them is, so loading a checkpoint into a drafter built on a different target
fails.

A final drafter file (format :data:`FINAL_FORMAT`) is what the evaluation probe loads: the
trainable weights of a checkpoint, the ``DrafterConfig`` and the training provenance. The
drafters stage writes one per variant and, for trajectory variants, one per epoch.

Every write is atomic (:func:`floorgap.records.atomic_path`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch import nn

from floorgap.errors import StageError
from floorgap.models.drafters import DrafterConfig, build_drafter
from floorgap.records import atomic_path

__all__ = ["CHECKPOINT_FORMAT", "FINAL_FORMAT", "RUN_FILE", "checkpoint_files", "checkpoint_path",
           "export_epochs", "final_record", "frozen_fingerprint", "latest_checkpoint",
           "load_checkpoint", "load_drafter_weights", "load_final", "run_record", "save_checkpoint",
           "trainable_layout", "trainable_state"]

CHECKPOINT_FORMAT = 1
FINAL_FORMAT = 1
RUN_FILE = "run.json"
_CKPT_RE = re.compile(r"^epoch-(\d{4,})\.pt$")


# --------------------------------------------------------------------------------------------
# Model state and fingerprints


def frozen_fingerprint(model: nn.Module) -> str:
    """SHA-256 over names, shapes, dtypes and a strided sample of every frozen tensor.

    Frozen parameters and buffers are not stored in checkpoints; this fingerprint ties a
    checkpoint to the target tables it was trained against without hashing gigabytes.
    """
    h = hashlib.sha256()
    frozen = [(f"param:{n}", p) for n, p in model.named_parameters() if not p.requires_grad]
    for name, t in frozen + [(f"buffer:{n}", b) for n, b in model.named_buffers()]:
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
        flat = t.detach().reshape(-1)
        if flat.numel():
            stride = max(1, flat.numel() // 4096)
            sample = flat[::stride][:4096].to("cpu", torch.float64).numpy()
            h.update(sample.tobytes())
    return h.hexdigest()


def trainable_layout(model: nn.Module) -> str:
    """SHA-256 over the names, shapes and dtypes of the trainable parameters."""
    spec = [(n, tuple(p.shape), str(p.dtype)) for n, p in model.named_parameters()
            if p.requires_grad]
    return hashlib.sha256(json.dumps(spec).encode()).hexdigest()


def trainable_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The trainable parameters by name, detached, on the CPU."""
    return {n: p.detach().to("cpu").clone() for n, p in model.named_parameters() if p.requires_grad}


# --------------------------------------------------------------------------------------------
# Training checkpoints


def checkpoint_path(directory: str | os.PathLike, epoch: int) -> Path:
    """Path of the checkpoint written after ``epoch`` (1-based) epochs."""
    return Path(directory) / f"epoch-{epoch:04d}.pt"


def checkpoint_files(directory: str | os.PathLike) -> list[tuple[int, Path]]:
    """``(epoch, path)`` of every checkpoint file in ``directory``, newest first."""
    d = Path(directory)
    if not d.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in d.iterdir() if (m := _CKPT_RE.match(p.name))]
    return sorted(found, reverse=True)


def save_checkpoint(path: str | os.PathLike, state: Mapping[str, Any]) -> None:
    """Write ``state`` as a checkpoint of :data:`CHECKPOINT_FORMAT`, atomically and synced."""
    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        # A file object, not a path: torch then names the archive "archive", not after the
        # temporary file, so the bytes do not depend on the temporary name.
        torch.save({"format": CHECKPOINT_FORMAT, **state}, fh)
        fh.flush()
        os.fsync(fh.fileno())


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu"
                    ) -> dict[str, Any]:
    """Load a training checkpoint (plain tensors and Python values only)."""
    ckpt = torch.load(path, map_location=map_location, weights_only=True)
    if ckpt.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: unknown checkpoint format {ckpt.get('format')!r}")
    return ckpt


def latest_checkpoint(directory: str | os.PathLike) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint in ``directory`` that loads, with its contents; ``None`` if none."""
    for _, path in checkpoint_files(directory):
        try:
            return path, load_checkpoint(path)
        except Exception as err:  # noqa: BLE001 - an unreadable file is skipped, older ones tried
            print(f"floorgap.training: skipping unreadable checkpoint {path}: {err}",
                  file=sys.stderr)
    return None


def load_drafter_weights(model: nn.Module, checkpoint: str | os.PathLike | Mapping[str, Any], *,
                         check_frozen: bool = True) -> dict[str, Any]:
    """Load a checkpoint's trainable parameters into ``model`` (built on the same target).

    Checks that the model's trainable layout matches and, with ``check_frozen``, that its frozen
    tables have the fingerprint recorded at training time. Returns the checkpoint.
    """
    ckpt = load_checkpoint(checkpoint) if not isinstance(checkpoint, Mapping) else checkpoint
    model = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
    if ckpt["trainable_layout"] != trainable_layout(model):
        raise ValueError("checkpoint trainable parameters do not match the model's")
    if check_frozen and ckpt["frozen_fingerprint"] != frozen_fingerprint(model):
        raise ValueError("checkpoint was trained against different frozen (target) tables")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, value in ckpt["model"].items():
            params[name].copy_(value.to(params[name].device))
    return ckpt


# --------------------------------------------------------------------------------------------
# Final drafter files and the run record of a checkpoint folder


def run_record(spec: Mapping[str, Any], cfg: Any, tcfg: Any, data_sha: str) -> dict[str, Any]:
    """What a checkpoint folder was trained on (``run.json``): the data's SHA-256, the drafter
    config, the training-config fingerprint, target and variant. Checkpoints whose record
    differs from the current run's are not resumed."""
    return {"train_data_sha256": data_sha, "drafter_config": asdict(cfg),
            "train_config_fingerprint": tcfg.fingerprint(), "target": spec["target"]["name"],
            "variant": spec["variant"]["name"]}


def final_record(ckpt: Mapping[str, Any], cfg: Any, target: str, variant: Mapping[str, Any],
                 data_sha: str, epochs: list[dict[str, Any]], processes: int) -> dict[str, Any]:
    """A trained drafter as the evaluation probe loads it: the trainable weights of a training
    checkpoint, its ``DrafterConfig`` and the training provenance."""
    return {
        "final_format": FINAL_FORMAT, "format": ckpt["format"], "model": ckpt["model"],
        "trainable_layout": ckpt["trainable_layout"],
        "frozen_fingerprint": ckpt["frozen_fingerprint"], "drafter_config": asdict(cfg),
        "target": target, "variant": dict(variant), "train_config": ckpt["config"],
        "train_config_fingerprint": ckpt["config_fingerprint"], "train_data_sha256": data_sha,
        "epochs": epochs, "processes": processes,
    }


def load_final(path: str | os.PathLike[str], target_model: Any) -> nn.Module:
    """A drafter built on ``target_model`` with the trained weights of ``final.pt``."""
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if ckpt.get("final_format") != FINAL_FORMAT:
        raise ValueError(f"{path}: not a final drafter file of format {FINAL_FORMAT}")
    model = build_drafter(DrafterConfig(**ckpt["drafter_config"]), target_model)
    load_drafter_weights(model, ckpt)
    return model


def export_epochs(ckpt_dir: Path, out_dir: Path, epochs: int, cfg: Any, target: str,
                  variant: Mapping[str, Any], data_sha: str, processes: int) -> None:
    """``out_dir/epoch-<e>.pt`` for e = 1..epochs, each in the final format, from the training
    checkpoints (written atomically; the folder is the rule's output)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for e in range(1, epochs + 1):
        path = checkpoint_path(ckpt_dir, e)
        if not path.exists():
            raise StageError(f"{path} is missing: the epoch checkpoints were removed; delete "
                             f"{ckpt_dir} and rerun the drafter rule to retrain")
        ckpt = load_checkpoint(path)
        history = [r for r in ckpt.get("log", []) if r.get("kind") == "epoch"]
        record = final_record(ckpt, cfg, target, variant, data_sha, history, processes)
        record["epoch"] = e
        with atomic_path(out_dir / f"epoch-{e}.pt") as tmp:
            torch.save(record, tmp)
