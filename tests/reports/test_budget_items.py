"""Appendix E report items (budget study) on a synthetic budget summary."""

from __future__ import annotations

import json

import pytest

from test_gap_items import _summarise


@pytest.fixture(scope="module")
def budget_inputs(tmp_path_factory):
    """The parts of the study: the variant ``base`` by epoch (a), arms of its recipe at two
    sizes (b) and one arm with one setting changed (c), plus an order-1 arm, and the tables
    fitted on the two sizes (d)."""
    root = tmp_path_factory.mktemp("budget")
    variants = {"base@epoch-1": {"order": 0}, "base@epoch-2": {"order": 0},
                "few": {"order": 0}, "many": {"order": 0}, "few-ce": {"order": 0},
                "markov": {"order": 1}, "table-few": {"order": 0}, "table-many": {"order": 0}}
    summary = _summarise(root, variants, {"contrasts": [], "sweeps": False}, "budget")
    inputs = {"summary": summary}
    for name, blocks, epochs in (("base", 900, 2), ("few", 100, 9), ("many", 900, 1),
                                 ("few-ce", 100, 9), ("markov", 900, 1)):
        log = root / f"{name}.jsonl"
        records = [json.dumps({"kind": "step", "examples": 1})]
        records += [json.dumps({"kind": "epoch", "epoch": e, "examples": blocks,
                                "steps": blocks // 100,
                                "heldout": {"tv_by_slot": [0.8, 0.85, 0.9], "score": 0.85}})
                    for e in range(1, epochs + 1)]
        log.write_text("\n".join(records) + "\n")
        inputs[f"log_{name}"] = log
    recipe = {"kind": "dflash", "layers": 2, "objective": "kl", "vocab": 64,
              "mask_embedding": True}
    spec = {"budget": {"base": recipe, "few": {**recipe, "blocks": 100},
                       "many": {**recipe, "blocks": 900},
                       "few-ce": {**recipe, "objective": "ce", "init": "target_scaled",
                                  "blocks": 100},
                       "markov": {"kind": "dspark", "layers": 1},
                       "table-few": {"kind": "bigram_committed", "blocks": 100},
                       "table-many": {"kind": "bigram_committed", "blocks": 900}},
            "train_epochs": {"base": 2, "few": 9, "many": 1, "few-ce": 9, "markov": 1},
            "lookups": {"table-few": "bigram_committed", "table-many": "bigram_committed",
                        "bigram": "bigram"},
            "width_in": 3.4, "height_in": 2.4, "font_size": 8, "dpi": 60}
    return inputs, spec


def test_study_runs_read_risk_blocks_steps_and_settings(budget_inputs):
    from floorgap.reports.budget_items import _parts, study_runs
    from floorgap.reports.common import GapSummary

    inputs, spec = budget_inputs
    runs = study_runs(inputs, spec)
    s = GapSummary(inputs["summary"])
    assert sorted(zip(runs["drafter"], runs["epoch"], runs["weights"])) == [
        ("base", 1, "epoch"), ("base", 2, "epoch"), ("few", 9, "kept"), ("few-ce", 9, "kept"),
        ("many", 1, "kept"), ("markov", 1, "kept"), ("table-few", 0, "table"),
        ("table-many", 0, "table")]
    for _, r in runs.iterrows():
        # the order's held-out risk
        stat = "R" if r["kind"] in ("dflash", "bigram_committed") else "R_oracle_all"
        assert r["risk"] == stat
        assert r["R_0"] == pytest.approx(s.get(stat, r["label"], 0))
        assert r["blocks"] == {"base": 900, "few": 100, "many": 900, "few-ce": 100,
                               "markov": 900, "table-few": 100, "table-many": 900}[r["drafter"]]
    # few: 9 epochs of 1 step; many: 1 epoch of 9 steps -- data at fixed steps
    assert dict(zip(runs["drafter"], runs["steps"]))["few"] == 9
    assert dict(zip(runs["drafter"], runs["steps"]))["many"] == 9
    assert set(runs.loc[runs["drafter"] == "markov", "objective"]) == {"ce"}   # the default
    epochs, data, changes, tables = _parts(runs, spec)
    assert set(epochs["drafter"]) == {"base"}
    assert set(data["drafter"]) == {"few", "many"}   # the recipe trained at several sizes
    assert set(changes["drafter"]) == {"few-ce", "markov"}
    assert set(tables["drafter"]) == {"table-few", "table-many"}
    assert set(tables["steps"]) == {0}


def test_items_write_files_and_finite_macros(budget_inputs, tmp_path):
    from floorgap.reports.budget_items import figE_drafter_learning, tableE_drafter_budget

    inputs, spec = budget_inputs
    fig = figE_drafter_learning(inputs, spec, tmp_path)
    tab = tableE_drafter_budget(inputs, spec, tmp_path)
    for ext in ("pdf", "png"):
        assert (tmp_path / f"figE_drafter_learning.{ext}").stat().st_size > 0
    tex = (tmp_path / "tableE_drafter_budget.tex").read_text()
    assert tex.startswith("\\begin{tabular}") and "nan" not in tex
    # a config value with LaTeX's specials is set as text (an init name broke the PDF once)
    assert "target\\_scaled" in tex and "target_scaled" not in tex
    # a study table is a row of its own, with no training settings
    assert "table-many (bigram\\_committed table) & -- & -- & -- & -- & -- & 900 & --" in tex
    assert fig["\\fgBudgetMaxBlocks"] == "900" and fig["\\fgBudgetMinBlocks"] == "100"
    assert fig["\\fgBudgetChangeFirst"].startswith(("\\ensuremath{+", "\\ensuremath{-"))
    # the sentences follow the curves' directions (lowest epoch, sign of the slope)
    assert fig["\\fgBudgetEpochSentence"].startswith("the first-slot risk is lowest after")
    assert ("falls by" in fig["\\fgBudgetDataSentence"]) == fig["\\fgBudgetChangeFirst"].startswith(
        "\\ensuremath{-")
    assert fig["\\fgBudgetFixedSteps"] == "9" and fig["\\fgBudgetEpochsStudied"] == "2"
    assert tab["\\fgBudgetFewBlocks"] == "100" and tab["\\fgBudgetTableManyBlocks"] == "900"
    assert all(v not in ("", "nan") for v in {**fig, **tab}.values())


def test_the_extrapolation_follows_the_fixed_steps_line():
    """Two sizes a decade apart at R_0 0.8 and 0.7: 0.1 per decade, so R_0 = 0.5 at 10x the
    larger size (1e2 -> 0.8, 1e3 -> 0.7, 1e5 -> 0.5)."""
    import pandas as pd

    from floorgap.reports.budget_items import _fit_per_decade

    intercept, slope = _fit_per_decade(pd.Series([100, 1000]), pd.Series([0.8, 0.7]))
    assert slope == pytest.approx(-0.1) and intercept == pytest.approx(1.0)
    assert 10 ** ((0.5 - intercept) / slope) == pytest.approx(1e5)


def test_a_missing_training_log_is_named(budget_inputs, tmp_path):
    from floorgap.reports.budget_items import study_runs

    inputs, spec = budget_inputs
    with pytest.raises(ValueError, match="log_many"):
        study_runs({k: v for k, v in inputs.items() if k != "log_many"}, spec)


@pytest.mark.parametrize("slope, words", [(-0.1, "falls by 0.100"), (0.05, "rises by 0.050"),
                                          (float("nan"), "no line is fitted")])
def test_the_data_sentence_takes_the_direction_of_the_slope(slope, words):
    from floorgap.reports.budget_items import _data_sentence

    assert words in _data_sentence(slope, 1e5)


def test_the_epoch_sentence_says_whether_the_risk_still_falls_at_the_last_epoch():
    import pandas as pd

    from floorgap.reports.budget_items import _epoch_sentence

    falling = pd.DataFrame({"epoch": [1, 2, 3], "R_0": [0.8, 0.7, 0.6]})
    turned = pd.DataFrame({"epoch": [1, 2, 3], "R_0": [0.8, 0.6, 0.7]})
    assert "still falls" in _epoch_sentence(falling)
    assert "did not lower it beyond epoch 2" in _epoch_sentence(turned)
