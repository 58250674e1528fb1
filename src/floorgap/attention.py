"""Which targets' attention the probes can compute with a shared prefix
(:mod:`floorgap.models.shared_prefix`), read from the target's model config: a transformers
config or the mapping of its ``config.json``. The memory plan (:mod:`floorgap.resources`) reads
the same answer to size the rollouts' caches.

A shared prefix needs full causal attention over every position with plain scaled dot-product
scores in every layer: sliding windows (Gemma-2/3/4, Mistral with a window, Qwen with
``use_sliding_window``), attention-logit soft-capping, layers of different shapes
(``per_layer_config``) and layers that share another layer's keys and values are refused with
the reason.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Decoder families whose attention modules call the configured attention function with
# (query, suffix keys, suffix values, scaling) and nothing else that changes the scores, and
# whose layer index is the cache's: checked against their modelling code.
SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})


def _field(cfg: Any, name: str, default: Any = None) -> Any:
    return cfg.get(name, default) if isinstance(cfg, Mapping) else getattr(cfg, name, default)


def _text(config: Any) -> Any:
    if isinstance(config, Mapping):
        return config.get("text_config") or config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def shared_prefix_support(config: Any) -> str | None:
    """None when a target of ``config`` decodes its paths with a shared prefix, else why not."""
    cfg = _text(config)
    kind = _field(cfg, "model_type")
    if kind not in SUPPORTED_MODEL_TYPES:
        return f"model type {kind!r} is not one of {sorted(SUPPORTED_MODEL_TYPES)}"
    layer_types = set(_field(cfg, "layer_types") or ())
    if layer_types - {"full_attention"}:
        return f"layer types {sorted(layer_types)} (only full attention shares a prefix)"
    # Qwen2/3 keep a window size with use_sliding_window off
    window = _field(cfg, "sliding_window")
    if window and _field(cfg, "use_sliding_window", not layer_types):
        return f"sliding window {window}"
    if _field(cfg, "is_heterogeneous") or (isinstance(cfg, Mapping)
                                           and cfg.get("per_layer_config")):
        return "layers of different shapes (per_layer_config)"
    for name in ("attn_logit_softcapping", "num_kv_shared_layers"):
        if _field(cfg, name):
            return f"{name} is set"
    return None
