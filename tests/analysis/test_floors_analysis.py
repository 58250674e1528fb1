"""The floors stage on hand-built records: known values, record checks, the CLI."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from floor_builders import ROLLOUTS, build_records, rewrite

import floorgap
from floorgap.analysis.floors import (
    ANCHOR_SLOT_COLUMNS,
    SUMMARY_COLUMNS,
    RecordMismatch,
    anchor_slot_table,
    load_records,
    summarise,
)
from floorgap.estimators.aggregate import hajek_mean

B = 300
KS = [1, 2, 4]


def run(files, n_boot=B, ks=KS):
    rec = load_records(files["anchors"], files["paths"], files["floors"])
    table = anchor_slot_table(rec, kmedian_k=ks, kmedian_restarts=2)
    summary = summarise(table, rec, n_boot=n_boot, level=0.9, kmedian_k=ks)
    return rec, table, summary


def stat(summary, name, slot, domain="all"):
    row = summary[(summary.statistic == name) & (summary.slot == slot)
                  & (summary.domain == domain)]
    assert len(row) == 1, (name, slot, domain, len(row))
    return row.iloc[0]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    files = build_records(tmp_path_factory.mktemp("floors"), anchors_per_domain=5)
    return files, *run(files)


def test_tables_have_the_documented_shape(synthetic):
    _, rec, table, summary = synthetic
    assert list(summary.columns) == SUMMARY_COLUMNS
    assert list(table.columns)[: len(ANCHOR_SLOT_COLUMNS)] == ANCHOR_SLOT_COLUMNS
    assert len(table) == 10 * rec.gamma
    assert (table.status == "ok").all()
    assert set(summary.domain) == {"all", "gsm8k", "mbpp"}
    assert stat(summary, "n_anchors", -1)["estimate"] == 10
    assert stat(summary, "n_prompts", -1)["estimate"] == 4
    assert stat(summary, "paths_per_anchor", -1)["estimate"] == ROLLOUTS["paths"]
    assert stat(summary, "records_corrupt", -1)["estimate"] == 0
    assert stat(summary, "records_missing", -1)["estimate"] == 0
    assert rec.domains["mbpp"]["stand_in_for"] == "MBPP"
    assert rec.domains["mbpp"]["dataset_short"] == "HumanEval"


def test_kmedian_k1_is_the_topk_floor_and_more_prototypes_help(synthetic):
    _, _, table, summary = synthetic
    np.testing.assert_allclose(table.kmedian_objective_k1, table.t0_topk, atol=1e-12)
    assert (table.kmedian_objective_k2 <= table.kmedian_objective_k1 + 1e-12).all()
    assert (table.kmedian_spread_k1 == 0).all()
    for k in (1, 2):
        share2 = stat(summary, "kmedian_share_removed_K2", k)["estimate"]
        share4 = stat(summary, "kmedian_share_removed_K4", k)["estimate"]
        worst = stat(summary, "kmedian_share_removed_worst_K2", k)["estimate"]
        assert 0 <= worst <= share2 <= 1 and share4 >= 0


def test_topk_band_contains_the_full_vocabulary_floor(synthetic):
    _, _, table, summary = synthetic
    gap = (table.t0 - table.t0_topk).abs()
    assert (gap <= table.t0_topk_band + 1e-9).all()
    assert (table.t0_topk_band > 0).any()  # K < V: the reads do truncate
    assert (summary[summary.statistic == "topk_band_violations"].estimate == 0).all()
    np.testing.assert_allclose(table.t0_full_minus_topk, table.t0 - table.t0_topk)


def test_hajek_means_and_ratios_match_the_anchor_table(synthetic):
    _, rec, table, summary = synthetic
    for k in range(1, rec.gamma):
        cells = table[table.slot == k]
        pi = torch.tensor(cells.pi.to_numpy())
        t0 = torch.tensor(cells.t0.to_numpy())
        rw = torch.tensor(cells.t1_reweighted.to_numpy())
        row = stat(summary, "T0", k)
        assert row.estimate == pytest.approx(float(hajek_mean(t0, pi)))
        assert row.lower <= row.estimate <= row.upper
        share = float(((t0 - rw) / pi).sum() / (t0 / pi).sum())
        assert stat(summary, "share_removed_reweighted", k).estimate == pytest.approx(share)
        mid = torch.tensor((cells.t1_lower + 0.5 * (cells.t1_upper - cells.t1_lower)).to_numpy())
        assert stat(summary, "T1_split_mid", k).estimate == pytest.approx(float(hajek_mean(mid, pi)))
    # slot 0: every path shares the context, so T0 = 0 exactly
    assert stat(summary, "T0", 0).estimate == 0.0


def test_covered_statistics_share_one_population(synthetic):
    """T1_split_covered weights each anchor's T_cov by its covered mass c, so the anchor
    means of the bounds are c T_cov and c T_cov + 1 - c with the population c (the paper's
    T = c T_cov + (1 - c) T_uncov); the share removed compares T_cov with T^(0) on the same
    covered paths. The old unweighted mean and the T_cov-against-all-paths share fail this."""
    _, rec, table, summary = synthetic
    checked = 0
    for k in range(1, rec.gamma):
        cells = table[table.slot == k]
        w = 1 / torch.tensor(cells.pi.to_numpy())
        c = torch.tensor(cells.t1_covered_mass.to_numpy())
        tcov = torch.nan_to_num(torch.tensor(cells.t1_split_cov.to_numpy()))
        t0cov = torch.nan_to_num(torch.tensor(cells.t0_covered.to_numpy()))
        if float(c.sum()) == 0:
            continue
        checked += 1
        t1 = stat(summary, "T1_split_covered", k).estimate
        assert t1 == pytest.approx(float((w * c * tcov).sum() / (w * c).sum()))
        c_pop = stat(summary, "T1_covered_mass", k).estimate
        assert c_pop == pytest.approx(float((w * c).sum() / w.sum()))
        assert stat(summary, "T1_split_lower", k).estimate == pytest.approx(c_pop * t1)
        assert stat(summary, "T1_split_upper", k).estimate == pytest.approx(c_pop * t1 + 1 - c_pop)
        share = float((w * c * (t0cov - tcov)).sum() / (w * c * t0cov).sum())
        assert stat(summary, "share_removed_split_covered", k).estimate == pytest.approx(share)
        t0c = stat(summary, "T0_covered", k).estimate
        assert 1 - t1 / t0c == pytest.approx(share)
    assert checked >= 1


def test_undefined_revealed_tokens_are_counted_and_fail_above_the_share(tmp_path):
    from floorgap.analysis.floors import check_reveal_undefined
    from floorgap.errors import StageError

    files = build_records(tmp_path, anchors_per_domain=4)

    def one_undefined(df):
        # The first anchor's slot-2 cell lost one of its J = 2 revealed predecessors; the
        # last anchor's slot-1 row claims more undefined predecessors than were revealed.
        first = df.anchor_id == df.anchor_id.iloc[0]
        df.loc[first & (df.slot == 2), "t1_reweighted_undefined"] = 1
        df.loc[(df.anchor_id == df.anchor_id.iloc[-1]) & (df.slot == 1),
               "t1_reweighted_undefined"] = 3
        return df

    rewrite(files["floors"][0], one_undefined)
    rec, table, summary = run(files, n_boot=100)
    corrupt = [i for i in rec.issues if i.kind == "floor_corrupt"]
    assert len(corrupt) == 1 and "t1_reweighted_undefined=3" in corrupt[0].detail
    assert stat(summary, "T1_reweighted_undefined", 2).estimate == 1
    assert stat(summary, "T1_reweighted_undefined", 1).estimate == 0
    share = stat(summary, "T1_reweighted_undefined_share", 2).estimate
    assert share == pytest.approx(1 / (8 * ROLLOUTS["reveal_paths"]))
    assert stat(summary, "T1_reweighted_cells_undefined", 2).estimate == 0
    check_reveal_undefined(summary, 0.1)  # 1/16 is within a 10% allowance
    with pytest.raises(StageError, match=r"reveal_undefined_max=0.05 \(slot 2: 6.2%\)"):
        check_reveal_undefined(summary, 0.05)


def test_neff_from_tokens_matches_probe(synthetic):
    _, _, table, summary = synthetic
    np.testing.assert_allclose(table.n_eff, table.n_eff_probe)
    assert stat(summary, "neff_probe_mismatch", -1).estimate == 0
    assert (table[table.slot == 0].n_eff == 1).all()


def test_identical_anchors_collapse_every_interval(tmp_path):
    files = build_records(tmp_path, anchors_per_domain=4, identical=True)
    _, _, summary = run(files)
    for name in ("T0", "T1_reweighted", "T1_split_covered", "share_removed_reweighted",
                 "T0_median", "T0_topdecile_share", "T0_topk", "kmedian_objective_K1",
                 "neff_median"):  # (K >= 2 seeds per anchor, so local optima may differ)
        rows = summary[(summary.statistic == name) & (summary.slot >= 1)]
        assert len(rows), name
        np.testing.assert_allclose(rows.lower, rows.estimate, atol=1e-12, err_msg=name)
        np.testing.assert_allclose(rows.upper, rows.estimate, atol=1e-12, err_msg=name)
    # n anchors with equal floors: the top decile of the anchor mass carries 10% of the total
    assert stat(summary, "T0_topdecile_share", 2).estimate == pytest.approx(0.1)
    # correlation of a constant column is undefined, so it is not reported
    assert not ((summary.statistic == "corr_log_neff_T0") & (summary.slot == 2)).any()


def test_known_values_by_domain_and_concentration(tmp_path):
    files = build_records(tmp_path, anchors_per_domain=4,
                          pis={f"{d}:p{i % 2}@{10 + i}": 0.1 for d in ("gsm8k", "mbpp")
                               for i in range(4)})
    # slot 1 floors: gsm8k anchors 0.2, mbpp anchors 0.6 / 0.005 (half below 0.01)
    rewrite(files["floors"][0], lambda df: df.assign(
        t0=np.where(df.slot == 1, 0.2, df.t0)))
    rewrite(files["floors"][1], lambda df: df.assign(
        t0=np.where(df.slot == 1, np.where(df.anchor_id.str.endswith(("10", "12")), 0.6, 0.005),
                    df.t0)))
    _, _, summary = run(files)
    assert stat(summary, "T0", 1, "gsm8k").estimate == pytest.approx(0.2)
    assert stat(summary, "T0", 1, "gsm8k").lower == pytest.approx(0.2)
    assert stat(summary, "T0", 1, "gsm8k").upper == pytest.approx(0.2)
    assert stat(summary, "T0", 1, "mbpp").estimate == pytest.approx((0.6 + 0.005) / 2)
    total = 4 * 0.2 + 2 * 0.6 + 2 * 0.005
    assert stat(summary, "T0", 1).estimate == pytest.approx(total / 8)
    assert stat(summary, "T0_share_below_001", 1).estimate == pytest.approx(2 / 8)
    assert stat(summary, "T0_below_001_share_of_total", 1).estimate == pytest.approx(0.01 / total)
    # 8 equal weights: the top decile is 0.8 of an anchor, all at 0.6
    assert stat(summary, "T0_topdecile_share", 1).estimate == pytest.approx(0.8 * 0.6 / total)
    assert stat(summary, "T0_median", 1).estimate == pytest.approx(0.2)


def test_corrupt_and_missing_records_are_counted_not_dropped(tmp_path, caplog):
    files = build_records(tmp_path, anchors_per_domain=4)
    aid = "gsm8k:p1@11"
    rewrite(files["floors"][0], lambda df: df.assign(
        t0=np.where((df.anchor_id == aid) & (df.slot == 2), 1.7, df.t0)))
    rewrite(files["floors"][1], lambda df: df[~((df.anchor_id == "mbpp:p0@10") & (df.slot == 1))])

    def break_path(df):
        df = df.copy()
        i = df.index[(df.anchor_id == "mbpp:p1@13") & (df.path == 3)][0]
        df.at[i, "tokens"] = [1, 2]
        return df

    rewrite(files["paths"][1], break_path)
    with caplog.at_level("WARNING", logger="floorgap"):
        rec, table, summary = run(files)
    assert rec.issue_counts() == {"floor_corrupt": 1, "floor_missing": 1, "path_corrupt": 1}
    assert any("t0=1.7" in m for m in caplog.messages)
    assert stat(summary, "records_corrupt", -1).estimate == 2
    assert "floor_corrupt" in stat(summary, "records_corrupt", -1).note
    assert stat(summary, "records_missing", -1).estimate == 1
    assert stat(summary, "records_corrupt", -1, "mbpp").estimate == 1
    assert stat(summary, "cells_excluded", -1).estimate == 2
    assert stat(summary, "cells_excluded_paths", -1).estimate == rec.gamma
    assert stat(summary, "T0", 2).n_anchors == 7
    assert stat(summary, "T0", 0).n_anchors == 8
    assert stat(summary, "T0_topk", 1).n_anchors == 7
    cell = table[(table.anchor_id == aid) & (table.slot == 2)].iloc[0]
    assert cell.status == "floor_corrupt" and math.isnan(cell.t0)
    assert set(table[table.anchor_id == "mbpp:p1@13"].status) == {"paths_incomplete"}


def test_anchor_record_mismatch_names_the_files(tmp_path):
    files = build_records(tmp_path, anchors_per_domain=3)
    extra = pd.DataFrame([{"anchor_id": "gsm8k:zz@1", "prompt_id": "gsm8k:zz", "domain": "gsm8k",
                           "stand_in_for": None, "stratum": "s0", "pi": 0.1}])
    rewrite(files["anchors"][0], lambda df: pd.concat([df, extra], ignore_index=True))
    with pytest.raises(RecordMismatch, match="gsm8k:zz@1.*anchors/gsm8k.parquet"):
        load_records(files["anchors"], files["paths"], files["floors"])
    # records of an anchor that no anchors file lists
    with pytest.raises(RecordMismatch, match="floors-0.parquet"):
        load_records(files["anchors"][1:], files["paths"][1:], files["floors"])


def test_run_metadata_must_agree(tmp_path):
    files = build_records(tmp_path, anchors_per_domain=2)
    from floorgap.records import read_metadata, read_table, write_table

    meta = read_metadata(files["paths"][1])
    meta["rollouts"] = dict(meta["rollouts"], paths=16)
    write_table(files["paths"][1], read_table(files["paths"][1]), meta)
    with pytest.raises(RecordMismatch, match="paths"):
        load_records(files["anchors"], files["paths"], files["floors"])


def test_cli_writes_both_records(tmp_path):
    import json

    from floorgap.stages._cli import run_stage
    from floorgap.stages.floors import build_parser, main
    from floorgap.records import read_metadata, read_table

    files = build_records(tmp_path, anchors_per_domain=3)
    spec = json.dumps({"bootstrap": 200, "level": 0.95, "kmedian_k": [1, 2],
                       "kmedian_restarts": 2, "reveal_undefined_max": 0.05})
    out = tmp_path / "out"
    argv = ["--spec", spec, "--anchors", *map(str, files["anchors"]),
            "--paths", *map(str, files["paths"]), "--floors", *map(str, files["floors"]),
            "--out-anchor-slot", str(out / "anchor_slot.parquet"),
            "--out-summary", str(out / "summary.parquet"), "--threads", "1"]
    assert run_stage(main, build_parser(), argv) == 0
    summary = read_table(out / "summary.parquet")
    assert {"T0", "T1_reweighted", "kmedian_share_removed_K2", "corr_log_neff_T0"} <= set(
        summary.statistic)
    meta = read_metadata(out / "summary.parquet")
    assert meta["gamma"] == 3 and meta["analysis"]["bootstrap"] == 200
    assert meta["domains"]["mbpp"]["stand_in_for"] == "MBPP"
    # an anchors/records mismatch is a one-line stage error
    argv_bad = list(argv)
    argv_bad[argv_bad.index(str(files["floors"][1]))] = str(files["floors"][0])
    assert run_stage(main, build_parser(), argv_bad) == 2


#: The two places of a new floor statistic, as edits of the package's own files: the field
#: of the probe's record (filled where the probe computes the others; here by rewriting the
#: records the probe wrote) and the summary's line with its note.
_NEW_STATISTIC_EDITS = {
    "probes/record_types.py": ("    n_eff: float\n", "    n_eff: float\n    t0_max_path: float = 0.0\n"),
    "analysis/floors/summary.py": (
        '    _emit_slots(rows, "T1_plugin", s.name, s.mean(plugin, ok), all_slots)\n',
        '    _emit_slots(rows, "T1_plugin", s.name, s.mean(plugin, ok), all_slots)\n'
        '    _emit_slots(rows, "T0_max_path", s.name, s.mean(s.matrix("t0_max_path"), ok),'
        ' all_slots)\n'),
    "analysis/floors/notes.py": (
        "NOTES = {\n", 'NOTES = {\n    "T0_max_path": "Hajek mean of the largest per-path TV",\n'),
}

_NEW_STATISTIC = '''
import sys
from pathlib import Path

from floor_builders import build_records, rewrite

from floorgap.analysis.floors import anchor_slot_table, load_records, summarise

files = build_records(Path(sys.argv[1]), anchors_per_domain=3)
for path in files["floors"]:  # what the probe writes now
    rewrite(path, lambda df: df.assign(t0_max_path=0.25 + 0.1 * df["slot"]))
rec = load_records(files["anchors"], files["paths"], files["floors"])
table = anchor_slot_table(rec, kmedian_k=[1], kmedian_restarts=1)
summary = summarise(table, rec, n_boot=20, level=0.9, kmedian_k=[1])
rows = summary[summary.statistic == "T0_max_path"]
print(sorted(table["t0_max_path"].round(6).unique().tolist()), len(rows),
      sorted(rows[rows.domain == "all"].estimate.round(6)), rows.note.iloc[0])
'''


def test_a_floor_statistic_is_the_probe_record_and_a_summary_line(tmp_path):
    """ARCHITECTURE.md, "A floor statistic": a field added to SlotFloorRecord
    (probes/record_types.py) reaches the record checks and the anchor x slot table with
    nothing else changed, and one line in the summary (analysis/floors/summary.py) with its
    note (analysis/floors/notes.py) gives its statistic by slot and scope. The edits are made
    to a copy of the package's files, run in a fresh interpreter."""
    here = Path(__file__).parent
    package = tmp_path / "src" / "floorgap"
    shutil.copytree(Path(floorgap.__file__).parent, package)
    for name, (old, new) in _NEW_STATISTIC_EDITS.items():
        source = (package / name).read_text()
        assert source.count(old) == 1, f"{name} no longer holds {old!r}"
        (package / name).write_text(source.replace(old, new))
    script = tmp_path / "new_statistic.py"
    script.write_text(_NEW_STATISTIC)
    out = subprocess.run([sys.executable, str(script), str(tmp_path / "records")],
                         cwd=here, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             [str(package.parent), str(here), os.environ.get("PYTHONPATH", "")])},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    # gamma 3, scopes all + 2 domains; a constant per slot is its own Hajek mean
    assert out.stdout.strip() == ("[0.25, 0.35, 0.45] 9 [0.25, 0.35, 0.45] Hajek mean of the "
                                  "largest per-path TV")
