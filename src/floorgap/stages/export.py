"""``floorgap export --spec JSON --model-dir DIR --drafter FINAL_PT --out FOLDER``

One trained drafter (``final.pt`` of the drafters stage) written as a checkpoint folder in one
of the layouts of :mod:`floorgap.models.engine_formats` (``dflash``, ``dspark``,
``speculators``: what serving engines load; ``floorgap``: this repository's own layout for the
kinds no engine runs). ``FOLDER`` holds ``config.json`` and ``model.safetensors`` in fp32, so
importing it back gives the drafter bitwise; it is written beside its destination and renamed
into place, so it exists completely or not at all.

The target is loaded (in the dtype and on the device the drafter was trained against, which
the frozen-table fingerprint of ``final.pt`` checks) because the drafter borrows its embedding
and output head, and because the folder's config records the target's real depth
(``num_hidden_layers``), ``max_position_embeddings``, name and architecture, which the drafter
alone does not know.

The spec holds ``target`` (config entry with ``name``), ``variant`` (the drafter's name, or its
entry with ``name``) and ``format``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

import torch

from floorgap.errors import StageError
from floorgap.models.engine_formats import DEFAULT_MAX_POSITIONS, FORMATS, export_drafter
from floorgap.models.targets import load_target, text_config
from floorgap.probes.drafter_eval import load_trained_drafter
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap export",
                          "Write one trained drafter as a serving-engine checkpoint folder.")
    add_files(parser, "--model-dir", "--drafter", "--out",
              help={"--drafter": "the trained drafter (results/<target>/drafters/<v>/final.pt)",
                    "--out": "the checkpoint folder to write (config.json, model.safetensors)"})
    return parser


def _spec_fields(spec: dict[str, Any]) -> tuple[dict[str, Any], str, str]:
    """The target entry, the variant's name and the format of ``spec``; a StageError names the
    missing key."""
    try:
        target, variant, fmt = dict(spec["target"]), spec["variant"], str(spec["format"])
        name = str(variant["name"] if isinstance(variant, dict) else variant)
    except (KeyError, TypeError, ValueError) as exc:
        raise StageError(f"--spec lacks {exc} (it holds target, variant and format)") from exc
    if "name" not in target:
        raise StageError("--spec target lacks 'name' (the config entry's name)")
    return target, name, fmt


def _target_facts(model: Any) -> dict[str, Any]:
    """What the folder's config records about the target, from its loaded config. A config
    without ``architectures`` (a model built in memory) falls back to the model's class name,
    which is what ``architectures`` would hold."""
    config = model.config
    text = text_config(config)
    architectures = getattr(config, "architectures", None) or [type(model).__name__]
    positions = getattr(text, "max_position_embeddings", None) or DEFAULT_MAX_POSITIONS
    return {"num_target_layers": int(text.num_hidden_layers),
            "max_position_embeddings": int(positions),
            "target_architecture": str(architectures[0])}


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    target, name, fmt = _spec_fields(args.spec)
    if fmt not in FORMATS:
        raise StageError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    for path in (args.model_dir, args.drafter):
        if not Path(path).exists():
            raise StageError(f"{path} does not exist; run the models and drafters stages first")
    model, _ = load_target(args.model_dir, target.get("dtype", "float32"),
                           target["device"])
    try:
        drafter = load_trained_drafter(args.drafter, model)
        facts = _target_facts(model)
        # fp32 whatever the training dtype: the round trip stays bitwise and an engine casts
        # to its own serving dtype on load.
        folder = export_drafter(drafter, args.out, fmt, target_name=str(target["name"]),
                                dtype=torch.float32, **facts)
    except ValueError as exc:  # a kind the format cannot hold, or a drafter of another target
        raise StageError(f"drafter {name}: {exc}") from exc
    logger.info("wrote %s: drafter %s (%s, gamma %d) of %s (%s, %d layers) in the %s format",
                folder, name, drafter.cfg.kind, drafter.cfg.gamma, target["name"],
                facts["target_architecture"], facts["num_target_layers"], fmt)
