"""The resource plan (floorgap.resources, `floorgap plan`): parameter count and KV cache against
a real model, the issue's 14B arithmetic, and the command on a shipped config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from floorgap.resources import (GIB, ModelShape, host_mem_mb, largest_forward_batch, plan,
                                probe_jobs, read_model_config)

from conftest import REPO, SMOKE_CONFIG, load_config

transformers = pytest.importorskip("transformers")

QWEN3_14B = {"hidden_size": 5120, "num_hidden_layers": 40, "num_attention_heads": 40,
             "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 17408,
             "vocab_size": 151936, "tie_word_embeddings": False}


def test_parameters_and_kv_cache_match_a_real_model():
    cfg = transformers.Qwen3Config(vocab_size=300, hidden_size=64, intermediate_size=96,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, head_dim=16, tie_word_embeddings=False)
    model = transformers.Qwen3ForCausalLM(cfg).eval()
    shape = ModelShape.from_config(cfg.to_dict())
    assert shape.parameters == sum(p.numel() for p in model.parameters())
    with torch.no_grad():
        cache = model(input_ids=torch.zeros(5, 11, dtype=torch.long), use_cache=True).cache
    stored = sum(t.numel() * t.element_size() for layer in cache.layers
                 for t in (layer.keys, layer.values))
    assert shape.kv_bytes(11, 5, 4) == stored


def _paper_14b():
    cfg = yaml.safe_load((REPO / "workflow" / "configs" / "qwen3-14b.yaml").read_text())
    cfg["corpus"]["max_prompt_tokens"], cfg["corpus"]["max_new_tokens"] = 6583, 2048
    return cfg


def test_the_14b_rollouts_on_copied_prefixes_do_not_fit_an_80_gb_card():
    """The paper config's 14B rollouts at forward_batch 32 and an 8,638-token context, the
    context's cache copied per row (a model without a shared prefix): weights ~27.5 GiB + KV
    ~42.2 GiB + the revealed tensor ~8.1 GiB, over 80 GiB."""
    shape = ModelShape.from_config(QWEN3_14B)   # no model_type: no shared prefix
    assert not shape.shared_prefix
    cfg = _paper_14b()
    cfg["rollouts"]["forward_batch"] = 32
    weights = shape.parameters * 2
    parts = probe_jobs(cfg, "qwen3-14b", shape, weights)["rollouts"]
    assert parts["weights"] / GIB == pytest.approx(27.5, abs=0.3)
    assert parts["kv_cache"] / GIB == pytest.approx(42.2, abs=0.1)
    assert parts["revealed"] / GIB == pytest.approx(8.1, abs=0.05)
    (job,) = [j for j in plan(cfg, "qwen3-14b", shape, None, {"rollouts": {"gpu": "1",
                                                                            "mem_mb": "12000"}})]
    assert job.problems(80) and "GPU memory" in job.problems(80)[0]
    fb = largest_forward_batch(cfg, "qwen3-14b", shape, weights, 80)
    assert 0 < fb < 32


def test_with_a_shared_prefix_every_path_fits_one_forward():
    """Qwen3 holds the context once: the KV is the context's (~1.3 GiB) plus the paths' own
    gamma + J tokens per row, and the attention scores of a forward's J queries over the
    context (256 rows x 40 heads x 8 x 8,646 x 10 bytes, ~6.6 GiB) are counted instead; all
    256 paths then fit one forward on an 80 GB card."""
    shape = ModelShape.from_config({**QWEN3_14B, "model_type": "qwen3"})
    assert shape.shared_prefix
    cfg = _paper_14b()
    cfg["rollouts"]["forward_batch"] = 256
    weights = shape.parameters * 2
    parts = probe_jobs(cfg, "qwen3-14b", shape, weights)["rollouts"]
    assert parts["kv_cache"] == shape.kv_bytes(8631, 1, 2) + shape.kv_bytes(7 + 8, 256, 2)
    assert parts["attention_scores"] == 256 * 40 * 8 * (8631 + 15) * 10
    assert sum(parts.values()) / GIB < 60
    assert largest_forward_batch(cfg, "qwen3-14b", shape, weights, 80) == 256


@pytest.mark.parametrize("name", ["qwen3-4b", "qwen3-8b", "qwen3-14b", "paper-cross-target"])
def test_paper_configs_decode_with_the_largest_forward_batch_that_fits(name):
    """Each Qwen3 target's rollouts.forward_batch is the plan's largest on its published config
    and the config's GPU (cluster.gpu_memory_gb), the longest context of its corpus."""
    from snakemake.utils import validate

    from floorgap.config import resolve
    from floorgap.models.model_cards import PUBLISHED_CONFIGS
    from floorgap.resources import DTYPE_BYTES

    cfg = yaml.safe_load((REPO / "workflow" / "configs" / f"{name}.yaml").read_text())
    validate(cfg, schema=str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    spec = resolve(cfg)
    checked = 0
    for target in spec.targets:
        hub = cfg["targets"][target]["source"].get("id")
        if hub not in PUBLISHED_CONFIGS:
            continue
        settings = spec.settings(target)
        shape = ModelShape.from_config(PUBLISHED_CONFIGS[hub])
        weights = shape.parameters * DTYPE_BYTES[settings["targets"][target]["dtype"]]
        best = largest_forward_batch(settings, target, shape, weights,
                                     float(cfg["cluster"]["gpu_memory_gb"]))
        assert settings["rollouts"]["forward_batch"] == best, (target, best)
        checked += 1
    assert checked >= 1


def test_floorgap_plan_on_the_smoke_config(smoke_target, tmp_path):
    _, _, model_dir, _ = smoke_target
    target = next(iter(load_config(SMOKE_CONFIG)["targets"]))
    cmd = [sys.executable, "-m", "floorgap", "plan", "--configfile", str(SMOKE_CONFIG),
           "--model-config", f"{target}={Path(model_dir) / 'config.json'}"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    rows = [line.split()[:2] for line in res.stdout.splitlines()[1:] if line.startswith(
        ("rollouts", "corpus", "mi", "drafter_data"))]
    assert ["rollouts", target] in rows and ["corpus", target] in rows
    # a host-memory request too small for a CPU job is named
    small = load_config(SMOKE_CONFIG)
    small["rollouts"]["paths"] = 4096
    shape = read_model_config(Path(model_dir) / "config.json")
    (job,) = plan(small, target, shape, Path(model_dir), {"rollouts": {"mem_mb": "2000"}})
    assert job.problems(80) and "host memory" in job.problems(80)[0], job.problems(80)


def test_probe_jobs_ask_for_the_host_memory_their_model_needs(smoke_target, tmp_path):
    """mem_mb of a probe rule is sized from the materialised model (a rule's ceiling before it
    exists), so what it asks covers the plan's host estimate with a margin."""
    _, _, model_dir, _ = smoke_target
    cfg = load_config(SMOKE_CONFIG)
    target = next(iter(cfg["targets"]))
    assert host_mem_mb(cfg, target, "rollouts", tmp_path / "absent", 12000) == 12000
    shape = read_model_config(Path(model_dir) / "config.json")
    for paths in (8, 4096):
        cfg["rollouts"]["paths"] = paths
        asked = host_mem_mb(cfg, target, "rollouts", model_dir, 12000)
        (job,) = plan(cfg, target, shape, Path(model_dir), {"rollouts": {"mem_mb": str(asked)}})
        assert asked % 500 == 0 and not job.problems(80), (asked, job.problems(80))
        assert asked * 2 ** 20 < 2 * job.host_bytes
