"""`floorgap bench rollouts`: the forwards and prefix copies it counts, exactly, at the paper's
settings (M 256, gamma 7, J 8) on a small model of the paper targets' family."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from floorgap.models.shared_prefix import copied_prefix
from floorgap.probes.rollouts import sample_block
from floorgap.sampling import SamplingLaw
from floorgap.bench.rollouts import ForwardCounter
from floorgap.stages.bench import build_parser


@pytest.fixture(scope="module")
def qwen3_small():
    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return AutoModelForCausalLM.from_config(cfg).eval()


def _count(model, forward_batch):
    with ForwardCounter(model) as counter:
        sample_block(model, list(range(1, 20)), n_paths=256, gamma=7, law=SamplingLaw(),
                     anchor_seed=1, forward_batch=forward_batch, reveal_paths=8)
    return counter.forwards, counter.prefix_copies


def test_paper_settings_take_13_forwards_and_one_prefix(qwen3_small) -> None:
    # prefill, then per slot 1..6 one decode forward and one forward of the 8 reveals
    assert _count(qwen3_small, 256) == (1 + 6 * 2, 1)


@pytest.mark.slow   # 433 forwards
def test_todays_probe_took_433_forwards_and_256_prefix_copies(qwen3_small) -> None:
    # forward_batch 32: 8 chunks x 6 slots x (1 decode + 8 reveal forwards), plus the prefill
    with copied_prefix():
        assert _count(qwen3_small, 32) == (1 + 8 * 6 * 9, 256)


def test_the_counter_leaves_the_probe_as_it_was(qwen3_small) -> None:
    import floorgap.probes.rollouts as rollouts

    before = rollouts.path_cache
    _count(qwen3_small, 256)
    assert rollouts.path_cache is before and not qwen3_small._forward_pre_hooks


def test_shape_options_parse() -> None:
    args = build_parser().parse_args(["rollouts", "--shape", "qwen3-14b", "--layers", "2",
                                      "--context", "4096", "--reveal-paths", "8"])
    assert (args.shape, args.layers, args.context, args.reveal_paths) == ("qwen3-14b", 2, 4096, 8)
