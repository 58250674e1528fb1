"""Anchors: a stratified random sample of evaluation positions on the target's own responses.

An anchor is a position ``t`` in a target-generated response; its context is
``X = prompt tokens + response[:t]`` and the realised block is ``response[t : t + gamma]``.

Eligibility. ``1 <= t`` and ``t + gamma <= n_response_tokens`` (the realised block lies inside
the response), and no special token occurs in ``response[:t + gamma]``: neither in the
response part of the context (so the committed token ``response[t-1]`` is ordinary text) nor in
the block window. In particular the EOS that ends a response is never inside a block.

Strata. Context-length bucket (upper edges from the config; the last bucket is open) x
relative position third of ``t / n_response_tokens`` (early < 1/3 <= middle < 2/3 <= late).
For a censored response ``n_response_tokens`` is ``max_new_tokens``, so its thirds are thirds
of the observed window, not of the (unseen) full response.

Allocation. ``per_domain`` anchors are split over the non-empty strata in proportion to their
sizes ``N_s`` by largest remainders, with at least one anchor per non-empty stratum when
``per_domain`` is at least the number of non-empty strata, and never more than ``N_s``. Within a
stratum, ``n_s`` positions are drawn by simple random sampling without replacement with a
generator seeded by ``derive_seed(seed, "anchors", domain, stratum)``; the inclusion
probability is ``pi = n_s / N_s``. All later probes reuse these anchors (paired design).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import torch

from floorgap.errors import StageError
from floorgap.records import TableRecord, read_metadata, read_table, sha256_file
from floorgap.seeds import derive_seed, generator_for

log = logging.getLogger("floorgap.anchors")

THIRDS = ("early", "middle", "late")


def eligible_positions(response: Sequence[int], gamma: int, special_ids: Iterable[int]) -> range:
    """Positions ``t`` of ``response`` that may carry an anchor with block length ``gamma``."""
    if gamma < 1:
        raise ValueError("gamma must be >= 1")
    special = set(special_ids)
    clean = next((i for i, tok in enumerate(response) if tok in special), len(response))
    return range(1, max(1, clean - gamma + 1))


def bucket_labels(edges: Sequence[int]) -> list[str]:
    """Labels of the context-length buckets for increasing upper ``edges``."""
    lows = [1, *(hi + 1 for hi in edges)]
    return [f"{lo}-{hi}" for lo, hi in zip(lows, edges)] + [f"{lows[-1]}+"]


def bucket_index(context_len: int, edges: Sequence[int]) -> int:
    """Index of the bucket holding ``context_len`` (bucket i covers (edges[i-1], edges[i]])."""
    return bisect.bisect_left(edges, context_len)


def third_of(t: int, n: int) -> str:
    """Relative position of ``t`` in a response of ``n`` tokens: early (3t < n), middle
    (3t < 2n) or late."""
    return THIRDS[min(3 * t // n, 2)]


def allocate(sizes: Mapping[str, int], total: int) -> dict[str, int]:
    """Split ``total`` draws over strata of the given sizes (see the module docstring).

    Strata are visited in the mapping's order to break ties, so pass them sorted. When
    ``total`` is at least the sum of the sizes every stratum is taken whole.
    """
    keys = [k for k, v in sizes.items() if v > 0]
    n_pop = sum(sizes[k] for k in keys)
    if total >= n_pop:
        return {k: int(sizes[k]) for k in keys}
    quota = {k: total * sizes[k] / n_pop for k in keys}
    floor = 1 if total >= len(keys) else 0
    alloc = {k: min(sizes[k], max(floor, math.floor(quota[k]))) for k in keys}
    while sum(alloc.values()) < total:  # largest remainder first
        k = max((k for k in keys if alloc[k] < sizes[k]), key=lambda k: quota[k] - alloc[k])
        alloc[k] += 1
    while sum(alloc.values()) > total:  # forced minima overshot: take from the most over-served
        k = max((k for k in keys if alloc[k] > floor), key=lambda k: alloc[k] - quota[k])
        alloc[k] -= 1
    return alloc


def optional_str(value: Any) -> str | None:
    """A nullable string cell as read back by pandas (None, NaN or pd.NA mean missing)."""
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA:
        return None
    return str(value)


ANCHOR_SCHEMA = pa.schema([
    ("anchor_id", pa.string()), ("prompt_id", pa.string()), ("domain", pa.string()),
    ("stand_in_for", pa.string()), ("t", pa.int32()), ("n_prompt_tokens", pa.int32()),
    ("n_response_tokens", pa.int32()), ("context_len", pa.int32()), ("bucket", pa.string()),
    ("third", pa.string()), ("stratum", pa.string()), ("N_s", pa.int64()), ("n_s", pa.int64()),
    ("pi", pa.float64()), ("anchor_seed", pa.int64()), ("committed_token", pa.int32()),
    ("block_tokens", pa.list_(pa.int32())), ("response_censored", pa.bool_()),
])


@dataclass
class _Candidates:
    """Eligible positions of a corpus grouped by stratum (``bucket|third``)."""
    by_stratum: dict[str, list[tuple[str, int]]]
    rows_by_prompt: dict[str, Any]
    n_with_eligible: int


def _eligible_candidates(corpus: pd.DataFrame, *, gamma: int, edges: Sequence[int],
                         labels: Sequence[str], special: set[int]) -> _Candidates:
    """Every eligible ``(prompt_id, t)`` of the corpus, keyed by its stratum."""
    candidates: dict[str, list[tuple[str, int]]] = {}
    rows_by_prompt: dict[str, Any] = {}
    n_with_eligible = 0
    for row in corpus.itertuples(index=False):
        response = [int(x) for x in row.response_token_ids]
        n = len(response)
        if n != int(row.n_response_tokens):
            raise StageError(f"{row.prompt_id}: n_response_tokens disagrees with the token list")
        rows_by_prompt[row.prompt_id] = (row, response)
        positions = eligible_positions(response, gamma, special)
        n_with_eligible += len(positions) > 0
        for t in positions:
            bucket = labels[bucket_index(int(row.n_prompt_tokens) + t, edges)]
            candidates.setdefault(f"{bucket}|{third_of(t, n)}", []).append((row.prompt_id, t))
    return _Candidates(candidates, rows_by_prompt, n_with_eligible)


def _draw_stratum(cands: _Candidates, s: str, n_s: int, *, seed: int, domain: str,
                  gamma: int) -> list[dict[str, Any]]:
    """The ``n_s`` anchor rows of stratum ``s``: a simple random sample without replacement of
    its sorted pool, from the stratum's own generator (so strata never share draws)."""
    big_n = len(cands.by_stratum[s])
    pool = sorted(cands.by_stratum[s])
    gen = generator_for(derive_seed(seed, "anchors", domain, s))
    picks = torch.randperm(big_n, generator=gen)[:n_s].tolist()
    bucket, third = s.split("|")
    out = []
    for k in picks:
        pid, t = pool[k]
        row, response = cands.rows_by_prompt[pid]
        anchor_id = f"{pid}@{t}"
        out.append({
            "anchor_id": anchor_id, "prompt_id": pid, "domain": row.domain,
            "stand_in_for": optional_str(row.stand_in_for), "t": t,
            "n_prompt_tokens": int(row.n_prompt_tokens), "n_response_tokens": len(response),
            "context_len": int(row.n_prompt_tokens) + t, "bucket": bucket, "third": third,
            "stratum": s, "N_s": big_n, "n_s": n_s, "pi": n_s / big_n,
            "anchor_seed": derive_seed(seed, "anchor", anchor_id),
            "committed_token": response[t - 1], "block_tokens": response[t:t + gamma],
            "response_censored": bool(row.censored),
        })
    return out


def _log_allocation_warnings(domain: str, *, total: int, per_domain: int, strata: list[str],
                             alloc: dict[str, int]) -> tuple[int, list[str]]:
    """The shortfall and the non-empty strata left unsampled, each logged as a warning."""
    shortfall = max(0, per_domain - total)
    if shortfall:
        log.warning("%s: only %d eligible positions for %d anchors: all are taken (pi = 1)",
                    domain, total, per_domain)
    empty_sampled = [s for s in strata if alloc.get(s, 0) == 0]
    if empty_sampled:
        log.warning("%s: %d non-empty strata receive no anchor (per_domain %d < %d strata)",
                    domain, len(empty_sampled), per_domain, len(strata))
    return shortfall, empty_sampled


def sample_anchors(corpus: pd.DataFrame, *, domain: str, per_domain: int, gamma: int,
                   context_buckets: Sequence[int], seed: int,
                   special_ids: Iterable[int]) -> TableRecord:
    """Draw the stratified anchor sample of one domain from its corpus records."""
    edges = [int(e) for e in context_buckets]
    if edges != sorted(set(edges)):
        raise StageError(f"context_buckets must be strictly increasing, got {edges}")
    labels = bucket_labels(edges)
    special = set(int(s) for s in special_ids)
    cands = _eligible_candidates(corpus, gamma=gamma, edges=edges, labels=labels,
                                 special=special)
    order = {f"{lab}|{th}": (i, j) for i, lab in enumerate(labels) for j, th in enumerate(THIRDS)}
    strata = sorted(cands.by_stratum, key=order.__getitem__)
    sizes = {s: len(cands.by_stratum[s]) for s in strata}
    total = sum(sizes.values())
    if total == 0:
        raise StageError(f"{domain}: no eligible anchor position (gamma={gamma}) in "
                         f"{len(corpus)} responses")
    alloc = allocate(sizes, per_domain)
    shortfall, empty_sampled = _log_allocation_warnings(domain, total=total, per_domain=per_domain,
                                                        strata=strata, alloc=alloc)
    out = [row for s in strata if alloc.get(s, 0)
           for row in _draw_stratum(cands, s, alloc[s], seed=seed, domain=domain, gamma=gamma)]
    out.sort(key=lambda a: (a["prompt_id"], a["t"]))
    table = pa.Table.from_pylist(out, schema=ANCHOR_SCHEMA)
    metadata = {
        "stage": "anchors", "domain": domain, "gamma": gamma, "per_domain": per_domain,
        "context_buckets": edges, "bucket_labels": labels, "seed": seed,
        "special_token_ids": sorted(special),
        "strata": [{"stratum": s, "N_s": sizes[s], "n_s": alloc.get(s, 0),
                    "pi": alloc.get(s, 0) / sizes[s]} for s in strata],
        "counts": {"responses": len(corpus), "responses_with_eligible": cands.n_with_eligible,
                   "eligible": total, "anchors": len(out), "prompts": len({a["prompt_id"]
                                                                          for a in out}),
                   "strata_nonempty": len(strata), "strata_sampled": len(strata) -
                   len(empty_sampled), "shortfall": shortfall},
    }
    return TableRecord(table, metadata)


def anchors_from_corpus_file(corpus_path: Path, spec: dict[str, Any]) -> TableRecord:
    """Read a corpus record, check it belongs to ``spec["domain"]`` and draw its anchors; the
    metadata also records the corpus file (path, hash, counts) and its target and law."""
    cfg = spec["anchors"]
    corpus = read_table(corpus_path)
    corpus_meta = read_metadata(corpus_path)
    special = corpus_meta.get("special_token_ids", corpus_meta.get("all_special_ids"))
    if special is None:
        raise StageError(f"{corpus_path} records no special token ids; regenerate the corpus")
    if corpus_meta.get("domain") not in (None, spec["domain"]):
        raise StageError(f"{corpus_path} holds domain {corpus_meta.get('domain')!r}, "
                         f"not {spec['domain']!r}")
    result = sample_anchors(corpus, domain=spec["domain"], per_domain=int(cfg["per_domain"]),
                            gamma=int(cfg["gamma"]), context_buckets=cfg["context_buckets"],
                            seed=int(spec["seed"]), special_ids=special)
    meta = result.metadata | {
        "corpus": {"path": str(corpus_path), "sha256": sha256_file(corpus_path),
                   "counts": corpus_meta.get("counts")},
        **{k: corpus_meta.get(k) for k in ("stand_in_for", "provenance", "target", "law")},
    }
    return TableRecord(result.table, meta)


def anchor_contexts(corpus: pd.DataFrame, anchors: pd.DataFrame) -> list[list[int]]:
    """Context token ids ``prompt + response[:t]`` of each anchor row, in the anchors' order."""
    by_prompt = {r.prompt_id: r for r in corpus.itertuples(index=False)}
    contexts = []
    for a in anchors.itertuples(index=False):
        r = by_prompt[a.prompt_id]
        ctx = [int(x) for x in r.prompt_token_ids] + [int(x) for x in r.response_token_ids[:a.t]]
        if len(ctx) != a.context_len:
            raise ValueError(f"{a.anchor_id}: context length mismatch")
        contexts.append(ctx)
    return contexts


def check_anchors_gamma(anchors_path: Path, anchor_meta: Mapping[str, Any], gamma: int) -> None:
    """Raise :class:`StageError` when the anchors file was drawn for another block length."""
    if int(anchor_meta.get("gamma", gamma)) != gamma:
        raise StageError(f"{anchors_path} was drawn for gamma={anchor_meta.get('gamma')}, "
                         f"not {gamma}; rebuild the anchors")


def shard_rows(anchors: pd.DataFrame, shard: int, shards: int) -> pd.DataFrame:
    """The anchors of one shard: row i of the id-sorted table goes to shard i mod ``shards``."""
    if not 0 <= shard < shards:
        raise StageError(f"shard {shard} is outside 0..{shards - 1}")
    ordered = anchors.sort_values("anchor_id", kind="stable").reset_index(drop=True)
    return ordered.iloc[shard::shards].reset_index(drop=True)


def read_shard(anchors_path: Path, corpus_path: Path, *, shard: int, shards: int,
                      gamma: int) -> tuple[pd.DataFrame, dict[str, Any], pd.DataFrame]:
    """One shard's anchors (:func:`shard_rows`), the anchors' metadata and the corpus; the shard
    must hold anchors drawn for this ``gamma`` (the rollouts and drafter_eval stages)."""
    anchors = shard_rows(read_table(anchors_path), shard, shards)
    if not len(anchors):
        raise StageError(f"shard {shard} of {anchors_path} holds no anchors; "
                         f"lower rollouts.shards (now {shards})")
    corpus = read_table(corpus_path)
    anchor_meta = read_metadata(anchors_path)
    check_anchors_gamma(anchors_path, anchor_meta, gamma)
    return anchors, anchor_meta, corpus


def leading_anchors(anchors: pd.DataFrame, per_domain: int, room: int | None = None
                    ) -> pd.DataFrame:
    """The first ``per_domain`` anchors of each domain by anchor id (domains in id order): the
    fixed subset the robustness probes share. ``room``: keep only anchors whose response holds a
    block of ``room`` tokens after the anchor (``t + room <= n_response_tokens``)."""
    ordered = anchors.sort_values("anchor_id", kind="stable")
    if room is not None:
        ordered = ordered[ordered["t"] + int(room) <= ordered["n_response_tokens"]]
    return ordered.groupby("domain", sort=True).head(int(per_domain)).reset_index(drop=True)
