"""The blocks a drafter trains on, read from a training record of the drafter_data stage
(:mod:`floorgap.data.drafter_data` writes it; this module is its one reader): every block of
every sequence, the nested subsets of a block budget, and :class:`BlockExamples`, the dataset
the trainer (:mod:`floorgap.models.training`) reads."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from floorgap.errors import StageError
from floorgap.models.from_target import target_features
from floorgap.models.targets import mixed_precision
from floorgap.progress import Timer
from floorgap.seeds import derive_seed, generator_for

#: The version of the training record: the writer (data.drafter_data) stamps it, the reader
#: refuses any other.
FORMAT = 2


def block_index(data: Mapping[str, Any], gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every block of a record: (sequence [N], context length c [N]), c running over
    ``prompt_len .. len - gamma`` of each sequence in order."""
    seqs, ctxs = [], []
    offsets, plen = data["seq_offsets"], data["seq_prompt_len"]
    for i in range(int(plen.shape[0])):
        n, lp = int(offsets[i + 1] - offsets[i]), int(plen[i])
        c = torch.arange(lp, n - gamma + 1, dtype=torch.long)
        seqs.append(torch.full_like(c, i))
        ctxs.append(c)
    return torch.cat(seqs), torch.cat(ctxs)


def sequence(data: Mapping[str, Any], i: int) -> torch.Tensor:
    """Token ids (int64) of sequence ``i`` of a training record."""
    a, b = int(data["seq_offsets"][i]), int(data["seq_offsets"][i + 1])
    return data["tokens"][a:b].long()


def load_drafter_data(path: Any) -> dict[str, Any]:
    """Load a training record written by the drafter_data stage."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StageError(f"{path}: not a drafter training record of format {FORMAT}")
    return data


def budget_sequences(block_seq: Any, n_seq: int, seed: int,
                     sequences: Sequence[int] | None = None, max_blocks: int | None = None
                     ) -> Any:
    """The sequences a block budget trains on: a seeded order of ``sequences`` (default all
    ``n_seq``), cut after the first whole sequences that hold at least ``max_blocks`` blocks
    (``block_seq``: the sequence of every block, :func:`block_index`).
    The order does not depend on the budget, so smaller budgets are subsets of larger ones;
    drafters and lookup tables of one budget get the same sequences."""
    order = torch.randperm(n_seq, generator=generator_for(derive_seed(seed, "budget")))
    if sequences is not None:
        pool = torch.zeros(n_seq, dtype=torch.bool)
        pool[torch.as_tensor(list(sequences), dtype=torch.long)] = True
        order = order[pool[order]]
        if len(order) == 0:
            raise StageError("no training sequence is left outside the held-out share")
    if max_blocks is None:
        return order
    counts = torch.bincount(block_seq, minlength=n_seq)
    return order[:int((counts[order].cumsum(0) < max_blocks).sum()) + 1]


class BlockExamples:
    """Every block of a training record (written by :mod:`floorgap.data.drafter_data`), with
    the target's tap features (stored in the record, or computed once per sequence) held in
    memory in the training precision.

    Batches group blocks by sequence (:meth:`epoch_batches`): the blocks of one sequence share
    its context features and differ only in where their prefix ends, so a batch carries the
    features once ([1, T, F]) with ``feature_index`` and per-block ``prefix_mask`` [N, T]
    (:class:`floorgap.models.drafters.Backbone`). ``max_blocks`` keeps the first whole
    sequences of a seeded order holding at least that many blocks (nested across budgets);
    ``sequences`` limits the pool to those sequences (the training or the held-out split).
    ``stream`` holds nothing: each batch's features come from a target forward over its
    sequence on the target's device (drafters.train.features: stream), for data whose
    features do not fit in host memory.
    """

    def __init__(self, data: Mapping[str, Any], target_model: Any, taps: list[int], gamma: int,
                 *, max_blocks: int | None = None, seed: int = 0,
                 autocast: str | None = None, sequences: Sequence[int] | None = None,
                 stream: bool = False) -> None:
        self.data, self.target, self.taps, self.gamma = data, target_model, list(taps), gamma
        self.autocast = autocast  # the training precision; the features follow it
        self.stream = stream
        self.features: dict[int, Any] | None = None
        seq, ctx = block_index(data, gamma)
        if len(seq) == 0:
            raise StageError("the training record holds no block")
        if int(ctx.min()) < 2:
            raise StageError("a training block has an empty committed prefix")
        n_seq = int(data["seq_prompt_len"].shape[0])
        keep = budget_sequences(seq, n_seq, seed, sequences, max_blocks)
        chosen = torch.zeros(n_seq, dtype=torch.bool)
        chosen[keep] = True
        sel = chosen[seq]
        self.block_seq, self.context_len = seq[sel], ctx[sel]
        self.sequences = sorted(int(i) for i in keep)

    def __len__(self) -> int:
        return int(self.block_seq.shape[0])

    def stored_features(self) -> bool:
        """Whether the record stores the tap features this drafter reads (same taps)."""
        meta = (self.data.get("metadata") or {}).get("features") or {}
        return "features" in self.data and [int(t) for t in meta.get("taps", [])] == self.taps

    def prepare(self) -> float:
        """The tap features of every kept sequence, read from the record when it stores them
        (:meth:`stored_features`) or else computed (nothing when streamed); returns the
        seconds it took."""
        if self.features is not None or (self.stream and not self.stored_features()):
            return 0.0
        timer = Timer()
        dtype = getattr(torch, self.autocast) if self.autocast else None
        if self.stored_features():
            offsets, stored = self.data["seq_offsets"], self.data["features"]
            self.features = {s: stored[int(offsets[s]):int(offsets[s + 1])].to(
                dtype or torch.float32) for s in self.sequences}
            return timer.seconds
        self.features = {s: self.sequence_features(s).to("cpu") for s in self.sequences}
        return timer.seconds

    def sequence_features(self, s: int) -> Any:
        """The tap features [T, F] of sequence ``s`` from a target forward, on the target's
        device, in the training precision."""
        # Under mixed-precision training the drafter reads the features in that precision
        # anyway, so the target's forward runs in it too (3-4x faster on bf16 CPUs).
        dtype = getattr(torch, self.autocast) if self.autocast else None
        device = next(self.target.parameters()).device
        with torch.no_grad(), mixed_precision(device.type, dtype):
            ids = sequence(self.data, s)[None].to(device)
            f = target_features(self.target, ids, torch.ones_like(ids), self.taps)
        return f[0].to(dtype or torch.float32)

    def epoch_batches(self, batch_size: int, seed: int, epoch: int, *, min_size: int = 1
                      ) -> list[Any]:
        """The epoch's batches: each sequence's blocks in a keyed random order, cut into chunks
        of ``batch_size``, the chunks in a keyed random order; chunks under ``min_size`` go."""
        gen = generator_for(derive_seed(seed, "drafter-train", "epoch", epoch))
        chunks = []
        for s in self.sequences:
            idx = (self.block_seq == s).nonzero().view(-1)
            idx = idx[torch.randperm(len(idx), generator=gen)]
            chunks += [c for c in torch.split(idx, batch_size) if len(c) >= min_size]
        return [chunks[int(i)] for i in torch.randperm(len(chunks), generator=gen)]

    def gather(self, indices: Any) -> dict[str, Any]:
        """The blocks ``indices`` (of one sequence) as one batch sharing that sequence's
        features."""
        if self.features is None:
            self.prepare()
        seqs = self.block_seq[indices].unique()
        if len(seqs) != 1:
            raise ValueError("a batch of blocks must come from one sequence")
        s = int(seqs[0])
        c = self.context_len[indices]                                       # [N]
        toks = sequence(self.data, s)
        t = int(c.max()) - 1                                                # longest prefix
        feats = self.sequence_features(s) if self.features is None else self.features[s]
        slot = torch.arange(self.gamma)
        start = int(self.data["pos_offsets"][s]) - int(self.data["seq_prompt_len"][s])
        rows = start + c[:, None] + slot                                    # [N, G]
        return {"features": feats[None, :t],
                "prefix_mask": torch.arange(t)[None, :] < (c[:, None] - 1),
                "feature_index": torch.zeros(len(c), dtype=torch.long),
                "committed": toks[c - 1], "block_tokens": toks[c[:, None] + slot],
                "target_ids": self.data["target_ids"][rows].long(),
                "target_vals": self.data["target_vals"][rows].float()}
