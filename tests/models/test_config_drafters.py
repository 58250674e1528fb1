"""Every trained drafter of every shipped config builds on its target's real model config and
runs one forward and backward, without training: the default's targets (their configs as
transformers reads them from the shipped GGUFs, kept in ``target_configs/`` and checked against
the GGUFs by a slow test), the smoke config's random targets, and the paper targets (their
published configs, ``floorgap.models.model_cards``) at their real widths on fake tensors, which
carry shapes and no memory. And the layer-shape rule itself on tiny Gemma-3 and Gemma-4 configs:
sliding and full layers of one shape train a drafter; layers of different shapes are refused.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from conftest import DEFAULT_CONFIG, REPO, SHIPPED_CONFIGS

transformers = pytest.importorskip("transformers")

from floorgap.errors import StageError  # noqa: E402
from floorgap.models.drafter_training import drafter_config, layer_shapes  # noqa: E402
from floorgap.models.drafters import TopKTargets, build_drafter  # noqa: E402
from floorgap.models.from_target import init_from_target, init_fusion_from_target  # noqa: E402
from floorgap.models.targets import text_config  # noqa: E402

TARGET_CONFIGS = Path(__file__).resolve().parent / "target_configs"
CONFIGS = [DEFAULT_CONFIG, *SHIPPED_CONFIGS]


@functools.cache
def spec_of(path: Path) -> Any:
    from snakemake.utils import validate

    from floorgap.config import resolve

    cfg = yaml.safe_load(path.read_text())
    validate(cfg, schema=str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    return resolve(cfg)


@functools.cache
def _vocab_of_tokenizer(source_json: str) -> int:
    import json

    from floorgap.models.targets import load_tokenizer_source

    return len(load_tokenizer_source(json.loads(source_json))[0])


def target_model_config(name: str, source: dict[str, Any]) -> Any:
    """The real model config of a config's target, without its weights."""
    import json

    from floorgap.models.model_cards import published_config
    from floorgap.models.targets import random_config

    kind = source["kind"]
    if kind == "gguf_package":
        return transformers.AutoConfig.from_pretrained(TARGET_CONFIGS / name)
    if kind == "hub":
        return published_config(source["id"])
    assert kind == "random", kind
    return random_config(source, _vocab_of_tokenizer(json.dumps(source["tokenizer"],
                                                                sort_keys=True)))


def trained_drafters(configs: list[Path], *marks: Any) -> list[Any]:
    """Every trained drafter of ``configs``, once per distinct (target source, drafter entry,
    taps, gamma): the paper configs repeat one another's drafters."""
    import json

    cases, seen = [], set()
    for path in configs:
        spec = spec_of(path)
        for target in spec.targets:
            for name in spec.target_drafters(target):
                if name in spec.lookups or spec.is_imported(name, target):
                    continue
                entry = {k: v for k, v in spec.variant_entry(name, target).items()
                         if k not in ("name", "epochs", "seed_key", "blocks")}
                key = json.dumps([spec.config["targets"][target]["source"], entry,
                                  spec.taps(target), spec.settings(target)["anchors"]["gamma"]],
                                 sort_keys=True)
                if key not in seen:
                    seen.add(key)
                    cases.append(pytest.param(path, target, name, marks=marks,
                                              id=f"{path.stem}-{target}-{name}"))
    return cases


@functools.cache
def _fake_mode() -> Any:
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


@functools.cache
def _target(path: Path, target: str, real: bool) -> Any:
    """A target model of the real config: on fake tensors (shapes, no memory), or real random
    weights on the CPU."""
    spec = spec_of(path)
    mcfg = target_model_config(target, spec.config["targets"][target]["source"])
    torch.manual_seed(0)
    with _fake_mode() if not real else nullcontext():
        return transformers.AutoModelForCausalLM.from_config(mcfg).eval().requires_grad_(False)


def one_step(path: Path, target: str, name: str, real: bool) -> None:
    """Build drafter ``name`` of ``target`` in config ``path`` on the target's model config and
    run one forward and backward: the training objective on real tensors; on fake tensors,
    which hold no values for the objective's logged parts, the sum of every output (it reaches
    every trainable weight just the same)."""
    spec = spec_of(path)
    cfg = spec.settings(target)
    entry = spec.variant_entry(name, target)
    model = _target(path, target, real)
    tcfg = text_config(model.config)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    draft_vocab = None
    if entry.get("vocab") is not None:
        draft_vocab = list(range(0, vocab, max(1, vocab // int(entry["vocab"]))))[
            : int(entry["vocab"])]
    gamma, taps = int(cfg["anchors"]["gamma"]), spec.taps(target)
    dcfg = drafter_config(entry, taps, gamma, tcfg, draft_vocab=draft_vocab)
    b, t, g = 2, 12, gamma
    with _fake_mode() if not real else nullcontext():
        torch.manual_seed(1)
        drafter = build_drafter(dcfg, model)
        if entry.get("init", "random") in ("target", "target_scaled"):
            init_from_target(drafter, model)
        if entry.get("init") == "target_scaled":       # the taps hold the stream it starts from
            init_fusion_from_target(drafter, model)
        feats = torch.randn(b, t, len(taps) * int(tcfg.hidden_size))
        committed = torch.randint(0, vocab - 1, (b,))
        block = torch.randint(0, vocab - 1, (b, g))
        mask = torch.ones(b, t, dtype=torch.bool)
        mask[1, :3] = False                                    # a right-aligned shorter prefix
        out = drafter(feats, committed, block, prefix_mask=mask)
        assert out.logits.shape[:2] == (b, g)
        if real:
            k = 16                      # the target's top-K, as the training record stores it
            vals, ids = torch.softmax(3 * torch.randn(b, g, vocab), -1).topk(k)
            loss, _ = drafter.loss(out, TopKTargets(ids=ids, vals=vals), block)
            assert torch.isfinite(loss)
        else:
            loss = sum(x.float().sum() for x in (out.logits, out.confidence,
                                                 out.nomination_logits) if x is not None)
        loss.backward()
    trainable = [n for n, p in drafter.named_parameters() if p.requires_grad]
    missing = [n for n, p in drafter.named_parameters() if p.requires_grad and p.grad is None]
    assert trainable and not missing, f"no gradient reached {missing}"


# the shared head's cast cache keys on the weight's data pointer, which a fake tensor lacks
@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
@pytest.mark.parametrize(("path", "target", "name"), trained_drafters(CONFIGS))
def test_every_trained_drafter_builds_on_its_target(path, target, name):
    one_step(path, target, name, real=False)


@pytest.mark.parametrize(("path", "target", "name"),
                         trained_drafters([DEFAULT_CONFIG], pytest.mark.slow))
def test_every_default_drafter_takes_a_real_training_step(path, target, name):
    """The default's drafters on real CPU tensors of their targets' shapes (random weights):
    the objective itself, finite, and its gradient in every trainable weight."""
    one_step(path, target, name, real=True)


def test_the_default_targets_mix_sliding_and_full_layers():
    """The case the default DAG met: Gemma-3-270M's 18 layers are sliding and full, one shape."""
    cfg = transformers.AutoConfig.from_pretrained(TARGET_CONFIGS / "gemma3-270m")
    assert set(cfg.layer_types) == {"sliding_attention", "full_attention"}
    assert list(layer_shapes(cfg)) == [(4, 1, 256, 2048)]
    default = yaml.safe_load(DEFAULT_CONFIG.read_text())
    assert "gemma3-270m" in default["targets"]


# ---------------------------------------------------------------- the layer-shape rule


def tiny_gemma3() -> Any:
    return transformers.Gemma3TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32,
        layer_types=["sliding_attention", "sliding_attention", "sliding_attention",
                     "full_attention"], sliding_window=8)


def test_a_gemma3_like_target_trains_a_drafter_on_its_full_layers_shape():
    tc = tiny_gemma3()
    cfg = drafter_config({"kind": "dspark", "layers": 2, "markov_rank": 4}, [1, 3], 5, tc)
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.intermediate_size) == (2, 1, 32, 96)
    assert cfg.rope_theta == 1_000_000.0          # the full layers' base, not the sliding 10k
    torch.manual_seed(0)
    target = transformers.Gemma3ForCausalLM(tc).eval().requires_grad_(False)
    drafter = build_drafter(cfg, target)
    from floorgap.models.from_target import target_features

    ids = torch.randint(0, 127, (2, 12))          # longer than the window
    feats = target_features(target, ids, torch.ones_like(ids), cfg.taps)
    block = torch.randint(0, 127, (2, 5))
    out = drafter(feats, ids[:, -1], block)
    loss, _ = drafter.loss(out, torch.softmax(torch.randn(2, 5, 128), -1), block)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in drafter.parameters() if p.requires_grad)
    # its layers are not Qwen3 layers: starting from them is refused by name
    with pytest.raises(ValueError, match="pre_feedforward_layernorm"):
        init_from_target(drafter, target)


def test_a_gemma4_like_target_is_refused_naming_the_fields_that_differ():
    if not hasattr(transformers, "Gemma4TextConfig"):
        pytest.skip("this transformers has no Gemma-4")
    tc = transformers.Gemma4TextConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        layer_types=["sliding_attention"] * 3 + ["full_attention"])
    assert len(layer_shapes(tc)) == 2
    with pytest.raises(StageError, match="head_dim differ") as err:
        drafter_config({"kind": "dflash", "layers": 1}, [1, 3], 7, tc)
    assert "layer_types" in str(err.value) and "checkpoint" in str(err.value)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_the_kept_default_target_configs_are_what_the_ggufs_give(name):
    """target_configs/ holds what transformers reads from the default targets' shipped GGUFs
    (reading them takes seconds, the Gemma one over ten)."""
    from floorgap.models.targets import package_gguf

    source = yaml.safe_load(DEFAULT_CONFIG.read_text())["targets"][name]["source"]
    path, _ = package_gguf(source)
    read = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    kept = transformers.AutoConfig.from_pretrained(TARGET_CONFIGS / name)
    drop = {"transformers_version", "_name_or_path", "_model_name_or_path"}
    assert ({k: v for k, v in kept.to_dict().items() if k not in drop}
            == {k: v for k, v in read.to_dict().items() if k not in drop})
