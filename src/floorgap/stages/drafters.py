"""``floorgap drafters --spec JSON --model-dir DIR --data TRAIN_DATA --out FINAL``

Train one drafter variant on a target's training record (floorgap.data.training_data) and write
``FINAL`` (``final.pt``): the trainable weights, the filled ``DrafterConfig``, the fingerprint of
the frozen target tables and the training provenance, atomically. Per-epoch checkpoints and the
loss log (``log.jsonl``, one record per logged step and per epoch, with tokens/s) go to
``--checkpoints`` (default ``<FINAL's folder>/checkpoints``); ``--train-log`` receives a copy of
the loss log at the end.

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
blocks; they are computed once, before the first epoch, and held in memory as float32
(``sum of sequence lengths * n_taps * hidden`` floats). A run that has nothing left to train
skips this.

Data parallel. With ``train.processes > 1`` the command re-executes itself under ``torchrun
--nproc_per_node=processes``; every rank loads the target and computes the features, ranks
split each global batch (see floorgap.models.training), rank 0 writes checkpoints and ``FINAL``.

The spec holds ``target`` (config entry with ``name``), ``variant`` (variant entry with
``name``; optional ``epochs`` and ``seed_key``), ``taps``, ``train`` (the config's
``drafters.train``), ``gamma``, ``seed`` and optional ``export_epochs`` (write every epoch's
weights to ``--epochs-dir``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from floorgap.errors import StageError
from floorgap.stages._cli import run_stage, stage_parser

FINAL_FORMAT = 1
RUN_FILE = "run.json"
# Variant keys that map onto DrafterConfig fields of another name, or that are not model fields.
_RENAMED = {"layers": "n_layers", "heads": "n_heads"}
_NOT_MODEL = {"name", "epochs", "checkpoint", "seed_key"}


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap drafters", "Train one drafter variant on a target.")
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--data", required=True, type=Path, help="drafter training record")
    parser.add_argument("--out", required=True, type=Path, help="final.pt")
    parser.add_argument("--checkpoints", type=Path, default=None,
                        help="per-epoch checkpoints and log.jsonl (default: OUT's folder/checkpoints)")
    parser.add_argument("--train-log", type=Path, default=None, help="copy of the loss log")
    parser.add_argument("--epochs-dir", type=Path, default=None,
                        help="folder for every epoch's weights as epoch-<e>.pt (final format), "
                        "written when the spec's export_epochs is true (training trajectory, "
                        "table 10); created empty otherwise")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def drafter_config(variant: Mapping[str, Any], taps: list[int], gamma: int, target_config: Any):
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


def train_config(spec: Mapping[str, Any], checkpoint_dir: Path, device: str):
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

        from floorgap.progress import Timer
        from floorgap.data.training_data import sequence
        from floorgap.models.drafters import target_features

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


def load_final(path: str | os.PathLike[str], target_model: Any):
    """A drafter built on ``target_model`` with the trained weights of ``final.pt``."""
    import torch

    from floorgap.models.drafters import DrafterConfig, build_drafter
    from floorgap.models.training import load_drafter_weights

    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if ckpt.get("final_format") != FINAL_FORMAT:
        raise ValueError(f"{path}: not a final drafter file of format {FINAL_FORMAT}")
    model = build_drafter(DrafterConfig(**ckpt["drafter_config"]), target_model)
    load_drafter_weights(model, ckpt)
    return model


def final_record(ckpt: Mapping[str, Any], cfg: Any, target: str, variant: Mapping[str, Any],
                 data_sha: str, epochs: list[dict[str, Any]], processes: int) -> dict[str, Any]:
    """A trained drafter as the evaluation probe loads it: the trainable weights of a training
    checkpoint, its ``DrafterConfig`` and the training provenance."""
    return {
        "final_format": FINAL_FORMAT,
        "format": ckpt["format"],
        "model": ckpt["model"],
        "trainable_layout": ckpt["trainable_layout"],
        "frozen_fingerprint": ckpt["frozen_fingerprint"],
        "drafter_config": asdict(cfg),
        "target": target,
        "variant": dict(variant),
        "train_config": ckpt["config"],
        "train_config_fingerprint": ckpt["config_fingerprint"],
        "train_data_sha256": data_sha,
        "epochs": epochs,
        "processes": processes,
    }


def export_epochs(ckpt_dir: Path, out_dir: Path, epochs: int, cfg: Any, target: str,
                  variant: Mapping[str, Any], data_sha: str, processes: int) -> None:
    """``out_dir/epoch-<e>.pt`` for e = 1..epochs, each in the final format, from the training
    checkpoints (written atomically; the folder is the rule's output)."""
    import torch

    from floorgap.models.training import checkpoint_path, load_checkpoint
    from floorgap.records import atomic_path

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


def _run_record(spec: Mapping[str, Any], cfg: Any, tcfg: Any, data_sha: str) -> dict[str, Any]:
    return {"train_data_sha256": data_sha, "drafter_config": asdict(cfg),
            "train_config_fingerprint": tcfg.fingerprint(), "target": spec["target"]["name"],
            "variant": spec["variant"]["name"]}


def _torchrun(processes: int, argv: list[str]) -> int:
    """Re-execute this stage (arguments ``argv``) under torchrun with ``processes`` ranks."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={processes}", "-m", "floorgap", "drafters", *argv]
    return subprocess.run(cmd, check=False).returncode


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    import torch

    from floorgap.progress import Timer
    from floorgap.data.training_data import load_training_data
    from floorgap.models.drafters import build_drafter
    from floorgap.models.targets import load_target
    from floorgap.models.training import (
        init_distributed,
        latest_checkpoint,
        load_checkpoint,
        train,
    )
    from floorgap.records import atomic_path, sha256_file, write_json
    from floorgap.seeds import derive_seed

    spec = args.spec
    target, variant = spec["target"], spec["variant"]
    if variant.get("checkpoint"):
        raise StageError(f"variant {variant['name']} names a released checkpoint; this stage "
                         "trains drafters and does not import checkpoints")
    processes = int(spec["train"].get("processes", 1))
    rank, world = 0, 1
    if processes > 1:
        rank, world = init_distributed()
        if world == 1:  # not under torchrun yet
            code = _torchrun(processes, args.argv)
            if code != 0:
                raise StageError(f"torchrun with {processes} processes exited with status {code}")
            return
    ckpt_dir = args.checkpoints or args.out.parent / "checkpoints"
    device = target["device"]
    if world > 1 and device.startswith("cuda"):
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"

    data = load_training_data(args.data)
    data_sha = sha256_file(args.data)
    gamma = int(data["metadata"]["gamma"])
    if gamma != int(spec["gamma"]):
        raise StageError(f"{args.data} holds blocks of {gamma} slots, not gamma={spec['gamma']}")
    model, _ = load_target(args.model_dir, target["dtype"], device)
    cfg = drafter_config(variant, spec["taps"], gamma, model.config)
    tcfg = train_config(spec, ckpt_dir, device)
    torch.manual_seed(derive_seed(tcfg.seed, "drafter-init"))
    drafter = build_drafter(cfg, model)
    n_params = sum(p.numel() for p in drafter.parameters() if p.requires_grad)

    run = _run_record(spec, drafter.cfg, tcfg, data_sha)
    run_path = ckpt_dir / RUN_FILE
    resume = run_path.exists() and json.loads(run_path.read_text()) == json.loads(json.dumps(run))
    if not resume and rank == 0 and run_path.exists():
        logger.info("%s: checkpoints were trained on other data or settings; starting afresh",
                    ckpt_dir)
    if world > 1:
        torch.distributed.barrier()  # every rank has decided before rank 0 rewrites run.json
    if rank == 0:
        write_json(run_path, run)
    found = latest_checkpoint(ckpt_dir) if resume else None
    done = found is not None and int(found[1]["epoch"]) >= tcfg.epochs
    dataset = BlockExamples(data, model, cfg.taps)
    logger.info("%s on %s: %d trainable parameters, %d blocks, %d epochs, batch %d, %d process(es)%s",
                variant["name"], target["name"], n_params, len(dataset), tcfg.epochs,
                tcfg.batch_size, world,
                f"; resuming after epoch {found[1]['epoch']}" if found else "")
    if not done:
        logger.info("target features of %d sequences: %.1f s",
                    int(data["seq_offsets"].shape[0]) - 1, dataset.prepare())
    timer = Timer()
    result = train(drafter, dataset, tcfg, resume=resume, progress=not args.no_progress)
    for rec in result.epochs:
        logger.info("epoch %d: loss %.4f %s, %d tokens in %.2f s (%.1f tokens/s)", rec["epoch"],
                    rec["loss"], " ".join(f"{k} {v:.4f}" for k, v in sorted(rec["parts"].items())
                             if k != "loss"),
                    rec["tokens"], rec["seconds"], rec["tokens_per_s"])
    logger.info("trained epochs %d..%d in %.1f s", result.resumed_from + 1, tcfg.epochs,
                timer.seconds)
    if rank != 0:
        return
    if result.checkpoint is None:
        raise StageError("training wrote no checkpoint")
    last = load_checkpoint(result.checkpoint)
    final = final_record(last, drafter.cfg, target["name"], variant, data_sha, result.epochs,
                         world)
    with atomic_path(args.out) as tmp:
        torch.save(final, tmp)
    if args.epochs_dir is not None:
        args.epochs_dir.mkdir(parents=True, exist_ok=True)
        if spec.get("export_epochs"):
            export_epochs(ckpt_dir, args.epochs_dir, tcfg.epochs, drafter.cfg, target["name"],
                          variant, data_sha, world)
    if args.train_log is not None:
        with atomic_path(args.train_log) as tmp:
            tmp.write_text("".join(json.dumps(r) + "\n" for r in result.log))
    logger.info("wrote %s", args.out)

