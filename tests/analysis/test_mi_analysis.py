"""The MI locality analysis (Table 4) on synthetic MI records: loading, arrays, estimates."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
from conftest import load_builders

from floorgap.analysis.mi import (
    ess_thresholds,
    load_records,
    records_to_arrays,
    summarise_locality,
)
from floorgap.estimators.mi import ess_gate_sensitivity, recovery_fraction
from floorgap.records import read_metadata, write_table as write_records


@pytest.fixture()
def record_files(tmp_path):
    return load_builders("mi_builders").write_record_files(tmp_path)


def test_load_records_checks_one_configuration(record_files, tmp_path):
    frame, meta = load_records(record_files)
    assert len(frame) == sum(len(pd.read_parquet(f)) for f in record_files)
    assert meta["files"] == [str(f) for f in record_files] and meta["gamma"] == 7
    other = tmp_path / "other.parquet"
    write_records(other, pd.read_parquet(record_files[0]),
                  read_metadata(record_files[0]) | {"gamma": 5})
    with pytest.raises(ValueError, match="different configuration"):
        load_records([record_files[0], other])
    with pytest.raises(ValueError, match="no MI record files"):
        load_records([])


def test_estimates_match_the_estimator(record_files):
    frame, meta = load_records(record_files)
    arr = records_to_arrays(frame)
    per = frame.drop_duplicates("anchor_id")
    assert len(arr.prompts) == int(per.screened.sum())  # screened-out anchors are left out
    summary = summarise_locality(frame, meta, ess_gates=[8], n_boot=100, level=0.9)
    table = summary.table
    # rho_{3,1} by hand: ratio of Hajek sums over the screened anchors
    kept = frame[frame.screened & (frame.slot == 3) & (frame.order == 1)]
    num = ((kept.c_k0 - kept.c_km) / kept.pi).sum()
    den = ((kept.c_k0 - kept.c_kk) / kept.pi).sum()
    got = table[(table.section == "slot") & (table.slot == 3) & (table.order == 1)].rho.item()
    assert got == pytest.approx(num / den, rel=1e-12)
    # pooled over slots = ratio of summed numerators and denominators over the m < k cells
    est = recovery_fraction(arr.n, arr.d, arr.pi, arr.mask)
    pooled = table[table.section == "pooled"].set_index("order")
    torch.testing.assert_close(torch.tensor(pooled.rho.to_numpy()), est.pooled)
    assert (pooled.lower <= pooled.rho).all() and (pooled.rho <= pooled.upper).all()
    assert pooled.loc[1, "cells"] == table[(table.section == "slot")
                                           & (table.order == 1)].cells.sum()
    assert summary.n_kept == len(arr.prompts) and summary.n_anchors == len(per)
    assert (table.paths == 16).all()


def test_summary_sections_and_per_order(record_files):
    frame, meta = load_records(record_files)
    summary = summarise_locality(frame, meta, ess_gates=[4, 8], n_boot=50, level=0.95)
    table = summary.table
    assert set(table.section) == {"slot", "pooled", "ess_gate", "domain:gsm8k", "domain:alpaca"}
    assert summary.slots == [2, 3, 4, 5, 6] and summary.orders == [1, 2, 4]
    slot2 = table[(table.section == "slot") & (table.slot == 2)].set_index("order")
    assert math.isfinite(slot2.loc[1, "rho"]) and slot2.loc[[2, 4], "rho"].isna().all()
    assert summary.gates == [(4.0, ["4"]), (8.0, ["8", "HalfPaths"])]
    assert sorted(table[table.section == "ess_gate"].ess_gate.unique()) == [4.0, 8.0]
    # the gate range includes the ungated estimate (threshold 0)
    arr = records_to_arrays(frame)
    sens = ess_gate_sensitivity(arr.n, arr.d, arr.ess, [0.0, 4.0, 8.0], arr.pi, arr.mask)
    rhos = [float(res.pooled[0]) for _, res in sens]
    assert summary.per_order.loc[1, "gate_rho_min"] == min(rhos)
    assert summary.per_order.loc[1, "gate_rho_max"] == max(rhos)
    per_slot = table[(table.section == "slot") & (table.order == 1)]
    assert per_slot.rho.min() == pytest.approx(summary.per_order.loc[1, "slot_min"], rel=1e-9)


def test_ess_thresholds_dedupe_half_paths():
    assert ess_thresholds([8, 32], 64) == [(8.0, ["8"]), (32.0, ["32", "HalfPaths"])]
    assert ess_thresholds([2], 8) == [(2.0, ["2"]), (4.0, ["HalfPaths"])]
