"""One drafter variant trained on a target's training record (the ``floorgap drafters`` stage):
configure, import, fit a lookup table or train, on the blocks of
:class:`floorgap.models.examples.BlockExamples` (the target's tap features of each sequence,
computed once before the first epoch; a run that has nothing left to train skips this).

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from floorgap.config import ConfigError, drafter_epochs, is_checkpoint, variant_kind
from floorgap.errors import StageError
from floorgap.estimators.topk import topk_divergences
from floorgap.models.checkpoints import (CHECKPOINT_FORMAT, RUN_FILE, final_record,
                                         frozen_fingerprint, latest_checkpoint, run_record,
                                         trainable_layout, trainable_state)
from floorgap.models.drafters import DrafterConfig, TopKTargets, build_drafter
from floorgap.models.engine_formats import import_drafter, resolve_checkpoint
from floorgap.models.examples import (BlockExamples, block_index, budget_sequences,
                                      load_drafter_data, sequence)
from floorgap.models.from_target import init_from_target, init_fusion_from_target, residual_scale
from floorgap.models.lookup import fit_lookup, heldout_lookup_risk
from floorgap.models.targets import load_target, mixed_precision, text_config
from floorgap.models.training import TrainConfig, TrainResult, best_epoch, train
from floorgap.progress import Timer
from floorgap.records import sha256_file, write_json
from floorgap.seeds import derive_seed, generator_for

# Variant keys that map onto DrafterConfig fields of another name, or that are not model fields.
_RENAMED = {"layers": "n_layers", "heads": "n_heads"}
_NOT_MODEL = {"name", "epochs", "checkpoint", "seed_key", "init", "blocks", "vocab"}
#: training sequences the residual scale of ``init: target_scaled`` is measured on
SCALE_SEQUENCES = 8


# The fields that fix a decoder layer's tensor shapes; a drafter layer copies them.
LAYER_SHAPE_FIELDS = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size")


def _layer_shape(layer_config: Any) -> tuple[int, int, int, int]:
    heads = int(layer_config.num_attention_heads)
    return (heads, int(getattr(layer_config, "num_key_value_heads", None) or heads),
            int(getattr(layer_config, "head_dim", None) or layer_config.hidden_size // heads),
            int(layer_config.intermediate_size))


def layer_shapes(target_config: Any) -> dict[tuple[int, int, int, int], list[int]]:
    """The target's decoder-layer shapes (``LAYER_SHAPE_FIELDS``, in that order) and the layers
    of each. Attention windows are not shapes: Gemma-3's sliding and full layers are one shape.
    A heterogeneous config (transformers' ``per_layer_config``: Gemma-4's full layers have
    ``global_head_dim`` and their own key/value heads) gives one shape per distinct layer."""
    tc = target_config
    if getattr(tc, "is_heterogeneous", False):
        per_layer = [_layer_shape(layer) for layer in tc.per_layer_config]
    else:
        per_layer = [_layer_shape(tc)] * int(tc.num_hidden_layers)
    shapes: dict[tuple[int, int, int, int], list[int]] = {}
    for i, shape in enumerate(per_layer):
        shapes.setdefault(shape, []).append(i)
    return shapes


def _rope_theta(target_config: Any) -> float:
    """The rotary base of the target's full-attention layers: ``rope_theta``, or inside
    ``rope_parameters`` (transformers 5), which a target with sliding layers keys by layer
    type (Gemma-3: 10,000 sliding, 1,000,000 full). The drafter's layers attend over the whole
    context as a full layer does, so they reuse that layer's base (the positions a
    target-initialised layer was trained on)."""
    theta = getattr(target_config, "rope_theta", None)
    params = getattr(target_config, "rope_parameters", None) or {}
    if isinstance(params, Mapping) and isinstance(params.get("full_attention"), Mapping):
        params = params["full_attention"]
    if theta is None and isinstance(params, Mapping):
        theta = params.get("rope_theta")
    return float(theta) if theta is not None else 1_000_000.0


def drafter_config(variant: Mapping[str, Any], taps: list[int], gamma: int, target_config: Any,
                   draft_vocab: list[int] | None = None) -> DrafterConfig:
    """The ``DrafterConfig`` of a config variant on a target: width, heads, key/value heads, head
    width, MLP width, norm epsilon and rotary base follow the target's (so a drafter layer has
    the shapes of a target layer) unless the variant sets ``heads``.

    A target whose layers differ only in attention window (Gemma-3: sliding and full layers of
    one shape) is fine: the drafter's own layers attend over the whole context and block, as
    the target's full layers do, with their rotary base. A target whose layers differ in shape
    (Gemma-4: ``global_head_dim`` and its own key/value heads on full layers) has no one layer
    to copy and is refused, naming the fields that differ."""
    tc = target_config
    shapes = layer_shapes(tc)
    if len(shapes) > 1:
        differ = [f for i, f in enumerate(LAYER_SHAPE_FIELDS)
                  if len({shape[i] for shape in shapes}) > 1]
        kinds = sorted(set(getattr(tc, "layer_types", None) or []))
        raise StageError(
            f"the target's decoder layers differ in shape ({', '.join(differ)} differ between "
            f"its layers{'; layer_types ' + str(kinds) if kinds else ''}); a trained drafter's "
            "layers copy one target layer's shapes: train on a target whose layers share one "
            "shape, or import a released drafter (checkpoint: {format, hub})")
    heads, n_kv, head_dim, intermediate = next(iter(shapes))
    fields = {"kind": variant["kind"], "gamma": int(gamma), "taps": [int(t) for t in taps],
              "hidden_size": int(tc.hidden_size), "n_heads": heads, "n_kv_heads": n_kv,
              "head_dim": head_dim, "intermediate_size": intermediate,
              "rms_eps": float(getattr(tc, "rms_norm_eps", 1e-6)),
              "rope_theta": _rope_theta(tc)}
    if "heads" in variant:  # a drafter with its own head count keeps full multi-head attention
        fields.update(n_kv_heads=None, head_dim=None)
    fields.update({_RENAMED.get(k, k): v for k, v in variant.items() if k not in _NOT_MODEL})
    if draft_vocab is not None:
        fields["draft_vocab"] = draft_vocab
    return DrafterConfig(**fields)


def heldout_sequences(data: Mapping[str, Any], share: float, seed: int) -> list[int]:
    """The training record's held-out sequences: a seeded ``share`` of them (at least one when
    the share is positive and there are two or more), the same for every variant and budget
    arm of a target, so that their held-out curves are comparable."""
    n_seq = int(data["seq_prompt_len"].shape[0])
    if share <= 0 or n_seq < 2:
        return []
    n = min(n_seq - 1, max(1, round(share * n_seq)))
    order = torch.randperm(n_seq, generator=generator_for(derive_seed(seed, "heldout")))
    return sorted(int(i) for i in order[:n])


def split_sequences(data: Mapping[str, Any], spec: Mapping[str, Any]
                    ) -> tuple[list[int], list[int]]:
    """(training, held-out) sequences of a record under the spec's ``train.heldout`` share."""
    heldout = heldout_sequences(data, float(spec["train"]["heldout"]), int(spec["seed"]))
    n_seq = int(data["seq_prompt_len"].shape[0])
    return sorted(set(range(n_seq)) - set(heldout)), heldout


def trimmed_vocabulary(data: Mapping[str, Any], sequences: Sequence[int], size: int,
                       vocab_size: int) -> list[int]:
    """The ``size`` target tokens with the most stored target mass (sum of the top-K
    probabilities over every response position of ``sequences``; ties by id), ascending: the
    draft vocabulary of an EAGLE-3 / FR-Spec style trimmed head, chosen from training data
    alone."""
    if not 1 <= size <= vocab_size:
        raise StageError(f"a draft vocabulary of {size} tokens does not fit the target's "
                         f"{vocab_size}; set vocab between 1 and {vocab_size}")
    pos = data["pos_offsets"]
    rows = torch.cat([torch.arange(int(pos[s]), int(pos[s + 1])) for s in sequences])
    mass = torch.zeros(vocab_size, dtype=torch.float64)
    mass.index_add_(0, data["target_ids"][rows].long().reshape(-1),
                    data["target_vals"][rows].double().reshape(-1))
    order = torch.sort(-mass, stable=True).indices[:size]   # by mass, ties by id
    return sorted(int(t) for t in order)


def train_config(spec: Mapping[str, Any], checkpoint_dir: Path, device: str) -> TrainConfig:
    """The ``TrainConfig`` of a variant: ``drafters.train`` (``epochs`` overridable per variant),
    seeded by the config seed and the variant's ``seed_key`` (default its name; the component
    arms of table 13 share one key, so they start from the same draws)."""
    tr, variant = spec["train"], spec["variant"]
    patience = tr.get("patience")
    return TrainConfig(epochs=drafter_epochs(variant, tr),
                       patience=None if patience is None else int(patience),
                       batch_size=int(tr["batch_size"]), lr=float(tr["lr"]),
                       warmup_steps=int(tr["warmup_steps"]), weight_decay=float(tr["weight_decay"]),
                       seed=derive_seed(int(spec["seed"]), "drafter-train",
                                       variant.get("seed_key", variant["name"])),
                       checkpoint_dir=str(checkpoint_dir), device=device,
                       autocast_dtype=tr.get("autocast"))


def heldout_risk(drafter: Any, examples: BlockExamples, batch_size: int) -> dict[str, Any]:
    """Held-out R by slot of a drafter in training: the mean over ``examples``' blocks of the
    top-K + residual TV(p_k, q_k) (:func:`floorgap.estimators.topk.topk_divergences`, q zero
    outside a trimmed draft vocabulary) of the proposal the drafter deploys
    (:meth:`~floorgap.models.drafters.Drafter.proposal_logits`: the prefix-attention head's q
    lives on its nominations), teacher-forced (for order-1 kinds the realised predecessor,
    R^oracle), in the training precision. ``score`` is the mean over slots."""
    device = next(drafter.parameters()).device
    total = torch.zeros(drafter.gamma, dtype=torch.float64)
    n = 0
    for idx in examples.epoch_batches(batch_size, 0, 0):
        b = {k: v.to(device) for k, v in examples.gather(idx).items()}
        with mixed_precision(device.type, examples.autocast):
            out = drafter(b["features"], b["committed"], b["block_tokens"],
                          prefix_mask=b["prefix_mask"], feature_index=b["feature_index"])
        top, valid = drafter.draft_targets(TopKTargets(b["target_ids"], b["target_vals"]))
        tv = topk_divergences(drafter.proposal_logits(out), top.ids, top.vals, valid)["tv"]
        total += tv.double().sum(0).cpu()
        n += int(tv.shape[0])
    by_slot = (total / max(n, 1)).tolist()
    return {"tv_by_slot": by_slot, "score": sum(by_slot) / len(by_slot), "blocks": n}


@dataclass
class VariantRun:
    """A trained variant: the training result, the filled ``DrafterConfig``, the SHA-256 of the
    training record, the epochs of the schedule, the number of data-parallel ranks and the
    epoch kept (the best held-out epoch, else the last)."""

    result: TrainResult
    drafter_config: DrafterConfig
    data_sha: str
    epochs: int
    world: int
    kept_epoch: int


def check_variant(variant: Mapping[str, Any]) -> bool:
    """Whether the variant imports a checkpoint (True) or is trained (False); a checkpoint
    variant whose kind cannot be resolved from its format is refused."""
    try:
        variant_kind(variant, f"variant {variant.get('name')}")
    except ConfigError as exc:
        raise StageError(str(exc)) from exc
    return is_checkpoint(variant)


def _check_imported(variant: Mapping[str, Any], cfg: DrafterConfig, where: str) -> None:
    """The imported drafter is what the config entry says it is (kind, layers)."""
    kind = variant_kind(variant, f"variant {variant['name']}")
    if cfg.kind != kind:
        raise StageError(f"{where} holds a {cfg.kind} drafter, but variant {variant['name']} "
                         f"is of kind {kind}; fix kind (or checkpoint.format) in the config")
    if "layers" in variant and int(variant["layers"]) != cfg.n_layers:
        raise StageError(f"{where} holds a drafter of {cfg.n_layers} layers, but variant "
                         f"{variant['name']} says layers: {variant['layers']}; fix or drop "
                         "layers in the config")


def import_variant(spec: Mapping[str, Any], model_dir: Path, logger: logging.Logger
                   ) -> dict[str, Any]:
    """The final record (floorgap.models.checkpoints format) of a checkpoint variant: the
    folder of ``spec["variant"]["checkpoint"]`` (local path or hub id) imported on the target
    of ``model_dir`` at the workflow's gamma, with provenance saying it was imported and no
    training epochs."""
    target, variant = spec["target"], spec["variant"]
    entry = variant["checkpoint"]
    try:
        folder = resolve_checkpoint(entry)
        model, _ = load_target(model_dir, target["dtype"], target["device"])
        drafter = import_drafter(folder, model, fmt=entry["format"], gamma=int(spec["gamma"]))
    except (ValueError, FileNotFoundError, ConnectionError) as exc:
        raise StageError(f"variant {variant['name']}: {exc}") from exc
    _check_imported(variant, drafter.cfg, str(folder))
    ckpt = {"format": CHECKPOINT_FORMAT, "model": trainable_state(drafter),
            "trainable_layout": trainable_layout(drafter),
            "frozen_fingerprint": frozen_fingerprint(drafter),
            "config": None, "config_fingerprint": None}
    record = final_record(ckpt, drafter.cfg, target["name"], variant, data_sha=None, epochs=[],
                          processes=1)
    record["provenance"] = {
        "imported": True, "format": entry["format"], "path": entry.get("path"),
        "hub": entry.get("hub"), "revision": entry.get("revision"), "folder": str(folder),
        "config_sha256": sha256_file(folder / "config.json")}
    logger.info("%s: imported a %s drafter (%d layers, taps %s, gamma %d) from %s (%s)",
                variant["name"], drafter.cfg.kind, drafter.cfg.n_layers, drafter.cfg.taps,
                drafter.cfg.gamma, entry.get("path") or entry.get("hub"), entry["format"])
    return record


def fit_lookup_variant(spec: Mapping[str, Any], data_path: Path, logger: logging.Logger
                       ) -> dict[str, Any]:
    """The final record of a lookup-table variant (:mod:`floorgap.models.lookup`): fitted on the
    training sequences of the record at ``data_path`` (with ``blocks``, on those a drafter arm
    of that budget trains on), its smoothing chosen on the held-out ones (the drafters' split),
    its held-out R by slot under ``heldout``, with the record's SHA-256 as provenance."""
    variant = spec["variant"]
    gamma = int(spec["gamma"])
    data = load_drafter_data(data_path)
    train_seqs, heldout = split_sequences(data, spec)
    block_seq = block_index(data, gamma)[0]
    if variant.get("blocks") is not None:
        # the sequences a drafter arm of the same budget trains on (BlockExamples)
        train_seqs = sorted(int(i) for i in budget_sequences(
            block_seq, int(data["seq_prompt_len"].shape[0]), int(spec["seed"]), train_seqs,
            int(variant["blocks"])))
    blocks = int(torch.isin(block_seq, torch.as_tensor(train_seqs, dtype=torch.long)).sum())
    vocab = int(data["metadata"]["model"].get("vocab_size") or
                int(data["target_ids"].max()) + 1)
    table, scores = fit_lookup(variant["kind"], data, train_seqs, heldout,
                               gamma=gamma, vocab_size=vocab, taps=spec["taps"])
    held = heldout_lookup_risk(table, data, heldout) if heldout else None
    logger.info("%s: %s table from %d training sequences (%d blocks); smoothing %g (held-out "
                "slot-0 TV by weight: %s); held-out R by slot: %s", variant["name"],
                variant["kind"], len(train_seqs), blocks,
                table.cfg.alpha, ", ".join(f"{a}: {v:.4f}" for a, v in scores.items()) or "-",
                " ".join(f"{v:.3f}" for v in held["tv_by_slot"]) if held else "-")
    return {**table.record(), "target": spec["target"]["name"], "variant": dict(variant),
            "train_data_sha256": sha256_file(data_path), "heldout_tv0": scores,
            "heldout": held, "epochs": []}


def _rank_device(device: str, world: int) -> str:
    """With several ranks on CUDA, each rank trains on its local GPU."""
    if world > 1 and device.startswith("cuda"):
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device


def _resume_decision(run: Mapping[str, Any], ckpt_dir: Path, rank: int, world: int,
                     logger: logging.Logger) -> bool:
    """Whether the checkpoints in ``ckpt_dir`` belong to this run (its ``run.json`` equals
    ``run``); rank 0 then writes this run's record."""
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
        held = rec.get("heldout")
        logger.info("epoch %d: loss %.4f %s, %d tokens in %.2f s (%.1f tokens/s)%s",
                    rec["epoch"], rec["loss"],
                    " ".join(f"{k} {v:.4f}" for k, v in sorted(rec["parts"].items())
                             if k != "loss"),
                    rec["tokens"], rec["seconds"], rec["tokens_per_s"],
                    "" if held is None else "; held-out TV by slot " +
                    " ".join(f"{v:.3f}" for v in held["tv_by_slot"]))


def train_variant(spec: Mapping[str, Any], model_dir: Path, data_path: Path, ckpt_dir: Path, *,
                  rank: int, world: int, progress: bool, logger: logging.Logger) -> VariantRun:
    """Train the variant of ``spec`` (see floorgap.stages.drafters) on the record at
    ``data_path`` with the target of ``model_dir``, checkpointing into ``ckpt_dir`` and
    resuming there when its ``run.json`` matches. Every rank of a data-parallel group calls it.
    """
    target, variant = spec["target"], spec["variant"]
    device = _rank_device(target["device"], world)
    data = load_drafter_data(data_path)
    data_sha = sha256_file(data_path)
    gamma = int(data["metadata"]["gamma"])
    if gamma != int(spec["gamma"]):
        raise StageError(f"{data_path} holds blocks of {gamma} slots, not gamma={spec['gamma']}")
    model, _ = load_target(model_dir, target["dtype"], device)
    train_seqs, heldout = split_sequences(data, spec)
    vocab = None
    if variant.get("vocab") is not None:
        vocab = trimmed_vocabulary(data, train_seqs, int(variant["vocab"]),
                                   int(model.get_output_embeddings().weight.shape[0]))
    cfg = drafter_config(variant, spec["taps"], gamma, text_config(model.config), draft_vocab=vocab)
    init = variant.get("init", "random")
    if init == "target_scaled":
        cfg.input_scale = residual_scale(model, [sequence(data, i) for i in
                                                 train_seqs[:SCALE_SEQUENCES]], cfg.n_layers)
        logger.info("block rows scaled by %.1f: the target's residual stream entering its "
                    "layer %d over its embeddings", cfg.input_scale,
                    int(text_config(model.config).num_hidden_layers) - cfg.n_layers)
    tcfg = train_config(spec, ckpt_dir, device)
    torch.manual_seed(derive_seed(tcfg.seed, "drafter-init"))
    drafter = build_drafter(cfg, model)
    n_params = sum(p.numel() for p in drafter.parameters() if p.requires_grad)
    resume = _resume_decision(run_record(spec, drafter.cfg, tcfg, data_sha), ckpt_dir, rank,
                              world, logger)
    found = latest_checkpoint(ckpt_dir) if resume else None
    if init in ("target", "target_scaled"):
        init_from_target(drafter, model)
    if init == "target_scaled":
        logger.info("fusion starts as tap %d through the first copied layer's input norm",
                    init_fusion_from_target(drafter, model))
    common = dict(seed=int(spec["seed"]), autocast=tcfg.autocast_dtype,
                  stream=spec["train"]["features"] == "stream")
    dataset = BlockExamples(data, model, cfg.taps, gamma, max_blocks=variant.get("blocks"),
                            sequences=train_seqs, **common)
    held = BlockExamples(data, model, cfg.taps, gamma, sequences=heldout, **common) \
        if heldout else None
    logger.info("%s on %s: %d trainable parameters, %d blocks (%d held out), %d epochs, "
                "batch %d, %s vocabulary, %d process(es)%s", variant["name"], target["name"],
                n_params, len(dataset), len(held) if held else 0, tcfg.epochs, tcfg.batch_size,
                f"a {len(vocab)}-token" if vocab else "the full", world,
                f"; resuming after epoch {found[1]['epoch']}" if found else "")
    if not (found is not None and int(found[1]["epoch"]) >= tcfg.epochs):
        logger.info("target features of %d sequences (%s): %.1f s", len(dataset.sequences),
                    "stored in the record" if dataset.stored_features() else
                    "streamed: computed per batch" if dataset.stream else "computed",
                    dataset.prepare() + (held.prepare() if held else 0.0))

    def evaluate(core: Any) -> dict[str, Any]:
        return heldout_risk(core, held, tcfg.batch_size)

    timer = Timer()
    result = train(drafter, dataset, tcfg, resume=resume, progress=progress,
                   evaluate=evaluate if held is not None else None)
    _log_epochs(result, logger)
    kept = best_epoch(result.epochs) or int(result.epochs[-1]["epoch"])
    logger.info("trained epochs %d..%d in %.1f s; kept epoch %d", result.resumed_from + 1,
                int(result.epochs[-1]["epoch"]), timer.seconds, kept)
    return VariantRun(result=result, drafter_config=drafter.cfg, data_sha=data_sha,
                      epochs=len(result.epochs), world=world, kept_epoch=kept)
