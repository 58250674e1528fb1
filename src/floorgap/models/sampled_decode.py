"""Sampled decoding that reads the target's own law at every step: one pass gives the responses,
the top-K targets of every response position and the tap features of every token.

A response token is drawn from the logits of the decode step that predicts it; those logits are
the target's next-token distribution at that position (the same a teacher-forced forward over
``prompt + response`` reads, to float rounding), so the training targets come from the same
forward and no second pass over the text is needed. The tap features of a token are the hidden
states of the forward that consumes it (the prefill for the prompt, the next decode step for a
response token), so a row stays one step after its last token when features are read.

Rows from which nothing more is read leave the batch (their key/value cache rows are dropped)
once they are a quarter of it, so a batch of unequal responses costs about what its rows need,
not its longest row times the batch, without copying the cache for every row that ends. Each
row draws its tokens from its own generator (``generator_for(seed)``), one uniform per token,
so a response depends on its seed, not on the rows beside it (the batch changes it only through
float rounding). Full-attention caches are prefilled in groups and kept in buffers sized for
the whole decode (:func:`_prefill`), and a step's attention reads each group of rows' keys from
its first prompt position on, not the batch's padded width (:func:`row_groups`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from floorgap.models.from_target import concat_taps
from floorgap.models.shared_prefix import attention_implementation
from floorgap.sampling import SamplingLaw, keyed_draws, law_topk
from floorgap.seeds import generator_for


@dataclass
class DecodedRow:
    """One prompt's response and what the target said along it.

    ``token_ids`` the response (its end-of-sequence token included), ``censored`` whether
    ``max_new_tokens`` cut it; ``target_ids`` int32 / ``target_vals`` float32 [n, K]: the top-K
    of the target law's distribution predicting response token j (row j); ``features`` the tap
    features of every token of ``prompt + response`` [len, n_taps * H], or None."""

    token_ids: list[int]
    censored: bool
    target_ids: torch.Tensor
    target_vals: torch.Tensor
    features: torch.Tensor | None = None


def left_padded(prompts: Sequence[Sequence[int]], pad_id: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention mask, position ids) [B, width] of left-padded prompts."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), int(pad_id), dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        mask[i, width - len(p):] = 1
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


class _PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer with its keys and values in buffers sized for the whole
    decode: a step writes one position instead of concatenating (and so copying) the cache,
    which at 128 rows of 800 tokens cost more than the step's matmuls. ``keys``/``values``
    are views of the filled positions; the interface is what the attention and
    :meth:`transformers.DynamicCache.batch_select_indices` call."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, room: int) -> None:
        self.is_initialized = True
        b, h, n, d = keys.shape
        self._k = keys.new_zeros((b, h, n + room, d))
        self._v = values.new_zeros((b, h, n + room, d))
        self._k[:, :, :n], self._v[:, :, :n] = keys, values
        self._n = n
        self.device = keys.device

    @property
    def keys(self) -> torch.Tensor:
        return self._k[:, :, :self._n]

    @property
    def values(self) -> torch.Tensor:
        return self._v[:, :, :self._n]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        m = key_states.shape[-2]
        if self._n + m > self._k.shape[-2]:
            raise RuntimeError("decode ran past the room its cache was sized for")
        self._k[:, :, self._n:self._n + m] = key_states
        self._v[:, :, self._n:self._n + m] = value_states
        self._n += m
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._n

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._k, self._v = self._k[indices], self._v[indices]


#: Prompts prefilled together when the cache can be joined afterwards: each group pads only to
#: its own longest prompt, so one long prompt no longer pads every row of a wide batch (with
#: 128 rows and one 448-token prompt the padded prefill cost ~4x the prompts' own tokens).
PREFILL_ROWS = 16


def _joinable(cache: Any) -> bool:
    """Whether a cache's layers are plain full-attention layers, whose key/value rows can be
    left-padded and stacked across prefill groups (a sliding window's cut cache cannot)."""
    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _prefill(model: Any, prompts: Sequence[Sequence[int]], order: Sequence[int], pad_id: int,
             read_features: bool, taps: Sequence[int] | None, features_dtype: torch.dtype,
             prefill_rows: int, room: int
             ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Prefill the prompts in ``order`` (shortest first): the cache, the batch's attention mask
    and position ids [B, width] (left-padded to the longest prompt), the last logits [B, V]
    and, with features, each row's prompt features. Full-attention caches are prefilled in
    groups of ``prefill_rows`` and joined, which equals one padded prefill up to rounding (a
    padded key is masked out either way), into layers with ``room`` more positions
    (:class:`_PreallocatedLayer`)."""
    device = next(model.parameters()).device
    chosen = [prompts[i] for i in order]
    _, mask, pos = left_padded(chosen, pad_id)
    width = mask.shape[1]
    cache = DynamicCache(config=model.config)
    joinable = _joinable(cache)
    group = prefill_rows if joinable else len(chosen)
    parts, logits, feats = [], [], []
    for a in range(0, len(chosen), group):
        ids, gmask, gpos = left_padded(chosen[a:a + group], pad_id)
        part = DynamicCache(config=model.config) if joinable else cache
        # the head on the last position, named by index: the model's own ``logits_to_keep=1``
        # slices a strided [B, 1, H] view, which CPU bf16 matmul multiplies by a copy of the
        # head per row (16 rows: 0.85 s a call against 2 ms for the gathered rows, SmolLM2)
        out = model(input_ids=ids.to(device), attention_mask=gmask.to(device),
                    position_ids=gpos.to(device), cache=part, use_cache=True,
                    output_hidden_states=read_features,
                    logits_to_keep=torch.tensor([ids.shape[1] - 1], device=device))
        logits.append(out.logits[:, -1])
        parts.append((part, width - ids.shape[1]))
        if read_features:
            f = concat_taps(out.hidden_states, taps).to("cpu", features_dtype)
            feats += [f[b, ids.shape[1] - len(p):] for b, p in enumerate(chosen[a:a + group])]
    if joinable:
        # the groups' caches left-padded to one width, in a buffer with room for every step
        for index, pieces in enumerate(zip(*(p.layers for p, _ in parts))):
            pads = [pad for _, pad in parts]
            cache.layers[index] = _PreallocatedLayer(
                *(torch.cat([torch.nn.functional.pad(getattr(x, kind), (0, 0, pad, 0))
                             for x, pad in zip(pieces, pads)]) for kind in ("keys", "values")),
                room=room)
    return cache, mask.to(device), pos.to(device), torch.cat(logits), feats


#: What a further attention call costs, in key positions of one row read: a group of rows is
#: split off when it saves more reads than this (SmolLM2 bf16 on 2 cores, one batch of 128
#: prompts: 480, 494 and 465 tokens/s with 256, 1024 and 8192).
ROW_GROUP_OVERHEAD = 1024


def row_groups(starts: Sequence[int], overhead: int | None = None
               ) -> list[tuple[int, int, int]]:
    """Contiguous row ranges ``(a, b, first)`` of a left-padded batch and the first key column
    ``first`` they must read: the split with the fewest key positions read plus ``overhead`` a
    group (an exact dynamic programme over the rows in batch order). ``starts[i]`` is row i's
    first unpadded column; every row reads on to the same last column, so a group reads
    ``(b - a) * (last - first)`` positions, and splits differ only in the padding they read.
    ``overhead`` defaults to :data:`ROW_GROUP_OVERHEAD`."""
    overhead = ROW_GROUP_OVERHEAD if overhead is None else overhead
    n = len(starts)
    top = max(starts, default=0)
    best = [0] + [None] * n
    cut = [0] * (n + 1)
    for b in range(1, n + 1):
        first = top
        for a in range(b - 1, -1, -1):
            first = min(first, starts[a])
            cost = best[a] + (b - a) * (top - first) + overhead
            if best[b] is None or cost < best[b]:
                best[b], cut[b] = cost, a
    groups, b = [], n
    while b > 0:
        a = cut[b]
        groups.append((a, b, min(starts[a:b])))
        b = a
    return groups[::-1]


def _row_group_attention(module: Any, query: torch.Tensor, key: torch.Tensor,
                         value: torch.Tensor, attention_mask: torch.Tensor | None,
                         row_groups: Sequence[tuple[int, int, int]] | None = None,
                         **kwargs: Any) -> tuple[torch.Tensor, None]:
    """PyTorch SDPA, one call per group of rows of a one-token step on the keys from the
    group's first unpadded column (:func:`row_groups`): a short prompt's row no longer reads
    the padding of the batch's longest. The dropped columns are masked out for every row of
    the group, so the result is the padded call's up to float rounding."""
    if row_groups is None or query.shape[2] != 1:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    outputs = []
    for a, b, first in row_groups:
        mask = attention_mask
        if mask is not None:
            mask = mask[..., first:] if mask.shape[0] == 1 else mask[a:b, ..., first:]
        outputs.append(sdpa_attention_forward(module, query[a:b], key[a:b, :, first:],
                                              value[a:b, :, first:], mask, **kwargs)[0])
    return torch.cat(outputs), None


#: the attention implementation of the decode steps of a joined full-attention cache
ROW_GROUP_ATTENTION = "floorgap_row_groups"
AttentionInterface.register(ROW_GROUP_ATTENTION, _row_group_attention)
AttentionMaskInterface.register(ROW_GROUP_ATTENTION, sdpa_mask)


def _groupable(model: Any, cache: Any) -> bool:
    """Whether the decode steps read keys by row groups (:func:`row_groups`): a joined
    full-attention cache under PyTorch SDPA on the CPU, where it was measured; other caches,
    implementations and devices run the padded call as it is."""
    return (isinstance(cache.layers[0], _PreallocatedLayer) and cache.layers[0].device.type == "cpu"
            and model.config._attn_implementation == "sdpa")


def _first_columns(mask: torch.Tensor) -> list[int]:
    """Each row's first unpadded column of a left-padded attention mask [B, width]."""
    return (mask.cumsum(-1) == 0).sum(-1).tolist()


@torch.inference_mode()
def decode_with_targets(model: Any, prompts: Sequence[Sequence[int]], seeds: Sequence[int], *,
                        law: SamplingLaw, target_law: SamplingLaw, top_k: int,
                        max_new_tokens: int, eos_ids: Sequence[int], pad_id: int,
                        taps: Sequence[int] | None = None,
                        features_dtype: torch.dtype = torch.float32,
                        prefill_rows: int = PREFILL_ROWS) -> list[DecodedRow]:
    """Sample one response per prompt under ``law`` (row i from ``generator_for(seeds[i])``)
    and read, at every response position, the top-``top_k`` of ``target_law``'s distribution
    (module docstring); with ``taps``, the tap features of every token too. The prompts are
    prefilled ``prefill_rows`` at a time where the cache allows (:func:`_prefill`)."""
    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds")
    device = next(model.parameters()).device
    read_features = taps is not None
    eos = {int(e) for e in eos_ids}
    generators = [generator_for(int(s)) for s in seeds]
    n = len(prompts)
    tokens: list[list[int]] = [[] for _ in range(n)]
    steps: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(n)]
    feats: list[list[torch.Tensor]] = [[] for _ in range(n)]
    finished = [False] * n

    # batch position -> prompt index, shortest prompt first (the prefill groups pad least)
    rows = sorted(range(n), key=lambda i: (len(prompts[i]), i))
    cache, mask, pos, logits, prompt_feats = _prefill(
        model, prompts, rows, pad_id, read_features, taps, features_dtype, prefill_rows,
        room=max_new_tokens + 1)

    def keep_rows(keep: list[int], *tensors: torch.Tensor) -> tuple[Any, ...]:
        """Keep the batch positions ``keep``: in the cache, the row map and ``tensors``."""
        cache.batch_select_indices(torch.tensor(keep, device=device))
        return ([rows[b] for b in keep], *(t[keep] for t in tensors))

    for i, f in zip(rows, prompt_feats):
        feats[i].append(f)
    last = pos[:, -1]
    grouped = _groupable(model, cache)
    groups = row_groups(_first_columns(mask)) if grouped else None
    with (attention_implementation(model, ROW_GROUP_ATTENTION) if grouped else nullcontext()):
        while True:
            # the rows still drawing: a finished row only waits in the batch to be dropped
            drawing = [b for b, i in enumerate(rows) if not finished[i]]
            step = logits[drawing].float()
            vals, top = law_topk(target_law, step, top_k)
            drawn = torch.full((len(rows),), int(pad_id), dtype=torch.long)
            drawn[drawing] = keyed_draws(law, step, [generators[rows[b]] for b in drawing]).cpu()
            vals, top = vals.cpu(), top.to("cpu", torch.int32)
            for j, b in enumerate(drawing):
                i = rows[b]
                tokens[i].append(int(drawn[b]))
                steps[i].append((top[j], vals[j]))
                finished[i] = tokens[i][-1] in eos or len(tokens[i]) >= max_new_tokens
            # fed: the rows drawing on, and one that just finished once more for its last token's
            # features; the others are dropped from the cache once they are a quarter of the batch
            # (each drop copies the whole cache, so one per finished row would cost more than
            # their wasted rows of the forward)
            fed = [b for b in drawing if read_features or not finished[rows[b]]]
            if not fed:
                break
            if len(rows) - len(fed) > len(rows) // 4:
                rows, mask, last, drawn = keep_rows(fed, mask, last, drawn)
                fed = list(range(len(fed)))
                groups = row_groups(_first_columns(mask)) if grouped else None
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=-1)
            last = last + 1
            out = model(input_ids=drawn[:, None].to(device), attention_mask=mask,
                        position_ids=last[:, None], cache=cache, use_cache=True,
                        output_hidden_states=read_features, logits_to_keep=1,
                        **({"row_groups": groups} if grouped else {}))
            if read_features:
                f = concat_taps(out.hidden_states, taps)[:, -1].to("cpu", features_dtype)
                for b in fed:
                    feats[rows[b]].append(f[b:b + 1])
            logits = out.logits[:, -1]
            if all(finished[rows[b]] for b in fed):
                break
    return [DecodedRow(token_ids=tokens[i], censored=tokens[i][-1] not in eos,
                       target_ids=torch.stack([t for t, _ in steps[i]]),
                       target_vals=torch.stack([v for _, v in steps[i]]),
                       features=torch.cat(feats[i]) if read_features else None)
            for i in range(n)]
