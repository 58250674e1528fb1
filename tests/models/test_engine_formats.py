"""Engine checkpoint folders (DFlash, DSpark, speculators, floorgap): layouts written out from
the engines' conventions, bitwise round trips, strict loading, and the evaluation loader."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from floorgap.models.drafters import DrafterConfig, build_drafter
from floorgap.models.from_target import target_features
from floorgap.models.engine_formats import (
    export_drafter,
    import_drafter,
    read_engine_config,
    resolve_checkpoint,
)

transformers = pytest.importorskip("transformers")
from _tiny import tiny_llama  # noqa: E402
safetensors = pytest.importorskip("safetensors")
from safetensors import safe_open  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

V, H, G, T, B = 96, 64, 4, 6, 2
TAPS = [0, 1]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(V, H, 128)


def make(kind: str, target, **kw):
    """A drafter whose every weight is random (norms, Markov map and biases included), so that
    a swapped or dropped tensor changes the outputs."""
    base = {"kind": kind, "gamma": G, "hidden_size": H, "n_layers": 2, "n_heads": 4,
            "n_kv_heads": 2, "head_dim": 16, "intermediate_size": 96, "taps": TAPS,
            "mask_token_id": V - 1, "markov_rank": 8, "head_width": 16, "head_heads": 2,
            "head_mlp": 32, "nominate_k": 5}
    base.update(kw)
    torch.manual_seed(1)
    drafter = build_drafter(DrafterConfig(**base), target).eval()
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
        if drafter.kind == "dspark":
            torch.nn.init.normal_(drafter.markov_head.markov_w2.weight, std=0.5)
    return drafter


@pytest.fixture(scope="module")
def batch(target):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V - 1, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :2] = 0
    feats = target_features(target, ids, mask, TAPS)
    committed = torch.randint(0, V - 1, (B,), generator=g)
    preds = torch.randint(0, V - 1, (B, G), generator=g)
    return feats, mask.bool(), committed, preds


def assert_same_drafter(a, b, batch) -> None:
    feats, mask, committed, preds = batch
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name
    assert torch.equal(a.propose(feats, committed, preds, mask),
                       b.propose(feats, committed, preds, mask))
    da = a.draft(feats, committed, mask, 1.0, torch.Generator().manual_seed(7))
    db = b.draft(feats, committed, mask, 1.0, torch.Generator().manual_seed(7))
    assert torch.equal(da.tokens, db.tokens) and torch.equal(da.logits, db.logits)


ROUND_TRIPS = [
    ("dflash", "dflash", {}),
    ("dflash", "speculators", {}),
    ("dspark", "dspark", {}),
    ("dspark", "speculators", {}),
    ("prefix_attention", "floorgap", {"short_conv": True, "slot_embeddings": True}),
    ("dflash", "floorgap", {"short_conv": True, "slot_embeddings": True}),
    ("dspark", "floorgap", {"short_conv": True}),
]


@pytest.mark.parametrize("kind,fmt,extra", ROUND_TRIPS)
def test_round_trip_is_bitwise(target, batch, tmp_path, kind, fmt, extra):
    drafter = make(kind, target, **extra)
    folder = export_drafter(drafter, tmp_path / "ckpt", fmt)
    assert read_engine_config(folder)[0] == fmt
    back = import_drafter(folder, target)
    assert back.cfg.kind == kind and back.cfg.gamma == G and back.cfg.taps == TAPS
    assert_same_drafter(drafter, back.eval(), batch)


@pytest.mark.parametrize("kind,fmt", [("dflash", "dflash"), ("dflash", "speculators"),
                                      ("dspark", "dspark"), ("dspark", "speculators")])
def test_a_scaled_drafter_exports_as_the_same_function_with_the_scale_folded(target, batch,
                                                                            tmp_path, kind, fmt):
    """Engines feed the block rows unscaled: the layout holds the branch outputs divided by s
    and the norms' epsilon by s^2, which proposes what the scaled drafter does; the floorgap
    layout keeps the scale itself, bitwise."""
    feats, mask, committed, preds = batch
    s = 271.0
    drafter = make(kind, target, input_scale=s, mask_embedding=True)
    back = import_drafter(export_drafter(drafter, tmp_path / "ckpt", fmt), target).eval()
    assert back.cfg.input_scale == 1.0
    assert back.cfg.rms_eps == pytest.approx(drafter.cfg.rms_eps / s ** 2)
    want = drafter.propose(feats, committed, preds, mask)
    torch.testing.assert_close(back.propose(feats, committed, preds, mask), want,
                               rtol=1e-4, atol=1e-4)
    unfolded = make(kind, target, mask_embedding=True)     # the same weights, rows unscaled
    assert (unfolded.propose(feats, committed, preds, mask) - want).abs().max() > 0.1
    kept = import_drafter(export_drafter(drafter, tmp_path / "own", "floorgap"), target).eval()
    assert kept.cfg.input_scale == s
    assert_same_drafter(drafter, kept, batch)


# ------------------------------------------------------------------------------------ layouts
# Written out from the engines' conventions, not taken from the module under test.

QWEN3 = {"model_type": "qwen3", "hidden_size": H, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "intermediate_size": 96, "hidden_act": "silu", "rms_norm_eps": 1e-6,
         "rope_theta": 1_000_000.0, "max_position_embeddings": 2048, "vocab_size": V,
         "attention_bias": False, "tie_word_embeddings": False, "torch_dtype": "float32"}
MARKOV = {"markov_rank": 8, "markov_head_type": "vanilla", "enable_confidence_head": True,
          "confidence_head_with_markov": True}


def backbone_shapes() -> dict[str, list[int]]:
    shapes = {"fc.weight": [H, 2 * H], "hidden_norm.weight": [H], "norm.weight": [H]}
    for i in range(2):
        p = f"layers.{i}."
        shapes.update({
            p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
            p + "self_attn.q_proj.weight": [64, H], p + "self_attn.k_proj.weight": [32, H],
            p + "self_attn.v_proj.weight": [32, H], p + "self_attn.o_proj.weight": [H, 64],
            p + "self_attn.q_norm.weight": [16], p + "self_attn.k_norm.weight": [16],
            p + "mlp.gate_proj.weight": [96, H], p + "mlp.up_proj.weight": [96, H],
            p + "mlp.down_proj.weight": [H, 96]})
    return shapes


DSPARK_SHAPES = {"markov_head.markov_w1.weight": [V, 8], "markov_head.markov_w2.weight": [V, 8],
                 "confidence_head.proj.weight": [1, H + 8], "confidence_head.proj.bias": [1]}


def written(folder: Path) -> tuple[dict, dict[str, list[int]], set[str]]:
    config = json.loads((folder / "config.json").read_text())
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys()}
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}
    return config, shapes, dtypes


def dflash_config(block: int) -> dict:
    return {"block_size": block, "target_layer_ids": TAPS, "mask_token_id": V - 1,
            "num_target_layers": 2}


def test_dflash_layout(target, tmp_path):
    folder = export_drafter(make("dflash", target), tmp_path / "d", "dflash",
                            num_target_layers=2, max_position_embeddings=2048)
    config, shapes, dtypes = written(folder)
    # the layout declared (1+N: row 0 the anchor), so an engine or check need not assume it
    assert config == {"architectures": ["DFlashDraftModel"], **QWEN3, "block_size": G + 1,
                      "target_hidden_size": H, "dflash_config": dflash_config(G + 1),
                      "sample_from_anchor": False}
    assert shapes == backbone_shapes() and dtypes == {"F32"}
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]


def test_dspark_layout(target, tmp_path):
    folder = export_drafter(make("dspark", target), tmp_path / "d", "dspark",
                            num_target_layers=2, max_position_embeddings=2048)
    config, shapes, _ = written(folder)
    # DeepSpec's Qwen3DSparkModel keys (deepspec/modeling/dspark/qwen3/config.py), the
    # architecture vLLM's and SGLang's DSpark load for a Qwen3 target
    assert config == {"architectures": ["Qwen3DSparkModel"], **QWEN3, "block_size": G,
                      "layer_types": ["full_attention"] * 2, "num_target_layers": 2,
                      "target_layer_ids": TAPS, "mask_token_id": V - 1, **MARKOV}
    assert shapes == {**backbone_shapes(), **DSPARK_SHAPES}


def test_an_anchor_row_dflash_exports_as_a_markov_rank_0_dspark(target, batch, tmp_path):
    """DeepSpec's DFlash layout: a dflash drafter with anchor rows is a Qwen3DSparkModel with
    markov_rank 0 and no confidence head, and comes back bitwise; the DFlash layout refuses it."""
    drafter = make("dflash", target, anchor_rows=True)
    with pytest.raises(ValueError, match="anchor rows"):
        export_drafter(drafter, tmp_path / "x", "dflash")
    folder = export_drafter(drafter, tmp_path / "d", "dspark", num_target_layers=2)
    config, shapes, _ = written(folder)
    assert config["markov_rank"] == 0 and config["enable_confidence_head"] is False
    assert config["block_size"] == G and shapes == backbone_shapes()
    back = import_drafter(folder, target).eval()
    assert back.cfg.kind == "dflash" and back.cfg.sample_from_anchor and back.cfg.gamma == G
    assert_same_drafter(drafter, back, batch)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_speculators_layout(target, tmp_path, kind):
    folder = export_drafter(make(kind, target), tmp_path / "s", "speculators",
                            target_name="org/tiny-llama", target_architecture="LlamaForCausalLM",
                            max_position_embeddings=2048)
    config, shapes, _ = written(folder)
    expected = {
        "architectures": ["DFlashSpeculator" if kind == "dflash" else "DSparkSpeculator"],
        "speculators_model_type": kind, "transformer_layer_config": QWEN3,
        "draft_vocab_size": V, "block_size": G + 1 if kind == "dflash" else G,
        "target_hidden_size": H, "aux_hidden_state_layer_ids": [1, 2], "mask_token_id": V - 1,
        "sample_from_anchor": kind == "dspark", "torch_dtype": "float32",
        "speculators_config": {
            "algorithm": kind,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": G}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": "org/tiny-llama", "architectures": ["LlamaForCausalLM"]},
        },
    }
    if kind == "dspark":
        expected.update(MARKOV)
    assert config == expected
    assert shapes == backbone_shapes() | (DSPARK_SHAPES if kind == "dspark" else {})


def test_floorgap_layout(target, tmp_path):
    drafter = make("prefix_attention", target, short_conv=True, slot_embeddings=True)
    folder = export_drafter(drafter, tmp_path / "f", "floorgap")
    config, shapes, _ = written(folder)
    assert config["architectures"] == ["FloorgapPrefixAttentionDraftModel"]
    assert config["block_size"] == G and config["sample_from_anchor"] is True
    assert config["dflash_config"]["target_layer_ids"] == TAPS
    assert config["floorgap_config"] == json.loads(json.dumps(dataclasses.asdict(drafter.cfg)))
    assert "markov_rank" not in config
    extras = {"slot_emb": [G, H], "confidence_head.proj.weight": [1, H + 16],
              "confidence_head.proj.bias": [1], "head.out.weight": [V, 16],
              "head.w_in.weight": [16, 2 * H]}
    for i in range(2):
        for conv in ("conv_pre", "conv_post"):
            extras.update({f"layers.{i}.{conv}.gates.weight": [2 * H, H],
                           f"layers.{i}.{conv}.b0": [H], f"layers.{i}.{conv}.b1": [H]})
    assert extras.items() <= shapes.items()
    assert backbone_shapes().items() <= shapes.items()
    assert all(not k.startswith("backbone.") for k in shapes)


def test_bf16_export_records_its_dtype(target, tmp_path):
    drafter = make("dspark", target)
    folder = export_drafter(drafter, tmp_path / "b", "dspark", dtype=torch.bfloat16)
    config, _, dtypes = written(folder)
    assert config["torch_dtype"] == "bfloat16" and dtypes == {"BF16"}
    back = import_drafter(folder, target)
    assert back.backbone.fc.weight.dtype == torch.float32
    assert torch.equal(back.backbone.fc.weight, drafter.backbone.fc.weight.bfloat16().float())


# ------------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("kind,fmt,option", [
    ("dflash", "dflash", {"short_conv": True}),
    ("dspark", "dspark", {"slot_embeddings": True}),
    ("dflash", "speculators", {"short_conv": True}),
])
def test_engine_formats_refuse_extras(target, tmp_path, kind, fmt, option):
    with pytest.raises(ValueError, match=next(iter(option))):
        export_drafter(make(kind, target, **option), tmp_path / "x", fmt)
    assert not (tmp_path / "x").exists()


def test_engine_formats_refuse_other_kinds(target, tmp_path):
    with pytest.raises(ValueError, match="floorgap"):
        export_drafter(make("prefix_attention", target), tmp_path / "x", "dspark")
    with pytest.raises(ValueError, match="dspark"):
        export_drafter(make("dflash", target), tmp_path / "x", "dspark")


def rewrite(folder: Path, edit) -> None:
    tensors = load_file(str(folder / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(folder / "model.safetensors"))


@pytest.mark.parametrize("edit,name", [
    (lambda t: t.update({"layers.0.self_attn.extra.weight": torch.zeros(2)}),
     "layers.0.self_attn.extra.weight"),
    (lambda t: t.pop("layers.1.mlp.up_proj.weight"), "layers.1.mlp.up_proj.weight"),
    (lambda t: t.update({"fc.weight": torch.zeros(H, H)}), "fc.weight"),
    (lambda t: t.pop("markov_head.markov_w2.weight"), "markov_head.markov_w2.weight"),
])
def test_strict_loading_names_the_tensor(target, tmp_path, edit, name):
    folder = export_drafter(make("dspark", target), tmp_path / "d", "dspark")
    rewrite(folder, edit)
    with pytest.raises(ValueError, match=name.replace(".", r"\.")) as err:
        import_drafter(folder, target)
    assert str(folder) in str(err.value)


def test_shared_tables_prefixes_and_shards_load(target, batch, tmp_path):
    drafter = make("dspark", target)
    folder = export_drafter(drafter, tmp_path / "d", "dspark")
    tensors = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    renamed = {f"model.{k}": v for k, v in tensors.items()}
    renamed.update({"model.embed_tokens.weight": torch.zeros(V, H),
                    "lm_head.weight": torch.zeros(V, H),
                    "model.rotary_emb.inv_freq": torch.zeros(8)})
    names = sorted(renamed)
    half = {n: renamed[n] for n in names[::2]}, {n: renamed[n] for n in names[1::2]}
    weight_map = {}
    for i, part in enumerate(half):
        shard = f"model-0000{i + 1}-of-00002.safetensors"
        save_file(part, str(folder / shard))
        weight_map.update(dict.fromkeys(part, shard))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert_same_drafter(drafter, import_drafter(folder, target).eval(), batch)


def test_missing_confidence_bias_is_zero(target, tmp_path):
    folder = export_drafter(make("dspark", target), tmp_path / "d", "dspark")
    rewrite(folder, lambda t: t.pop("confidence_head.proj.bias"))
    back = import_drafter(folder, target)
    assert torch.equal(back.confidence_head.proj.bias, torch.zeros(1))


def edit_config(folder: Path, **changes) -> None:
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize("changes,message", [
    ({"markov_head_type": "gated"}, "markov_head_type"),
    ({"hidden_size": 2 * H}, "hidden_size"),
    ({"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4},
     "layer_types"),
    ({"target_layer_ids": [-1, 1]}, "embedding"),
    ({"architectures": ["Gemma4DSparkModel"]}, "gemma4_text"),
    ({"architectures": ["LlamaForCausalLM"]}, "unrecognised"),
])
def test_unsupported_configs_are_refused(target, tmp_path, changes, message):
    folder = export_drafter(make("dspark", target), tmp_path / "d", "dspark")
    edit_config(folder, **changes)
    with pytest.raises(ValueError, match=message):
        import_drafter(folder, target)


def test_format_must_match_when_given(target, tmp_path):
    folder = export_drafter(make("dflash", target), tmp_path / "d", "dflash")
    assert read_engine_config(folder, "dflash")[1]["gamma"] == G
    with pytest.raises(ValueError, match="dflash checkpoint, not dspark"):
        import_drafter(folder, target, fmt="dspark")


@pytest.mark.parametrize("kind,fmt", [("dflash", "dflash"), ("dspark", "speculators")])
def test_gamma_override_fits_the_stored_block(target, batch, tmp_path, kind, fmt):
    drafter = make(kind, target)
    folder = export_drafter(drafter, tmp_path / "d", fmt)
    short = import_drafter(folder, target, gamma=G - 2)
    assert short.gamma == G - 2
    feats, mask, committed, preds = batch
    # engines attend over the whole block, so the shorter block is a different proposal; it
    # must still be a valid one of the right shape from the same weights
    assert short.propose(feats, committed, preds, mask).shape == (B, G - 2, V)
    assert torch.equal(short.backbone.fc.weight, drafter.backbone.fc.weight)
    with pytest.raises(ValueError, match="block rows"):
        import_drafter(folder, target, gamma=G + 1)


def test_reexport_replaces_an_export_but_not_other_folders(target, tmp_path):
    folder = tmp_path / "d"
    export_drafter(make("dflash", target), folder, "dflash")
    export_drafter(make("dspark", target), folder, "dspark")
    assert read_engine_config(folder)[0] == "dspark"
    assert [p.name for p in tmp_path.iterdir()] == ["d"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match="not replacing"):
        export_drafter(make("dflash", target), other, "dflash")
    assert (other / "notes.txt").read_text() == "keep"


# ------------------------------------------------------------------------- config entries


def test_resolve_checkpoint_local_paths(target, tmp_path):
    folder = export_drafter(make("dflash", target), tmp_path / "d", "dflash")
    assert resolve_checkpoint({"format": "dflash", "path": str(folder)}) == folder
    with pytest.raises(FileNotFoundError, match="missing"):
        resolve_checkpoint({"format": "dflash", "path": str(tmp_path / "missing")})
    with pytest.raises(ValueError, match="format"):
        resolve_checkpoint({"format": "eagle", "path": str(folder)})
    with pytest.raises(ValueError, match="exactly one"):
        resolve_checkpoint({"format": "dflash", "path": str(folder), "hub": "a/b"})


def test_resolve_checkpoint_hub_is_mocked(monkeypatch, tmp_path):
    # The real hub cannot be reached from the tests: only the call and the error are checked.
    huggingface_hub = pytest.importorskip("huggingface_hub")
    calls = []

    def fake(**kw):
        calls.append(kw)
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    entry = {"format": "dspark", "hub": "org/drafter", "revision": "abc"}
    assert resolve_checkpoint(entry) == tmp_path
    assert calls == [{"repo_id": "org/drafter", "revision": "abc",
                      "allow_patterns": ["config.json", "*.safetensors*"]}]

    def offline(**kw):
        raise OSError("network unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ConnectionError, match="unreachable.*'path'"):
        resolve_checkpoint(entry)


# ----------------------------------------------------------------------- evaluation loader


def test_load_drafters_imports_folders(target, batch, tmp_path):
    from floorgap.errors import StageError
    from floorgap.probes.drafter_eval import load_drafters

    dspark, dflash = make("dspark", target), make("dflash", target)
    a = export_drafter(dspark, tmp_path / "a", "speculators")
    b = export_drafter(dflash, tmp_path / "b", "dflash")
    loaded = load_drafters([a, str(b)], target, G)
    assert [d.cfg.kind for d in loaded] == ["dspark", "dflash"]
    assert not any(p.requires_grad for d in loaded for p in d.parameters())
    assert_same_drafter(dspark, loaded[0], batch)
    assert_same_drafter(dflash, loaded[1], batch)
    assert load_drafters([b], target, G - 1)[0].gamma == G - 1   # a shorter block fits
    with pytest.raises(StageError, match="block rows"):
        load_drafters([b], target, G + 1)


# ------------------------------------------------------------ trimmed vocabulary, mask embedding
# The layout vLLM's DFlash model (qwen3_dflash.py) and EAGLE-3 load: draft_vocab_size at the top
# level, d2t int64 offsets (target id = draft index + d2t), lm_head.weight the head's rows;
# the mask embedding in mask_embedding.pt as {"embedding", "mask_token_id"}.

DRAFT_VOCAB = sorted({0, 3, 4, 10, 17, 31, 40, 41, 42, 63, 77, 90, V - 1})


@pytest.mark.parametrize("kind,fmt", [("dflash", "dflash"), ("dspark", "dspark"),
                                      ("dflash", "speculators"),
                                      ("prefix_attention", "floorgap")])
def test_trimmed_vocabulary_and_mask_embedding_round_trip_bitwise(target, batch, tmp_path,
                                                                  kind, fmt):
    drafter = make(kind, target, draft_vocab=DRAFT_VOCAB, mask_embedding=True)
    folder = export_drafter(drafter, tmp_path / "ckpt", fmt)
    config = json.loads((folder / "config.json").read_text())
    assert config["draft_vocab_size"] == len(DRAFT_VOCAB)
    tensors = load_file(str(folder / "model.safetensors"))
    d2t = tensors["d2t"]
    assert d2t.dtype == torch.int64
    assert (torch.arange(len(DRAFT_VOCAB)) + d2t).tolist() == DRAFT_VOCAB
    head = target.get_output_embeddings().weight
    assert torch.equal(tensors["lm_head.weight"], head[DRAFT_VOCAB])
    assert not any("mask" in k for k in tensors)          # vLLM reads it from its own file
    mask = torch.load(folder / "mask_embedding.pt", weights_only=True)
    assert mask["mask_token_id"] == V - 1
    assert torch.equal(mask["embedding"], drafter.mask_embed.detach())
    back = import_drafter(folder, target).eval()
    assert back.cfg.draft_vocab == DRAFT_VOCAB and back.cfg.mask_embedding
    assert torch.equal(back.mask_embed, drafter.mask_embed)
    assert_same_drafter(drafter, back, batch)


def test_trimmed_proposals_vanish_outside_the_draft_vocabulary(target, batch):
    feats, mask, committed, preds = batch
    outside = sorted(set(range(V)) - set(DRAFT_VOCAB))
    for kind in ("dflash", "dspark", "prefix_attention"):
        drafter = make(kind, target, draft_vocab=DRAFT_VOCAB)
        q = torch.softmax(drafter.propose(feats, committed, preds, mask), -1)
        assert torch.all(q[..., outside] == 0), kind
        assert torch.allclose(q.sum(-1), torch.ones(q.shape[:-1]))
        d = drafter.draft(feats, committed, mask, 1.0, torch.Generator().manual_seed(5))
        assert set(d.tokens.reshape(-1).tolist()) <= set(DRAFT_VOCAB), kind


def test_a_trimmed_folder_with_its_own_head_or_no_d2t_is_refused(target, tmp_path):
    folder = export_drafter(make("dflash", target, draft_vocab=DRAFT_VOCAB), tmp_path / "d",
                            "dflash")
    tensors = load_file(str(folder / "model.safetensors"))
    save_file({**tensors, "lm_head.weight": tensors["lm_head.weight"] + 1},
              str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="draft head of its own"):
        import_drafter(folder, target)
    save_file({k: v for k, v in tensors.items() if k != "d2t"}, str(folder / "model.safetensors"))
    with pytest.raises(ValueError, match="d2t"):
        import_drafter(folder, target)


def test_a_mask_embedding_for_another_token_is_refused(target, tmp_path):
    folder = export_drafter(make("dflash", target, mask_embedding=True), tmp_path / "d",
                            "dflash")
    mask = torch.load(folder / "mask_embedding.pt", weights_only=True)
    torch.save({**mask, "mask_token_id": 5}, folder / "mask_embedding.pt")
    with pytest.raises(ValueError, match="mask token"):
        import_drafter(folder, target)


def test_each_injected_fault_changes_what_the_folder_says_or_holds(target, tmp_path):
    """The export faults of floorgap.models.export_faults on an exported DFlash folder (with a
    trained mask embedding): each changes its config or weights as named; unknown names and a
    folder without a layout to flip are refused."""
    import json
    import shutil

    from safetensors.torch import load_file

    from floorgap.models.export_faults import FAULTS, inject_fault

    drafter = make("dflash", target, mask_embedding=True)
    base = export_drafter(drafter, tmp_path / "base", "dflash")
    config = json.loads((base / "config.json").read_text())
    fc = load_file(str(base / "model.safetensors"))["fc.weight"]
    for fault in FAULTS:
        folder = Path(shutil.copytree(base, tmp_path / fault))
        inject_fault(folder, fault)
        now = json.loads((folder / "config.json").read_text())
        moved = {k for k in set(config) | set(now) if config.get(k) != now.get(k)}
        if fault == "layout-flipped":
            assert moved == {"sample_from_anchor"} and now["sample_from_anchor"] is True
        elif fault == "taps-offset":
            assert moved == {"dflash_config"}
            assert now["dflash_config"]["target_layer_ids"] == [t + 1 for t in TAPS]
        elif fault == "fc-permuted":
            half = fc.shape[1] // 2
            swapped = load_file(str(folder / "model.safetensors"))["fc.weight"]
            assert torch.equal(swapped, torch.cat([fc[:, half:], fc[:, :half]], dim=1))
        else:
            assert not moved and not (folder / "mask_embedding.pt").exists()
    with pytest.raises(ValueError, match="unknown fault"):
        inject_fault(base, "nope")
    del config["sample_from_anchor"]
    (base / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="declares no layout"):
        inject_fault(base, "layout-flipped")
