"""Floors under changed settings on a fixed subset of anchors (paper App. C.3, C.4, C.7).

Each variant reruns the rollout probe with one setting changed: the number of paths M (C.3:
finite-sample sensitivity), the block length gamma (C.4: longer blocks) or the sampling law
(C.7: the drafters' training law). Path r of an anchor draws from its own generator keyed by
(anchor seed, r) and every forward has ``forward_batch`` rows, so

* the first M paths of a run with M' > M paths *are* the M-path run: one pass at the largest M
  gives every smaller M on nested paths (the records say which M);
* a gamma = 16 run repeats the gamma = 7 run's tokens and probabilities on slots 0-6.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import pandas as pd

from floorgap.data.anchors import anchor_contexts
from floorgap.probes.rollouts import SampledBlock, anchor_records, sample_block
from floorgap.progress import progress
from floorgap.sampling import SamplingLaw

log = logging.getLogger("floorgap.floor_variants")


def first_paths(block: SampledBlock, n: int) -> SampledBlock:
    """The block of the first ``n`` paths (nested): the same draws as a run with ``n`` paths.
    Bit for bit when ``forward_batch`` <= n; past that the run with ``n`` paths makes forwards
    of n rows (:func:`~floorgap.probes.rollouts.forward_rows`), and a CPU's matmul may round a
    row differently at another row count."""
    revealed = None if block.revealed is None else block.revealed[:, :, :n]
    return SampledBlock(tokens=block.tokens[:n], probs=block.probs[:, :n], revealed=revealed,
                        seconds=block.seconds)


def variant_floor_rows(model: Any, anchors: pd.DataFrame, corpus: pd.DataFrame, *,
                       paths: Sequence[int], gamma: int, law: SamplingLaw, forward_batch: int,
                       desc: str = "floor_variants") -> list[dict[str, Any]]:
    """Per anchor, slot and M of ``paths``: the rollout probe's floor record (T^(0) in-sample and
    split-half, split-half and plug-in T^(1), ...) from one sampling pass at max(paths)."""
    contexts = anchor_contexts(corpus, anchors)
    rows: list[dict[str, Any]] = []
    for a, ctx in progress(zip(anchors.itertuples(index=False), contexts), total=len(anchors),
                           desc=desc, unit="anchor"):
        block = sample_block(model, ctx, n_paths=max(paths), gamma=gamma, law=law,
                             anchor_seed=int(a.anchor_seed), forward_batch=forward_batch)
        for n in sorted(paths):
            _, floors = anchor_records(a.anchor_id, first_paths(block, n), store_top_k=1)
            rows += [{**asdict(f), "domain": a.domain, "paths": n} for f in floors]
        log.info("anchor %s: %d paths x %d slots in %.1f s", a.anchor_id, max(paths), gamma,
                 block.seconds)
    return rows
