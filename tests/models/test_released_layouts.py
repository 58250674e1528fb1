"""The released drafters' own layouts (stand-ins from floorgap.models.released_layouts, written
from DeepSpec's, z-lab's and speculators' sources): `floorgap inspect` reads each, the import
loads each strictly with the row convention its project uses, and what it cannot run is
refused by field name."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from floorgap.models.from_target import target_features
from floorgap.models.engine_formats import describe_folder, import_drafter, read_weights
from floorgap.models.released_layouts import (deepspec_folder, gemma4_dspark_config,
                                              speculators_folder, zlab_dflash_folder)

transformers = pytest.importorskip("transformers")
from _tiny import tiny_llama  # noqa: E402

V, H = 96, 64
TAPS = [0, 1]
MASK = V - 2


@pytest.fixture(scope="module")
def target():
    return tiny_llama(V, H, 128)


def _proposals(drafter, target):
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V, (2, 6), generator=g)
    mask = torch.ones(2, 6, dtype=torch.long)
    feats = target_features(target, ids, mask, TAPS)
    committed = torch.randint(0, V, (2,), generator=g)
    preds = torch.randint(0, V, (2, drafter.cfg.gamma), generator=g)
    return drafter.propose(feats, committed, preds, mask.bool())


def _weights_match(drafter, folder) -> None:
    files = read_weights(folder)
    state = drafter.state_dict()
    for name in ("fc.weight", "layers.1.self_attn.k_norm.weight", "norm.weight"):
        assert torch.equal(state[f"backbone.{name}"], files[name]), name


@pytest.mark.parametrize("rank,kind", [(0, "dflash"), (8, "dspark")])
def test_deepspec_releases_import_with_anchor_rows(target, tmp_path, rank, kind):
    folder = deepspec_folder(tmp_path / "d", target, TAPS, block_size=7, markov_rank=rank,
                             mask_token_id=MASK)
    facts = describe_folder(folder)
    assert (facts["layout"], facts["architecture"], facts["kind"]) == \
        ("dspark", "Qwen3DSparkModel", kind)
    assert (facts["gamma"], facts["block_rows"], facts["row_convention"]) == (7, 7, "anchor")
    assert facts["target_hidden_size"] == H and facts["mask_token_id"] == MASK
    drafter = import_drafter(folder, target).eval()
    assert drafter.cfg.kind == kind and drafter.cfg.sample_from_anchor
    assert drafter.cfg.gamma == 7 and drafter.cfg.taps == TAPS
    _weights_match(drafter, folder)
    if rank:
        assert torch.equal(drafter.markov_head.markov_w2.weight,
                           read_weights(folder)["markov_head.markov_w2.weight"])
    assert _proposals(drafter, target).shape == (2, 7, V)


def test_zlab_dflash_imports_without_target_hidden_size(target, tmp_path):
    folder = zlab_dflash_folder(tmp_path / "z", target, TAPS, block_size=16, mask_token_id=MASK)
    facts = describe_folder(folder)
    assert (facts["kind"], facts["gamma"], facts["row_convention"]) == ("dflash", 15, "dflash")
    assert facts["target_hidden_size"] == H
    drafter = import_drafter(folder, target, gamma=7).eval()  # the paper reads b16 at gamma 7
    assert drafter.cfg.gamma == 7 and not drafter.cfg.sample_from_anchor
    _weights_match(drafter, folder)
    assert _proposals(drafter, target).shape == (2, 7, V)


def test_inspect_names_the_declared_layout_and_the_one_each_engine_runs(target, tmp_path):
    """z-lab's folder declares no layout (read as 1+N by convention); the same folder declaring
    anchor-first (floorgap's key, or SGLang's proposed one) is read so, and both engines' DFlash
    would run it 1+N: a mismatch named before anything is served. Two keys that disagree are
    refused by name."""
    folder = zlab_dflash_folder(tmp_path / "z", target, TAPS, block_size=8, mask_token_id=MASK)
    facts = describe_folder(folder)
    assert (facts["block_layout"], facts["layout_field"]) == ("1+N", None)
    assert facts["engine_layouts"] == {"vllm": "1+N", "sglang": "1+N"}
    assert facts["layout_mismatch"] == []
    config = json.loads((folder / "config.json").read_text())
    for key, where in (("sample_from_anchor", config),
                       ("query_zero_predicts_next", config["dflash_config"])):
        where[key] = True
        (folder / "config.json").write_text(json.dumps(config))
        facts = describe_folder(folder)
        assert facts["block_layout"] == "anchor-first" and facts["gamma"] == 8
        assert facts["layout_mismatch"] == ["sglang", "vllm"]
        where.pop(key)
    config["sample_from_anchor"] = False
    config["dflash_config"]["query_zero_predicts_next"] = True
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="two block layouts: sample_from_anchor"):
        describe_folder(folder)


@pytest.mark.parametrize("anchor,gamma", [(True, 7), (False, 6)])
def test_speculators_dspark_follows_its_sample_from_anchor(target, tmp_path, anchor, gamma):
    folder = speculators_folder(tmp_path / "s", target, TAPS, kind="dspark", block_size=7,
                                mask_token_id=MASK, sample_from_anchor=anchor)
    facts = describe_folder(folder)
    assert facts["taps"] == TAPS and facts["gamma"] == gamma  # aux ids are taps + 1
    drafter = import_drafter(folder, target).eval()
    assert drafter.cfg.sample_from_anchor is anchor and drafter.cfg.kind == "dspark"
    # the layer config was a diff: what it left out is Qwen3's default
    assert drafter.cfg.rms_eps == transformers.Qwen3Config().rms_norm_eps
    _weights_match(drafter, folder)


def test_speculators_dflash_imports(target, tmp_path):
    folder = speculators_folder(tmp_path / "s", target, TAPS, kind="dflash", block_size=8,
                                mask_token_id=MASK)
    drafter = import_drafter(folder, target).eval()
    assert (drafter.cfg.kind, drafter.cfg.gamma, drafter.cfg.sample_from_anchor) == \
        ("dflash", 7, False)


@pytest.mark.parametrize("build,field", [
    # RedHatAI's DSpark: five sliding-window layers (window 2048), causal inside the block
    (lambda d, t: speculators_folder(d, t, TAPS, kind="dspark", block_size=7,
                                     mask_token_id=MASK, sliding=True,
                                     sample_from_anchor=True), "layer_types"),
    # a speculators DSpark exported before sample_from_anchor existed: either convention
    (lambda d, t: speculators_folder(d, t, TAPS, kind="dspark", block_size=7,
                                     mask_token_id=MASK), "sample_from_anchor"),
    (lambda d, t: zlab_dflash_folder(d, t, TAPS, block_size=16, mask_token_id=MASK,
                                     layer_types=["sliding_attention", "full_attention"]),
     "layer_types"),
    (lambda d, t: deepspec_folder(d, t, [-1, 1], block_size=7, markov_rank=8,
                                  mask_token_id=MASK), "embedding"),
    (lambda d, t: gemma4_dspark_config(d), "Gemma4DSparkModel"),
])
def test_what_no_import_runs_is_refused_by_field(target, tmp_path, build, field):
    folder = build(tmp_path / "f", target)
    with pytest.raises(ValueError, match=field):
        describe_folder(folder)


def test_floorgap_inspect_prints_json_or_the_refusal(target, tmp_path):
    good = deepspec_folder(tmp_path / "d", target, TAPS, block_size=7, markov_rank=0,
                           mask_token_id=MASK)
    bad = speculators_folder(tmp_path / "s", target, TAPS, kind="dspark", block_size=7,
                             mask_token_id=MASK, sliding=True, sample_from_anchor=True)
    run = [sys.executable, "-m", "floorgap", "inspect"]
    ok = subprocess.run([*run, str(good)], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    facts = json.loads(ok.stdout)
    assert facts["kind"] == "dflash" and facts["rows"].startswith("row k proposes slot k")
    assert facts["attention"] == ["full_attention"] * 2
    refused = subprocess.run([*run, str(bad)], capture_output=True, text=True)
    assert refused.returncode == 1 and "layer_types" in json.loads(refused.stdout)["refused"]


def test_deepspec_dflash_is_configured_served_and_exported_as_dspark() -> None:
    """A DeepSpec DFlash release (kind dflash, format dspark) is exported in its own layout
    and served by the engines' DSpark method (vLLM has no DFlash reading of anchor rows)."""
    from floorgap.config import variant_kind
    from floorgap.probes.serving import EngineSpec, engine_command

    entry = {"kind": "dflash", "checkpoint": {"format": "dspark",
                                              "hub": "deepseek-ai/dflash_qwen3_4b_block7"}}
    assert variant_kind(entry) == "dflash"
    spec = EngineSpec(engine="vllm", python="/py", target_dir="/t", dtype="bfloat16",
                      device="cuda", gamma=7, kind="dflash", drafter_dir="/d", layout="dspark")
    cmd, _ = engine_command(spec)
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["method"] == "dspark"
    sg = EngineSpec(engine="sglang", python="/py", target_dir="/t", dtype="bfloat16",
                    device="cuda", gamma=7, kind="dflash", drafter_dir="/d", layout="dspark")
    cmd, _ = engine_command(sg)
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "DSPARK"
