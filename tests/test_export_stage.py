"""The export stage: a trained drafter's final.pt on the smoke target written as the checkpoint
folders serving engines load, read back bitwise; the formats each drafter goes to
(WorkflowSpec.export_formats); and the export jobs of the smoke workflow."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import pytest
import torch
import yaml

from conftest import SMOKE_CONFIG, dry_run_jobs, load_config, snakemake
from floorgap.config import resolve

GAMMA = 7
TAPS = [0, 1]

#: Drafter entries of each kind, as the config writes them (the smoke config's sizes).
VARIANTS = {
    "dflash": {"name": "dflash", "kind": "dflash", "layers": 1},
    "dspark": {"name": "dspark", "kind": "dspark", "layers": 1, "markov_rank": 8},
    "ours": {"name": "ours", "kind": "prefix_attention", "layers": 1, "head_width": 32,
             "head_heads": 2, "head_mlp": 64, "nominate_k": 8, "short_conv": True,
             "slot_embeddings": True},
    "conv": {"name": "conv", "kind": "dspark", "layers": 1, "markov_rank": 8,
             "short_conv": True},
}


def smoke() -> dict:
    return load_config(SMOKE_CONFIG)


# ------------------------------------------------------------------------ formats per drafter


@pytest.mark.parametrize(("entry", "formats"), [
    (VARIANTS["dflash"], ["dflash", "speculators"]),
    (VARIANTS["dspark"], ["dspark", "speculators"]),
    ({"name": "head", "kind": "prefix_attention", "layers": 1}, ["floorgap"]),
    (VARIANTS["ours"], ["floorgap"]),
    (VARIANTS["conv"], ["floorgap"]),                                     # short_conv alone
    ({"name": "s", "kind": "dflash", "layers": 1, "slot_embeddings": True}, ["floorgap"]),
    ({"name": "off", "kind": "dflash", "layers": 1, "short_conv": False}, ["dflash",
                                                                           "speculators"]),
    ({"name": "rel", "checkpoint": {"format": "dspark", "path": "/x"}}, ["dspark",
                                                                          "speculators"]),
], ids=["dflash", "dspark", "prefix_attention", "ours", "short_conv", "slot_embeddings",
        "extras-off", "checkpoint-kind-from-format"])
def test_export_formats_by_kind(entry: dict, formats: list[str]) -> None:
    assert resolve(smoke()).export_formats(entry) == formats


def test_export_formats_by_name_and_export_targets() -> None:
    spec = resolve(smoke())
    assert spec.export_formats("dflash") == ["dflash", "speculators"]
    assert spec.export_formats("dspark") == ["dspark", "speculators"]
    assert spec.export_formats("ours") == ["floorgap"]
    assert spec.export_formats("short_conv") == ["floorgap"]  # a component arm, by name
    assert spec.export_formats("vanilla") == ["dspark", "speculators"]
    root = f"results/{spec.primary}/export"
    assert spec.export_targets() == [f"{root}/dflash/dflash", f"{root}/dflash/speculators",
                                     f"{root}/dspark/dspark", f"{root}/dspark/speculators",
                                     f"{root}/ours/floorgap"]


def test_export_targets_are_the_primary_targets_variants_only() -> None:
    cfg = smoke()
    name = resolve(cfg).primary
    cfg["targets"]["other"] = copy.deepcopy(cfg["targets"][name])
    cfg["primary_target"] = "other"
    targets = resolve(cfg).export_targets()
    assert targets and all(t.startswith("results/other/export/") for t in targets)
    arms = set(cfg["drafters"]["components"]["arms"])
    assert not {Path(t).parent.name for t in targets} & arms


# ------------------------------------------------------------------------ the stage command


@pytest.fixture(scope="module")
def model(smoke_target):
    from floorgap.models.targets import load_target

    return load_target(smoke_target[2], "float32", "cpu")[0]


def _final(model, entry: dict, path: Path):
    """A random drafter of ``entry`` on the smoke target (every weight perturbed, so a dropped
    or swapped tensor shows in the logits), saved as a final.pt; returns the drafter."""
    from floorgap.models.checkpoints import (
        FINAL_FORMAT,
        frozen_fingerprint,
        trainable_layout,
        trainable_state,
    )
    from floorgap.models.drafter_training import drafter_config
    from floorgap.models.drafters import build_drafter

    torch.manual_seed(5)
    drafter = build_drafter(drafter_config(entry, TAPS, GAMMA, model.config), model).eval()
    with torch.no_grad():
        for p in drafter.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"final_format": FINAL_FORMAT, "drafter_config": dataclasses.asdict(drafter.cfg),
                "model": trainable_state(drafter), "trainable_layout": trainable_layout(drafter),
                "frozen_fingerprint": frozen_fingerprint(drafter), "variant": entry}, path)
    return drafter


@pytest.fixture(scope="module")
def finals(model, smoke_target):
    """final.pt of a dflash, a dspark and a prefix-attention drafter (with short_conv and slot
    embeddings), and the drafters."""
    root = smoke_target[3] / "export-stage" / "drafters"
    return {name: (root / name / "final.pt", _final(model, VARIANTS[name],
                                                     root / name / "final.pt"))
            for name in ("dflash", "dspark", "ours")}


def _export(smoke_target, variant: str, fmt: str, drafter: Path, out: Path) -> int:
    from floorgap.stages import export as export_cli
    from floorgap.stages._cli import run_stage

    _, target, model_dir, _ = smoke_target
    spec = {"target": target, "variant": variant, "format": fmt}
    return run_stage(export_cli.main, export_cli.build_parser(), [
        "--spec", json.dumps(spec), "--model-dir", str(model_dir), "--drafter", str(drafter),
        "--out", str(out), "--threads", "1"])


def _batch(model):
    from floorgap.models.from_target import target_features

    g = torch.Generator().manual_seed(3)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab - 1, (2, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding, as the evaluation batches it
    feats = target_features(model, ids, mask, TAPS)
    committed = torch.randint(0, vocab - 1, (2,), generator=g)
    preds = torch.randint(0, vocab - 1, (2, GAMMA), generator=g)
    return feats, mask.bool(), committed, preds


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "fmt"), [
    ("dflash", "dflash"), ("dflash", "speculators"), ("dspark", "dspark"),
    ("dspark", "speculators"), ("ours", "floorgap"),
])
def test_export_reads_back_bitwise(smoke_target, model, finals, tmp_path, variant, fmt) -> None:
    from floorgap.models.engine_formats import import_drafter, read_engine_config

    final, drafter = finals[variant]
    out = tmp_path / "export" / variant / fmt
    assert _export(smoke_target, variant, fmt, final, out) == 0
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    assert read_engine_config(out)[0] == fmt
    config = json.loads((out / "config.json").read_text())
    target = model.config
    if fmt == "speculators":
        verifier = config["speculators_config"]["verifier"]
        assert verifier == {"name_or_path": smoke_target[1]["name"],
                            "architectures": [target.architectures[0]]}
        layer = config["transformer_layer_config"]
    else:
        # Qwen3DSparkModel (dspark) keeps the target's depth at the top, as DeepSpec writes it
        depth = (config["num_target_layers"] if fmt == "dspark"
                 else config["dflash_config"]["num_target_layers"])
        assert depth == target.num_hidden_layers
        layer = config
    assert layer["max_position_embeddings"] == target.max_position_embeddings
    assert layer["torch_dtype"] == "float32"
    back = import_drafter(out, model).eval()
    feats, mask, committed, preds = _batch(model)
    with torch.no_grad():
        assert torch.equal(back.propose(feats, committed, preds, mask),
                           drafter.propose(feats, committed, preds, mask))
    for name, value in drafter.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name


@pytest.mark.slow
def test_export_replaces_an_earlier_export(smoke_target, finals, tmp_path) -> None:
    out = tmp_path / "export"
    final = finals["dflash"][0]
    assert _export(smoke_target, "dflash", "dflash", final, out) == 0
    first = (out / "config.json").read_text()
    assert _export(smoke_target, "dflash", "dflash", final, out) == 0  # a rerun of the rule
    assert (out / "config.json").read_text() == first
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no leftovers


@pytest.mark.slow
@pytest.mark.parametrize(("variant", "fmt"), [
    ("ours", "dflash"),        # prefix attention and its extras: no engine runs them
    ("ours", "speculators"),
    ("dspark", "dflash"),      # a dflash folder holds a dflash drafter
    ("dflash", "safetensors"),  # no such format
])
def test_formats_that_cannot_hold_the_drafter_are_refused(smoke_target, finals, tmp_path,
                                                          variant, fmt) -> None:
    out = tmp_path / "export"
    assert _export(smoke_target, variant, fmt, finals[variant][0], out) == 2
    assert not out.exists()


@pytest.mark.slow  # the smoke target is materialised
def test_missing_drafter_is_refused(smoke_target, tmp_path) -> None:
    out = tmp_path / "export"
    assert _export(smoke_target, "dflash", "dflash", tmp_path / "final.pt", out) == 2
    assert not out.exists()


# ------------------------------------------------------------------------ the workflow


@pytest.mark.slow
def test_smoke_dry_run_lists_the_export_jobs(tmp_path) -> None:
    res = snakemake("-n", "--cores", "2", "--configfile", str(SMOKE_CONFIG), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    expected = resolve(smoke()).export_targets()
    assert dry_run_jobs(res.stdout)["export"] == len(expected) == 5
    for folder in expected:
        assert f"output: {folder}\n" in out, folder
