"""The rollout probe on the smoke config's tiny random target: exactness and determinism."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from floorgap.stages._cli import run_stage
from floorgap.estimators.kmedian import tv_kmedian
from floorgap.models.targets import load_target
from floorgap.probes.rollouts import anchor_records, sample_block
from floorgap.records import dataclass_rows, read_table, sha256_file
from floorgap.sampling import SamplingLaw

pytestmark = pytest.mark.slow

GAMMA = 7
M = 8


@pytest.fixture(scope="module")
def smoke_records(smoke_domain_records):
    return smoke_domain_records


@pytest.fixture(scope="module")
def model(smoke_target):
    return load_target(smoke_target[2], "float32", "cpu")[0]


def _context(smoke_records) -> tuple[list[int], int]:
    from floorgap.data.anchors import anchor_contexts

    _, _, _, corpus, anchors, _ = smoke_records
    a = read_table(anchors).iloc[:1]
    return anchor_contexts(read_table(corpus), a)[0], int(a.anchor_seed.iloc[0])


def _block(model, ctx, seed, law=SamplingLaw(), **kw):
    return sample_block(model, ctx, n_paths=M, gamma=GAMMA, law=law,
                        anchor_seed=seed, forward_batch=M, **kw)


def test_chunk_size_does_not_change_records(model, smoke_records):
    ctx, seed = _context(smoke_records)
    whole = _block(model, ctx, seed, chunk_paths=M, reveal_paths=2)
    small = _block(model, ctx, seed, chunk_paths=4, reveal_paths=2)
    assert torch.equal(whole.tokens, small.tokens)
    assert torch.equal(whole.probs, small.probs)
    assert torch.equal(whole.revealed[1:], small.revealed[1:])
    rows_a = [dataclass_rows(r) for r in anchor_records("a", whole, store_top_k=16)]
    rows_b = [dataclass_rows(r) for r in anchor_records("a", small, store_top_k=16)]
    for a, b in zip(rows_a, rows_b):
        pd.testing.assert_frame_equal(a, b, check_exact=True)


def test_forwards_carry_no_rows_past_the_pass(model, smoke_records, monkeypatch):
    """A forward_batch above the pass's path count pads nothing: every forward has M rows, and
    the records equal those of forward_batch = M bit for bit."""
    ctx, seed = _context(smoke_records)
    rows: list[int] = []
    forward = type(model).forward

    def counting(self, *args, **kwargs):
        rows.append(int(kwargs["input_ids"].shape[0]))
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(type(model), "forward", counting)
    wide = sample_block(model, ctx, n_paths=M, gamma=GAMMA, law=SamplingLaw(),
                        anchor_seed=seed, forward_batch=4 * M, reveal_paths=2)
    assert max(rows) == M
    exact = _block(model, ctx, seed, reveal_paths=2)
    assert torch.equal(wide.tokens, exact.tokens)
    assert torch.equal(wide.probs, exact.probs)
    assert torch.equal(wide.revealed[1:], exact.revealed[1:])


def test_probabilities_are_the_teacher_forced_conditionals(model, smoke_records):
    ctx, seed = _context(smoke_records)
    block = _block(model, ctx, seed)
    for r in (0, M - 1):
        seq = torch.tensor([ctx + block.tokens[r].tolist()])
        with torch.no_grad():
            logits = model(input_ids=seq).logits[0, len(ctx) - 1:len(ctx) - 1 + GAMMA]
        ref = torch.softmax(logits.double(), -1)
        assert torch.allclose(block.probs[:, r].double(), ref, atol=1e-6)


def test_floor_identities_on_real_rollouts(model, smoke_records):
    ctx, seed = _context(smoke_records)
    # Top-3 truncation makes predecessors repeat across 8 paths, so predecessor groups are
    # covered and the split-half identity at slot 1 is exercised (the random model is diffuse).
    block = _block(model, ctx, seed, law=SamplingLaw(top_k=3), reveal_paths=2)
    _, floors = anchor_records("a", block, store_top_k=16)
    f = dataclass_rows(floors)
    assert f.t1_covered_mass.iloc[1] > 0
    assert f.t0.iloc[0] == 0.0 and f.t0_split.iloc[0] == 0.0  # slot 0: nothing revealed yet
    assert f.t1_split_cov.iloc[1] == pytest.approx(0.0, abs=1e-6)  # Z_0 fixes the whole prefix
    assert f.t1_reweighted.iloc[1] == pytest.approx(0.0, abs=1e-6)
    assert (f.t1_plugin <= f.t0 + 1e-6).all()
    assert (f.t1_lower <= f.t1_upper).all()
    for k in range(GAMMA):
        k1 = tv_kmedian(block.probs[k], 1)
        assert float(k1.objective) == pytest.approx(f.t0.iloc[k], abs=1e-7)


def _rollouts(smoke_records, out_dir, shards: int, shard: int) -> tuple:
    from floorgap.stages import rollouts as rollouts_cli

    cfg, target, model_dir, corpus, anchors, _ = smoke_records
    out_dir.mkdir(parents=True, exist_ok=True)
    paths, floors = out_dir / f"paths-{shard}.parquet", out_dir / f"floors-{shard}.parquet"
    spec = {"target": target, "rollouts": dict(cfg["rollouts"], shards=shards),
            "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"], "shard": shard}
    assert run_stage(rollouts_cli.main, rollouts_cli.build_parser(),
                     ["--spec", json.dumps(spec), "--model-dir", str(model_dir),
                      "--corpus", str(corpus), "--anchors", str(anchors),
                      "--out-paths", str(paths), "--out-floors", str(floors),
                      "--threads", "1"]) == 0
    return paths, floors


def test_sharding_does_not_change_records(smoke_records):
    out = smoke_records[5]
    one = _rollouts(smoke_records, out / "one", 1, 0)
    again = _rollouts(smoke_records, out / "again", 1, 0)
    assert [sha256_file(p) for p in one] == [sha256_file(p) for p in again]
    three = [_rollouts(smoke_records, out / "three", 3, s) for s in range(3)]
    for i, _ in enumerate(("paths", "floors")):
        whole = read_table(one[i]).sort_values(["anchor_id"], kind="stable")
        parts = pd.concat([read_table(t[i]) for t in three]).sort_values(["anchor_id"],
                                                                          kind="stable")
        pd.testing.assert_frame_equal(whole.reset_index(drop=True),
                                      parts.reset_index(drop=True), check_exact=True)


def test_the_shared_prefix_reproduces_the_copied_prefix_on_real_anchors(
        default_domain_records) -> None:
    """SmolLM2 (the default's first target, llama) in float32 at every anchor of the default
    records: the shared prefix (one forward of the J reveals per step) and today's copied
    prefix (J forwards) sample the same tokens; probabilities and revealed reads agree within
    1e-5."""
    from floorgap.data.anchors import anchor_contexts
    from floorgap.models.shared_prefix import copied_prefix

    _, _, model_dir, corpus, anchors, _ = default_domain_records
    model = load_target(model_dir, "float32", "cpu")[0]
    table = read_table(anchors)
    worst = 0.0
    for ctx, seed in zip(anchor_contexts(read_table(corpus), table), table.anchor_seed):
        shared = _block(model, ctx, int(seed), reveal_paths=2)
        with copied_prefix():
            copied = _block(model, ctx, int(seed), reveal_paths=2)
        assert torch.equal(shared.tokens, copied.tokens)
        worst = max(worst, float((shared.probs - copied.probs).abs().max()),
                    float((shared.revealed[1:] - copied.revealed[1:]).abs().max()))
    assert len(table) >= 3 and worst < 1e-5, worst
