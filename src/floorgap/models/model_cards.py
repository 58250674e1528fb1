"""The published model configs of the paper's hub targets, for what needs their shapes without
the hub: checking that every drafter of a paper config builds at the real widths (on fake
tensors, no memory), and benchmarks of the probes at the real shapes on random weights.

Values are the ``config.json`` fields of each model's Hugging Face release (Qwen/Qwen3-4B,
Qwen/Qwen3-8B, Qwen/Qwen3-14B; the Qwen3 technical report's Table 1 gives the same layer counts,
heads and tying). Only the fields that fix tensor shapes and positions are listed; the rest are
transformers' Qwen3 defaults, which the releases share (no attention bias, SiLU MLP).
"""

from __future__ import annotations

from typing import Any

_QWEN3_COMMON: dict[str, Any] = {
    "model_type": "qwen3", "vocab_size": 151936, "head_dim": 128, "num_key_value_heads": 8,
    "max_position_embeddings": 40960, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
    "bos_token_id": 151643, "eos_token_id": 151645,
}

PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen/Qwen3-4B": {**_QWEN3_COMMON, "hidden_size": 2560, "intermediate_size": 9728,
                      "num_hidden_layers": 36, "num_attention_heads": 32,
                      "tie_word_embeddings": True},
    "Qwen/Qwen3-8B": {**_QWEN3_COMMON, "hidden_size": 4096, "intermediate_size": 12288,
                      "num_hidden_layers": 36, "num_attention_heads": 32,
                      "tie_word_embeddings": False},
    "Qwen/Qwen3-14B": {**_QWEN3_COMMON, "hidden_size": 5120, "intermediate_size": 17408,
                       "num_hidden_layers": 40, "num_attention_heads": 40,
                       "tie_word_embeddings": False},
}


def published_config(hub_id: str) -> Any:
    """The transformers config of hub model ``hub_id`` from :data:`PUBLISHED_CONFIGS`."""
    from transformers import AutoConfig

    if hub_id not in PUBLISHED_CONFIGS:
        raise KeyError(f"no published config of {hub_id!r} here; known: "
                       f"{sorted(PUBLISHED_CONFIGS)}")
    fields = dict(PUBLISHED_CONFIGS[hub_id])
    return AutoConfig.for_model(fields.pop("model_type"), **fields)
