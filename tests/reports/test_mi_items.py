"""Table 4 (MI locality) on synthetic MI records: files, values and the estimator wiring."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd
import pytest
import torch

from floorgap.estimators.mi import recovery_fraction
from floorgap.records import write_table as write_records
from floorgap.reports.mi_items import ess_thresholds, mi_locality

GAMMA = 7
ORDERS = [1, 2, 4]
MI_CFG = {"screen_paths": 8, "paths": 16, "threshold_nats": 0.05, "orders": ORDERS}


def _records(domain: str, n_prompts: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        for t in range(2):
            aid = f"{domain}:p{p}@{t}"
            screen = float(rng.uniform(0.0, 1.0))
            screened = screen > 0.05 and not (p == 0 and t == 1)
            for k in range(1, GAMMA):
                c_kk = float(rng.uniform(0.5, 2.0))
                d = float(rng.uniform(0.1, 1.0))
                for m in ORDERS:
                    ok = screened and m < k
                    rho = {1: 0.9, 2: 0.97, 4: 0.995}[m] + float(rng.normal(0, 0.02))
                    rows.append({
                        "anchor_id": aid, "prompt_id": f"{domain}:p{p}", "domain": domain,
                        "pi": 0.5 if t else 0.25, "slot": k, "order": m, "token": 3,
                        "c_k0": c_kk + d if screened else math.nan,
                        "c_km": c_kk + d * (1 - rho) if ok else math.nan,
                        "c_kk": c_kk if screened else math.nan,
                        "ess": float(rng.uniform(1, 15)) if ok else math.nan,
                        "screened": screened if p else (t == 0), "screen": screen})
    return pd.DataFrame(rows)


@pytest.fixture()
def record_files(tmp_path):
    files = []
    for i, dom in enumerate(["gsm8k", "alpaca"]):
        path = tmp_path / "mi" / f"{dom}.parquet"
        write_records(path, _records(dom, 4, i), {"target": "t", "mi": MI_CFG, "law": {},
                                                  "gamma": GAMMA, "forward_batch": 4,
                                                  "domain": dom})
        files.append(path)
    return files


def test_writes_table_and_values(record_files, tmp_path):
    from floorgap.stages.report import build_parser, main
    from floorgap.stages._cli import run_stage

    values = tmp_path / "values" / "table4_mi_locality.tex"
    spec = json.dumps({"analysis": {"bootstrap": 200, "level": 0.95}, "ess_gates": [4, 8]})
    argv = ["table4_mi_locality", "--spec", spec, "--out-dir", str(tmp_path / "tables"),
            "--out-values", str(values)]
    for path in record_files:
        argv += ["--input", f"{path.stem}={path}"]
    assert run_stage(main, build_parser(), argv) == 0
    tex = (tmp_path / "tables" / "table4_mi_locality.tex").read_text()
    assert tex.startswith("\\begin{tabular}{lrrr}") and tex.rstrip().endswith("\\end{tabular}")
    body = [line for line in tex.splitlines() if line.endswith("\\\\")]
    assert len(body) == 1 + 5 + 1 + 2  # header, slots 2..6, pooled, ESS 4 and 8 (= M/2)
    assert body[1].startswith("2 & ") and body[1].count("--") == 2  # slot 2: m=2, m=4 dashes
    assert "\\textbf{" in body[6] and "($M/2$)" in body[8]
    csv = pd.read_csv(tmp_path / "tables" / "table4_mi_locality.csv")
    assert set(csv.section) >= {"slot", "pooled", "ess_gate", "domain:gsm8k", "domain:alpaca"}
    pooled = csv[csv.section == "pooled"].set_index("order")
    assert (pooled.lower <= pooled.rho).all() and (pooled.rho <= pooled.upper).all()
    assert pooled.loc[1, "cells"] == csv[(csv.section == "slot") & (csv.order == 1)].cells.sum()
    text = values.read_text()
    macros = dict(re.findall(r"\\newcommand\{(\\fg[A-Za-z]+)\}\{(.*)\}", text))
    for name in ["\\fgMiRhoOrderOnePooled", "\\fgMiRhoOrderOnePooledCI",
                 "\\fgMiRhoOrderFourPooled", "\\fgMiRhoOrderOneSlotMin",
                 "\\fgMiRhoOrderOneSlotMax", "\\fgMiEligibleAnchors", "\\fgMiEligiblePrompts",
                 "\\fgMiCellsOrderOne", "\\fgMiPaths", "\\fgMiEssGateRhoOrderOneMin",
                 "\\fgMiEssGateRhoOrderOneMax", "\\fgMiEssGateHalfPathsRhoOrderOne",
                 "\\fgMiEssGateEightCellsOrderOne", "\\fgMiScreenedShare"]:
        assert name in macros, name
    assert macros["\\fgMiPaths"] == "16"
    assert macros["\\fgMiEssGateHalfPathsRhoOrderOne"] == macros["\\fgMiEssGateEightRhoOrderOne"]


def test_estimates_match_the_estimator(record_files, tmp_path):
    from floorgap.reports.mi_items import load_records, records_to_arrays, table4_mi_locality

    frame, meta = load_records(record_files)
    arr = records_to_arrays(frame)
    per = frame.drop_duplicates("anchor_id")
    assert len(arr.prompts) == int(per.screened.sum())  # screened-out anchors are left out
    csv, _, values = mi_locality(frame, meta, ess_gates=[8], n_boot=100, level=0.9)
    direct = tmp_path / "direct"
    assert table4_mi_locality({"b": record_files[1], "a": record_files[0]},
                              {"analysis": {"bootstrap": 100, "level": 0.9}, "ess_gates": [8]},
                              direct) == values
    assert (direct / "table4_mi_locality.tex").is_file()
    # rho_{3,1} by hand: ratio of Hajek sums over the screened anchors
    kept = frame[frame.screened & (frame.slot == 3) & (frame.order == 1)]
    num = ((kept.c_k0 - kept.c_km) / kept.pi).sum()
    den = ((kept.c_k0 - kept.c_kk) / kept.pi).sum()
    got = csv[(csv.section == "slot") & (csv.slot == 3) & (csv.order == 1)].rho.item()
    assert got == pytest.approx(num / den, rel=1e-12)
    # pooled over slots = ratio of summed numerators and denominators over the m < k cells
    est = recovery_fraction(arr.n, arr.d, arr.pi, arr.mask)
    pooled = csv[csv.section == "pooled"].set_index("order").rho
    torch.testing.assert_close(torch.tensor(pooled.to_numpy()), est.pooled)
    assert values["\\fgMiEligibleAnchors"] == str(len(arr.prompts))
    assert values["\\fgMiAnchors"] == str(len(per))


def test_ess_thresholds_dedupe_half_paths():
    assert ess_thresholds([8, 32], 64) == [(8.0, ["8"]), (32.0, ["32", "HalfPaths"])]
    assert ess_thresholds([2], 8) == [(2.0, ["2"]), (4.0, ["HalfPaths"])]
