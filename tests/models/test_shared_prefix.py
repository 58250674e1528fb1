"""Shared-prefix decoding against full forwards of the same model, on every supported family,
and the refusals read from the config."""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import (AutoModelForCausalLM, Gemma2Config, Gemma3TextConfig, LlamaConfig,
                          MistralConfig, Qwen3Config)

from floorgap.attention import shared_prefix_support
from floorgap.models.shared_prefix import (SharedPrefixCache, copied_prefix, decode_forward,
                                           path_cache, sibling_logits)

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2)


def _model(config):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


SUPPORTED = {
    "llama": lambda: LlamaConfig(**SMALL),
    "qwen3": lambda: Qwen3Config(**SMALL, head_dim=8),
    "mistral": lambda: MistralConfig(**SMALL, sliding_window=None),
}


@pytest.fixture(scope="module", params=sorted(SUPPORTED))
def model(request):
    return _model(SUPPORTED[request.param]())


CTX = torch.tensor([[5, 17, 3, 44, 9, 81, 2, 60, 33, 7, 12]])


def _full(model, rows: torch.Tensor) -> torch.Tensor:
    """Logits of context + rows, recomputed from scratch for every row: [B, L, V]."""
    with torch.inference_mode():
        ids = torch.cat([CTX.expand(rows.shape[0], -1), rows], dim=1)
        return model(input_ids=ids).logits[:, CTX.shape[1]:]


def _prefill(model):
    return model(input_ids=CTX, use_cache=True, logits_to_keep=1).cache


@torch.inference_mode()
def test_paths_after_a_shared_prefix_equal_full_forwards(model) -> None:
    gen = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 97, (5, 4), generator=gen)
    prefill = _prefill(model)
    keys_before = [layer.keys.clone() for layer in prefill.layers]
    cache = path_cache(model, prefill, 5)
    assert isinstance(cache, SharedPrefixCache)
    # one token, then three at once: positions and the causal suffix mask both exercised
    got = torch.cat([decode_forward(model, rows[:, :1], cache),
                     decode_forward(model, rows[:, 1:], cache)], dim=1)
    assert cache.get_seq_length() == CTX.shape[1] + 4
    torch.testing.assert_close(got, _full(model, rows), rtol=0, atol=2e-5)
    # the prefill's cache is shared, never written: the next chunk starts from it unchanged
    for layer, before in zip(prefill.layers, keys_before):
        assert torch.equal(layer.keys, before)
    assert model.config._attn_implementation != "floorgap_shared_prefix"


@torch.inference_mode()
def test_siblings_read_alone_in_one_forward_and_leave_the_cache(model) -> None:
    gen = torch.Generator().manual_seed(2)
    rows = torch.randint(0, 97, (3, 2), generator=gen)
    siblings = torch.randint(0, 97, (3, 4), generator=gen)
    for share in (True, False):
        with contextlib.nullcontext() if share else copied_prefix():
            cache = path_cache(model, _prefill(model), 3)
            assert isinstance(cache, SharedPrefixCache) == share
            decode_forward(model, rows, cache)
            got = sibling_logits(model, siblings, cache)
            assert cache.get_seq_length() == CTX.shape[1] + 2
            nxt = decode_forward(model, siblings[:, :1], cache)[:, -1]
        for j in range(4):
            want = _full(model, torch.cat([rows, siblings[:, j:j + 1]], 1))[:, -1]
            torch.testing.assert_close(got[:, j], want, rtol=0, atol=2e-5)
        # after the siblings the cache decodes on as if they had never been read
        torch.testing.assert_close(nxt, _full(model, torch.cat([rows, siblings[:, :1]], 1))[:, -1],
                                   rtol=0, atol=2e-5)


@torch.inference_mode()
def test_rollouts_with_a_shared_prefix_equal_the_copied_prefix(model) -> None:
    """The rollout probe's paths, probabilities and revealed reads, shared against copied."""
    from floorgap.probes.rollouts import sample_block
    from floorgap.sampling import SamplingLaw

    def run():
        return sample_block(model, CTX[0].tolist(), n_paths=6, gamma=4, law=SamplingLaw(),
                            anchor_seed=3, forward_batch=4, reveal_paths=3)

    shared = run()
    with copied_prefix():
        copied = run()
    assert torch.equal(shared.tokens, copied.tokens)
    torch.testing.assert_close(shared.probs, copied.probs, rtol=0, atol=1e-6)
    torch.testing.assert_close(shared.revealed[1:], copied.revealed[1:], rtol=0, atol=1e-6)


@pytest.mark.parametrize("config,reason", [
    (lambda: Gemma3TextConfig(**SMALL, layer_types=["sliding_attention", "full_attention"],
                              sliding_window=8), "model type"),
    (lambda: Gemma2Config(**SMALL), "model type"),
    (lambda: MistralConfig(**SMALL, sliding_window=16), "sliding window 16"),
    (lambda: Qwen3Config(**SMALL, use_sliding_window=True, sliding_window=16,
                         max_window_layers=1), "layer types"),
])
def test_models_that_cannot_share_say_why_and_keep_the_copy(config, reason) -> None:
    cfg = config()
    why = shared_prefix_support(cfg)
    assert why is not None and reason in why
    model = _model(cfg)
    with torch.inference_mode():
        cache = path_cache(model, _prefill(model), 2)
    assert not isinstance(cache, SharedPrefixCache)


def test_qwen3_without_its_window_shares() -> None:
    assert shared_prefix_support(Qwen3Config(**SMALL, sliding_window=4096)) is None


def test_config_files_read_as_their_configs() -> None:
    """The memory plan reads config.json mappings: the same answer as the config objects."""
    import json
    from pathlib import Path

    from floorgap.models.model_cards import published_config

    here = Path(__file__).parent / "target_configs"
    assert shared_prefix_support(json.loads((here / "smollm2-135m/config.json").read_text())) \
        is None
    assert "model type" in shared_prefix_support(
        json.loads((here / "gemma3-270m/config.json").read_text()))
    qwen = published_config("Qwen/Qwen3-4B")
    assert shared_prefix_support(qwen) is None
    assert shared_prefix_support(qwen.to_dict()) is None
    assert "sliding window" in shared_prefix_support({**qwen.to_dict(), "use_sliding_window": True,
                                                      "sliding_window": 64})
    assert "sliding window" in shared_prefix_support({"model_type": "mistral",
                                                      "sliding_window": 4096})
