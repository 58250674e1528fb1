"""The floors' robustness variants (floorgap.probes.floor_variants, the floor_variants stage) on
the smoke target: nested M equals separate runs, a longer block repeats the shorter block's
slots, and the stage writes records and a summary for each variant kind."""

from __future__ import annotations

import json
from dataclasses import asdict

import pandas as pd
import pytest
import torch

from floorgap.models.targets import load_target
from floorgap.probes.floor_variants import first_paths, variant_floor_rows
from floorgap.probes.rollouts import anchor_records, sample_block
from floorgap.records import read_table
from floorgap.sampling import SamplingLaw
from floorgap.stages._cli import run_stage

pytestmark = pytest.mark.slow
LAW = SamplingLaw(1.0, 1.0, 0)


@pytest.fixture(scope="module")
def setup(smoke_domain_records):
    from floorgap.data.anchors import anchor_contexts

    cfg, target, model_dir, corpus, anchors, out = smoke_domain_records
    model = load_target(model_dir, "float32", "cpu")[0]
    a = read_table(anchors).sort_values("anchor_id").iloc[:1]
    ctx = anchor_contexts(read_table(corpus), a)[0]
    return smoke_domain_records, model, ctx, int(a.anchor_seed.iloc[0])


def test_the_first_paths_of_a_larger_run_are_the_smaller_run(setup) -> None:
    _, model, ctx, seed = setup
    # forwards of 4 rows in both runs: the smaller run is the larger one's first chunk, bit for
    # bit (at 8 rows a run of 4 paths forwards 4 rows, and some CPUs round by row count)
    big = sample_block(model, ctx, n_paths=8, gamma=4, law=LAW, anchor_seed=seed, forward_batch=4)
    small = sample_block(model, ctx, n_paths=4, gamma=4, law=LAW, anchor_seed=seed,
                         forward_batch=4)
    nested = first_paths(big, 4)
    assert torch.equal(nested.tokens, small.tokens) and torch.equal(nested.probs, small.probs)
    pd.testing.assert_frame_equal(
        pd.DataFrame([asdict(f) for f in anchor_records("a", nested, store_top_k=1)[1]]),
        pd.DataFrame([asdict(f) for f in anchor_records("a", small, store_top_k=1)[1]]))


def test_a_longer_block_repeats_the_shorter_blocks_slots(setup) -> None:
    _, model, ctx, seed = setup
    short = sample_block(model, ctx, n_paths=8, gamma=4, law=LAW, anchor_seed=seed,
                         forward_batch=8)
    long = sample_block(model, ctx, n_paths=8, gamma=9, law=LAW, anchor_seed=seed,
                        forward_batch=8)
    assert torch.equal(long.tokens[:, :4], short.tokens)
    assert torch.equal(long.probs[:4], short.probs)


def test_variant_rows_carry_every_m(setup) -> None:
    (cfg, target, model_dir, corpus, anchors, out), model, _, _ = setup
    a = read_table(anchors).sort_values("anchor_id").iloc[:2]
    rows = pd.DataFrame(variant_floor_rows(model, a, read_table(corpus), paths=[4, 8], gamma=3,
                                           law=LAW, forward_batch=8))
    assert sorted(rows["paths"].unique()) == [4, 8] and len(rows) == 2 * 2 * 3
    assert (rows[rows.slot == 0]["t0"].abs() < 1e-9).all()


@pytest.mark.parametrize("variant", [
    {"name": "finite_m", "paths": [4, 8]},
    {"name": "block16", "gamma": 9},
    {"name": "sampling_law", "law": {"temperature": 0.7, "top_p": 0.8, "top_k": 20}},
])
def test_the_stage_writes_records_and_summary(setup, tmp_path, variant) -> None:
    from floorgap.stages import floor_variants

    (cfg, target, model_dir, corpus, anchors, _), _, _, _ = setup
    spec = {"target": target, "variant": variant, "anchors_per_domain": 2,
            "law": cfg["evaluation_law"], "gamma": 7, "paths": 8, "forward_batch": 8}
    argv = ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus", str(corpus),
            "--anchors", str(anchors), "--out", str(tmp_path / "v.parquet"),
            "--out-summary", str(tmp_path / "s.parquet"), "--threads", "1"]
    assert run_stage(floor_variants.main, floor_variants.build_parser(), argv) == 0
    summary = read_table(tmp_path / "s.parquet")
    gamma = variant.get("gamma", 7)
    assert summary["slot"].max() == gamma - 1
    assert set(summary["law"]) == ({"evaluation", "variant"} if "law" in variant
                                   else {"evaluation"})
    assert set(summary["paths"]) == set(variant.get("paths", [8]))
    assert (summary["anchors"] >= 1).all()
