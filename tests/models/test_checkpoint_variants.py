"""Checkpoint variants on the smoke target: the drafters stage imports an exported folder (no
training) into final.pt, and drafter_eval scores that final.pt and the folder itself exactly as
it scores the drafter that was exported."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from floorgap.models.checkpoints import frozen_fingerprint, load_final, trainable_layout
from floorgap.models.checkpoints import trainable_state
from floorgap.models.drafters import DrafterConfig, build_drafter
from floorgap.models.engine_formats import export_drafter
from floorgap.models.targets import load_target
from floorgap.records import read_metadata, read_table
from floorgap.stages import drafter_eval as eval_cli
from floorgap.stages import drafters as drafters_cli
from floorgap.stages import rollouts as rollouts_cli
from floorgap.stages._cli import run_stage

GAMMA = 7


@pytest.fixture(scope="module")
def model(smoke_target):
    return load_target(smoke_target[2], "float32", "cpu")[0]


def _random_drafter(model, kind: str):
    """A randomly initialised drafter on the smoke target, every weight perturbed (norms and
    Markov map included) so that a dropped or swapped tensor shows in the proposals."""
    torch.manual_seed(11)
    cfg = DrafterConfig(kind=kind, gamma=GAMMA, hidden_size=model.config.hidden_size,
                        n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=64,
                        taps=[0, 1], markov_rank=8)
    drafter = build_drafter(cfg, model).eval()
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    return drafter


@pytest.fixture(scope="module")
def exported(model, smoke_target):
    """dflash and speculators (dspark) folders of random drafters, and the drafters."""
    root = smoke_target[3] / "checkpoint-variants"
    out = {}
    for kind, fmt in (("dflash", "dflash"), ("dspark", "speculators")):
        drafter = _random_drafter(model, kind)
        out[kind] = (export_drafter(drafter, root / "folders" / fmt, fmt, num_target_layers=2),
                     drafter)
    return root, out


def _import(smoke_target, variant: dict, out: Path) -> int:
    _, target, model_dir, _ = smoke_target
    spec = {"target": target, "variant": variant, "gamma": GAMMA}
    return run_stage(drafters_cli.main, drafters_cli.build_parser(), [
        "--spec", json.dumps(spec), "--model-dir", str(model_dir), "--out", str(out / "final.pt"),
        "--train-log", str(out / "train_log.jsonl"), "--epochs-dir", str(out / "epochs"),
        "--checkpoints", str(out / "checkpoints"), "--threads", "1", "--no-progress"])


@pytest.mark.parametrize(("kind", "variant"), [
    ("dflash", {"checkpoint": {"format": "dflash"}}),
    ("dspark", {"kind": "dspark", "layers": 1, "checkpoint": {"format": "speculators"}}),
])
def test_drafters_stage_imports_without_training(smoke_target, model, exported, kind, variant):
    root, folders = exported
    folder, drafter = folders[kind]
    variant = {"name": f"rel-{kind}", **variant}
    variant["checkpoint"] = {**variant["checkpoint"], "path": str(folder)}
    out = root / "drafters" / variant["name"]
    assert _import(smoke_target, variant, out) == 0  # no --data: nothing to train on
    assert (out / "train_log.jsonl").read_text() == ""
    assert (out / "epochs").is_dir() and not any((out / "epochs").iterdir())
    assert not (out / "checkpoints").exists()
    record = torch.load(out / "final.pt", weights_only=True)
    assert record["epochs"] == [] and record["train_data_sha256"] is None
    prov = record["provenance"]
    assert prov["imported"] is True and prov["path"] == str(folder)
    assert prov["format"] == variant["checkpoint"]["format"] and prov["hub"] is None
    loaded = load_final(out / "final.pt", model)  # checks layout and target fingerprint
    assert loaded.cfg.kind == kind and loaded.cfg.gamma == GAMMA
    params = dict(loaded.named_parameters())
    for name, value in trainable_state(drafter).items():
        assert torch.equal(params[name].detach(), value), name


@pytest.mark.parametrize(("variant", "exit_code"), [
    ({"kind": "dspark", "checkpoint": {"format": "dflash"}}, 2),        # kind vs format
    ({"layers": 3, "checkpoint": {"format": "dflash"}}, 2),             # layers vs folder
    ({"checkpoint": {"format": "dspark"}}, 2),                          # format vs folder
    ({"checkpoint": {"format": "speculators"}}, 2),                     # no kind
])
def test_inconsistent_imports_are_refused(smoke_target, exported, tmp_path, variant, exit_code):
    _, folders = exported
    variant = {"name": "bad", **variant}
    variant["checkpoint"] = {**variant["checkpoint"], "path": str(folders["dflash"][0])}
    assert _import(smoke_target, variant, tmp_path) == exit_code
    assert not (tmp_path / "final.pt").exists()


def test_trained_variant_without_data_is_refused(smoke_target, tmp_path):
    cfg, target, model_dir, _ = smoke_target
    spec = {"target": target, "variant": {"name": "v", "kind": "dflash", "layers": 1},
            "taps": [0, 1], "train": cfg["drafters"]["train"], "gamma": GAMMA, "seed": 1}
    assert run_stage(drafters_cli.main, drafters_cli.build_parser(), [
        "--spec", json.dumps(spec), "--model-dir", str(model_dir),
        "--out", str(tmp_path / "final.pt"), "--threads", "1"]) == 2


def _legacy_final(drafter, path: Path) -> Path:
    """The exported drafter itself, in the final.pt layout (the reference to compare with)."""
    torch.save({"drafter_config": dataclasses.asdict(drafter.cfg),
                "model": trainable_state(drafter), "trainable_layout": trainable_layout(drafter),
                "frozen_fingerprint": frozen_fingerprint(drafter)}, path)
    return path


def test_imported_checkpoint_evaluates_like_the_exported_drafter(smoke_target, model, exported,
                                                                 smoke_domain_records):
    """drafters (import) -> drafter_eval on the smoke records, with the imported final.pt and
    with the folder directly: per-slot records for every anchor, and the same proposals as the
    drafter that was exported (q of every path and slot, TV, accept factors, self chain)."""
    cfg, target, model_dir, corpus, anchors, _ = smoke_domain_records
    root, folders = exported
    folder, drafter = folders["dspark"]
    out = root / "eval"
    variant = {"name": "rel", "kind": "dspark",
               "checkpoint": {"format": "speculators", "path": str(folder)}}
    assert _import(smoke_target, variant, out / "rel") == 0
    roll = dict(cfg["rollouts"], shards=3)  # 2 anchors per shard keep the test small
    spec = {"target": target, "rollouts": roll, "law": cfg["evaluation_law"], "gamma": GAMMA,
            "shard": 0}
    paths = out / "rollouts-paths-0.parquet"
    assert run_stage(rollouts_cli.main, rollouts_cli.build_parser(), [
        "--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus", str(corpus),
        "--anchors", str(anchors), "--out-paths", str(paths),
        "--out-floors", str(out / "floors-0.parquet"), "--threads", "1"]) == 0
    labels = ["final", "folder", "exported"]
    weights = [out / "rel" / "final.pt", folder, _legacy_final(drafter, out / "exported.pt")]
    argv = ["--spec", json.dumps(dict(spec, variants=labels)), "--model-dir", str(model_dir),
            "--corpus", str(corpus), "--anchors", str(anchors), "--rollouts", str(paths),
            "--drafter", *map(str, weights),
            "--out-paths", *[str(out / f"paths-{x}.parquet") for x in labels],
            "--out-slots", *[str(out / f"slots-{x}.parquet") for x in labels], "--threads", "1"]
    assert run_stage(eval_cli.main, eval_cli.build_parser(), argv) == 0
    stored = read_table(paths)
    n_anchors = stored.anchor_id.nunique()
    ref_p, ref_s = (read_table(out / f"{k}-exported.parquet") for k in ("paths", "slots"))
    assert len(ref_s) == n_anchors * GAMMA and len(ref_p) == len(stored) * GAMMA
    assert (ref_s.order == 1).all() and (ref_s.logp_mismatches == 0).all()
    for label in ("final", "folder"):
        p, s = (read_table(out / f"{k}-{label}.parquet") for k in ("paths", "slots"))
        assert read_metadata(out / f"slots-{label}.parquet")["drafter_kind"] == "dspark"
        for col in ("q_tok", "tv", "accept", "self_token", "q_self_tok", "tv_self"):
            np.testing.assert_array_equal(p[col].to_numpy(), ref_p[col].to_numpy(), col)
        for col in ("risk", "risk_oracle", "risk_self", "exposure"):
            np.testing.assert_array_equal(s[col].to_numpy(), ref_s[col].to_numpy(), col)
