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


def _hand_tv(q: torch.Tensor, ids: list[int], vals: list[float]) -> float:
    """TV on the stored tokens plus one residual bucket, written out."""
    q_k = [float(q[i]) for i in ids]
    r_p, r_q = 1 - sum(vals), 1 - sum(q_k)
    return 0.5 * (sum(abs(p - x) for p, x in zip(vals, q_k)) + abs(r_p - r_q))


@pytest.mark.parametrize("kind", ["unigram", "bigram_committed", "bigram"])
def test_held_out_risk_by_slot_scores_every_block_as_the_drafters_do(kind: str) -> None:
    """Block by block (floorgap.models.examples.block_index) through the drafters'
    interface: slot k of the block with context c is scored against the target row predicting
    token c + k, q_k conditioned on the committed token (order 0) or on the realised
    predecessor (order 1)."""
    from floorgap.models.examples import block_index
    from floorgap.models.lookup import heldout_lookup_risk

    data = _record()
    # longer responses so that every slot of gamma 2 has several blocks
    data["tokens"] = torch.tensor([0, 1, 2, 3, 4, 1, 4, 1, 2, 0], dtype=torch.int32)
    data["seq_offsets"] = torch.tensor([0, 5, 10])
    data["seq_prompt_len"] = torch.tensor([2, 1])
    data["pos_offsets"] = torch.tensor([0, 3, 7])
    g = torch.Generator().manual_seed(0)
    data["target_ids"] = torch.stack([torch.randperm(V, generator=g)[:2] for _ in range(7)])
    data["target_vals"] = torch.tensor([[0.6, 0.3], [0.5, 0.1], [0.9, 0.1], [0.4, 0.4],
                                        [0.7, 0.2], [0.3, 0.3], [0.8, 0.0]])
    gamma = 2
    table, _ = fit_lookup(kind, data, [0], [1], gamma=gamma, vocab_size=V)
    seqs, ctxs = block_index(data, gamma)
    expect, n = [0.0] * gamma, 0
    for s, c in zip(seqs.tolist(), ctxs.tolist()):
        if s != 1:
            continue
        start, lp = int(data["seq_offsets"][s]), int(data["seq_prompt_len"][s])
        block = data["tokens"][start + c:start + c + gamma].long()
        committed = data["tokens"][start + c - 1].long().view(1)
        q = table.propose(torch.zeros(1, 1, 1), committed, block.view(1, -1)).exp().double()[0]
        for k in range(gamma):
            row = int(data["pos_offsets"][s]) + c + k - lp
            expect[k] += _hand_tv(q[k], data["target_ids"][row].tolist(),
                                  data["target_vals"][row].tolist())
        n += 1
    got = heldout_lookup_risk(table, data, [1])
    assert got["blocks"] == n == 3
    assert got["tv_by_slot"] == pytest.approx([e / n for e in expect], abs=1e-6)
    assert got["score"] == pytest.approx(sum(expect) / n / gamma, abs=1e-6)


def test_a_budget_keeps_nested_whole_sequences_the_same_for_tables_and_drafters() -> None:
    """budget_sequences (what BlockExamples and a lookup entry's ``blocks`` train on): whole
    sequences of one seeded order, at least the budget's blocks, smaller budgets nested in
    larger ones, only sequences of the pool."""
    from floorgap.models.examples import budget_sequences

    block_seq = torch.repeat_interleave(torch.arange(10), torch.tensor([3, 1, 4, 1, 5, 9, 2,
                                                                        6, 5, 3]))
    pool = [0, 2, 3, 5, 7, 8, 9]
    every = budget_sequences(block_seq, 10, 7, pool).tolist()
    assert sorted(every) == pool
    kept = []
    for budget in (1, 5, 12, 40):
        seqs = budget_sequences(block_seq, 10, 7, pool, budget).tolist()
        blocks = int(torch.isin(block_seq, torch.tensor(seqs)).sum())
        assert seqs == every[:len(seqs)]                       # a prefix of one order
        assert blocks >= min(budget, 31)                       # 31: the pool's blocks
        assert len(seqs) == 1 or blocks - int((block_seq == seqs[-1]).sum()) < budget
        kept.append(set(seqs))
    assert all(a <= b for a, b in zip(kept, kept[1:]))


def test_a_lookup_entry_with_blocks_fits_on_the_budget_and_records_its_held_out_risk(
        tmp_path) -> None:
    """``drafters.lookups.<name>.blocks``: the table is fitted on the sequences a drafter arm
    of that budget trains on, and its record carries the held-out R by slot."""
    import logging

    from floorgap.models.drafter_training import fit_lookup_variant, split_sequences
    from floorgap.models.examples import FORMAT, block_index, budget_sequences
    from floorgap.models.lookup import heldout_lookup_risk

    g = torch.Generator().manual_seed(3)
    n_seq, lp, n_resp = 12, 2, 6
    tokens = torch.randint(0, V, (n_seq * (lp + n_resp),), generator=g, dtype=torch.int32)
    ids = torch.stack([torch.randperm(V, generator=g)[:3] for _ in range(n_seq * n_resp)])
    vals = torch.softmax(torch.randn(n_seq * n_resp, 3, generator=g), -1) * 0.9
    data = {"format": FORMAT, "tokens": tokens,
            "seq_offsets": torch.arange(n_seq + 1) * (lp + n_resp),
            "seq_prompt_len": torch.full((n_seq,), lp), "pos_offsets": torch.arange(n_seq + 1)
            * n_resp, "target_ids": ids.to(torch.int32), "target_vals": vals,
            "metadata": {"model": {"vocab_size": V}}}
    path = tmp_path / "data.pt"
    torch.save(data, path)
    spec = {"seed": 11, "gamma": 2, "taps": [], "train": {"heldout": 0.25},
            "target": {"name": "t"}, "variant": {"name": "bigram-8", "kind": "bigram",
                                                  "blocks": 8}}
    record = fit_lookup_variant(spec, path, logging.getLogger("test"))
    train, held = split_sequences(data, spec)
    budget = sorted(budget_sequences(block_index(data, 2)[0], n_seq, 11, train, 8).tolist())
    assert len(budget) == 2 < len(train)            # 5 blocks a sequence: two hold >= 8
    expect, _ = fit_lookup("bigram", data, budget, held, gamma=2, vocab_size=V)
    assert torch.equal(record["unigram"], expect.unigram)
    assert record["heldout"] == heldout_lookup_risk(expect, data, held)
    assert len(record["heldout"]["tv_by_slot"]) == 2 and record["heldout"]["blocks"] == 15


def test_counts_at_the_stored_tokens_equal_the_dense_rows() -> None:
    """_SoftCounts.at (sorted-key search) gives the dense rows' entries and row totals,
    including conditioning tokens and pairs never counted."""
    from floorgap.models.lookup import _SoftCounts

    g = torch.Generator().manual_seed(5)
    vocab = 11
    rows = torch.randint(0, 6, (40,), generator=g)            # tokens 6..10 never condition
    cols = torch.randint(0, vocab, (40,), generator=g)
    counts = _SoftCounts(rows, cols, torch.rand(40, generator=g), vocab)
    a = torch.arange(vocab)
    v = torch.randint(0, vocab, (vocab, 4), generator=g)
    at, totals = counts.at(a, v)
    dense = counts.dense_rows(a)
    assert torch.allclose(at, dense.gather(1, v)) and torch.allclose(totals, dense.sum(1))
    assert (totals[6:] == 0).all()
