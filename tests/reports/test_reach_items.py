"""Tables C.6 (API floors), F.3 (serving bounds) and 2 (notation) (floorgap.reports.reach_items),
and the API-floors analysis they read (floorgap.analysis.api_floors)."""

from __future__ import annotations

import importlib
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from floorgap.analysis.api_floors import anchor_slot_floors, summarise
from floorgap.notation import NOTATION
from floorgap.records import write_table
from floorgap.reports.reach_items import (
    table2_notation,
    tableC6_api_floors,
    tableF3_serving_bounds,
)

from test_serving_items import _summary as serving_summary


def _reads() -> pd.DataFrame:
    """Two anchors, 4 paths, gamma 2, top-2 reads. Anchor a: slot 0 identical rows (floor 0),
    slot 1 two predecessor groups with different rows; anchor b: one path ends after slot 0."""
    lp = math.log
    rows = []
    for anchor, n_tok in (("a", [2, 2, 2, 2]), ("b", [2, 2, 2, 1])):
        for r in range(4):
            pred = "x" if r < 2 else "y"
            slot1 = ({"u": lp(0.6), "v": lp(0.3)} if pred == "x"
                     else {"v": lp(0.5), "w": lp(0.4)})
            tops = [{"x": lp(0.5), "y": lp(0.4), "z": lp(0.01)}, slot1][:n_tok[r]]
            rows.append({"anchor_id": anchor, "domain": "gsm8k", "path": r,
                         "tokens": [pred, "u"][:n_tok[r]], "logp": [0.0] * n_tok[r],
                         "top_tokens": [list(t) for t in tops],
                         "top_logp": [list(t.values()) for t in tops], "finish_reason": "length"})
    return pd.DataFrame(rows)


def test_anchor_slot_floors_by_hand() -> None:
    full = pd.DataFrame([{"anchor_id": a, "slot": k, "t0": t0, "t1_plugin": 0.0,
                          "t1_split_cov": 0.0, "t1_covered_mass": 1.0}
                         for a in ("a", "b") for k, t0 in ((0, 0.0), (1, 0.35))])
    floors = anchor_slot_floors(_reads(), 2, top_k=2, full=full)
    a0 = floors[(floors.anchor_id == "a") & (floors.slot == 0)].iloc[0]
    # top-2 keeps x, y (z dropped): identical rows, floor 0, omitted 1 - 0.9
    assert a0["t0"] == pytest.approx(0) and a0["omitted"] == pytest.approx(0.1)
    a1 = floors[(floors.anchor_id == "a") & (floors.slot == 1)].iloc[0]
    # rows (2/3, 1/3, 0) and (0, 5/9, 4/9) half each: barycentre value = TV/2 between them
    tv = 0.5 * (2 / 3 + abs(1 / 3 - 5 / 9) + 4 / 9)
    assert a1["t0"] == pytest.approx(tv / 2)
    assert a1["t1_plugin"] == pytest.approx(0)  # each predecessor group has identical rows
    assert a1["omitted"] == pytest.approx(0.1)
    assert a1["t0_lower"] == pytest.approx(tv / 2 - 0.1)
    assert bool(a1["t0_contained"]) == (tv / 2 - 0.1 - 1e-3 <= 0.35 <= tv / 2 + 0.1 + 1e-3)
    b1 = floors[(floors.anchor_id == "b") & (floors.slot == 1)].iloc[0]
    assert not b1["complete"] and np.isnan(b1["t0"]) and pd.isna(b1["t0_contained"])
    summary = summarise(floors)
    s1 = summary[(summary.scope == "all") & (summary.slot == 1)].iloc[0]
    assert s1["anchors"] == 1 and s1["incomplete"] == 1
    assert s1["t1_removed_share"] == pytest.approx(1.0)
    s0 = summary[(summary.scope == "all") & (summary.slot == 0)].iloc[0]
    assert s0["anchors"] == 2 and s0["t0_contained"] == 2


def test_table_c6_values(tmp_path: Path) -> None:
    full = pd.DataFrame([{"anchor_id": a, "slot": k, "t0": 0.0, "t1_plugin": 0.0,
                          "t1_split_cov": 0.0, "t1_covered_mass": 1.0}
                         for a in ("a", "b") for k in (0, 1)])
    path = tmp_path / "summary.parquet"
    write_table(path, summarise(anchor_slot_floors(_reads(), 2, 2, full)),
                {"anchors": 2, "paths": 4, "top_k": 2,
                 "endpoint": "local vLLM server on the target"})
    values = tableC6_api_floors({"summary": path}, {}, tmp_path)
    assert values["\\fgApiAnchors"] == "2" and values["\\fgApiCompleteLast"] == "1"
    assert values["\\fgApiTopK"] == "2" and values["\\fgApiOmittedLast"] == "0.1000"
    assert values["\\fgApiMatchedCells"] == "3" and values["\\fgApiMatchedSaid"] == "done"
    assert values["\\fgApiEndpoint"] == "local vLLM server on the target"
    tex = (tmp_path / "tableC6_api_floors.tex").read_text()
    assert "\\widetilde T^{(0)}" in tex and "1/1" in tex
    assert (tmp_path / "tableC6_api_floors.csv").exists()


def test_table_f3_bounds_published_and_own_taus(tmp_path: Path) -> None:
    spec = {"gamma": 2, "published": [{"label": "paper", "tau": 1.82, "gamma": 1,
                                       "source": "PR 1"}]}
    values = tableF3_serving_bounds({"summary": serving_summary(tmp_path)}, spec, tmp_path)
    df = pd.read_csv(tmp_path / "tableF3_serving_bounds.csv")
    assert df.iloc[0]["r_min"] == pytest.approx(0.18)
    own = df[df["source"] == "serving benchmark"]
    # dflash verifies 2 tokens per step (tau 2 at gamma 2): r_min = 2 (1 + 2 - 2) / 6 = 1/3
    dflash = own[own["label"].str.startswith("dflash")]
    assert len(dflash) == 2 and dflash["r_min"].to_numpy() == pytest.approx([1 / 3, 1 / 3])
    assert values["\\fgBoundPublishedR"] == "0.180" and values["\\fgBoundPublishedGamma"] == "1"
    assert values["\\fgBoundPublishedRows"] == "1"


def test_table2_lists_the_notation_and_every_home_documents_its_symbol(tmp_path: Path) -> None:
    values = table2_notation({}, {}, tmp_path)
    assert values["\\fgNotationRows"] == str(len(NOTATION))
    tex = (tmp_path / "table2_notation.tex").read_text()
    assert all(s.symbol in tex for s in NOTATION)
    for sym in NOTATION:
        assert sym.homes, sym.symbol
        for home in sym.homes:
            module, _, attr = home.partition(":")
            doc = getattr(importlib.import_module(module), attr).__doc__ or ""
            assert sym.ascii in doc, f"{home}'s docstring does not spell {sym.ascii}"


def test_table_c2_replication_pairs_the_engines_on_the_same_anchors(tmp_path: Path) -> None:
    from floorgap.reports.robustness_items import tableC2_replication

    rep = anchor_slot_floors(_reads(), 2, top_k=2)
    rep_path = tmp_path / "rep.parquet"
    write_table(rep_path, rep, {"paths": 4, "top_k": 2})
    full = pd.DataFrame([{"anchor_id": a, "slot": k, "t0": t0, "t1_split_cov": 0.1,
                          "t1_covered_mass": 0.5, "t1_reweighted": 0.2 if k else np.nan}
                         for a, t0 in (("a", 0.3), ("b", 0.5)) for k in (0, 1)])
    full_path = tmp_path / "anchor_slot.parquet"
    write_table(full_path, full, {})
    values = tableC2_replication({"replication": rep_path, "anchor_slot": full_path}, {},
                                 tmp_path)
    out = pd.read_csv(tmp_path / "tableC2_replication.csv")
    last = out[out.slot == 1].iloc[0]
    a1 = rep[(rep.anchor_id == "a") & (rep.slot == 1)].iloc[0]
    assert last["anchors"] == 1  # anchor b's slot 1 is incomplete
    assert last["t0_diff"] == pytest.approx(a1["t0"] - 0.3)
    assert last["t1_split"] == pytest.approx(0.1) and last["t1_importance"] == pytest.approx(0.2)
    assert values["\\fgReplicationTOneRoutesDiffLast"] == "\\ensuremath{+0.1000}"
    assert values["\\fgReplicationTopK"] == "2"


def test_table_c6_without_the_matched_check_still_defines_every_macro(tmp_path: Path) -> None:
    """A remote endpoint has no local model: the matched values read "--", so the paper
    compiles."""
    path = tmp_path / "summary.parquet"
    write_table(path, summarise(anchor_slot_floors(_reads(), 2, 2)),
                {"anchors": 2, "endpoint": "https://api.example/v1"})
    values = tableC6_api_floors({"summary": path}, {}, tmp_path)
    assert values["\\fgApiMatchedCells"] == "--" and values["\\fgApiMatchedTZeroContained"] == "--"
    assert values["\\fgApiMatchedSaid"] == "not done"
    assert "--" in (tmp_path / "tableC6_api_floors.tex").read_text()
