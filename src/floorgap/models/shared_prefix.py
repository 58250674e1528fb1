"""Shared-prefix decoding: many paths after one prefilled context, the context's KV held once.

The probes decode M paths after one context X (rollouts, MI, floor variants, the drafter
evaluation's target reads). A plain cache copies X's keys and values into every row
(``batch_repeat_interleave``), so memory grows as rows x |X| and every decode step re-copies
the whole cache (``DynamicLayer.update`` concatenates). Here each layer keeps X's keys and
values once, batch 1 (:class:`SharedPrefixLayer`), and only the rows' own suffix tokens per
row. Attention (:func:`shared_prefix_attention`, registered with transformers'
``AttentionInterface`` and switched on only around the decode forwards by
:func:`decode_forward`) scores each row's queries against the shared prefix by broadcasting and
against the row's suffix, and normalises the two parts together: one softmax over
[prefix; suffix] scores is the exact log-sum-exp merge of the two partial attentions.

The suffix mask is causal (:func:`decode_forward`). :func:`sibling_logits` reads several
alternative next tokens at one position in one forward (the revealed predecessors z*_j of the
importance route, paper App. C.2): every new token sees the prefix, the suffix cached before the
forward and itself, never its siblings, all take the same position, and they are cropped again.

Which models take it is read from the model's config
(:func:`floorgap.attention.shared_prefix_support`); the others keep the copied cache.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer

from floorgap.attention import shared_prefix_support

ATTENTION_NAME = "floorgap_shared_prefix"


class SharedPrefixLayer(DynamicLayer):
    """One layer's cache: the prefix's keys/values once (``[1, H, P, D]``) and the rows' suffix
    (``[B, H, S, D]``, grown by :meth:`update`, cropped by :meth:`crop`). Its length is P + S,
    so the model gives new tokens their true positions."""

    def __init__(self, prefix_keys: torch.Tensor, prefix_values: torch.Tensor) -> None:
        super().__init__()
        if prefix_keys.shape[0] != 1:
            raise ValueError("the shared prefix must be one sequence (batch 1)")
        self.prefix_keys = prefix_keys
        self.prefix_values = prefix_values

    def get_seq_length(self) -> int:
        return int(self.prefix_keys.shape[-2]) + super().get_seq_length()

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise TypeError("a shared prefix is never copied per row")


class SharedPrefixCache(Cache):
    """The cache of a batch of paths after one prefilled context: one :class:`SharedPrefixLayer`
    per decoder layer, built from the prefill's cache (which stays untouched and reusable)."""

    def __init__(self, prefix_cache: Any) -> None:
        layers = []
        for layer in prefix_cache.layers:
            if not isinstance(layer, DynamicLayer) or getattr(layer, "is_sliding", False):
                raise TypeError(f"cannot share a prefix held in {type(layer).__name__}")
            layers.append(SharedPrefixLayer(layer.keys, layer.values))
        super().__init__(layers=layers)


def shared_prefix_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, attention_mask: torch.Tensor | None,
                            scaling: float, dropout: float = 0.0, **kwargs: Any
                            ) -> tuple[torch.Tensor, None]:
    """Attention of rows' queries ``[B, Hq, L, D]`` over the shared prefix and their suffix
    (``key``/``value`` ``[B, Hkv, S, D]``, the new tokens last): returns ``[B, L, Hq, D]``.

    The keyword ``shared_prefix`` (the :class:`SharedPrefixCache`) gives the prefix;
    ``shared_prefix_tree`` selects the siblings' mask (:func:`sibling_logits`)."""
    cache = kwargs.get("shared_prefix")
    if cache is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention runs only inside decode_forward")
    if kwargs.get("sliding_window"):
        raise RuntimeError("shared-prefix attention got a sliding window; see "
                           "shared_prefix_support")
    layer = cache.layers[module.layer_idx]
    pk, pv = layer.prefix_keys[0], layer.prefix_values[0]        # [Hkv, P, D]
    b, hq, n_new, d = query.shape
    hkv, s = key.shape[1], key.shape[2]
    q = query.reshape(b, hkv, hq // hkv, n_new, d)
    # prefix scores by broadcasting the one prefix over the rows; the suffix per row
    scores_p = torch.einsum("bhgld,hpd->bhglp", q, pk) * scaling
    scores_s = torch.einsum("bhgld,bhsd->bhgls", q, key) * scaling
    pos = torch.arange(s, device=query.device)
    first_new = s - n_new
    new = torch.arange(n_new, device=query.device).unsqueeze(-1)     # [L, 1]
    if kwargs.get("shared_prefix_tree"):
        visible = (pos < first_new) | (pos == first_new + new)
    else:
        visible = pos <= first_new + new
    scores_s = scores_s.masked_fill(~visible, float("-inf"))
    weights = torch.softmax(torch.cat([scores_p, scores_s], dim=-1), dim=-1,
                            dtype=torch.float32).to(query.dtype)
    p_len = pk.shape[-2]
    out = (torch.einsum("bhglp,hpd->bhgld", weights[..., :p_len], pv)
           + torch.einsum("bhgls,bhsd->bhgld", weights[..., p_len:], value))
    return out.reshape(b, hq, n_new, d).transpose(1, 2).contiguous(), None


AttentionInterface.register(ATTENTION_NAME, shared_prefix_attention)


@contextlib.contextmanager
def attention_implementation(model: Any, name: str) -> Iterator[None]:
    """Every config of ``model`` set to attention ``name`` for the duration (then restored)."""
    configs = {id(m.config): m.config for m in model.modules()
               if hasattr(getattr(m, "config", None), "_attn_implementation")}
    before = {k: c._attn_implementation for k, c in configs.items()}
    try:
        for c in configs.values():
            c._attn_implementation = name
        yield
    finally:
        for k, c in configs.items():
            c._attn_implementation = before[k]


_COPY_ONLY = False


@contextlib.contextmanager
def copied_prefix() -> Iterator[None]:
    """Within it every :func:`path_cache` copies the prefix per row, as for a model that cannot
    share it: the baseline of ``floorgap bench rollouts`` and of the equivalence tests."""
    global _COPY_ONLY
    before, _COPY_ONLY = _COPY_ONLY, True
    try:
        yield
    finally:
        _COPY_ONLY = before


def path_cache(model: Any, prefix_cache: Any, rows: int) -> Any:
    """The cache for ``rows`` paths after a prefilled context: shared-prefix where the model
    takes it (:func:`shared_prefix_support`), else a copy of the context's cache per row that
    can be cropped back.

    A sliding-window layer (Gemma-4, Mistral) keeps only its last window - 1 positions, so once
    the window is full, dropping a token again (``crop``) needs the states it would have
    discarded: the copy records them until each crop (``activate_past_recording``; caches
    without such layers have nothing to record).
    """
    if not _COPY_ONLY and shared_prefix_support(model.config) is None:
        return SharedPrefixCache(prefix_cache)
    cache = copy.deepcopy(prefix_cache)
    cache.batch_repeat_interleave(rows)
    if hasattr(cache, "activate_past_recording"):
        cache.activate_past_recording()
    return cache


def decode_forward(model: Any, input_ids: torch.Tensor, cache: Any, *,
                   logits_to_keep: int = 0) -> torch.Tensor:
    """Logits ``[B, L', V]`` of ``input_ids`` ``[B, L]`` appended to ``cache`` (a
    :func:`path_cache`), which keeps them."""
    if isinstance(cache, SharedPrefixCache):
        with attention_implementation(model, ATTENTION_NAME):
            return model(input_ids=input_ids, cache=cache, use_cache=True,
                         logits_to_keep=logits_to_keep, shared_prefix=cache).logits
    return model(input_ids=input_ids, cache=cache, use_cache=True,
                 logits_to_keep=logits_to_keep).logits


def sibling_logits(model: Any, siblings: torch.Tensor, cache: Any) -> torch.Tensor:
    """Logits ``[B, J, V]`` of J alternative next tokens ``siblings`` ``[B, J]``, each read
    at the next position after ``cache`` as if it alone came next; ``cache`` is left as it
    was. A shared-prefix cache reads the J in one forward (module docstring), a copied cache
    in J forwards."""
    n = siblings.shape[1]
    if isinstance(cache, SharedPrefixCache):
        position = torch.full_like(siblings, cache.get_seq_length())
        with attention_implementation(model, ATTENTION_NAME):
            logits = model(input_ids=siblings, cache=cache, use_cache=True,
                           position_ids=position, shared_prefix=cache,
                           shared_prefix_tree=True).logits
        cache.crop(-n)
        return logits
    out = []
    for j in range(n):
        out.append(model(input_ids=siblings[:, j:j + 1], cache=cache,
                         use_cache=True).logits[:, -1:, :])
        cache.crop(-1)
    return torch.cat(out, dim=1)
