"""Lookup-table proposals: the baselines every drafter must beat (unigram and bigram tables
estimated from the training record alone).

A table proposes q_k at slot k from token counts, with no model: what a drafter that learnt
nothing from the target's features could still do. Counts are *soft*: every response position
of a training sequence adds the target's stored distribution there (its top-K probabilities,
:mod:`floorgap.data.drafter_data`) rather than the one token drawn, which gives the same
expected table with less noise.

Kinds (``order`` as in :mod:`floorgap.models.drafters`)
-------------------------------------------------------
``unigram``            order 0: q_k = u, the mean target distribution, at every slot.
``bigram_committed``   order 0: q_k(. | c), the table of the token k + 1 positions after the
                       committed token c (at slot 0 the bigram): a function of X only, so it is
                       the lookup counterpart of an order-0 drafter at every slot.
``bigram``             order 1: q_k(. | z_{k-1}) with z_{-1} = c, one table at every slot, the
                       lookup counterpart of an order-1 drafter fed the realised predecessor.

Smoothing. A conditional row is shrunk to the unigram with weight ``alpha``:
q(v | a) = (C(a, v) + alpha u(v)) / (C(a) + alpha), and the unigram itself is shrunk to uniform
with one pseudo-count per token. ``alpha`` is chosen from ``ALPHAS`` by the slot-0 TV on the
held-out sequences of the record (the drafters' own held-out split), so nothing is tuned on the
evaluation anchors.

A table answers the drafters' proposal interface (``propose``, ``propose_paths``, ``order``,
``gamma``, ``cfg.taps``) so that the evaluation probe scores it on the same anchors and paths
as a drafter; it reads the committed token and the predecessors, never the features.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import Tensor

from floorgap.config import KIND_ORDER, LOOKUP_KINDS
from floorgap.estimators.topk import topk_divergences, topk_tv
from floorgap.models.drafters import SlotProposal
from floorgap.models.examples import block_index

LOOKUP_ORDER = {k: KIND_ORDER[k] for k in LOOKUP_KINDS}
ALPHAS = (0.01, 0.1, 1.0, 10.0, 100.0)
LOOKUP_FORMAT = 1
# the stored top-K entries of each position that enter the counts: the rest of the top-128
# adds little mass and would multiply the table's size
COUNT_TOP_K = 32


@dataclass
class LookupConfig:
    """What a table is: its kind, slots, vocabulary, the taps it shares with the drafters it is
    evaluated beside (so the probe computes their inputs once) and the smoothing weight."""

    kind: str
    gamma: int
    vocab_size: int
    taps: list[int] = field(default_factory=list)
    alpha: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in LOOKUP_KINDS:
            raise ValueError(f"unknown lookup kind {self.kind!r}; expected one of {LOOKUP_KINDS}")

    @property
    def order(self) -> int:
        return LOOKUP_ORDER[self.kind]


class _SoftCounts:
    """Sparse soft counts C(a, v) in CSR form (rows a: the conditioning token)."""

    def __init__(self, rows: Tensor, cols: Tensor, vals: Tensor, vocab: int) -> None:
        key = rows.long() * vocab + cols.long()
        uniq, inv = torch.unique(key, return_inverse=True)
        sums = torch.zeros(len(uniq), dtype=torch.float64).index_add_(0, inv, vals.double())
        r = uniq // vocab
        self.vocab = vocab
        self.cols = (uniq % vocab).to(torch.int32)
        self.vals = sums.float()
        self.crow = torch.zeros(vocab + 1, dtype=torch.long)
        self.crow[1:] = torch.bincount(r, minlength=vocab).cumsum(0)

    @classmethod
    def from_state(cls, state: Mapping[str, Tensor], vocab: int) -> _SoftCounts:
        obj = cls.__new__(cls)
        obj.vocab, obj.crow, obj.cols, obj.vals = vocab, state["crow"], state["cols"], state["vals"]
        return obj

    def state(self) -> dict[str, Tensor]:
        return {"crow": self.crow, "cols": self.cols, "vals": self.vals}

    def at(self, a: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """(C(a, v) [n, K], C(a) [n]) float64 for conditioning tokens ``a`` [n] and tokens
        ``v`` [n, K], without building rows over the vocabulary (entries are sorted by the key
        a * V + v, which ``torch.unique`` gave them)."""
        rows = torch.repeat_interleave(torch.arange(self.vocab), self.crow.diff())
        keys = rows * self.vocab + self.cols.long()
        query = a.long()[:, None] * self.vocab + v.long()
        at = torch.searchsorted(keys, query).clamp(max=max(len(keys) - 1, 0))
        hit = keys[at] == query if len(keys) else torch.zeros_like(query, dtype=torch.bool)
        counts = torch.where(hit, self.vals[at].double(), torch.zeros((), dtype=torch.float64))
        totals = torch.zeros(self.vocab, dtype=torch.float64).index_add_(0, rows,
                                                                        self.vals.double())
        return counts, totals[a.long()]

    def dense_rows(self, a: Tensor) -> Tensor:
        """C(a, .) for tokens ``a`` [n] -> [n, V] float64."""
        out = torch.zeros(len(a), self.vocab, dtype=torch.float64)
        for i, t in enumerate(a.tolist()):
            lo, hi = int(self.crow[t]), int(self.crow[t + 1])
            out[i, self.cols[lo:hi].long()] = self.vals[lo:hi].double()
        return out


def _positions(data: Mapping[str, Any], sequences: Sequence[int], lag: int,
               top_k: int | None = COUNT_TOP_K) -> tuple[Tensor, Tensor, Tensor]:
    """For every response position j of ``sequences``: the token ``lag`` positions before the
    one predicted (lag 1: its predecessor), and the stored top-K ids and values there."""
    conds, rows = [], []
    offs, plen, pos = data["seq_offsets"], data["seq_prompt_len"], data["pos_offsets"]
    for s in sequences:
        start, lp = int(offs[s]), int(plen[s])
        n_resp = int(pos[s + 1] - pos[s])
        j = torch.arange(n_resp)                       # response token j is at lp + j
        at = start + lp + j - lag                      # the conditioning token's index
        keep = at >= start                             # inside the sequence
        conds.append(data["tokens"][at[keep]].long())
        rows.append(int(pos[s]) + j[keep])
    rows_t = torch.cat(rows)
    return (torch.cat(conds), data["target_ids"][rows_t, :top_k].long(),
            data["target_vals"][rows_t, :top_k].float())


class LookupProposal(SlotProposal):
    """A fitted table (module docstring); ``propose``/``propose_paths`` as the drafters'."""

    def __init__(self, cfg: LookupConfig, unigram: Tensor,
                 tables: Sequence[_SoftCounts]) -> None:
        self.cfg = cfg
        self.unigram = unigram.double()                 # [V], sums to 1
        self.tables = list(tables)                      # one per slot, or one (bigram)

    # ---- the drafters' interface (gamma and order: SlotProposal)
    def _rows(self, slot: int, cond: Tensor) -> Tensor:
        """q_slot(. | cond) [n, V] float64."""
        if self.cfg.kind == "unigram":
            return self.unigram.expand(len(cond), -1).clone()
        table = self.tables[slot if self.cfg.kind == "bigram_committed" else 0]
        counts = table.dense_rows(cond.cpu())
        a = self.cfg.alpha
        return (counts + a * self.unigram) / (counts.sum(-1, keepdim=True) + a)

    def _probs_at(self, slot: int, cond: Tensor, ids: Tensor) -> Tensor:
        """q_slot(ids | cond) [n, K] float64: :meth:`_rows` at the tokens ``ids`` only."""
        u = self.unigram[ids.long()]
        if self.cfg.kind == "unigram":
            return u
        table = self.tables[slot if self.cfg.kind == "bigram_committed" else 0]
        counts, totals = table.at(cond.cpu(), ids.cpu())
        a = self.cfg.alpha
        return (counts + a * u) / (totals[:, None] + a)

    def _slot_conditions(self, committed: Tensor, predecessors: Tensor | None) -> Tensor:
        """The token each slot's row conditions on, [B, G]: the committed token at every slot
        (order 0), or [c, z_0, ..., z_{G-2}] (order 1)."""
        committed = committed.view(-1).cpu()
        if self.order == 0:
            return committed[:, None].expand(-1, self.gamma)
        if predecessors is None:
            raise ValueError("a bigram table needs predecessors")
        return torch.cat([committed[:, None], predecessors.cpu()[:, : self.gamma - 1]], 1)

    def propose(self, features: Tensor, committed: Tensor, predecessors: Tensor | None = None,
                prefix_mask: Tensor | None = None) -> Tensor:
        """Log-probabilities [B, G, V] (q_k = softmax of them), as ``Drafter.propose``."""
        cond = self._slot_conditions(committed, predecessors)
        return self._log_rows(features, cond, range(self.gamma))

    def propose_paths(self, features: Tensor, committed: Tensor, predecessors: Tensor,
                      prefix_mask: Tensor | None = None, slots: Sequence[int] | None = None
                      ) -> Tensor:
        """As ``Drafter.propose_paths``: M predecessor rows of one context -> [M, S, V], the
        rows computed at ``slots`` only."""
        m = predecessors.shape[0]
        cond = self._slot_conditions(committed.view(1).expand(m), predecessors)
        ks = range(self.gamma) if slots is None else [int(k) for k in slots]
        return self._log_rows(features, cond, ks)

    def _log_rows(self, features: Tensor, cond: Tensor, slots: Sequence[int]) -> Tensor:
        """log q_k(. | cond[:, k]) for k in ``slots`` -> [B, S, V] on the features' device."""
        rows = [self._rows(k, cond[:, k]) for k in slots]
        return torch.stack(rows, 1).log().float().to(features.device)

    # ---- files
    def record(self) -> dict[str, Any]:
        return {"lookup_format": LOOKUP_FORMAT, "lookup_config": asdict(self.cfg),
                "unigram": self.unigram, "tables": [t.state() for t in self.tables]}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> LookupProposal:
        if record.get("lookup_format") != LOOKUP_FORMAT:
            raise ValueError(f"not a lookup table of format {LOOKUP_FORMAT}")
        cfg = LookupConfig(**record["lookup_config"])
        return cls(cfg, record["unigram"],
                   [_SoftCounts.from_state(t, cfg.vocab_size) for t in record["tables"]])


def _heldout_tv0(fit: LookupProposal, cond: Tensor, ids: Tensor, vals: Tensor) -> float:
    """Mean slot-0 top-K + residual TV of ``fit`` on held-out positions (the drafters' loss
    measure), in chunks to bound memory."""
    total, n = 0.0, 0
    for lo in range(0, len(cond), 256):
        q = fit._rows(0, cond[lo:lo + 256]).clamp_min(1e-300).log().float()
        tv = topk_divergences(q, ids[lo:lo + 256], vals[lo:lo + 256])["tv"]
        total += float(tv.sum())
        n += len(tv)
    return total / max(n, 1)


def heldout_lookup_risk(fit: LookupProposal, data: Mapping[str, Any],
                        sequences: Sequence[int]) -> dict[str, Any]:
    """Held-out R by slot of a table, as the drafters' held-out curve reads it
    (:func:`floorgap.models.drafter_training.heldout_risk`): the mean over every block of
    ``sequences`` of the top-K + residual TV(p_k, q_k) at slot k, q_k conditioned on the
    committed token (order 0) or on the realised predecessor (order 1: R^oracle, teacher
    forced). ``score`` is the mean over slots."""
    seq, ctx = block_index(data, fit.gamma)
    keep = torch.isin(seq, torch.as_tensor(list(sequences), dtype=torch.long))
    seq, ctx = seq[keep], ctx[keep]
    start = data["seq_offsets"][seq]
    by_slot = []
    for k in range(fit.gamma):
        # slot k of the block with context c predicts token c + k, from the target row of
        # that response position; bigram_committed's slot-k table reads the committed token
        # (k + 1 before it), the bigram the predecessor, the unigram nothing
        lag = k + 1 if fit.cfg.kind == "bigram_committed" else 1
        rows = data["pos_offsets"][seq] + ctx + k - data["seq_prompt_len"][seq]
        cond = data["tokens"][start + ctx + k - lag].long()
        q = fit._probs_at(k, cond, data["target_ids"][rows])
        tv = topk_tv(data["target_vals"][rows].double(), q)
        by_slot.append(float(tv.mean()) if len(tv) else 0.0)
    return {"tv_by_slot": by_slot, "score": sum(by_slot) / len(by_slot), "blocks": int(len(seq))}


def fit_lookup(kind: str, data: Mapping[str, Any], train_seqs: Sequence[int],
               heldout_seqs: Sequence[int], *, gamma: int, vocab_size: int,
               taps: Sequence[int] = ()) -> tuple[LookupProposal, dict[str, float]]:
    """The table of ``kind`` from the soft counts of ``train_seqs``, its smoothing weight
    chosen by the slot-0 TV on ``heldout_seqs`` (the first of :data:`ALPHAS` when none is held
    out). Returns the table and the held-out TV of every weight tried."""
    uni = torch.ones(vocab_size, dtype=torch.float64)
    _, ids, vals = _positions(data, train_seqs, 1)
    uni.index_add_(0, ids.reshape(-1), vals.double().reshape(-1))
    uni /= uni.sum()
    tables = []
    if kind != "unigram":
        lags = range(1, gamma + 1) if kind == "bigram_committed" else [1]
        for lag in lags:
            cond, ids, vals = _positions(data, train_seqs, lag)
            k = ids.shape[-1]
            tables.append(_SoftCounts(cond[:, None].expand(-1, k).reshape(-1),
                                      ids.reshape(-1), vals.reshape(-1), vocab_size))
    cfg = LookupConfig(kind=kind, gamma=int(gamma), vocab_size=int(vocab_size),
                       taps=[int(t) for t in taps])
    scores: dict[str, float] = {}
    if kind == "unigram" or not heldout_seqs:
        cfg.alpha = ALPHAS[0]
        return LookupProposal(cfg, uni, tables), scores
    cond, ids, vals = _positions(data, heldout_seqs, 1, top_k=None)
    for a in ALPHAS:
        cfg.alpha = a
        scores[str(a)] = _heldout_tv0(LookupProposal(cfg, uni, tables), cond, ids, vals)
    cfg.alpha = float(min(ALPHAS, key=lambda a: scores[str(a)]))
    return LookupProposal(cfg, uni, tables), scores
