"""Anchor eligibility, stratification, allocation and inclusion probabilities."""

from __future__ import annotations

import random

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.errors import StageError
from floorgap.data.anchors import (
    allocate,
    anchor_contexts,
    bucket_index,
    bucket_labels,
    eligible_positions,
    sample_anchors,
    third_of,
)
from floorgap.seeds import derive_seed

SPECIAL = {0, 1, 2}
EOS = 2
GAMMA = 4
EDGES = [40, 80]


def synthetic_corpus(n_prompts: int = 12, seed: int = 0) -> pd.DataFrame:
    rng = random.Random(seed)
    rows = []
    for i in range(n_prompts):
        n_prompt = rng.randint(5, 70)
        n_resp = rng.randint(1, 60)
        resp = [rng.randint(3, 500) for _ in range(n_resp)]
        censored = rng.random() < 0.3
        if not censored:
            resp[-1] = EOS
        if rng.random() < 0.2 and n_resp > 10:  # a stray special token mid-response
            resp[rng.randint(0, n_resp - 2)] = 1
        rows.append({"prompt_id": f"syn:{i:04d}", "domain": "syn", "stand_in_for": None,
                     "prompt_token_ids": [1] + [rng.randint(3, 500) for _ in range(n_prompt - 1)],
                     "response_token_ids": resp, "n_prompt_tokens": n_prompt,
                     "n_response_tokens": n_resp, "censored": censored})
    return pd.DataFrame(rows)


def brute_force_eligible(corpus: pd.DataFrame) -> dict[str, list[tuple[str, int]]]:
    labels = bucket_labels(EDGES)
    strata: dict[str, list[tuple[str, int]]] = {}
    for r in corpus.itertuples():
        resp = list(r.response_token_ids)
        n = len(resp)
        for t in range(0, n + 1):
            ok = (t >= 1 and t + GAMMA <= n
                  and not any(tok in SPECIAL for tok in resp[:t + GAMMA]))
            if ok:
                ctx = r.n_prompt_tokens + t
                b = 0 if ctx <= EDGES[0] else 1 if ctx <= EDGES[1] else 2
                third = ("early" if t / n < 1 / 3 else "middle" if t / n < 2 / 3 else "late")
                strata.setdefault(f"{labels[b]}|{third}", []).append((r.prompt_id, t))
    return strata


def run(corpus, per_domain=20, seed=7):
    return sample_anchors(corpus, domain="syn", per_domain=per_domain, gamma=GAMMA,
                          context_buckets=EDGES, seed=seed, special_ids=SPECIAL)


def test_eligible_positions():
    assert list(eligible_positions([5, 6, 7, 8, 9, 2], 3, SPECIAL)) == [1, 2]
    assert list(eligible_positions([5, 6, 7], 3, SPECIAL)) == []
    assert list(eligible_positions([5, 6, 7, 8], 3, SPECIAL)) == [1]
    assert list(eligible_positions([5, 1, 7, 8, 9, 10], 2, SPECIAL)) == []
    assert list(eligible_positions([5, 6, 7, 1, 9, 10, 11, 12], 2, SPECIAL)) == [1]
    assert list(eligible_positions([], 1, SPECIAL)) == []


def test_buckets_and_thirds():
    assert bucket_labels([256, 512]) == ["1-256", "257-512", "513+"]
    assert [bucket_index(c, [256, 512]) for c in (1, 256, 257, 512, 513, 9000)] == [0, 0, 1, 1,
                                                                                   2, 2]
    assert [third_of(t, 9) for t in (1, 2, 3, 5, 6, 8)] == ["early", "early", "middle",
                                                            "middle", "late", "late"]


def test_strata_sizes_and_inclusion_probabilities():
    corpus = synthetic_corpus()
    truth = brute_force_eligible(corpus)
    res = run(corpus)
    df = res.table.to_pandas()
    assert len(df) == 20
    meta_sizes = {s["stratum"]: s["N_s"] for s in res.metadata["strata"]}
    assert meta_sizes == {k: len(v) for k, v in truth.items()}
    for r in df.itertuples():
        assert (r.prompt_id, r.t) in truth[r.stratum]
        assert r.N_s == len(truth[r.stratum])
        assert r.n_s == (df.stratum == r.stratum).sum()
        assert r.pi == pytest.approx(r.n_s / r.N_s)
        assert r.anchor_id == f"{r.prompt_id}@{r.t}"
        assert r.anchor_seed == derive_seed(7, "anchor", r.anchor_id)
        resp = corpus.set_index("prompt_id").loc[r.prompt_id, "response_token_ids"]
        assert r.committed_token == resp[r.t - 1]
        assert list(r.block_tokens) == list(resp[r.t:r.t + GAMMA])
        assert not SPECIAL & {r.committed_token, *r.block_tokens}
        assert r.context_len == r.n_prompt_tokens + r.t
        assert r.t + GAMMA <= r.n_response_tokens
    assert res.metadata["counts"]["eligible"] == sum(len(v) for v in truth.values())
    assert sum(s["n_s"] for s in res.metadata["strata"]) == 20
    # at least one anchor in every non-empty stratum when per_domain allows it
    assert all(s["n_s"] >= 1 for s in res.metadata["strata"])
    assert list(zip(df.prompt_id, df.t)) == sorted(zip(df.prompt_id, df.t))
    assert df.anchor_id.is_unique


def test_deterministic_and_seeded():
    corpus = synthetic_corpus()
    a, b = run(corpus), run(corpus.sample(frac=1, random_state=3))
    assert a.table.equals(b.table)
    assert a.metadata == b.metadata
    c = run(corpus, seed=8)
    assert c.table.column("anchor_id").to_pylist() != a.table.column("anchor_id").to_pylist()


def test_shortfall_takes_everything():
    corpus = synthetic_corpus(3, seed=5)
    total = sum(len(v) for v in brute_force_eligible(corpus).values())
    res = run(corpus, per_domain=total + 10)
    df = res.table.to_pandas()
    assert len(df) == total and (df.pi == 1.0).all()
    assert res.metadata["counts"]["shortfall"] == 10


def test_no_eligible_position_fails():
    corpus = pd.DataFrame([{"prompt_id": "syn:0", "domain": "syn", "stand_in_for": None,
                            "prompt_token_ids": [1, 5], "response_token_ids": [7, 2],
                            "n_prompt_tokens": 2, "n_response_tokens": 2, "censored": False}])
    with pytest.raises(StageError, match="no eligible anchor"):
        run(corpus)


def test_anchor_contexts():
    corpus = synthetic_corpus()
    df = run(corpus).table.to_pandas()
    ctxs = anchor_contexts(corpus, df)
    for ctx, r in zip(ctxs, df.itertuples()):
        row = corpus.set_index("prompt_id").loc[r.prompt_id]
        assert ctx == list(row.prompt_token_ids) + list(row.response_token_ids[:r.t])
        assert ctx[-1] == r.committed_token


def test_allocate_examples():
    assert allocate({"a": 50, "b": 30, "c": 20}, 10) == {"a": 5, "b": 3, "c": 2}
    assert allocate({"a": 1000, "b": 1, "c": 1}, 5) == {"a": 3, "b": 1, "c": 1}
    assert allocate({"a": 2, "b": 3}, 10) == {"a": 2, "b": 3}
    assert allocate({"a": 10, "b": 10, "c": 80}, 2) == {"a": 0, "b": 0, "c": 2}
    assert allocate({"a": 0, "b": 4}, 2) == {"b": 2}


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=9), st.integers(1, 200))
def test_allocate_properties(sizes, total):
    keys = {f"s{i}": n for i, n in enumerate(sizes)}
    alloc = allocate(keys, total)
    nonempty = [k for k, n in keys.items() if n > 0]
    assert set(alloc) == set(nonempty)
    pop = sum(keys.values())
    assert sum(alloc.values()) == min(total, pop)
    assert all(0 <= alloc[k] <= keys[k] for k in nonempty)
    if nonempty and total >= len(nonempty):
        assert all(alloc[k] >= 1 for k in nonempty)
    if pop and total < pop:
        # proportional up to the rounding and the forced minimum of one
        for k in nonempty:
            assert abs(alloc[k] - total * keys[k] / pop) < 1 + len(nonempty)
