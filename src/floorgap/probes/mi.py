"""Mutual-information recovery at an anchor: the model work behind rho_{k,m} (paper B.2, D.3).

Two independent passes of fresh target paths per anchor, both drawn with
:func:`floorgap.probes.rollouts.sample_block` under anchor seeds derived from the anchor's own
(``"mi-screen"`` and ``"mi"``), so they share no draws with each other or with the rollouts:

* **Screen.** ``screen_paths`` paths; at the final slot k = gamma - 1 every path's token is
  scored teacher forced on its own prefix and mixed over the other paths' prefixes. The mean
  of the per-path missing information C_{k,0} - C_{k,k} is the anchor's screen value; only
  anchors above the threshold get the measurement (:func:`screen_anchor`).
* **Measurement.** ``paths`` = M paths. Path 0 supplies the scored tokens z*_k; paths
  1..M-1 are prefixes sampled independently of it. C_{k,m} needs, for every prefix s, the
  target on X + Z^(s)_{<k-m} + (z*_{k-m}, ..., z*_{k-1}): one teacher-forced forward per
  start j = k - m and chunk of prefixes serves every (k, m) with that start, reading
  log p(z*_k | ...) and the log-probabilities of the revealed tokens (their sum is the log
  weight of the prefix) at once (:func:`conditioned_logprobs`). C_{k,0} (m = 0, start k) and
  C_{k,k} (path 0's own prefix as the row) come from the same teacher-forced pass, so all three
  terms of rho_{k,m} are float64 log-softmax reads of one kind of forward: a ratio of
  differences of log-losses must not mix them with the float32 probabilities read while
  sampling.

The estimator math (mixtures, weights, ESS) lives in :mod:`floorgap.estimators.mi`.

Determinism. As in the rollouts, every forward of a pass has exactly
``forward_rows(forward_batch, paths of the pass)`` rows (real prefixes padded with copies of
the first one), so a prefix's numbers depend only on the anchor, its index, the pass's size and
``forward_batch``, never on how prefixes are chunked.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from floorgap.data.anchors import anchor_contexts, check_anchors_gamma
from floorgap.errors import StageError
from floorgap.estimators.mi import (MICellLosses, leave_one_out_missing_information,
                                    mi_cell_losses, screen_anchors)
from floorgap.progress import progress
from floorgap.records import read_metadata, read_table
from floorgap.models.shared_prefix import decode_forward, path_cache
from floorgap.probes.rollouts import forward_plan, sample_block
from floorgap.sampling import SamplingLaw
from floorgap.seeds import derive_seed

log = logging.getLogger("floorgap.mi")

SCREEN_KEY = "mi-screen"
MEASURE_KEY = "mi"


@dataclass(frozen=True)
class ScreenResult:
    """Screening pass at one anchor: the final-slot missing information of every path
    (``per_path``, nats) and their mean ``value``; ``seconds``: wall time."""

    per_path: torch.Tensor
    value: float
    seconds: float


@dataclass(frozen=True)
class MIMeasurement:
    """Recovery measurement at one anchor.

    ``tokens`` ``[M, gamma]``: path 0 is the scored block z*, paths 1..M-1 the prefixes;
    ``losses``: :class:`MICellLosses` over slots, ``c_kk``/``c_k0`` ``[gamma]`` (NaN at slot
    0, where nothing is realised yet) and ``c_km``/``ess`` ``[gamma, J]`` for the orders in
    ``orders`` (NaN where m >= k, where the last m tokens are the whole realised prefix);
    ``seconds``: wall time.
    """

    tokens: torch.Tensor
    orders: tuple[int, ...]
    losses: MICellLosses
    seconds: float


def realised_logp(probs: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """``[gamma, R, S]`` float64: log p_k^(s)(tokens[r, k]), path r's token at slot k under
    the distribution along path s (``probs`` ``[gamma, S, V]``, ``tokens`` ``[R, gamma]``)."""
    idx = tokens.to(probs.device).T  # [gamma, R]
    picked = torch.stack([probs[k][:, idx[k]] for k in range(probs.shape[0])])  # [gamma, S, R]
    return torch.log(picked.transpose(1, 2).double())


def screen_anchor(model: Any, context_ids: list[int], *, n_paths: int, gamma: int,
                  law: SamplingLaw, anchor_seed: int, forward_batch: int,
                  chunk_paths: int | None = None) -> ScreenResult:
    """The screening value of B.2: mean final-slot C_{k,0} - C_{k,k} over ``n_paths`` fresh
    paths, each scored against the other paths as prefixes (``anchor_seed`` is the anchor's;
    the pass derives its own)."""
    if gamma < 2 or n_paths < 2:
        raise ValueError("screening needs gamma >= 2 and at least 2 paths")
    start = time.perf_counter()
    block = sample_block(model, context_ids, n_paths=n_paths, gamma=gamma, law=law,
                         anchor_seed=derive_seed(anchor_seed, SCREEN_KEY),
                         forward_batch=forward_batch, chunk_paths=chunk_paths)
    k = gamma - 1
    cross = realised_logp(block.probs[k:], block.tokens[:, k:])[0]  # [R, S]
    d = leave_one_out_missing_information(cross).cpu()
    return ScreenResult(per_path=d, value=float(d.mean()), seconds=time.perf_counter() - start)


def law_logprob(law: SamplingLaw, logits: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """log p(index) under ``law`` (float64), gathered along the last dim of ``logits``.

    Without truncation this is a log-softmax at the law's temperature, which keeps tail
    tokens exact; with truncation, the log of the law's probabilities (-inf off its support).
    """
    if law.is_plain:
        x = logits.to(torch.float64) / law.temperature
        return x.gather(-1, index) - torch.logsumexp(x, dim=-1, keepdim=True)
    return torch.log(law.probs(logits).gather(-1, index))


def cell_starts(gamma: int, orders: Sequence[int]) -> dict[int, int]:
    """Start j = k - m of every measured cell (m in ``orders``, m < k < gamma), mapped to the
    largest slot k scored from it. Order 0 gives the starts j = k of the blind terms."""
    starts: dict[int, int] = {}
    for k in range(gamma):
        for m in orders:
            if m < k:
                starts[k - m] = max(starts.get(k - m, 0), k)
    return dict(sorted(starts.items()))


@torch.inference_mode()
def conditioned_logprobs(model: Any, context_ids: list[int], prefixes: torch.Tensor,
                         z_star: torch.Tensor, starts: dict[int, int], *, law: SamplingLaw,
                         forward_batch: int, chunk_paths: int | None = None
                         ) -> dict[int, torch.Tensor]:
    """Teacher-forced log-probabilities of the scored block after truncated prefixes.

    For every start j with last slot K = ``starts[j]`` and every row s of ``prefixes``
    (``[S, >= K]`` tokens) the target reads X + prefixes[s, :j] + z*[j:K]; the result
    ``out[j]`` ``[S, K - j + 1]`` float64 holds, at column i,
    log p(z*_{j+i} | X, prefixes[s, :j], z*_j, ..., z*_{j+i-1}) under ``law``: columns 0..i-1
    are the revealed tokens' log-probabilities, column i the score of z*_{j+i}.

    The prompt is prefilled once; each chunk of ``chunk_paths`` prefixes (default and at most
    ``forward_rows(forward_batch, S)``, the rows of every forward) copies its cache once and
    crops it back after every start.
    """
    if not starts:
        return {}
    if min(starts) < 1:
        raise ValueError("every start must reveal after at least one prefix token")
    forward_batch, chunk = forward_plan(forward_batch, chunk_paths, prefixes.shape[0])
    device = next(model.parameters()).device
    n_rows = prefixes.shape[0]
    prefixes = prefixes.to(device)
    z_star = z_star.to(device)
    ctx = torch.tensor([context_ids], dtype=torch.long, device=device)
    prefix_cache = model(input_ids=ctx, use_cache=True, logits_to_keep=1).cache
    out = {j: torch.empty((n_rows, last - j + 1), dtype=torch.float64)
           for j, last in starts.items()}
    for lo in range(0, n_rows, chunk):
        hi = min(lo + chunk, n_rows)
        n = hi - lo
        cache = path_cache(model, prefix_cache, forward_batch)
        rows = prefixes[lo:hi]
        # Pad rows repeat the first real prefix; they are computed and discarded.
        rows = torch.cat([rows, rows[:1].expand(forward_batch - n, -1)])
        for j, last in starts.items():
            tail = z_star[j:last].unsqueeze(0).expand(forward_batch, -1)
            inputs = torch.cat([rows[:, :j], tail], dim=1)  # [B, last]
            keep = last - j + 1  # logits at positions j-1..last-1 predict z*_j..z*_last
            logits = decode_forward(model, inputs, cache, logits_to_keep=keep)
            target = z_star[j:last + 1].view(1, keep, 1).expand(n, keep, 1)
            out[j][lo:hi] = law_logprob(law, logits[:n], target).squeeze(-1).cpu()
            cache.crop(-last)  # drop this start's tokens again
        del cache
    return out


def measure_anchor(model: Any, context_ids: list[int], *, n_paths: int, gamma: int,
                   orders: Sequence[int], law: SamplingLaw, anchor_seed: int,
                   forward_batch: int, chunk_paths: int | None = None) -> MIMeasurement:
    """C_{k,k}, C_{k,0} and C_{k,m} at every slot of one anchor from ``n_paths`` fresh paths
    (one scored path and ``n_paths - 1`` prefixes; ``anchor_seed`` is the anchor's)."""
    if n_paths < 2:
        raise ValueError("the measurement needs the scored path and at least one prefix")
    orders = tuple(int(m) for m in orders)
    if not orders or min(orders) < 1:
        raise ValueError("orders must be positive")
    start = time.perf_counter()
    block = sample_block(model, context_ids, n_paths=n_paths, gamma=gamma, law=law,
                         anchor_seed=derive_seed(anchor_seed, MEASURE_KEY),
                         forward_batch=forward_batch, chunk_paths=chunk_paths)
    tokens = block.tokens
    # Row 0 is z*'s own prefix (the teacher-forced term), rows 1..M-1 the sampled prefixes.
    cond = conditioned_logprobs(model, context_ids, tokens, tokens[0],
                                cell_starts(gamma, (0, *orders)), law=law,
                                forward_batch=forward_batch, chunk_paths=chunk_paths)
    losses = mi_losses_of_pass(cond, gamma, orders)
    return MIMeasurement(tokens=tokens, orders=orders, losses=losses,
                         seconds=time.perf_counter() - start)


def mi_losses_of_pass(cond: Mapping[int, torch.Tensor], gamma: int, orders: Sequence[int]
                      ) -> MICellLosses:
    """C_{k,k}, C_{k,0} and C_{k,m} from one teacher-forced pass (:func:`conditioned_logprobs`
    over the rows z*, S_1, ..., S_{M-1} with the starts of ``(0, *orders)``).

    Start j = k, column 0 gives log p(z*_k | X, row[:k]): row 0 (z*'s own prefix) is the
    teacher term, rows 1.. the blind terms. Start k - m gives the conditioned term (column m)
    and the revealed tokens' log weight (columns 0..m-1). Slot 0 and cells with m >= k are NaN.
    """
    n_ord = len(orders)
    n_pre = next(iter(cond.values())).shape[0] - 1
    nan = float("nan")
    logp_teacher = torch.zeros(gamma, dtype=torch.float64)
    logp_blind = torch.zeros((gamma, n_pre), dtype=torch.float64)
    logp_cond = torch.zeros((gamma, n_pre, n_ord), dtype=torch.float64)
    logw_reveal = torch.zeros_like(logp_cond)
    valid = torch.zeros((gamma, n_ord), dtype=torch.bool)
    for k in range(1, gamma):
        logp_teacher[k] = cond[k][0, 0]
        logp_blind[k] = cond[k][1:, 0]
        for jm, m in enumerate(orders):
            if m >= k:
                continue
            c = cond[k - m][1:]  # columns 0..m-1: revealed z*_{k-m..k-1}; column m: z*_k
            logp_cond[k, :, jm] = c[:, m]
            logw_reveal[k, :, jm] = c[:, :m].sum(-1)
            valid[k, jm] = True
    losses = mi_cell_losses(logp_teacher, logp_blind, logp_cond, logw_reveal)
    slot = torch.arange(gamma) >= 1
    return MICellLosses(c_kk=torch.where(slot, losses.c_kk, nan),
                        c_k0=torch.where(slot, losses.c_k0, nan),
                        c_km=torch.where(valid, losses.c_km, nan),
                        ess=torch.where(valid, losses.ess, nan))


@dataclass(frozen=True)
class MICellRecord:
    """One anchor x slot x order cell of the recovery measurement (losses in nats).

    ``screened``: the anchor passed the screen (its ``screen`` value, the mean final-slot
    missing information of the screening pass, exceeds the threshold); screened-out anchors
    keep their rows with NaN losses. ``c_km`` and ``ess`` are NaN where m >= k (the last m
    tokens are the whole prefix: C_{k,m} = C_{k,k}). ``token``: the scored token z*_k.
    """

    anchor_id: str
    prompt_id: str
    domain: str
    pi: float
    slot: int
    order: int
    token: int
    c_k0: float
    c_km: float
    c_kk: float
    ess: float
    screened: bool
    screen: float


def anchor_cells(anchor: Any, screen: ScreenResult, measured: MIMeasurement | None, *,
                 screened: bool, gamma: int, orders: Sequence[int]) -> list[MICellRecord]:
    """Rows of one anchor for slots 1..gamma-1 and every order (``anchor``: a row of the
    anchors table with ``anchor_id``, ``prompt_id``, ``domain``, ``pi``)."""
    rows = []
    nan = float("nan")
    for k in range(1, gamma):
        for jm, m in enumerate(orders):
            if measured is None:
                token, c0, cm, ck, ess = -1, nan, nan, nan, nan
            else:
                L = measured.losses
                token = int(measured.tokens[0, k])
                c0, ck = float(L.c_k0[k]), float(L.c_kk[k])
                cm, ess = float(L.c_km[k, jm]), float(L.ess[k, jm])
            rows.append(MICellRecord(
                anchor_id=str(anchor.anchor_id), prompt_id=str(anchor.prompt_id),
                domain=str(anchor.domain), pi=float(anchor.pi), slot=k, order=int(m),
                token=token, c_k0=c0, c_km=cm, c_kk=ck, ess=ess, screened=bool(screened),
                screen=float(screen.value)))
    return rows


@dataclass
class MIRun:
    """The MI probe over one domain's anchors: every anchor's cells (``rows``), how many
    anchors passed the screen, and the wall time of each screening and measuring pass."""

    rows: list[MICellRecord]
    n_screened: int
    screen_seconds: list[float]
    measure_seconds: list[float]


def probe_anchor(model: Any, anchor: Any, context_ids: list[int], *, cfg: Mapping[str, Any],
                 gamma: int, law: SamplingLaw, forward_batch: int
                 ) -> tuple[ScreenResult, MIMeasurement | None]:
    """Screen one anchor and, when its missing information exceeds ``threshold_nats``, measure
    C_{k,0}, C_{k,m}, C_{k,k} for every order of ``cfg["orders"]``."""
    threshold = float(cfg["threshold_nats"])
    seed = int(anchor.anchor_seed)
    screen = screen_anchor(model, context_ids, n_paths=int(cfg["screen_paths"]), gamma=gamma,
                           law=law, anchor_seed=seed, forward_batch=forward_batch)
    if not bool(screen_anchors(torch.tensor(screen.value), threshold)):
        log.info("anchor %s: context %d tokens, screen %.3f nats <= %.3f: screened out "
                 "(%.2f s)", anchor.anchor_id, len(context_ids), screen.value, threshold,
                 screen.seconds)
        return screen, None
    measured = measure_anchor(model, context_ids, n_paths=int(cfg["paths"]), gamma=gamma,
                              orders=[int(m) for m in cfg["orders"]], law=law, anchor_seed=seed,
                              forward_batch=forward_batch)
    L = measured.losses
    d = (L.c_k0 - L.c_kk)[1:]
    log.info("anchor %s: context %d tokens, screen %.3f nats (%.2f s), measured "
             "(%.2f s): d by slot %s, min ESS %.1f", anchor.anchor_id, len(context_ids),
             screen.value, screen.seconds, measured.seconds,
             " ".join(f"{float(x):.3f}" for x in d),
             float(torch.nan_to_num(L.ess, nan=float("inf")).min()))
    return screen, measured


def read_mi_inputs(anchors_path: Path, corpus_path: Path, gamma: int
                   ) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame]:
    """The anchors (sorted by id), their metadata and the corpus of one domain, checked: MI
    needs gamma >= 2 and anchors drawn for this gamma."""
    if gamma < 2:
        raise StageError(f"mutual-information recovery needs gamma >= 2 (got {gamma})")
    anchors = read_table(anchors_path).sort_values("anchor_id", kind="stable")
    anchors = anchors.reset_index(drop=True)
    if not len(anchors):
        raise StageError(f"{anchors_path} holds no anchors")
    anchor_meta = read_metadata(anchors_path)
    check_anchors_gamma(anchors_path, anchor_meta, gamma)
    return anchors, anchor_meta, read_table(corpus_path)


def probe_anchors(model: Any, anchors: pd.DataFrame, corpus: pd.DataFrame, *,
                  cfg: Mapping[str, Any], gamma: int, law: SamplingLaw, forward_batch: int,
                  desc: str = "mi") -> MIRun:
    """Screen, and measure where screened in, every anchor in the table's order (the cells of
    screened-out anchors keep their screen value and NaN losses)."""
    orders = [int(m) for m in cfg["orders"]]
    contexts = anchor_contexts(corpus, anchors)
    run = MIRun(rows=[], n_screened=0, screen_seconds=[], measure_seconds=[])
    for a, ctx in progress(zip(anchors.itertuples(index=False), contexts), total=len(anchors),
                           desc=desc, unit="anchor"):
        screen, measured = probe_anchor(model, a, ctx, cfg=cfg, gamma=gamma, law=law,
                                        forward_batch=forward_batch)
        run.screen_seconds.append(screen.seconds)
        if measured is not None:
            run.n_screened += 1
            run.measure_seconds.append(measured.seconds)
        run.rows += anchor_cells(a, screen, measured, screened=measured is not None,
                                 gamma=gamma, orders=orders)
    return run


def non_finite_cells(table: pd.DataFrame) -> int:
    """Measured cells (screened in, m < k) whose losses are not all finite."""
    measured_rows = table[table.screened & table.slot.gt(table.order)]
    losses = measured_rows[["c_k0", "c_km", "c_kk"]].to_numpy(dtype=float)
    return int((~np.isfinite(losses).all(axis=1)).sum())
