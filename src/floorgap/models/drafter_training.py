"""One drafter variant trained on a target's training record (the ``floorgap drafters`` stage).

The drafter sees the committed prefix (context without its last token, the committed token)
through the target's tap layers. Every context of the record is a prefix of one stored sequence
and the target is causal, so one forward per sequence gives the features of all its blocks
(:class:`BlockExamples`); they are computed once, before the first epoch, and held in memory as
float32. A run that has nothing left to train skips this.

Resumption. :func:`train_variant` calls :func:`floorgap.models.training.train` with resumption
on when ``run.json`` in the checkpoint folder (:func:`floorgap.models.checkpoints.run_record`)
matches the current run: a killed job continues after its newest epoch checkpoint, and a run
whose checkpoints cover every epoch trains nothing. When the record differs, training starts
afresh.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from floorgap.errors import StageError

if TYPE_CHECKING:
    from floorgap.models.drafters import DrafterConfig
    from floorgap.models.training import TrainConfig, TrainResult

# Variant keys that map onto DrafterConfig fields of another name, or that are not model fields.
_RENAMED = {"layers": "n_layers", "heads": "n_heads"}
_NOT_MODEL = {"name", "epochs", "checkpoint", "seed_key"}


def drafter_config(variant: Mapping[str, Any], taps: list[int], gamma: int, target_config: Any
                   ) -> DrafterConfig:
    """The ``DrafterConfig`` of a config variant on a target (width, heads and MLP width follow
    the target unless the variant sets ``heads``)."""
    from floorgap.models.drafters import DrafterConfig

    fields = {"kind": variant["kind"], "gamma": int(gamma), "taps": [int(t) for t in taps],
              "hidden_size": int(target_config.hidden_size),
              "n_heads": int(target_config.num_attention_heads),
              "intermediate_size": int(target_config.intermediate_size)}
    for key, value in variant.items():
        if key in _NOT_MODEL:
            continue
        fields[_RENAMED.get(key, key)] = value
    return DrafterConfig(**fields)


def train_config(spec: Mapping[str, Any], checkpoint_dir: Path, device: str) -> TrainConfig:
    """The ``TrainConfig`` of a variant: ``drafters.train`` (``epochs`` overridable per variant),
    seeded by the config seed and the variant's ``seed_key`` (default its name; the component
    arms of table 13 share one key, so they start from the same draws)."""
    from floorgap.models.training import TrainConfig
    from floorgap.seeds import derive_seed

    tr, variant = spec["train"], spec["variant"]
    return TrainConfig(epochs=int(variant.get("epochs", tr["epochs"])),
                       batch_size=int(tr["batch_size"]), lr=float(tr["lr"]),
                       warmup_steps=int(tr.get("warmup_steps", 0)),
                       weight_decay=float(tr.get("weight_decay", 0.01)),
                       seed=derive_seed(int(spec["seed"]), "drafter-train",
                                       variant.get("seed_key", variant["name"])),
                       checkpoint_dir=str(checkpoint_dir), device=device)


class BlockExamples:
    """Training examples of a record with target features computed online, once per sequence.

    ``example[i]`` = ``features [T, F]`` (the committed prefix ``sequence[:context_len - 1]``),
    ``committed``, ``block_tokens [G]``, ``target_ids``/``target_vals [G, K]``.
    """

    def __init__(self, data: Mapping[str, Any], target_model: Any, taps: list[int]) -> None:
        self.data, self.target, self.taps = data, target_model, list(taps)
        self.features: list[Any] | None = None
        if int(data["context_len"].min()) < 2:
            raise StageError("a training block has an empty committed prefix")

    def __len__(self) -> int:
        return int(self.data["block_seq"].shape[0])

    def prepare(self) -> float:
        """Compute the tap features of every sequence; returns the seconds it took."""
        import torch

        from floorgap.data.drafter_data import sequence
        from floorgap.models.drafters import target_features
        from floorgap.progress import Timer

        if self.features is not None:
            return 0.0
        timer = Timer()
        device = next(self.target.parameters()).device
        feats = []
        n_seq = int(self.data["seq_offsets"].shape[0]) - 1
        with torch.no_grad():
            for s in range(n_seq):
                ids = sequence(self.data, s)[None].to(device)
                f = target_features(self.target, ids, torch.ones_like(ids), self.taps)
                feats.append(f[0].to("cpu", torch.float32))
        self.features = feats
        return timer.seconds

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self.features is None:
            self.prepare()
        d = self.data
        c = int(d["context_len"][i])
        return {"features": self.features[int(d["block_seq"][i])][:c - 1],
                "committed": d["committed"][i], "block_tokens": d["block_tokens"][i],
                "target_ids": d["target_ids"][i].long(), "target_vals": d["target_vals"][i]}


@dataclass
class VariantRun:
    """A trained variant: the training result, the filled ``DrafterConfig``, the SHA-256 of the
    training record, the epochs of the schedule and the number of data-parallel ranks."""

    result: TrainResult
    drafter_config: DrafterConfig
    data_sha: str
    epochs: int
    world: int


def check_variant(variant: Mapping[str, Any]) -> None:
    """Refuse a variant that names a released checkpoint: this stage only trains."""
    if variant.get("checkpoint"):
        raise StageError(f"variant {variant['name']} names a released checkpoint; this stage "
                         "trains drafters and does not import checkpoints")


def _rank_device(device: str, world: int) -> str:
    """With several ranks on CUDA, each rank trains on its local GPU."""
    if world > 1 and device.startswith("cuda"):
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def _resume_decision(run: Mapping[str, Any], ckpt_dir: Path, rank: int, world: int,
                     logger: logging.Logger) -> bool:
    """Whether the checkpoints in ``ckpt_dir`` belong to this run (its ``run.json`` equals
    ``run``); rank 0 then writes this run's record."""
    import torch

    from floorgap.models.checkpoints import RUN_FILE
    from floorgap.records import write_json

    run_path = ckpt_dir / RUN_FILE
    resume = run_path.exists() and json.loads(run_path.read_text()) == json.loads(json.dumps(run))
    if not resume and rank == 0 and run_path.exists():
        logger.info("%s: checkpoints were trained on other data or settings; starting afresh",
                    ckpt_dir)
    if world > 1:
        torch.distributed.barrier()  # every rank has decided before rank 0 rewrites run.json
    if rank == 0:
        write_json(run_path, run)
    return resume


def _log_epochs(result: TrainResult, logger: logging.Logger) -> None:
    """One line per epoch: mean loss and parts, tokens and throughput."""
    for rec in result.epochs:
        logger.info("epoch %d: loss %.4f %s, %d tokens in %.2f s (%.1f tokens/s)", rec["epoch"],
                    rec["loss"], " ".join(f"{k} {v:.4f}" for k, v in sorted(rec["parts"].items())
                             if k != "loss"),
                    rec["tokens"], rec["seconds"], rec["tokens_per_s"])


def train_variant(spec: Mapping[str, Any], model_dir: Path, data_path: Path, ckpt_dir: Path, *,
                  rank: int, world: int, progress: bool, logger: logging.Logger) -> VariantRun:
    """Train the variant of ``spec`` (see floorgap.stages.drafters) on the record at
    ``data_path`` with the target of ``model_dir``, checkpointing into ``ckpt_dir`` and
    resuming there when its ``run.json`` matches. Every rank of a data-parallel group calls it.
    """
    import torch

    from floorgap.data.drafter_data import load_drafter_data
    from floorgap.models.checkpoints import latest_checkpoint, run_record
    from floorgap.models.drafters import build_drafter
    from floorgap.models.targets import load_target
    from floorgap.models.training import train
    from floorgap.progress import Timer
    from floorgap.records import sha256_file
    from floorgap.seeds import derive_seed

    target, variant = spec["target"], spec["variant"]
    device = _rank_device(target["device"], world)
    data = load_drafter_data(data_path)
    data_sha = sha256_file(data_path)
    gamma = int(data["metadata"]["gamma"])
    if gamma != int(spec["gamma"]):
        raise StageError(f"{data_path} holds blocks of {gamma} slots, not gamma={spec['gamma']}")
    model, _ = load_target(model_dir, target["dtype"], device)
    cfg = drafter_config(variant, spec["taps"], gamma, model.config)
    tcfg = train_config(spec, ckpt_dir, device)
    torch.manual_seed(derive_seed(tcfg.seed, "drafter-init"))
    drafter = build_drafter(cfg, model)
    n_params = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    resume = _resume_decision(run_record(spec, drafter.cfg, tcfg, data_sha), ckpt_dir, rank,
                              world, logger)
    found = latest_checkpoint(ckpt_dir) if resume else None
    dataset = BlockExamples(data, model, cfg.taps)
    logger.info("%s on %s: %d trainable parameters, %d blocks, %d epochs, batch %d, %d process(es)%s",
                variant["name"], target["name"], n_params, len(dataset), tcfg.epochs,
                tcfg.batch_size, world,
                f"; resuming after epoch {found[1]['epoch']}" if found else "")
    if not (found is not None and int(found[1]["epoch"]) >= tcfg.epochs):
        logger.info("target features of %d sequences: %.1f s",
                    int(data["seq_offsets"].shape[0]) - 1, dataset.prepare())
    timer = Timer()
    result = train(drafter, dataset, tcfg, resume=resume, progress=progress)
    _log_epochs(result, logger)
    logger.info("trained epochs %d..%d in %.1f s", result.resumed_from + 1, tcfg.epochs,
                timer.seconds)
    return VariantRun(result=result, drafter_config=drafter.cfg, data_sha=data_sha,
                      epochs=tcfg.epochs, world=world)
