"""Gap-half analysis on synthetic drafter records (floorgap.analysis.gaps, serving_risk CLI)."""

from __future__ import annotations

import json

import pytest
import torch

from floorgap.analysis.gaps import (
    SUMMARY_COLUMNS,
    load_records,
    per_anchor_floor_check,
    summarise,
)
from conftest import load_builders
from floorgap.stages._cli import run_stage
from floorgap.records import read_table


def _builders():
    return load_builders("gap_builders")


def _get(df, stat, variant, slot=-1, domain="all", field="estimate"):
    row = df[(df.statistic == stat) & (df.variant == variant) & (df.domain == domain)
             & (df.slot == slot)]
    assert len(row) == 1, (stat, variant, slot, domain)
    return float(row[field].iloc[0])


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    root = tmp_path_factory.mktemp("gaps")
    variants = {"exact": {"order": 0, "exact": True}, "dflash": {"order": 0},
                "dspark": {"order": 1}, "ours": {"order": 1}, "blind": {"order": 1, "blind": True}}
    files = _builders().build(root, variants=variants, gamma=3, M=8)
    rec = load_records(files["anchor_slot"][0], files["paths"], files["slots"])
    return files, rec, summarise(rec, n_boot=50, level=0.9, contrasts=[("ours", "dspark")])


def test_exact_drafter(toy):
    _, rec, df = toy
    g = rec.gamma
    for k in range(g):
        assert _get(df, "R", "exact", k) == pytest.approx(0, abs=1e-12)
        assert _get(df, "G0", "exact", k) == pytest.approx(-_get(df, "T0", "exact", k), abs=1e-12)
        assert _get(df, "D", "exact", k) == pytest.approx(1, abs=1e-12)
        assert _get(df, "R_serve", "exact", k) == pytest.approx(0, abs=1e-12)
    assert _get(df, "tau", "exact") == pytest.approx(g + 1, abs=1e-12)
    assert _get(df, "tau_independent", "exact") == pytest.approx(g + 1, abs=1e-12)


def test_blind_drafter_has_zero_exposure(toy):
    _, rec, df = toy
    for k in range(rec.gamma):
        assert _get(df, "exposure", "blind", k) == pytest.approx(0, abs=1e-12)
        assert _get(df, "R_self", "blind", k) == pytest.approx(_get(df, "R_oracle", "blind", k),
                                                                 abs=1e-12)


def test_oracle_risk_above_order1_floor(toy):
    _, rec, df = toy
    assert len(per_anchor_floor_check(rec, tol=1e-9)) == 0
    assert _get(df, "T1", "dspark", 0) == pytest.approx(_get(df, "T0", "dspark", 0), abs=1e-12)
    assert _get(df, "G1", "dspark", 0) == pytest.approx(_get(df, "R_oracle", "dspark", 0)
                                                        - _get(df, "T0", "dspark", 0), abs=1e-12)
    for v in ("dspark", "ours", "blind"):
        for k in range(rec.gamma):
            # The builders' importance column is the in-sample plug-in, a lower bound of R.
            assert _get(df, "G1_reweighted", v, k) >= -1e-9
            lo, est, hi = (_get(df, "G1_share", v, k, field=f) for f in ("lower", "estimate",
                                                                         "upper"))
            assert lo - 1e-12 <= est <= hi + 1e-12


def test_summary_shape_and_pairing(toy):
    _, rec, df = toy
    assert list(df.columns) == SUMMARY_COLUMNS
    assert set(df.domain) == {"all", "gsm8k", "alpaca"}
    v = "dflash"
    for k in range(rec.gamma):
        diff = _get(df, "R_serve", v, k) - _get(df, "R_free", v, k)
        assert _get(df, "R_serve_minus_free", v, k) == pytest.approx(diff, abs=1e-12)
        assert _get(df, "G0", v, k) == pytest.approx(_get(df, "R", v, k) - _get(df, "T0", v, k),
                                                     abs=1e-12)
        assert _get(df, "D", v, 0) == pytest.approx(1, abs=1e-12)
        opt = _get(df, "dtau_br_in_sample", v, k) - _get(df, "dtau_br", v, k)
        assert _get(df, "dtau_br_optimism", v, k) == pytest.approx(opt, abs=1e-12)
    assert _get(df, "tau_gap", v) == pytest.approx(
        _get(df, "tau", v) - _get(df, "tau_independent", v), abs=1e-12)
    fwd = _get(df, "sweep_forward", v) - _get(df, "sweep_isolated_sum", v)
    assert _get(df, "sweep_forward_minus_isolated", v) == pytest.approx(fwd, abs=1e-12)
    # the contrast is paired: a difference of means on common anchors
    last = rec.gamma - 1
    d = _get(df, "diff_R_oracle", "ours-dspark", last)
    assert d == pytest.approx(_get(df, "R_oracle", "ours", last)
                              - _get(df, "R_oracle", "dspark", last), abs=1e-12)
    assert _get(df, "n_anchors", "dflash") == 8


DECOMPOSITIONS = [  # (whole, parts, variants): whole = sum of parts, estimate by estimate
    ("R", ("T0", "G0"), ("dflash",)),
    ("R_oracle", ("T1", "G1"), ("dspark", "ours")),
    ("R_self", ("R_oracle", "exposure"), ("dspark", "ours")),
    ("R_self_all", ("R_oracle_all", "exposure_all"), ("dspark", "ours")),
    ("R_oracle_reweighted", ("T1_reweighted", "G1_reweighted"), ("dspark", "ours")),
]
SHARES = [("G0_share", "G0", "R"), ("G1_share", "G1", "R_oracle"),
          ("G1_share_reweighted", "G1_reweighted", "R_oracle_reweighted")]


def _assert_decompositions(df, gamma: int) -> None:
    for whole, parts, variants in DECOMPOSITIONS:
        for v in variants:
            for k in range(gamma):
                total = sum(_get(df, p, v, k) for p in parts)
                assert _get(df, whole, v, k) == pytest.approx(total, abs=1e-12), (whole, v, k)
    for share, num, den in SHARES:
        for v in ("dflash",) if share == "G0_share" else ("dspark", "ours"):
            for k in range(1, gamma):
                assert _get(df, share, v, k) == pytest.approx(
                    _get(df, num, v, k) / _get(df, den, v, k), rel=1e-12), (share, v, k)


def test_decompositions_add_up(toy):
    _, rec, df = toy
    _assert_decompositions(df, rec.gamma)


def test_decompositions_add_up_when_floor_populations_differ(tmp_path):
    """One anchor's last-slot floors are unusable (NaN, as the floors stage leaves a corrupt
    cell) and another's importance route is undefined: every decomposition still uses one
    population, so R = T + G holds on the summary table (it did not when R^oracle was
    averaged over every anchor and G^(1) over those with a floor)."""
    from floorgap.records import read_metadata, write_table

    files = _builders().build(tmp_path, gamma=3, M=8)
    path = files["anchor_slot"][0]
    table, meta = read_table(path), read_metadata(path)
    first, second = table.anchor_id.unique()[:2]
    last = table.slot == 2
    probe = ["t0", "t1_split_cov", "t1_covered_mass", "t1_reweighted"]
    table.loc[(table.anchor_id == first) & last, probe] = float("nan")
    table.loc[(table.anchor_id == second) & last, "t1_reweighted"] = float("nan")
    write_table(path, table, meta)
    rec = load_records(path, files["paths"], files["slots"])
    df = summarise(rec, n_boot=30, level=0.9, contrasts=[("ours", "dspark")])
    _assert_decompositions(df, rec.gamma)
    assert _get(df, "G1", "dspark", 2, field="n_anchors") == 7
    assert _get(df, "G1_reweighted", "dspark", 2, field="n_anchors") == 6
    assert _get(df, "R_oracle_all", "dspark", 2, field="n_anchors") == 8


def test_covered_mass_must_match_the_drafter_paths(tmp_path):
    from floorgap.analysis.gaps import RecordMismatch
    from floorgap.records import read_metadata, write_table

    files = _builders().build(tmp_path, gamma=3, M=8)
    path = files["anchor_slot"][0]
    table, meta = read_table(path), read_metadata(path)
    table.loc[table.slot == 1, "t1_covered_mass"] = 0.5 + table.loc[table.slot == 1,
                                                                     "t1_covered_mass"] / 4
    write_table(path, table, meta)
    with pytest.raises(RecordMismatch, match="same rollouts"):
        load_records(path, files["paths"], files["slots"])


def test_cli_and_incomplete_anchor(tmp_path):
    from floorgap.stages.gaps import build_parser, main

    files = _builders().build(tmp_path, domains=("gsm8k",), anchors_per_domain=4, gamma=2, M=4,
                              variants={"dflash": {"order": 0}, "dspark": {"order": 1}})
    paths = read_table(files["paths"][0])
    from floorgap.records import read_metadata, write_table

    meta = read_metadata(files["paths"][0])
    write_table(files["paths"][0], paths.iloc[1:], meta)  # one anchor loses a path row
    out = tmp_path / "gaps" / "summary.parquet"
    argv = ["--spec", json.dumps({"bootstrap": 20, "level": 0.9, "contrasts": []}),
            "--anchor-slot", str(files["anchor_slot"][0]),
            "--paths", *map(str, files["paths"]), "--slots", *map(str, files["slots"]),
            "--out-summary", str(out), "--threads", "1"]
    no_contrasts = ["--spec", json.dumps({"bootstrap": 20, "level": 0.9}), *argv[2:]]
    assert run_stage(main, build_parser(), no_contrasts) == 2  # contrasts are named explicitly
    assert not out.exists()
    assert run_stage(main, build_parser(), argv) == 0
    df = read_table(out)
    assert _get(df, "anchors_incomplete", "dflash") == 1
    assert _get(df, "n_anchors", "dflash") == 3
    assert _get(df, "n_anchors", "dspark") == 4
    assert torch.isfinite(torch.tensor(df[df.statistic == "tau"].estimate.to_numpy())).all()
