"""Appendix E report items (budget study) on a synthetic budget summary."""

from __future__ import annotations

import json

import pytest

from test_gap_items import _summarise


@pytest.fixture(scope="module")
def budget_inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    variants = {"few@epoch-1": {"order": 0}, "few": {"order": 0}, "many": {"order": 0},
                "markov": {"order": 1}}
    summary = _summarise(root, variants, {"labels": {"few": "few@epoch-2", "many": "many@epoch-1",
                                                     "markov": "markov@epoch-1"},
                                          "contrasts": [], "sweeps": False}, "budget")
    inputs = {"summary": summary}
    for name, blocks in (("few", 100), ("many", 900), ("markov", 900)):
        log = root / f"{name}.jsonl"
        log.write_text(json.dumps({"kind": "step", "examples": 1}) + "\n"
                       + json.dumps({"kind": "epoch", "epoch": 1, "examples": blocks}) + "\n")
        inputs[f"log_{name}"] = log
    spec = {"budget": {"few": {"kind": "dflash", "layers": 2, "objective": "kl", "blocks": 100},
                       "many": {"kind": "dflash", "layers": 2, "objective": "kl"},
                       "markov": {"kind": "dspark", "layers": 1}},
            "train_epochs": {"few": 2, "many": 1, "markov": 1}, "dpi": 60}
    return inputs, spec


def test_study_runs_read_risk_blocks_and_settings(budget_inputs):
    from floorgap.reports.budget_items import study_runs
    from floorgap.reports.gap_items import GapSummary

    inputs, spec = budget_inputs
    runs = study_runs(inputs, spec)
    s = GapSummary(inputs["summary"])
    assert sorted(zip(runs["drafter"], runs["epoch"])) == [("few", 1), ("few", 2), ("many", 1),
                                                           ("markov", 1)]
    for _, r in runs.iterrows():
        stat = "R" if r["kind"] == "dflash" else "R_oracle_all"   # the order's held-out risk
        assert r["risk"] == stat
        assert r["R_0"] == pytest.approx(s.get(stat, r["label"], 0))
        assert r["blocks"] == {"few": 100, "many": 900, "markov": 900}[r["drafter"]]
    assert set(runs.loc[runs["drafter"] == "few", "objective"]) == {"kl"}
    assert set(runs.loc[runs["drafter"] == "markov", "objective"]) == {"ce"}   # the default


def test_items_write_files_and_finite_macros(budget_inputs, tmp_path):
    from floorgap.reports.budget_items import figE_drafter_learning, tableE_drafter_budget

    inputs, spec = budget_inputs
    fig = figE_drafter_learning(inputs, spec, tmp_path)
    tab = tableE_drafter_budget(inputs, spec, tmp_path)
    for ext in ("pdf", "png"):
        assert (tmp_path / f"figE_drafter_learning.{ext}").stat().st_size > 0
    tex = (tmp_path / "tableE_drafter_budget.tex").read_text()
    assert tex.startswith("\\begin{tabular}") and "nan" not in tex
    assert fig["\\fgBudgetMaxBlocks"] == "900" and fig["\\fgBudgetMinBlocks"] == "100"
    assert tab["\\fgBudgetFewBlocks"] == "100"
    assert all(v not in ("", "nan") for v in {**fig, **tab}.values())


def test_a_missing_training_log_is_named(budget_inputs, tmp_path):
    from floorgap.reports.budget_items import study_runs

    inputs, spec = budget_inputs
    with pytest.raises(ValueError, match="log_many"):
        study_runs({k: v for k, v in inputs.items() if k != "log_many"}, spec)
