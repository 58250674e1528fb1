"""Gap-half report items: each writes its files and a values fragment of valid macros."""

from __future__ import annotations

import json
import re

import pytest

from conftest import load_builders
from floorgap.stages._cli import run_stage
from floorgap.reports.registry import report_items
from floorgap.stages.report import build_parser, main

ITEMS = report_items()

GAP_ITEMS = {
    "fig4_drafter_decomposition": "figure",
    "fig6_slot_priority": "figure",
    "fig7_prefix_attention": "figure",
    "table5_dflash": "table",
    "table6_dspark": "table",
    "table7_serving_risk": "table",
    "table8_dependence": "table",
    "table12_ours_vs_dspark": "table",
    "tableF5_single_slot": "table",
    "tableF6_sweeps": "table",
}
ROLES = {"order0": "dflash", "order1": "dspark", "ours": "ours"}
FIG_SPEC = json.dumps({"width_in": 3.4, "height_in": 2.4, "font_size": 8, "dpi": 60, "roles": ROLES})
TABLE_SPEC = json.dumps({"roles": ROLES})
MACRO = re.compile(r"\\newcommand\{(\\fg[A-Za-z]+)\}\{(.*)\}")


def _builders():
    return load_builders("gap_builders")


@pytest.fixture(scope="module")
def summary_path(tmp_path_factory):
    from floorgap.stages.gaps import build_parser as stage_parser
    from floorgap.stages.gaps import main as stage_main

    root = tmp_path_factory.mktemp("gap_items")
    files = _builders().build(root, gamma=3, M=6, anchors_per_domain=3)
    out = root / "gaps" / "summary.parquet"
    argv = ["--spec", json.dumps({"bootstrap": 50, "level": 0.95,
                                  "contrasts": [["ours", "dspark"]]}),
            "--anchor-slot", str(files["anchor_slot"][0]),
            "--paths", *map(str, files["paths"]), "--slots", *map(str, files["slots"]),
            "--out-summary", str(out), "--threads", "1"]
    assert run_stage(stage_main, stage_parser(), argv) == 0
    return out


@pytest.mark.parametrize("name", sorted(GAP_ITEMS))
def test_item_writes_files_and_macros(name, summary_path, tmp_path):
    assert name in ITEMS
    kind = GAP_ITEMS[name]
    out_dir = tmp_path / ("figures" if kind == "figure" else "tables")
    values = tmp_path / "values" / f"{name}.tex"
    argv = [name, "--summary", str(summary_path), "--out-dir", str(out_dir),
            "--out-values", str(values), "--threads", "1"]
    argv += ["--spec", FIG_SPEC if kind == "figure" else TABLE_SPEC]
    assert run_stage(main, build_parser(), argv) == 0
    exts = ("pdf", "png") if kind == "figure" else ("tex", "csv")
    for ext in exts:
        f = out_dir / f"{name}.{ext}"
        assert f.exists() and f.stat().st_size > 0
    macros = MACRO.findall(values.read_text())
    assert macros
    for macro, value in macros:
        assert value and value != "--", (macro, value)
    if kind == "table":
        tex = (out_dir / f"{name}.tex").read_text()
        assert tex.startswith("\\begin{tabular}") and "nan" not in tex


def test_macros_unique_across_items(summary_path, tmp_path):
    from floorgap.reports.common import concat_values

    frags = []
    for name, kind in GAP_ITEMS.items():
        values = tmp_path / f"{name}.tex"
        argv = [name, "--summary", str(summary_path), "--out-dir", str(tmp_path / "o"),
                "--out-values", str(values), "--threads", "1"]
        argv += ["--spec", FIG_SPEC if kind == "figure" else TABLE_SPEC]
        assert run_stage(main, build_parser(), argv) == 0
        frags.append(values)
    concat_values(tmp_path / "values.tex", frags)


def _summarise(root, variants, spec, name):
    """Synthetic drafter records of ``variants`` through the serving_risk stage."""
    from floorgap.stages.gaps import build_parser as stage_parser
    from floorgap.stages.gaps import main as stage_main

    files = _builders().build(root, gamma=3, M=6, anchors_per_domain=3, variants=variants)
    out = root / "gaps" / f"{name}.parquet"
    argv = ["--spec", json.dumps({"bootstrap": 50, "level": 0.95, **spec}),
            "--anchor-slot", str(files["anchor_slot"][0]),
            "--paths", *map(str, files["paths"]), "--slots", *map(str, files["slots"]),
            "--out-summary", str(out), "--threads", "1"]
    assert run_stage(stage_main, stage_parser(), argv) == 0
    return out


def _run_item(name, summary, tmp_path, spec=None, served=None):
    values = tmp_path / "values" / f"{name}.tex"
    argv = [name, "--summary", str(summary), "--out-dir", str(tmp_path / "tables"),
            "--out-values", str(values), "--threads", "1"]
    if served is not None:
        argv += ["--input", f"served={served}"]
    if spec is not None:
        argv += ["--spec", json.dumps(spec)]
    assert run_stage(main, build_parser(), argv) == 0
    return dict(MACRO.findall(values.read_text()))


def test_table10_trajectory_reads_every_epoch(tmp_path):
    import pandas as pd

    from floorgap.reports.common import GapSummary

    # the final weights are the last epoch: the stage relabels them
    summary = _summarise(tmp_path, {"ours@epoch-1": {"order": 1}, "ours@epoch-2": {"order": 1},
                                    "ours": {"order": 1}},
                         {"labels": {"ours": "ours@epoch-3"}, "contrasts": [],
                          "sweeps": False}, "trajectory")
    s = GapSummary(summary)
    assert s.variants == ["ours@epoch-1", "ours@epoch-2", "ours@epoch-3"]
    assert not (s.df["statistic"].str.startswith("sweep")).any()
    values = _run_item("table10_trajectory", summary, tmp_path, {"roles": ROLES})
    csv = pd.read_csv(tmp_path / "tables" / "table10_trajectory.csv")
    assert csv["epoch"].tolist() == [1, 2, 3]
    for e in (1, 2, 3):
        tau = float(csv.loc[csv["epoch"] == e, "tau"].iloc[0])
        assert tau == pytest.approx(s.get("tau", f"ours@epoch-{e}"))
        assert 1.0 <= tau <= 4.0
    assert values["\\fgOursTrajectoryEpochs"] == "3"
    tex = (tmp_path / "tables" / "table10_trajectory.tex").read_text()
    assert "Epoch & 1 & 2 & 3" in tex and "nan" not in tex


def test_table10_refuses_a_summary_without_epochs(summary_path, tmp_path):
    values = tmp_path / "v.tex"
    argv = ["table10_trajectory", "--spec", TABLE_SPEC, "--summary", str(summary_path),
            "--out-dir", str(tmp_path),
            "--out-values", str(values), "--threads", "1"]
    assert run_stage(main, build_parser(), argv) != 0
    assert not values.exists()


def _served_summary(tmp_path, systems):
    """A serving summary in which ``systems`` (with AR) were served: tau = 2 at T = 1."""
    import pandas as pd

    from floorgap.analysis.serving import summarise_serving
    from floorgap.records import write_table

    req, runs = [], []
    for system, steps in (("ar", 20), *((v, 10) for v in systems)):
        for temp in (0.0, 1.0):
            req.append({"system": system, "task": "gsm8k", "row_id": "gsm8k:0",
                        "temperature": temp, "concurrency": 1, "completion_tokens": 20,
                        "verify_steps": steps, "verified_tokens": 20, "latency_s": 1.0})
            runs.append({"system": system, "task": "gsm8k", "temperature": temp,
                         "concurrency": 1, "wall_s": 1.0})
    path = tmp_path / "served.parquet"
    write_table(path, summarise_serving(pd.DataFrame(req), pd.DataFrame(runs), n_boot=20,
                                        level=0.95, seed=1), {"device": "cpu"})
    return path


def test_table13_components_change_is_the_paired_tau_difference(tmp_path):
    import pandas as pd

    arms = ["vanilla", "short_conv", "head"]
    summary = _summarise(tmp_path, {a: {"order": 1} for a in arms},
                         {"contrasts": [[a, "vanilla"] for a in arms[1:]], "sweeps": False},
                         "components")
    values = _run_item("table13_components", summary, tmp_path,
                       {"baseline": "vanilla", "arms": arms},
                       served=_served_summary(tmp_path, ["vanilla"]))
    csv = pd.read_csv(tmp_path / "tables" / "table13_components.csv").set_index("arm")
    assert list(csv.index) == arms
    # the served arm has its served tau next to the offline one; the others were not served
    assert csv.loc["vanilla", "served_tau"] == 2.0 and pd.isna(csv.loc["head", "served_tau"])
    tex = (tmp_path / "tables" / "table13_components.tex").read_text()
    assert "Served" in tex and "2.000" in tex
    for a in arms[1:]:
        # Hajek means over the same anchors: the paired mean difference is the difference of
        # the means, and its interval brackets it
        assert csv.loc[a, "change"] == pytest.approx(csv.loc[a, "tau"] - csv.loc["vanilla", "tau"],
                                                     abs=1e-9)
        assert csv.loc[a, "change_lower"] <= csv.loc[a, "change"] <= csv.loc[a, "change_upper"]
    assert pd.isna(csv.loc["vanilla", "change"])
    best = max(arms, key=lambda a: csv.loc[a, "tau"])
    from floorgap.reports.gap_items import LABELS

    assert values["\\fgComponentsBest"] == LABELS[best]
    assert "\\fgComponentsShortConvChange" in values


def test_macros_are_named_by_role_whatever_the_variants_are_called(tmp_path):
    """The paper cites \\fgDflash..., \\fgDspark..., \\fgOurs...: renamed variants keep them."""
    roles = {"order0": "blockwise", "order1": "markov", "ours": "prefix-head"}
    summary = _summarise(tmp_path, {"blockwise": {"order": 0}, "markov": {"order": 1},
                                    "prefix-head": {"order": 1}},
                         {"contrasts": [["prefix-head", "markov"]], "sweeps": False}, "summary")
    values = _run_item("table8_dependence", summary, tmp_path, {"roles": roles})
    assert {"\\fgDflashTau", "\\fgDsparkTau", "\\fgDsparkDependenceLast"} <= set(values)
    assert not any("Blockwise" in m or "Markov" in m for m in values)
    tex = (tmp_path / "tables" / "table8_dependence.tex").read_text()
    assert "blockwise" in tex and "markov" in tex  # the tables show the variants' own names


def test_fig5_compares_every_targets_final_slot(summary_path, tmp_path):
    """Two targets (the same summary twice, and a second built from other draws): one bar pair per
    target, and the cross-target ranges of G0/R and G1/R^oracle follow the summaries."""
    from floorgap.records import read_metadata, read_table, write_table
    from floorgap.reports.common import GapSummary
    from floorgap.reports.reach_items import fig5_cross_target
    from floorgap.stages.gaps import build_parser as stage_parser
    from floorgap.stages.gaps import main as stage_main

    files = _builders().build(tmp_path / "b", gamma=3, M=6, anchors_per_domain=3, seed=5)
    other = tmp_path / "b" / "gaps" / "summary.parquet"
    argv = ["--spec", json.dumps({"bootstrap": 50, "level": 0.95, "contrasts": []}),
            "--anchor-slot", str(files["anchor_slot"][0]),
            "--paths", *map(str, files["paths"]), "--slots", *map(str, files["slots"]),
            "--out-summary", str(other), "--threads", "1"]
    assert run_stage(stage_main, stage_parser(), argv) == 0
    # the second target was prompted as a base model is: its records say so
    write_table(other, read_table(other), {**read_metadata(other), "prompts": "plain"})
    spec = json.loads(FIG_SPEC)
    values = fig5_cross_target({"gaps_first": summary_path, "gaps_second": other}, spec, tmp_path)
    assert values["\\fgCrossPlainPromptTargets"] == "\\texttt{second}"
    assert (tmp_path / "fig5_cross_target.pdf").stat().st_size > 1000
    shares = [GapSummary(p).get("G0_share", ROLES["order0"], 2) for p in (summary_path, other)]
    assert values["\\fgCrossTargets"] == "2"
    assert values["\\fgCrossDflashGapShareRange"] == (
        f"{100 * min(shares):.0f}\\%--{100 * max(shares):.0f}\\%")
    assert "\\texttt{first}, \\texttt{second}" == values["\\fgCrossTargetList"]


def test_lookup_tables_get_rows_lines_and_a_verdict(tmp_path):
    """Lookup tables beside the drafters: rows in Tables 5, 6 and 12, the paired differences
    in their csv, and the verdict macro naming where a drafter loses to a table."""
    import pandas as pd

    from floorgap.analysis.lookup_verdicts import lookup_verdicts
    from floorgap.reports.common import GapSummary

    variants = {"dflash": {"order": 0}, "dspark": {"order": 1}, "ours": {"order": 1},
                "bigram_committed": {"order": 0}, "bigram": {"order": 1}}
    pairs = [["dflash", "bigram_committed"], ["dspark", "bigram"], ["ours", "bigram"]]
    summary = _summarise(tmp_path, variants, {"contrasts": [["ours", "dspark"], *pairs],
                                              "lookups": ["bigram_committed", "bigram"]},
                         "summary")
    s = GapSummary(summary)
    spec = {"roles": ROLES, "lookups": {"bigram_committed": "bigram_committed",
                                        "bigram": "bigram"}}
    values = {}
    for name in ("table5_dflash", "table6_dspark", "table12_ours_vs_dspark"):
        values.update(_run_item(name, summary, tmp_path, spec))
    tex5 = (tmp_path / "tables" / "table5_dflash.tex").read_text()
    assert "bigram table on $c$" in tex5
    assert "bigram table" in (tmp_path / "tables" / "table6_dspark.tex").read_text()
    csv5 = pd.read_csv(tmp_path / "tables" / "table5_dflash.csv")
    assert "dflash-bigram_committed" in set(csv5["variant"])
    verdicts = lookup_verdicts(s.df, pairs)
    assert [v.statistic for v in verdicts] == ["diff_R", "diff_R_oracle", "diff_R_oracle"]
    sentence = values["\\fgLookupVerdict"]
    for v in verdicts:
        assert (f"at slots {', '.join(map(str, v.loses))}" in sentence) == bool(v.loses)
        # a slot is a loss where the paired difference is not below zero
        d = [s.get(v.statistic, f"{v.drafter}-{v.table}", k) for k in s.slots]
        assert v.loses == [k for k in s.slots if not d[k] < 0]
    for name in ("fig4_drafter_decomposition", "fig7_prefix_attention"):
        fig_spec = {**json.loads(FIG_SPEC), **spec}
        _run_item(name, summary, tmp_path, fig_spec)
