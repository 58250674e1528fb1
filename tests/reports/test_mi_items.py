"""Table 4 (MI locality) on synthetic MI records: the files and values the item writes."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest
from conftest import load_builders

from floorgap.analysis.mi import load_records, summarise_locality
from floorgap.reports.mi_items import (
    mi_locality_latex,
    mi_locality_macros,
    table4_mi_locality,
)


@pytest.fixture()
def record_files(tmp_path):
    return load_builders("mi_builders").write_record_files(tmp_path)


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
                 "\\fgMiCellsOrderOne", "\\fgMiPaths", "\\fgMiEssGateRhoOrderOneRange",
                 "\\fgMiEssGateHalfPathsRhoOrderOne",
                 "\\fgMiEssGateEightCellsOrderOne", "\\fgMiScreenedShare"]:
        assert name in macros, name
    assert macros["\\fgMiPaths"] == "16"
    assert macros["\\fgMiEssGateHalfPathsRhoOrderOne"] == macros["\\fgMiEssGateEightRhoOrderOne"]


def test_item_formats_the_analysis_summary(record_files, tmp_path):
    frame, meta = load_records(record_files)
    summary = summarise_locality(frame, meta, ess_gates=[8], n_boot=100, level=0.9)
    values = mi_locality_macros(summary)
    direct = tmp_path / "direct"
    assert table4_mi_locality({"b": record_files[1], "a": record_files[0]},
                              {"analysis": {"bootstrap": 100, "level": 0.9}, "ess_gates": [8]},
                              direct) == values
    written = pd.read_csv(direct / "table4_mi_locality.csv")
    pd.testing.assert_frame_equal(written, summary.table.reset_index(drop=True),
                                  check_dtype=False)
    latex = mi_locality_latex(summary)
    assert list(latex.iloc[:, 0]) == ["2", "3", "4", "5", "6", "pooled",
                                      "pooled, ESS $\\geq$ 8 ($M/2$)"]
    assert (direct / "table4_mi_locality.tex").is_file()
    assert values["\\fgMiEligibleAnchors"] == str(summary.n_kept)
    assert values["\\fgMiAnchors"] == str(frame.anchor_id.nunique())
    assert values["\\fgMiLevel"] == "90\\%" and values["\\fgMiBootstrap"] == "100"
