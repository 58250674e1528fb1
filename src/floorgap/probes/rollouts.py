"""Target rollouts at an anchor: M sampled blocks and the full-vocabulary p_k^(r) along each.

At an anchor with context X the probe draws M continuations Z^(r) = (Z_0, ..., Z_{gamma-1})
from the target under the sampling law and reads p_k^(r) = p_T(. | X, Z^(r)_<k) at every slot
(paper Sec. B.3). The logits computed while sampling slot k are exactly p_k^(r), so no second
teacher-forced pass is needed. The prompt is prefilled once; the paths decode after it with its
keys and values held once where the model allows (:mod:`floorgap.models.shared_prefix`), else
on a copy per row.

Determinism. Path r draws its uniforms from its own generator, seeded by
``derive_seed(anchor_seed, "path", r)``. CPU and GPU matrix kernels choose their summation order
by the number of rows, so a path's probabilities would change in the last bits with the number
of paths decoded beside it. Every forward therefore has exactly :func:`forward_rows` rows
(``forward_batch``, or the pass's path count when that is smaller): real paths, padded with
copies when fewer remain. A path's numbers then depend only on the anchor, its index, the
pass's path count and ``forward_batch`` (a recorded part of the numerical recipe), never on
how paths are chunked or anchors sharded.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd
import torch

from floorgap.data.anchors import anchor_contexts
from floorgap.estimators.floors import (alternating_split, floor_order0_split,
                                        floor_order1_plugin, floor_order1_reweighted,
                                        floor_order1_split, order0_path_tv, reveal_weights)
from floorgap.estimators.support import effective_support
from floorgap.estimators.truncation import topk_sparse
from floorgap.models.shared_prefix import decode_forward, path_cache, sibling_logits
from floorgap.probes.record_types import PathRecord, SlotFloorRecord
from floorgap.progress import progress
from floorgap.sampling import SamplingLaw, inverse_cdf_sample
from floorgap.seeds import derive_seed, generator_for

log = logging.getLogger("floorgap.rollouts")


def forward_rows(forward_batch: int, n_paths: int) -> int:
    """Rows of every forward of a pass over ``n_paths`` paths: ``forward_batch``, capped at
    ``n_paths`` (rows past the pass's paths would only be padding, computed and discarded)."""
    return max(1, min(int(forward_batch), int(n_paths)))


def forward_plan(forward_batch: int, chunk_paths: int | None, n_paths: int) -> tuple[int, int]:
    """(rows of every forward, real paths per forward) for a pass over ``n_paths`` paths:
    ``chunk_paths`` (default ``forward_batch``) must lie in [1, forward_batch]; both are then
    capped by :func:`forward_rows`."""
    chunk = forward_batch if chunk_paths is None else chunk_paths
    if not 1 <= chunk <= forward_batch:
        raise ValueError(f"chunk_paths must lie in [1, forward_batch={forward_batch}]")
    rows = forward_rows(forward_batch, n_paths)
    return rows, min(chunk, rows)


@dataclass(frozen=True)
class SampledBlock:
    """M target paths at one anchor.

    ``tokens``: ``[M, gamma]`` realised tokens; ``probs``: ``[gamma, M, V]`` the law's
    next-token distributions p_k^(r) (float32, on the model's device); ``revealed``:
    ``[gamma, J, M, V]`` or None (see :func:`sample_block`; slot 0 is unused);
    ``seconds``: wall time.
    """

    tokens: torch.Tensor
    probs: torch.Tensor
    revealed: torch.Tensor | None
    seconds: float

    @property
    def realised_probs(self) -> torch.Tensor:
        """``[M, gamma]``: p_k^(r)(Z_k^(r)), the probability of each realised token."""
        idx = self.tokens.to(self.probs.device).T.unsqueeze(-1)  # [gamma, M, 1]
        return self.probs.gather(-1, idx).squeeze(-1).T


@torch.inference_mode()
def sample_block(model: Any, context_ids: list[int], *, n_paths: int, gamma: int,
                 law: SamplingLaw, anchor_seed: int, forward_batch: int,
                 chunk_paths: int | None = None, reveal_paths: int = 0) -> SampledBlock:
    """Draw ``n_paths`` blocks of ``gamma`` tokens after ``context_ids`` (prefill shared).

    Every decode forward has ``forward_rows(forward_batch, n_paths)`` rows; ``chunk_paths``
    (default and at most that) is how many real paths fill each forward. Results
    are identical for every ``chunk_paths`` (see the module docstring).

    ``reveal_paths`` = J > 0 also reads, for the re-weighting route of T^(1) (paper Sec. B.3),
    the target's distribution after appending the realised predecessor z*_j = Z^(j)_{k-1} of
    path j < J to *every* path's prefix Z^(s)_{<k-1}: ``revealed[k, j, s]`` =
    p_T(. | X, Z^(s)_{<k-1}, z*_j) for k >= 1. With a shared prefix the J reveals of a step
    are one forward of J sibling tokens per row, else J forwards
    (:func:`floorgap.models.shared_prefix.sibling_logits`); the cache is left as it was.
    """
    if n_paths < 1 or gamma < 1:
        raise ValueError("n_paths and gamma must be positive")
    forward_batch, chunk = forward_plan(forward_batch, chunk_paths, n_paths)
    if not 0 <= reveal_paths <= min(chunk, n_paths):
        # The revealed tokens come from the first chunk's paths, known before any later chunk.
        raise ValueError("reveal_paths must lie in [0, min(chunk_paths, n_paths)]")
    start_time = time.perf_counter()
    device = next(model.parameters()).device
    ctx = torch.tensor([context_ids], dtype=torch.long, device=device)
    # the output head runs on the last position only: the context's other rows are never read
    out = model(input_ids=ctx, use_cache=True, logits_to_keep=1)
    prefix_cache = out.cache
    p0 = law.probs(out.logits[:, -1, :]).float()  # [1, V]: every path shares slot 0's distribution
    vocab = p0.shape[-1]

    probs = torch.empty((gamma, n_paths, vocab), dtype=torch.float32, device=device)
    tokens = torch.empty((n_paths, gamma), dtype=torch.long)
    revealed = (torch.empty((gamma, reveal_paths, n_paths, vocab), dtype=torch.float32,
                            device=device) if reveal_paths else None)
    gens = [generator_for(derive_seed(anchor_seed, "path", r)) for r in range(n_paths)]
    for lo in range(0, n_paths, chunk):
        rows = list(range(lo, min(lo + chunk, n_paths)))
        n = len(rows)
        cache = path_cache(model, prefix_cache, forward_batch)
        p = p0.expand(forward_batch, vocab)
        z = torch.empty(0, dtype=torch.long, device=device)  # the previous slot's tokens
        for k in range(gamma):
            if k > 0:
                if revealed is not None:
                    z_star = tokens[:reveal_paths, k - 1].to(device)
                    logits = sibling_logits(model, z_star.expand(forward_batch, -1), cache)
                    revealed[k, :, lo:lo + n] = law.probs(logits[:n]).float().transpose(0, 1)
                logits = decode_forward(model, z.unsqueeze(-1), cache)[:, -1, :]
                p = law.probs(logits).float()
            probs[k, lo:lo + n] = p[:n]
            u = torch.stack([torch.rand((), dtype=torch.float64, generator=gens[r])
                             for r in rows])
            z_real = inverse_cdf_sample(p[:n], u)
            tokens[lo:lo + n, k] = z_real.cpu()
            # Pad rows continue the first real path; they are computed and discarded.
            z = torch.cat([z_real, z_real[:1].expand(forward_batch - n)])
        del cache
    return SampledBlock(tokens=tokens, probs=probs, revealed=revealed,
                        seconds=time.perf_counter() - start_time)


def revealed_floors(block: SampledBlock, k: int) -> Any:
    """The importance route at slot k >= 1 for each of the block's J revealed predecessors
    (:class:`floorgap.estimators.floors.ReweightedFloor`, leading dim J): weights w_s =
    p_{k-1}^(s)(z*_j) with the revealed path's own weight set to zero, since its prefix is not
    independent of its token. A j whose weights are all zero has value NaN."""
    if block.revealed is None or k < 1:
        raise ValueError("the importance route needs revealed predecessors and slot k >= 1")
    P = block.probs
    J = block.revealed.shape[1]
    weights = reveal_weights(P[k - 1], block.tokens[:J, k - 1].to(P.device))  # [J, M]
    weights[torch.arange(J), torch.arange(J)] = 0.0
    return floor_order1_reweighted(block.revealed[k], weights)


def _reweighted_slot(block: SampledBlock, k: int) -> tuple[float, float, float, int]:
    """The importance route at slot k >= 1: (mean floor, min ESS, mean ESS) over the revealed
    predecessors with some weight, and how many had none. NaNs when none had any."""
    rw = revealed_floors(block, k)
    defined = torch.isfinite(rw.value)
    n_undefined = int((~defined).sum())
    if n_undefined == defined.numel():
        nan = float("nan")
        return nan, nan, nan, n_undefined
    ess = rw.ess[defined]
    return (float(rw.value[defined].mean()), float(ess.min()), float(ess.mean()), n_undefined)


def anchor_records(anchor_id: str, block: SampledBlock, *, store_top_k: int
                   ) -> tuple[list[PathRecord], list[SlotFloorRecord]]:
    """Records of one anchor: per-path sparse reads and per-slot floors (estimators on device)."""
    P = block.probs
    gamma, M, _ = P.shape
    tokens = block.tokens
    split = alternating_split(M, device=P.device)
    path_tv0 = order0_path_tv(P)  # [gamma, M], batched over slots; its mean is T^(0)
    t0 = path_tv0.mean(-1)
    t0_split = floor_order0_split(P, split)
    floors = []
    for k in range(gamma):
        pred = None if k == 0 else tokens[:, k - 1].to(P.device)
        t1 = floor_order1_split(P[k], pred)
        t0_cov = (float(path_tv0[k][t1.covered].mean()) if bool(t1.covered.any())
                  else float("nan"))
        rw_value = rw_ess_min = rw_ess_mean = float("nan")
        rw_undefined = 0
        if block.revealed is not None and k >= 1:
            rw_value, rw_ess_min, rw_ess_mean, rw_undefined = _reweighted_slot(block, k)
        floors.append(SlotFloorRecord(
            anchor_id=anchor_id, slot=k, t0=float(t0[k]), t0_split=float(t0_split[k]),
            t0_covered=t0_cov, t1_split_cov=float(t1.value_covered),
            t1_covered_mass=float(t1.covered_mass), t1_lower=float(t1.lower),
            t1_upper=float(t1.upper), t1_uncovered_paths=int(t1.n_uncovered_paths),
            t1_plugin=float(floor_order1_plugin(P[k], pred)), t1_reweighted=rw_value,
            t1_reweighted_ess_min=rw_ess_min, t1_reweighted_ess_mean=rw_ess_mean,
            t1_reweighted_undefined=rw_undefined,
            n_eff=effective_support(tokens[:, :k]).n_eff))
    read = topk_sparse(P.transpose(0, 1), store_top_k)  # [M, gamma, K]
    logp = torch.log(block.realised_probs.double()).cpu()
    ids, vals, res = (read.indices.cpu(), read.values.cpu(), read.residual.cpu())
    paths = [PathRecord(anchor_id=anchor_id, path=r, tokens=tokens[r].tolist(),
                        logp=logp[r].tolist(), topk_ids=ids[r].flatten().tolist(),
                        topk_probs=vals[r].flatten().tolist(), residual=res[r].tolist())
             for r in range(M)]
    return paths, floors


@dataclass
class RolloutRun:
    """Records of a shard's anchors: per-path reads, per-slot floors, and each anchor's
    wall time."""

    path_rows: list[PathRecord]
    floor_rows: list[SlotFloorRecord]
    seconds: list[float]


def roll_out_anchors(model: Any, anchors: pd.DataFrame, corpus: pd.DataFrame, *,
                     cfg: Mapping[str, Any], gamma: int, law: SamplingLaw,
                     desc: str = "rollouts") -> RolloutRun:
    """Sample ``cfg["paths"]`` blocks at every anchor, in the table's order, and compute its
    path and floor records (T^(0), T^(1), N_eff per slot)."""
    contexts = anchor_contexts(corpus, anchors)
    run = RolloutRun(path_rows=[], floor_rows=[], seconds=[])
    for a, ctx in progress(zip(anchors.itertuples(index=False), contexts), total=len(anchors),
                           desc=desc, unit="anchor"):
        block = sample_block(model, ctx, n_paths=int(cfg["paths"]), gamma=gamma, law=law,
                             anchor_seed=int(a.anchor_seed),
                             forward_batch=int(cfg["forward_batch"]),
                             reveal_paths=int(cfg["reveal_paths"]))
        paths, floors = anchor_records(a.anchor_id, block, store_top_k=int(cfg["store_top_k"]))
        run.path_rows += paths
        run.floor_rows += floors
        run.seconds.append(block.seconds)
        log.info("anchor %s: context %d tokens, %.2f s, T0 by slot %s", a.anchor_id,
                 len(ctx), block.seconds, " ".join(f"{f.t0:.3f}" for f in floors))
    return run
