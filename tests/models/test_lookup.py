"""Lookup-table proposals (floorgap.models.lookup) against hand computations on a tiny record."""

from __future__ import annotations

import math

import pytest
import torch

from floorgap.models.lookup import ALPHAS, LookupProposal, fit_lookup

V = 5


def _record() -> dict:
    """Two sequences over a 5-token vocabulary. Sequence 0: prompt [0, 1], response [2, 3];
    sequence 1: prompt [4], response [1, 2]. Stored targets (top-2) at each response position."""
    tokens = torch.tensor([0, 1, 2, 3, 4, 1, 2], dtype=torch.int32)
    return {
        "tokens": tokens,
        "seq_offsets": torch.tensor([0, 4, 7]),
        "seq_prompt_len": torch.tensor([2, 1]),
        "pos_offsets": torch.tensor([0, 2, 4]),
        # row 0 predicts token 2 after 1; row 1 token 3 after 2; row 2 token 1 after 4; row 3
        # token 2 after 1
        "target_ids": torch.tensor([[2, 3], [3, 0], [1, 2], [2, 4]], dtype=torch.int32),
        "target_vals": torch.tensor([[0.75, 0.25], [0.5, 0.5], [1.0, 0.0], [0.5, 0.5]]),
    }


def test_unigram_and_bigram_match_the_hand_computation() -> None:
    data = _record()
    uni_counts = torch.ones(V, dtype=torch.float64)       # one pseudo-count per token
    for ids, vals in zip(data["target_ids"].tolist(), data["target_vals"].tolist()):
        for t, p in zip(ids, vals):
            uni_counts[t] += p
    u = uni_counts / uni_counts.sum()
    assert torch.allclose(u, torch.tensor([1.5, 2, 2.25, 1.75, 1.5], dtype=torch.float64) / 9)
    table, _ = fit_lookup("unigram", data, [0, 1], [], gamma=2, vocab_size=V)
    q = table.propose(torch.zeros(1, 1, 1), torch.tensor([3])).exp().double()
    assert torch.allclose(q[0, 0], u, atol=1e-6) and torch.allclose(q[0, 1], u, atol=1e-6)
    # bigram with alpha = ALPHAS[0] (nothing held out): after token 1 the counts are
    # C(1, .) = row 0 + row 3 = {2: 1.25, 3: 0.25, 4: 0.5}, C(1) = 2
    bigram, _ = fit_lookup("bigram", data, [0, 1], [], gamma=2, vocab_size=V)
    a = ALPHAS[0]
    c1 = torch.tensor([0, 0, 1.25, 0.25, 0.5], dtype=torch.float64)
    expect = (c1 + a * u) / (2 + a)
    pred = torch.tensor([[4, 0]])                          # slot 1's predecessor is token 4
    q = bigram.propose(torch.zeros(1, 1, 1), torch.tensor([1]), pred).exp().double()
    assert torch.allclose(q[0, 0], expect, atol=1e-6)
    # after token 4 (row 2 only): C(4, .) = {1: 1}, C(4) = 1
    c4 = torch.tensor([0, 1, 0, 0, 0], dtype=torch.float64)
    assert torch.allclose(q[0, 1], (c4 + a * u) / (1 + a), atol=1e-6)
    assert bigram.order == 1 and table.order == 0


def test_the_committed_token_table_looks_k_plus_one_back() -> None:
    """bigram_committed at slot 1 conditions on the token two positions before the one it
    predicts: row 0 (two after token 0), row 1 (two after 1), row 3 (two after 4); row 2's
    would lie before its sequence and is left out."""
    data = _record()
    table, _ = fit_lookup("bigram_committed", data, [0, 1], [], gamma=2, vocab_size=V)
    a = table.cfg.alpha
    u = table.unigram
    q = table.propose(torch.zeros(1, 1, 1), torch.tensor([1])).exp().double()[0]
    c_slot1 = torch.tensor([0.5, 0, 0, 0.5, 0], dtype=torch.float64)   # row 1 after token 1
    assert torch.allclose(q[1], (c_slot1 + a * u) / (1 + a), atol=1e-6)
    q4 = table.propose(torch.zeros(1, 1, 1), torch.tensor([4])).exp().double()[0]
    c4_slot1 = torch.tensor([0, 0, 0.5, 0, 0.5], dtype=torch.float64)  # row 3 only
    assert torch.allclose(q4[1], (c4_slot1 + a * u) / (1 + a), atol=1e-6)
    assert table.order == 0


def test_smoothing_is_chosen_on_the_held_out_sequences_and_the_record_round_trips() -> None:
    data = _record()
    table, scores = fit_lookup("bigram", data, [0], [1], gamma=2, vocab_size=V)
    assert set(scores) == {str(a) for a in ALPHAS}
    assert scores[str(table.cfg.alpha)] == min(scores.values())
    back = LookupProposal.from_record(table.record())
    x = torch.zeros(1, 1, 1)
    pred = torch.tensor([[2, 0], [1, 0]])
    assert torch.equal(back.propose(x, torch.tensor([1, 4]), pred),
                       table.propose(x, torch.tensor([1, 4]), pred))
    paths = table.propose_paths(x, torch.tensor([1]), pred, slots=[1])
    assert paths.shape == (2, 1, V)
    assert torch.equal(paths[:, 0], table.propose(x, torch.tensor([1, 1]), pred)[:, 1])
    with pytest.raises(ValueError, match="predecessors"):
        table.propose(x, torch.tensor([1]))
    assert math.isclose(float(table.propose(x, torch.tensor([1]), pred[:1]).exp().sum(-1)[0, 0]),
                        1.0, rel_tol=1e-5)
