"""The paper's findings as checks (floorgap.reports.claims): the verdict rules, each kind of
check flipped by a summary edited to contradict it, and the table and macros of the item."""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import DEFAULT_CONFIG, SHIPPED_CONFIGS, load_config
from floorgap.records import write_table
from floorgap.reports.claims import (CLAIMS, HOLDS, NOT_HELD, NOT_MEASURED, UNRESOLVED, Check,
                                     Evidence, claims, count_line, evaluate, judge)

GAMMA = 4
ROLES = {"order0": "dflash", "order1": "dspark", "ours": "ours"}
SETTING = {"device": "cpu", "dtype": "float32", "taps": [1, 2], "top_k_targets": 16,
           "drafters": {"order0": {"name": "dflash", "kind": "dflash", "layers": 2, "epochs": 1},
                        "order1": {"name": "dspark", "imported": "org/dspark_block7"}}}
SPEC = {"roles": ROLES, "lookups": {}, "analysis": {"bootstrap": 10, "level": 0.95, "seed": 1},
        "ess_gates": [2], "setting": SETTING, "components_baseline": "vanilla", "arms": []}


def _ev(est, lo=None, hi=None) -> Evidence:
    return Evidence.of([f"k={i}" for i in range(len(est))], est, lo, hi)


@pytest.mark.parametrize("check, ev, verdict", [
    (Check("above", 0.5), _ev([0.7, 0.8], [0.6, 0.55], [0.8, 0.9]), HOLDS),
    (Check("above", 0.5), _ev([0.7, 0.3], [0.6, 0.2], [0.8, 0.45]), NOT_HELD),
    (Check("above", 0.5), _ev([0.7, 0.6], [0.6, 0.4], [0.8, 0.8]), UNRESOLVED),
    (Check("below", 0.1), _ev([0.05], [0.01], [0.08]), HOLDS),
    (Check("below", 0.1), _ev([0.3], [0.2], [0.4]), NOT_HELD),
    (Check("within", 0.4, 0.6), _ev([0.5], [0.45], [0.55]), HOLDS),
    (Check("within", 0.4, 0.6), _ev([0.8], [0.7], [0.9]), NOT_HELD),
    (Check("within", 0.4, 0.6), _ev([0.55], [0.5], [0.7]), UNRESOLVED),
    (Check("rises"), _ev([0.1, 0.2, 0.4], [0.05, 0.1, 0.3], [0.15, 0.3, 0.5]), HOLDS),
    (Check("rises"), _ev([0.4, 0.2, 0.1], [0.3, 0.1, 0.05], [0.5, 0.3, 0.15]), NOT_HELD),
    (Check("rises"), _ev([0.1, 0.2], [0.0, 0.1], [0.3, 0.3]), UNRESOLVED),
    (Check("falls"), _ev([0.4, 0.1], [0.3, 0.0], [0.5, 0.2]), HOLDS),
    # no interval: the estimate decides
    (Check("above", 0.0), _ev([0.2]), HOLDS),
    (Check("above", 0.0), _ev([-0.2]), NOT_HELD),
    (Check("rises"), _ev([0.3, 0.1]), NOT_HELD),
    (Check("above", 0.0), _ev([math.nan]), NOT_MEASURED),
    (Check("above", 0.0), None, NOT_MEASURED),
])
def test_verdict_rules(check, ev, verdict):
    assert judge(check, ev) == verdict


@given(st.lists(st.floats(-1, 1), min_size=1, max_size=6), st.floats(-0.5, 0.5),
       st.floats(0, 0.3))
def test_mirrored_evidence_never_keeps_a_verdict_of_holds(est, threshold, width):
    """A claim that holds on some evidence does not hold on its mirror image about the
    threshold: every check can fail."""
    est = np.array(est)
    ev = _ev(est, est - width, est + width)
    mirror = _ev(2 * threshold - est, 2 * threshold - est - width, 2 * threshold - est + width)
    for check in (Check("above", threshold), Check("below", threshold)):
        if judge(check, ev) == HOLDS:
            assert judge(check, mirror) == NOT_HELD


def test_there_are_at_least_25_claims_with_distinct_keys():
    keys = [c.key for c in CLAIMS]
    assert len(keys) >= 25 and len(set(keys)) == len(keys)
    assert {c.check.kind for c in CLAIMS} == {"above", "below", "within", "rises", "falls"}
    for c in CLAIMS:
        assert c.paper and c.where and c.statistic and c.claim.endswith(".")


# ------------------------------------------------------------------ summaries edited to flip

def _floors(path, t0, t0_lo, t0_hi, *, topdecile=(0.6, 0.3), t1=0.02, fit=0.0):
    """A floors summary: T^(0) by slot 0..GAMMA-1 with the given intervals, a top-decile share
    at slot 1 and the last slot, T^(1) and the split-half fit check."""
    rows = [{"statistic": "gamma", "domain": "all", "slot": -1, "estimate": GAMMA,
             "lower": math.nan, "upper": math.nan, "n_anchors": 8}]
    for k in range(GAMMA):
        rows.append({"statistic": "T0", "domain": "all", "slot": k, "estimate": t0[k],
                     "lower": t0_lo[k], "upper": t0_hi[k], "n_anchors": 8})
        rows.append({"statistic": "T1_split_covered", "domain": "all", "slot": k,
                     "estimate": t1, "lower": t1 / 2, "upper": t1 * 1.5, "n_anchors": 8})
        rows.append({"statistic": "T0_split_minus_T0", "domain": "all", "slot": k,
                     "estimate": fit, "lower": fit - 0.002, "upper": fit + 0.002,
                     "n_anchors": 8})
    for k, share in zip((1, GAMMA - 1), topdecile):
        rows.append({"statistic": "T0_topdecile_share", "domain": "all", "slot": k,
                     "estimate": share, "lower": share - 0.05, "upper": share + 0.05,
                     "n_anchors": 8})
    write_table(path, pd.DataFrame(rows), {"target": "t", "analysis": {"level": 0.95}})
    return path


def _verdicts(tmp_path, **files) -> dict[str, str]:
    inputs = {f"{kind}__summary": path for kind, path in files.items()}
    return {r.claim.key: r.verdict for r in evaluate(inputs, SPEC)}


RISING = ([0.0, 0.1, 0.2, 0.3], [0.0, 0.08, 0.17, 0.26], [0.0, 0.12, 0.23, 0.34])


@pytest.mark.parametrize("key, kind, edit", [
    # rises: the floor falls instead
    ("floor_rises_with_slot", "rises", dict(t0=[0.0, 0.3, 0.2, 0.1], t0_lo=[0.0, 0.26, 0.17, 0.08],
                                           t0_hi=[0.0, 0.34, 0.23, 0.12])),
    # above 0: the floor's intervals below zero
    ("floor_positive", "above", dict(t0=[0.0, -0.1, -0.2, -0.3], t0_lo=[0.0, -0.2, -0.3, -0.4],
                                     t0_hi=[0.0, -0.05, -0.1, -0.2])),
    # below 0.1: the order-1 floor large
    ("order_one_floor_small", "below", dict(t1=0.3)),
    # within [-0.01, 0.01]: the fit check far off
    ("split_fit_check_small", "within", dict(fit=0.05)),
    # falls: the top decile's share grows with depth
    ("concentration_falls_with_depth", "falls", dict(topdecile=(0.3, 0.6))),
])
def test_each_kind_of_check_fails_on_a_summary_edited_to_contradict_it(tmp_path, key, kind,
                                                                        edit):
    claim = next(c for c in CLAIMS if c.key == key)
    assert claim.check.kind == kind
    base = _floors(tmp_path / "base.parquet", *RISING)
    assert _verdicts(tmp_path, floors=base)[key] == HOLDS
    args = dict(zip(("t0", "t0_lo", "t0_hi"), RISING)) | edit
    edited = _floors(tmp_path / "edited.parquet", **args)
    assert _verdicts(tmp_path, floors=edited)[key] == NOT_HELD


def _gaps(path, g0_share_last: float, gap_reduction: float):
    """A gaps summary: the order-0 drafter's gap share and the ours-vs-order-1 contrast."""
    rows = []
    for v, order in (("dflash", 0), ("dspark", 1), ("ours", 1)):
        rows.append({"statistic": "order", "variant": v, "domain": "all", "slot": -1,
                     "estimate": order, "lower": math.nan, "upper": math.nan})
    for k in range(GAMMA):
        share = 0.6 if k < GAMMA - 1 else g0_share_last
        rows.append({"statistic": "G0_share", "variant": "dflash", "domain": "all", "slot": k,
                     "estimate": share, "lower": share - 0.05, "upper": share + 0.05})
        rows.append({"statistic": "gap_reduction", "variant": "ours-dspark", "domain": "all",
                     "slot": k, "estimate": gap_reduction, "lower": gap_reduction - 0.05,
                     "upper": gap_reduction + 0.05})
    write_table(path, pd.DataFrame(rows), {"target": "t", "gamma": GAMMA})
    return path


def test_gap_claims_follow_the_gaps_summary(tmp_path):
    holds = _verdicts(tmp_path, gaps=_gaps(tmp_path / "a.parquet", 0.55, 0.25))
    flipped = _verdicts(tmp_path, gaps=_gaps(tmp_path / "b.parquet", 0.9, -0.25))
    for key in ("dflash_gap_share_last_range", "ours_gap_lower"):
        assert (holds[key], flipped[key]) == (HOLDS, NOT_HELD)
    # what the run does not have is not measured, never a verdict
    assert holds["floor_rises_with_slot"] == NOT_MEASURED


MACRO = re.compile(r"\\fg[A-Za-z]+")


def test_the_item_writes_its_table_counts_and_prose_macros(tmp_path):
    floors = _floors(tmp_path / "floors.parquet", *RISING)
    gaps = _gaps(tmp_path / "gaps.parquet", 0.9, -0.25)
    values = claims({"floors__summary": floors, "gaps__summary": gaps}, SPEC, tmp_path)
    table = pd.read_csv(tmp_path / "claims.csv")
    assert set(table["claim"]) == {c.key for c in CLAIMS}
    assert all(MACRO.fullmatch(name) for name in values)
    total = sum(int(values[f"\\fgClaims{w}"]) for w in ("Held", "NotHeld", "NotResolved",
                                                        "NotMeasured"))
    assert total == len(CLAIMS) == int(values["\\fgClaimsTotal"])
    assert values["\\fgClaimFloorRisesWithSlotDirection"] == "rises"
    assert values["\\fgClaimOursGapLowerDirection"] == "widens"
    assert values["\\fgClaimOursGapLowerSays"] == "does not hold"
    assert "longtable" in (tmp_path / "claims.tex").read_text()
    assert values["\\fgSettingDrafters"] == (
        "the order-0 baseline dflash, a dflash drafter of 2 layers trained for 1 epoch; "
        "the order-1 baseline dspark, imported from \\url{org/dspark_block7}")
    assert count_line(list(table.drop_duplicates("claim")["verdict"])).startswith(
        f"the paper's findings on this run: {values[chr(92) + 'fgClaimsHeld']} held")


def test_the_claims_command_prints_the_count_line_and_refuses_a_missing_table(tmp_path, capsys):
    from floorgap.cli import main

    floors = _floors(tmp_path / "floors.parquet", *RISING)
    claims({"floors__summary": floors}, SPEC, tmp_path)
    assert main(["claims", "--table", str(tmp_path / "claims.csv")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("the paper's findings on this run: ") and f"(of {len(CLAIMS)};" in out
    assert main(["claims", "--table", str(tmp_path / "nothing.csv")]) == 2
    assert "snakemake paper/tables/claims.csv" in capsys.readouterr().err


@pytest.mark.parametrize("path", [DEFAULT_CONFIG, *SHIPPED_CONFIGS], ids=lambda p: p.stem)
def test_every_shipped_config_gives_the_claims_item_its_inputs_and_setting(path):
    """The claims item's files and options resolve under every shipped config: imported and
    trained drafters, each role named in words, taps and top-K from the config."""
    import json

    from floorgap.config import REPORT_SUMMARIES, as_json, resolve
    from floorgap.reports.claims import _setting_macros

    w = resolve(load_config(path))
    inputs = REPORT_SUMMARIES["claims"].inputs(w)
    assert "floors__summary" in inputs and any(k.startswith("mi__") for k in inputs)
    options = json.loads(as_json(REPORT_SUMMARIES["claims"].options(w)))
    assert set(options["setting"]["drafters"]) == {"order0", "order1", "ours"}
    values = _setting_macros(options["setting"])
    assert values["\\fgSettingTaps"].startswith("$[") and values["\\fgSettingDevice"] in ("CPU",
                                                                                         "GPU")
