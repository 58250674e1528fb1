"""What a drafter takes from its frozen target: the tap features through which it sees the
committed prefix X (tap t is the output of decoder layer t), and the starts of ``init: target``
and ``init: target_scaled``, whose layers, final norm, fusion and input scale come from the
target's last layers and the residual stream entering them."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from floorgap.models.drafters import Drafter


def _decoder(target_model: nn.Module) -> nn.Module:
    """The decoder stack of a causal LM (the model itself when it is one)."""
    return target_model.get_decoder() if hasattr(target_model, "get_decoder") else target_model


@torch.no_grad()
def init_from_target(drafter: Drafter, target_model: nn.Module) -> list[int]:
    """Start the drafter's decoder layers as copies of the target's last ``n_layers`` decoder
    layers (attention projections, MLP, both layer norms) and its final ``norm`` as the
    target's final norm; ``q_norm``/``k_norm`` (absent from Llama layers) stay at ones and the
    fusion ``fc`` stays random. The drafter's layer shapes must be the target's. Returns the
    target layers copied."""
    decoder = _decoder(target_model)
    layers = list(decoder.layers)
    n = drafter.cfg.n_layers
    if n > len(layers):
        raise ValueError(f"the drafter has {n} layers, the target only {len(layers)}")
    picked = list(range(len(layers) - n, len(layers)))
    # a layer with norms around its MLP as well (Gemma's sandwich norms, whose scale is 1 + w)
    # computes something else from the same weights: copying them would not start from it
    extra = [name for name in ("pre_feedforward_layernorm", "post_feedforward_layernorm")
             if hasattr(layers[picked[0]], name)]
    if extra:
        raise ValueError(f"the target's decoder layers have {extra}, which the drafter's "
                         "Qwen3-style layers lack; set init: random for this target")
    names = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
             "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
             "post_attention_layernorm")
    for mine, i in zip(drafter.backbone.layers, picked):
        src = layers[i]
        for name in names:
            a, b = mine.get_submodule(name).weight, src.get_submodule(name).weight
            if a.shape != b.shape:
                raise ValueError(f"{name}: drafter shape {tuple(a.shape)} != target layer {i}'s "
                                 f"{tuple(b.shape)}; keep the target's heads and widths")
            a.copy_(b.detach().to(a.dtype))
    norm = drafter.backbone.norm.weight
    norm.copy_(decoder.norm.weight.detach().to(norm.dtype))
    return picked


@torch.no_grad()
def init_fusion_from_target(drafter: Drafter, target_model: nn.Module) -> int:
    """Start the fusion (``fc``, ``hidden_norm``) so that the copied layers
    (:func:`init_from_target`) read the context as the target's first copied layer does: ``fc``
    passes one tap through and drops the others, ``hidden_norm`` is that layer's input norm.
    The tap is the stream entering that layer (tap L - n_layers - 1, the output of the layer
    below), so the first layer's context keys and values start as the target's own. Returns
    that tap."""
    layers = list(_decoder(target_model).layers)
    first = len(layers) - drafter.cfg.n_layers
    taps, width = list(drafter.cfg.taps), drafter.cfg.target_hidden
    if first - 1 not in taps:
        raise ValueError(f"no tap {first - 1} (the output of the layer below the first copied "
                         f"layer {first}) among the taps {taps}; add it or set init: target")
    fc = drafter.backbone.fc.weight                                   # [D, n_taps * H]
    if fc.shape[0] != width:
        raise ValueError(f"the drafter's width {fc.shape[0]} is not the target's {width}")
    at = taps.index(first - 1) * width
    fc.zero_()
    fc[:, at:at + width].copy_(torch.eye(width, dtype=fc.dtype))
    norm = drafter.backbone.hidden_norm.weight
    norm.copy_(layers[first].input_layernorm.weight.detach().to(norm.dtype))
    return first - 1


@torch.no_grad()
def residual_scale(target_model: nn.Module, sequences: Sequence[Tensor], n_layers: int) -> float:
    """The input scale that puts a drafter whose ``n_layers`` layers are copies of the target's
    last ones (:func:`init_from_target`) in the target's regime there: the mean norm of the
    target's residual stream entering its layer ``L - n_layers`` over the mean norm of its token
    embeddings, on the positions of ``sequences`` (token ids [T] each). On SmolLM2 the stream
    entering layer 28 has norm ~630 and the embeddings ~3.2, so copied layers fed the block
    rows' embeddings as they are see a residual 200x smaller than they were trained on."""
    decoder = _decoder(target_model)
    depth = len(decoder.layers) - n_layers
    if depth < 0:
        raise ValueError(f"the drafter has {n_layers} layers, the target only "
                         f"{len(decoder.layers)}")
    device = next(target_model.parameters()).device
    inner = embeds = 0.0
    for ids in sequences:
        out = decoder(input_ids=ids[None].to(device), output_hidden_states=True, use_cache=False)
        inner += float(out.hidden_states[depth].float().norm(dim=-1).mean())
        embeds += float(out.hidden_states[0].float().norm(dim=-1).mean())
    if not sequences or embeds <= 0:
        raise ValueError("no sequence to measure the residual scale on")
    return inner / embeds


def concat_taps(hidden_states: Sequence[Tensor], taps: Sequence[int]) -> Tensor:
    """The hidden states at ``taps`` concatenated on the last dimension: tap t is the output of
    decoder layer t (0-based), ``hidden_states[t + 1]`` of a forward with
    ``output_hidden_states=True``."""
    return torch.cat([hidden_states[t + 1] for t in taps], dim=-1)


@torch.no_grad()
def target_features(target_model: nn.Module, input_ids: Tensor, attention_mask: Tensor,
                    taps: list[int]) -> Tensor:
    """Concatenated hidden states at ``taps`` -> [B, T, n_taps * H].

    Tap t is the output of decoder layer t (0-based), i.e. ``hidden_states[t + 1]`` of one
    forward of the decoder with ``output_hidden_states=True`` (the output head is not run).
    In transformers the last entry is after the final norm. Positions follow the attention
    mask, so left-padded (right-aligned) prefixes get the same positions as unpadded ones.
    """
    decoder = _decoder(target_model)
    pos = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=pos,
                  output_hidden_states=True, use_cache=False)
    return concat_taps(out.hidden_states, taps)


@torch.no_grad()
def target_features_and_logits(target_model: nn.Module, input_ids: Tensor, taps: list[int],
                               logits_to_keep: int) -> tuple[Tensor, Tensor]:
    """One forward of an unpadded batch ``input_ids`` [B, T] for a drafter's inputs and the
    target's own laws (training data, replay): the features at ``taps`` for every position
    [B, T, n_taps * H] (as :func:`target_features` reads them) and the logits of the last
    ``logits_to_keep`` positions [B, logits_to_keep, V]. The output head, the costly part of a
    long prompt's forward, runs only on the positions kept (all of them on a model that would
    otherwise skip layers at the other positions)."""
    keep = int(logits_to_keep)
    out = target_model(input_ids=input_ids, output_hidden_states=True, use_cache=False,
                       logits_to_keep=keep)
    hs, logits = out.hidden_states, out.logits
    if any(hs[t + 1].shape[1] != input_ids.shape[1] for t in taps):
        # a model whose later layers run only at the kept positions (Gemma 4's KV-shared
        # layers) has no features there: run every position through every layer
        out = target_model(input_ids=input_ids, output_hidden_states=True, use_cache=False)
        hs, logits = out.hidden_states, out.logits[:, -keep:]
    return concat_taps(hs, taps), logits
