"""Drafter evaluation at an anchor: the drafter's q on the stored target paths (paper Secs. 2,
3.3, 3.5, App. B.5, E, F.1).

At an anchor with context X the rollouts probe stored M target paths Z^(r). This probe reuses
exactly those paths (it never resamples the target) and reads, at every slot k:

* p_k^(r) = p_T(. | X, Z^(r)_<k) under the sampling law, recomputed by one teacher-forced
  forward of the path tokens after a shared prefill; the realised-token probabilities are
  checked against the stored ``logp``.
* The drafter's proposal, warped by the same law (paper C.7):
  order 0 (DFlash): q_k(. | X), one pass, the same row for every path;
  order 1 oracle (DSpark, prefix attention): q_k(. | X, Z^(r)_{k-1}) fed the target's realised
  predecessor, one pass over all paths;
  order 1 self: the drafter's own chain Zhat^(r), drawn left to right from its warped proposal
  with uniforms from ``generator_for(derive_seed(anchor_seed, "self", r))``, and the proposal
  q_k(. | X, Zhat^(r)_{k-1}) along it. R^self pairs that proposal with the target's p_k^(r).

Per path and slot it keeps the scalars that serving reweighting and the single-slot best
response need: p_k(Z_k), q_k(Z_k), TV_k and the accept factor a_k = min(1, q/p). For order 1
the accept factor uses the oracle proposal: on the event that path r survives to slot k the
drafter's accepted predecessor is the target's Z_{k-1} (paper F.1).

Drafter inputs. The committed token c is the last context token; the drafter sees the target's
tap features of the prefix before it (X without c), and slot 0 is fed E(c).

Cost. p_k^(r) is computed once per anchor (:func:`anchor_target`) and shared by every drafter
evaluated there (:func:`evaluate_drafter`); a drafter's block pass runs once per anchor, its
predecessors enter as M rows of the head, and the self chain reads the output head at one slot
per step.

Determinism. Target forwards have exactly ``forward_rows(forward_batch, M)`` rows (paths padded
with copies of the chunk's first path, as in the rollouts probe); the drafter's block pass has
one row and its head exactly M rows (M fixed by the stored records); every uniform is keyed by
the anchor and the path index.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from floorgap.errors import StageError
from floorgap.estimators.barycentre import tv_distance
from floorgap.estimators.risk import exposure
from floorgap.estimators.serving import accept_factors
from floorgap.models.checkpoints import load_drafter_weights
from floorgap.models.drafters import DrafterConfig, build_drafter
from floorgap.models.engine_formats import import_drafter
from floorgap.models.from_target import target_features
from floorgap.models.lookup import LookupProposal
from floorgap.models.shared_prefix import decode_forward, path_cache
from floorgap.probes.record_types import PathSlotRecord, SlotRiskRecord
from floorgap.probes.rollouts import forward_rows
from floorgap.progress import progress
from floorgap.records import read_metadata, read_table
from floorgap.sampling import SamplingLaw, inverse_cdf_sample
from floorgap.seeds import derive_seed, generator_for

LOGP_ATOL = 1e-5  # |p_recomputed(Z_k) - exp(stored logp)| above this counts as a mismatch


@dataclass(frozen=True)
class AnchorEval:
    """Everything measured at one anchor (tensors on the CPU, float64 where probabilities).

    ``tokens`` [M, G] the stored target paths; ``p_tok``/``q_tok``/``tv``/``accept`` [M, G] the
    target's and the (oracle) proposal's probability of Z_k, TV(p_k, q_k) and a_k;
    ``self_tokens``/``q_self_tok``/``tv_self`` [M, G] the self chain (None at order 0);
    ``p_stored`` [M, G] exp of the stored logp; ``seconds`` wall time.
    """

    order: int
    committed: int
    tokens: Tensor
    p_tok: Tensor
    q_tok: Tensor
    tv: Tensor
    accept: Tensor
    self_tokens: Tensor | None
    q_self_tok: Tensor | None
    tv_self: Tensor | None
    p_stored: Tensor
    seconds: float

    @property
    def logp_abs_diff(self) -> Tensor:
        return (self.p_tok - self.p_stored).abs()


@torch.inference_mode()
def target_path_probs(model: Any, context_ids: list[int], tokens: Tensor, *, law: SamplingLaw,
                      forward_batch: int) -> Tensor:
    """p_k^(r) under ``law`` along stored paths ``tokens`` [M, G] -> [G, M, V] float64.

    The context is prefilled once (slot 0's distribution is shared); each chunk of at most
    ``forward_batch`` paths is teacher-forced in one forward of G - 1 tokens after the prefix
    (:func:`floorgap.models.shared_prefix.path_cache`), padded to exactly
    ``forward_rows(forward_batch, M)`` rows.
    """
    device = next(model.parameters()).device
    n_paths, gamma = tokens.shape
    forward_batch = forward_rows(forward_batch, n_paths)
    ctx = torch.tensor([context_ids], dtype=torch.long, device=device)
    out = model(input_ids=ctx, use_cache=True, logits_to_keep=1)   # head on the last row only
    p0 = law.probs(out.logits[:, -1, :])                       # [1, V]
    vocab = p0.shape[-1]
    probs = torch.empty((gamma, n_paths, vocab), dtype=torch.float64, device=device)
    probs[0] = p0.expand(n_paths, vocab)
    if gamma == 1:
        return probs
    toks = tokens.to(device)
    for lo in range(0, n_paths, forward_batch):
        n = min(forward_batch, n_paths - lo)
        rows = toks[lo:lo + n, :-1]
        rows = torch.cat([rows, rows[:1].expand(forward_batch - n, gamma - 1)])
        cache = path_cache(model, out.cache, forward_batch)
        logits = decode_forward(model, rows, cache)  # [fb, G-1, V]
        probs[1:, lo:lo + n] = law.probs(logits[:n]).transpose(0, 1)
        del cache
    return probs


def drafter_inputs(target: Any, drafter: Any, context_ids: list[int]
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """(features [1, T, F], committed [1], prefix_mask [1, T]) for context X = prefix + c;
    shareable between drafters with the same taps."""
    if len(context_ids) < 2:
        raise ValueError("a drafter context needs a prefix and a committed token")
    device = next(target.parameters()).device
    prefix = torch.tensor([context_ids[:-1]], dtype=torch.long, device=device)
    mask = torch.ones_like(prefix)
    feats = target_features(target, prefix, mask, list(drafter.cfg.taps))
    committed = torch.tensor([context_ids[-1]], dtype=torch.long, device=device)
    return feats, committed, mask.bool()


def _at(probs: Tensor, tokens: Tensor) -> Tensor:
    """probs [G, M, V], tokens [M, G] -> [M, G] probability of each token."""
    return probs.gather(-1, tokens.T.unsqueeze(-1).to(probs.device)).squeeze(-1).T


@dataclass(frozen=True)
class AnchorTarget:
    """The target's side of one anchor, shared by every drafter evaluated there: the stored
    paths ``tokens`` [M, G], p_k^(r) ``probs`` [G, M, V] (float64, on the target's device),
    exp of the stored logp ``p_stored`` [M, G] and the seconds the recomputation took."""

    context_ids: list[int]
    tokens: Tensor
    probs: Tensor
    p_stored: Tensor
    seconds: float


def anchor_target(target: Any, context_ids: list[int], tokens: Tensor, stored_logp: Tensor, *,
                  law: SamplingLaw, forward_batch: int) -> AnchorTarget:
    """Recompute p_k^(r) along the stored paths once per anchor (the costly part at scale)."""
    start = time.perf_counter()
    tokens = tokens.long().cpu()
    p = target_path_probs(target, context_ids, tokens, law=law, forward_batch=forward_batch)
    return AnchorTarget(context_ids=list(context_ids), tokens=tokens, probs=p,
                        p_stored=torch.exp(stored_logp.double().cpu()),
                        seconds=time.perf_counter() - start)


@torch.inference_mode()
def evaluate_drafter(target: Any, drafter: Any, at: AnchorTarget, *, law: SamplingLaw,
                     anchor_seed: int,
                     features: tuple[Tensor, Tensor, Tensor] | None = None) -> AnchorEval:
    """One drafter's proposals on the anchor's stored paths. ``features`` (the output of the
    drafter inputs for the drafter's taps) may be passed to share it between drafters with the
    same taps; ``seconds`` counts the drafter's side only."""
    start = time.perf_counter()
    tokens, p = at.tokens, at.probs
    n_paths, gamma = tokens.shape
    if gamma != drafter.gamma:
        raise ValueError(f"stored paths have {gamma} slots, the drafter drafts {drafter.gamma}")
    device = p.device
    feats, committed, mask = features or drafter_inputs(target, drafter, at.context_ids)
    order = int(drafter.order)
    self_tokens = q_self = None
    if order == 0:
        logits = drafter.propose(feats, committed, None, prefix_mask=mask)    # [1, G, V]
        q = law.probs(logits[0]).unsqueeze(1).to(device)                       # [G, 1, V]
    else:
        # one block pass for the context; the M target predecessors as M rows of the head
        logits = drafter.propose_paths(feats, committed, tokens.to(feats.device), mask)
        q = law.probs(logits).transpose(0, 1).to(device)                       # [G, M, V]
        gens = [generator_for(derive_seed(anchor_seed, "self", r)) for r in range(n_paths)]
        chain = torch.zeros((n_paths, gamma), dtype=torch.long, device=feats.device)
        rows = []
        for k in range(gamma):
            # slot k's proposal depends on the chain only through chain[:, k-1]
            row = law.probs(drafter.propose_paths(feats, committed, chain, mask, slots=[k])[:, 0])
            u = torch.stack([torch.rand((), dtype=torch.float64, generator=g) for g in gens])
            chain[:, k] = inverse_cdf_sample(row, u).to(chain.device)
            rows.append(row)
        q_self = torch.stack(rows).to(device)                                   # [G, M, V]
        self_tokens = chain.cpu()
    tv = tv_distance(p, q.expand_as(p), dim=-1).T                              # [M, G]
    p_tok = _at(p, tokens)
    q_tok = _at(q.expand_as(p), tokens)
    accept = accept_factors(p_tok, q_tok)
    tv_self = q_self_tok = None
    if q_self is not None:
        tv_self = tv_distance(p, q_self, dim=-1).T.cpu()
        q_self_tok = _at(q_self, self_tokens).cpu()
    return AnchorEval(order=order, committed=int(at.context_ids[-1]), tokens=tokens,
                      p_tok=p_tok.cpu(), q_tok=q_tok.cpu(), tv=tv.cpu(), accept=accept.cpu(),
                      self_tokens=self_tokens, q_self_tok=q_self_tok, tv_self=tv_self,
                      p_stored=at.p_stored, seconds=time.perf_counter() - start)


def anchor_eval_records(anchor_id: str, ev: AnchorEval
                        ) -> tuple[list[PathSlotRecord], list[SlotRiskRecord]]:
    """Per path x slot scalars and per slot risks of one anchor."""
    n_paths, gamma = ev.tokens.shape
    # R_k = path mean of TV(p_k^(r), q_k^(r)); paths on dim 0 of the [M, G] per-path TVs
    risk = ev.tv.mean(0)
    r_oracle, r_self = risk, (risk if ev.tv_self is None else ev.tv_self.mean(0))
    expo = exposure(r_self, r_oracle)
    diff = ev.logp_abs_diff
    mism = (diff > LOGP_ATOL).sum(0)
    nan = float("nan")
    paths = [PathSlotRecord(
        anchor_id=anchor_id, path=r, slot=k, committed_token=ev.committed,
        token=int(ev.tokens[r, k]), p_tok=float(ev.p_tok[r, k]), q_tok=float(ev.q_tok[r, k]),
        tv=float(ev.tv[r, k]), accept=float(ev.accept[r, k]),
        self_token=-1 if ev.self_tokens is None else int(ev.self_tokens[r, k]),
        q_self_tok=nan if ev.q_self_tok is None else float(ev.q_self_tok[r, k]),
        tv_self=nan if ev.tv_self is None else float(ev.tv_self[r, k]))
        for r in range(n_paths) for k in range(gamma)]
    slots = [SlotRiskRecord(anchor_id=anchor_id, slot=k, order=ev.order, risk=float(risk[k]),
                            risk_oracle=float(r_oracle[k]), risk_self=float(r_self[k]),
                            exposure=float(expo[k]), logp_mismatches=int(mism[k]),
                            logp_max_abs_diff=float(diff[:, k].max()))
             for k in range(gamma)]
    return paths, slots


def path_arrays(rows: Any, gamma: int) -> tuple[Tensor, Tensor]:
    """(tokens [M, G], logp [M, G]) of one anchor's stored rollout rows, ordered by path."""
    rows = rows.sort_values("path", kind="stable")
    tokens = torch.tensor([list(t) for t in rows.tokens], dtype=torch.long)
    logp = torch.tensor([list(v) for v in rows.logp], dtype=torch.float64)
    if tokens.shape[1] != gamma or logp.shape != tokens.shape:
        raise ValueError(f"stored paths have shape {tuple(tokens.shape)}, expected gamma={gamma}")
    if rows.path.tolist() != list(range(len(rows))):
        raise ValueError("stored paths are not numbered 0..M-1")
    return tokens, logp


def load_trained_drafter(path: str | Path, target: Any, gamma: int | None = None) -> Any:
    """A trained drafter on ``target`` from ``final.pt`` or from an engine checkpoint folder.

    A folder holding ``config.json`` (dflash, dspark, speculators or floorgap layout, detected
    from the config) is imported by :func:`floorgap.models.engine_formats.import_drafter`, at
    ``gamma`` slots when given (a released block may be evaluated at fewer slots). A file is a
    ``final.pt``: the config is read from ``drafter_config`` (or a ``config`` mapping that
    names a ``kind``); the weights from ``model`` through the training loader, which checks the
    layout and the frozen-table fingerprint when the file records them; ``gamma`` is unused.
    """
    if Path(path).is_dir() and (Path(path) / "config.json").is_file():
        return import_drafter(path, target, gamma=gamma).eval().requires_grad_(False)
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    if "lookup_format" in ckpt:
        return LookupProposal.from_record(ckpt)
    cfg = ckpt.get("drafter_config")
    if cfg is None and isinstance(ckpt.get("config"), dict) and "kind" in ckpt["config"]:
        cfg = ckpt["config"]
    if cfg is None or "model" not in ckpt:
        raise ValueError(f"{path}: expected a drafter config and trainable weights ('model')")
    known = {f.name for f in fields(DrafterConfig)}
    drafter = build_drafter(DrafterConfig(**{k: v for k, v in cfg.items() if k in known}), target)
    if "trainable_layout" in ckpt:
        load_drafter_weights(drafter, ckpt, check_frozen="frozen_fingerprint" in ckpt)
    else:
        params = dict(drafter.named_parameters())
        with torch.no_grad():
            for name, value in ckpt["model"].items():
                params[name].copy_(value.to(params[name].device))
    return drafter.eval().requires_grad_(False)


# --------------------------------------------------------------------------------------------
# One shard of anchors (the drafter_eval stage)


def stored_paths(path: str | Path, anchor_ids: Sequence[str], gamma: int,
                 law_spec: Mapping[str, Any]) -> dict[str, Any]:
    """The rollout rows of ``path`` by anchor id, checked against the shard: the same gamma and
    sampling law, and stored paths for every anchor of ``anchor_ids``."""
    stored = read_table(path)
    roll_meta = read_metadata(path)
    if int(roll_meta.get("gamma", gamma)) != gamma:
        raise StageError(f"{path} holds gamma={roll_meta.get('gamma')}, not {gamma}")
    if roll_meta.get("law", law_spec) != law_spec:
        raise StageError(f"{path} was sampled under law {roll_meta.get('law')}, "
                         f"not {law_spec}; rerun the rollouts")
    by_anchor = {a: g for a, g in stored.groupby("anchor_id", sort=False)}
    missing = [a for a in anchor_ids if a not in by_anchor]
    if missing:
        raise StageError(f"{path} lacks paths of {len(missing)} anchors of this shard "
                         f"(first {missing[0]}); rerun the rollouts")
    return by_anchor


def load_drafters(paths: Sequence[str | Path], target: Any, gamma: int) -> list[Any]:
    """The trained drafters of ``paths`` on ``target``; each must draft ``gamma`` slots.

    A path is a ``final.pt`` file or an engine checkpoint folder (see
    :func:`load_trained_drafter`); a folder is imported at ``gamma`` slots, which its stored
    block must fit."""
    drafters = []
    for path in paths:
        try:
            drafter = load_trained_drafter(path, target, gamma)
        except (ValueError, FileNotFoundError) as exc:
            raise StageError(str(exc)) from exc
        if drafter.gamma != gamma:
            raise StageError(f"{path} drafts {drafter.gamma} slots, the anchors {gamma}")
        drafters.append(drafter)
    return drafters


@dataclass
class ShardEval:
    """The records of every drafter (by label) on one shard: per path x slot scalars
    ``paths``, per slot risks ``slots``, the drafter-side seconds per anchor, the logp
    mismatches, and the target-side seconds per anchor (shared by the drafters)."""

    paths: dict[str, list[PathSlotRecord]]
    slots: dict[str, list[SlotRiskRecord]]
    seconds: dict[str, list[float]]
    mismatches: dict[str, int]
    target_seconds: list[float] = dataclasses.field(default_factory=list)

    @classmethod
    def empty(cls, labels: Sequence[str]) -> ShardEval:
        return cls(paths={label: [] for label in labels}, slots={label: [] for label in labels},
                   seconds={label: [] for label in labels},
                   mismatches={label: 0 for label in labels})


def _evaluate_drafters_at(out: ShardEval, target: Any, drafters: Sequence[Any],
                          labels: Sequence[str], at: AnchorTarget, anchor: Any, *,
                          law: SamplingLaw, logger: logging.Logger) -> None:
    """Every drafter at one anchor (target side ``at`` already computed), added to ``out``."""
    inputs: dict[tuple[int, ...], Any] = {}  # drafter inputs by taps, shared
    for label, drafter in zip(labels, drafters, strict=True):
        taps = tuple(drafter.cfg.taps)
        if taps not in inputs:
            inputs[taps] = drafter_inputs(target, drafter, at.context_ids)
        ev = evaluate_drafter(target, drafter, at, law=law, anchor_seed=int(anchor.anchor_seed),
                              features=inputs[taps])
        paths, slots = anchor_eval_records(anchor.anchor_id, ev)
        out.paths[label].extend(paths)
        out.slots[label].extend(slots)
        out.seconds[label].append(ev.seconds)
        n_bad = sum(s.logp_mismatches for s in slots)
        out.mismatches[label] += n_bad
        logger.info("anchor %s %s: %.2f s, %d logp mismatches (max |dp| %.2e), R by slot %s",
                    anchor.anchor_id, label, ev.seconds, n_bad,
                    max(s.logp_max_abs_diff for s in slots),
                    " ".join(f"{s.risk:.3f}" for s in slots))


def evaluate_shard(target: Any, drafters: Sequence[Any], labels: Sequence[str], anchors: Any,
                   contexts: Sequence[list[int]], paths_by_anchor: Mapping[str, Any], *,
                   law: SamplingLaw, gamma: int, forward_batch: int, desc: str,
                   logger: logging.Logger) -> ShardEval:
    """Every drafter on the stored paths of every anchor of a shard (``anchors`` rows with
    ``anchor_id`` and ``anchor_seed``, their ``contexts``): p_k^(r) once per anchor
    (:func:`anchor_target`), then each drafter's proposals and records."""
    out = ShardEval.empty(labels)
    for a, ctx in progress(zip(anchors.itertuples(index=False), contexts), total=len(anchors),
                           desc=desc, unit="anchor"):
        tokens, logp = path_arrays(paths_by_anchor[a.anchor_id], gamma)
        at = anchor_target(target, ctx, tokens, logp, law=law, forward_batch=forward_batch)
        out.target_seconds.append(at.seconds)
        _evaluate_drafters_at(out, target, drafters, labels, at, a, law=law, logger=logger)
    return out
