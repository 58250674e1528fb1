"""`floorgap check`: the check section of the config, the verdicts and comparisons computed from
real gaps summaries of synthetic records, the page and summary, the check_report stage, and
the command (its Snakemake run replaced by a stub; the real run is
tests/integration/test_check_workflow.py)."""

from __future__ import annotations

import base64
import copy
import json
import math
import re
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import SMOKE_CONFIG, load_builders, load_config
from floorgap.config import ConfigError, resolve

DRAFTERS = {"mine": {"order": 0}, "other": {"order": 0}, "theirs": {"order": 1},
            "table0": {"order": 0}, "table1": {"order": 1}}


def smoke_with_checks(checks: dict, decompose: tuple[str, ...] = ("mine", "other", "theirs")
                      ) -> dict:
    cfg = load_config(SMOKE_CONFIG)
    cfg["decompose"] = {n: {"checkpoint": {"format": "dspark" if n == "theirs" else "dflash",
                                           "path": f"/models/{n}"}} for n in decompose}
    cfg["check"] = checks
    return cfg


# ------------------------------------------------------------------ the config


def test_a_check_compares_its_drafters_pairwise_in_the_decompose_summary() -> None:
    spec = resolve(smoke_with_checks({"a+b": {"drafters": ["mine", "other", "theirs"]},
                                      "solo": {"drafters": ["mine"]}}))
    assert spec.check_contrasts() == [["mine", "other"], ["mine", "theirs"], ["other", "theirs"]]
    contrasts = spec.gaps_spec("decompose", spec.primary)["contrasts"]
    assert ["mine", "other"] in contrasts and ["other", "theirs"] in contrasts
    check = spec.check_spec("a+b")
    assert check["target"] == spec.primary and check["pairs"] == spec.check_contrasts()
    assert [d["name"] for d in check["drafters"]] == ["mine", "other", "theirs"]
    # each drafter beside the lookup tables of its own order
    orders = {d["name"]: {spec.drafter_order(t) for t in d["lookups"]}
              for d in check["drafters"]}
    assert orders == {"mine": {0}, "other": {0}, "theirs": {1}}
    assert spec.check_spec("solo")["pairs"] == []
    assert spec.check_files() == ["results/check/a+b/index.html", "results/check/a+b/summary.md",
                                  "results/check/solo/index.html", "results/check/solo/summary.md"]


@pytest.mark.parametrize(("checks", "needle"), [
    ({"c": {"drafters": ["nope"]}}, r"check.c names \['nope'\], which are not in the decompose"),
    ({"c": {"drafters": ["mine"], "target": "tiny-random-b"}}, "not a target of scope full"),
    ({"c": {"drafters": ["mine"], "target": "nope"}}, "check.c.target 'nope' is not a target"),
])
def test_bad_checks_are_refused_by_name(checks, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        resolve(smoke_with_checks(checks))


def test_the_schema_refuses_a_check_without_drafters() -> None:
    import jsonschema

    from conftest import REPO

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    jsonschema.validate(smoke_with_checks({"c": {"drafters": ["mine"]}}), schema)
    with pytest.raises(jsonschema.ValidationError, match="'drafters' is a required property"):
        jsonschema.validate(smoke_with_checks({"c": {"target": "tiny-random"}}), schema)


def test_a_check_serves_its_engine_folders_after_the_configured_systems() -> None:
    cfg = smoke_with_checks({"c": {"drafters": ["mine", "theirs", "other"], "serve_rows": 2,
                                   "references": {"mine": "/w/final.pt"}}})
    cfg["decompose"]["other"]["checkpoint"]["format"] = "speculators"
    cfg["decompose"]["other"]["kind"] = "dspark"
    for target in cfg["targets"].values():   # on a GPU, where both engine methods run
        target["device"] = "cuda"
    spec = resolve(cfg)
    t = spec.primary
    # the speculators layout is no engine's: not served
    assert spec.check_served("c") == ["mine", "theirs"] == spec.check_systems
    assert spec.check_replay_files("c") == [f"results/{t}/serving_replay/{d}/rounds.parquet"
                                            for d in ("mine", "theirs")]
    port = cfg["serving"]["port"]
    assert [spec.serving_port(s) for s in ("ar", "dflash", "mine", "theirs")] == \
        [port, port + 1, port + 2, port + 3]
    mine = spec.serving_spec(t, "mine")
    assert mine["serving"]["rows_per_task"] == 2 and mine["serving"]["concurrency"] == [1]
    assert mine["system"] == {"name": "mine", "kind": "dflash", "format": "dflash"}
    assert spec.serving_system("theirs")["format"] == "dspark"
    # the configured systems are served as before
    assert "rows_per_task" not in spec.serving_spec(t, "dflash")["serving"]
    assert spec.served_folder(t, "mine") == "/models/mine"
    assert spec.served_folder(t, "dflash") == f"results/{t}/export/dflash/dflash"
    assert spec.served_folder(t, "ar") is None
    assert spec.replay_reference("mine") == ["/w/final.pt"]
    # a checked folder's rounds are replayed under the named faults too, the benchmark's not
    assert spec.serving_replay_spec(t, "mine")["name_faults"] is True
    assert "name_faults" not in spec.serving_replay_spec(t, "dflash")
    assert spec.replay_reference("theirs") == spec.replay_reference("dflash") == []
    assert spec.check_spec("c")["served"] == ["mine", "theirs"]
    # off by choice
    cfg["check"]["c"]["serve"] = False
    assert resolve(cfg).check_served("c") == [] == resolve(cfg).check_systems


# ------------------------------------------------------------------ verdicts and the page


@pytest.fixture(scope="module")
def summaries(tmp_path_factory) -> tuple[Path, Path]:
    """A real gaps summary of synthetic records (two order-0 drafters, one order-1, a table
    of each order) with the lookup and pairwise contrasts, and a floors summary of the same
    target and gamma with the other-order floors."""
    return load_builders("gap_builders").decompose_summaries(
        tmp_path_factory.mktemp("check"), DRAFTERS,
        [["mine", "table0"], ["other", "table0"], ["theirs", "table1"], ["mine", "other"],
         ["mine", "theirs"]])


def check_spec(drafters=("mine", "other", "theirs"), pairs=(("mine", "other"),
                                                            ("mine", "theirs"))) -> dict:
    tables = {"mine": ["table0"], "other": ["table0"], "theirs": ["table1"]}
    return {"name": "+".join(drafters), "level": 0.9, "pairs": [list(p) for p in pairs],
            "drafters": [{"name": d, "entry": {"kind": "dspark" if d == "theirs" else "dflash"},
                          "lookups": tables[d]} for d in drafters],
            "command": "floorgap check /models/mine /models/other", "configfiles": []}


def test_the_verdicts_follow_the_numbers_and_their_thresholds(summaries) -> None:
    from floorgap.reports.check import FLOOR_SHARE, build_check
    from floorgap.reports.common import GapSummary

    report = build_check(*summaries, check_spec())
    gaps = GapSummary(summaries[0])
    for c in report.drafters:
        d = c.decomposition
        kinds = [v.kind for v in c.verdicts]
        assert kinds == ["export", "engine", "under-trained", "floor", "order", "fix first"]
        assert "no reference weights" in c.verdicts[0].text and not c.verdicts[0].flag
        assert "was not served: the config has no serving section" in c.verdicts[1].text
        assert not c.verdicts[1].flag
        share = "G0_share" if d.order == 0 else "G1_share"
        near = [k for k in range(3) if d.value(share, k) <= FLOOR_SHARE]
        floor = c.verdicts[3]
        if near:
            assert f"at slots {', '.join(map(str, near))}" in floor.text and not floor.flag
        else:
            assert "not within 10% of its floor at any slot" in floor.text and floor.flag
        # the table verdict flags exactly the slots where the paired difference is not < 0
        table = "table0" if d.order == 0 else "table1"
        diff = "diff_R" if d.order == 0 else "diff_R_oracle"
        loses = [k for k in range(3) if not gaps.get(diff, f"{d.drafter}-{table}", k) < 0]
        assert c.verdicts[2].flag == bool(loses)
        # fix first: the slot of the largest held-out best-response gain
        gains = [gaps.get("dtau_br", d.drafter, k) for k in range(3)]
        best = max(range(3), key=lambda k: gains[k])
        assert c.verdicts[5].text.startswith(f"fix slot {best} of {d.drafter} first")
        assert f"{gains[best]:.3f}" in c.verdicts[5].text
        # the order verdict quotes the other order's floor from the floors summary
        assert ("0.120" if d.order == 0 else "0.320") in c.verdicts[4].text


def fidelity_record(drafter: str, tvs=(0.0, 0.0, 0.0), error: str | None = None) -> dict:
    return {"drafter": drafter, "folder": f"/models/{drafter}", "anchors": 8,
            "reference": f"results/t/drafters/{drafter}/final.pt", "error": error,
            "slots": [] if error else [{"slot": k, "blocks": 8, "max_abs_dq": tv / 3,
                                         "mean_tv": tv, "argmax_agreement": 1 - tv}
                                        for k, tv in enumerate(tvs)]}


@pytest.mark.parametrize(("record", "needle", "flag"), [
    (fidelity_record("mine"), "reads as the weights it was exported from", False),
    (fidelity_record("mine", tvs=(0.0, 0.2, 0.05)),
     "export or layout fault: mine's folder does not read as results/t/drafters/mine/final.pt: "
     "mean TV(q_ref, q) above 0.01 at slots 1, 2 (up to 0.200)", True),
    (fidelity_record("mine", error="gamma=3 needs 3 block rows"),
     "export or layout fault: mine's folder does not read as results/t/drafters/mine/final.pt: "
     "gamma=3 needs 3 block rows", True),
])
def test_the_export_verdict_reads_the_fidelity_record(summaries, record, needle, flag) -> None:
    from floorgap.reports.check import build_check

    spec = {**check_spec(drafters=("mine",), pairs=()),
            "references": {"mine": record["reference"]}}
    with pytest.raises(ValueError, match=r"no export_fidelity record for \['mine'\]"):
        build_check(*summaries, spec)
    verdict = build_check(*summaries, spec, fidelity={"mine": record}).drafters[0].verdicts[0]
    assert verdict.kind == "export" and needle in verdict.text and verdict.flag == flag


def served(acceptance_z=0.3, lossless_z=-0.8, agreement=1.0, first=None, drafts=(25, 26.5),
           active=12):
    from floorgap.reports.check import ServedCheck

    return ServedCheck(engine="vllm", replayed_with="results/t/drafters/mine/final.pt",
                       by_temperature={
                           0.0: {"tau_served": [2.0, 1.8, 2.2], "tau_offline": [2.0, 1.8, 2.2],
                                 "rounds": 40.0, "acceptance_z": math.nan,
                                 "lossless_z": math.nan, "greedy_agreement": agreement,
                                 "active_rounds": float(active)},
                           1.0: {"tau_served": [1.5, 1.3, 1.7], "tau_offline": [1.6, 1.4, 1.8],
                                 "rounds": 50.0, "acceptance_z": acceptance_z,
                                 "lossless_z": lossless_z, "greedy_agreement": math.nan,
                                 "accepted_observed": float(drafts[0]),
                                 "accepted_expected": float(drafts[1])}},
                       first_divergent=first)


FIRST = {"task": "gsm8k", "row_id": "gsm8k:3", "round": 4, "served": 0, "replayed": 2}


@pytest.mark.parametrize(("check", "needle", "flag"), [
    (served(), "the engine serves what the weights predict: mine in vllm, replayed with "
               "results/t/drafters/mine/final.pt: acceptance z +0.30 at T = 1; lossless z -0.80 "
               "at T = 1; 100% of 40 rounds reproduced at T = 0", False),
    (served(acceptance_z=-9.5, agreement=0.4, first=FIRST),
     "engine or layout fault: mine in vllm, replayed with results/t/drafters/mine/final.pt: "
     "acceptance z -9.50 at T = 1; 40% of 40 rounds reproduced at T = 0; first divergent round: "
     "gsm8k row gsm8k:3 round 4 (served 0 drafts accepted, replayed 2)", True),
    (served(lossless_z=6.0), "engine or layout fault: mine in vllm, replayed with "
     "results/t/drafters/mine/final.pt: lossless z +6.00 at T = 1; tau served 2.000", True),
    (served(agreement=0.85), "85% of 40 rounds reproduced at T = 0; tau served", True),
    # informative at one temperature is enough
    (served(drafts=(1, 2.0)), "the engine serves what the weights predict", False),
    (served(active=0), "the engine serves what the weights predict", False),
    # nothing accepted, served or replayed: no fault can show
    (served(drafts=(1, 2.4), active=2),
     "the served rounds cannot tell whether the engine serves what the weights predict: mine in "
     "vllm, replayed with results/t/drafters/mine/final.pt: 1 drafts accepted against 2.4 "
     "predicted at T = 1; 2 of 40 greedy rounds accept any draft", False),
    # but a fault shows whatever the count
    (served(drafts=(1, 2.4), active=2, acceptance_z=-5.0), "engine or layout fault", True),
])
def test_the_engine_verdict_follows_the_served_tests(summaries, check, needle, flag) -> None:
    from floorgap.reports.check import build_check
    from floorgap.reports.check_page import to_html, to_markdown

    spec = {**check_spec(drafters=("mine",), pairs=()), "served": ["mine"], "engine": "vllm"}
    with pytest.raises(ValueError, match=r"no served rounds for \['mine'\]"):
        build_check(*summaries, spec)
    report = build_check(*summaries, spec, served={"mine": check})
    verdict = report.drafters[0].verdicts[1]
    assert verdict.kind == "engine" and needle in verdict.text and verdict.flag == flag
    # the page: the drafter's figure and the served one; the served table in both
    page, md = to_html(report), to_markdown(report)
    assert len(re.findall(r"<img ", page)) == 2 and "Served in vllm" in page
    assert "| T | rounds | tau served |" in md and "| 1 | 50 | 1.500 | [1.300, 1.700] |" in md


SHIFT = "block layout shifted by one"
OFFSET = "target-layer index offset by +1"


@pytest.mark.parametrize(("hypotheses", "needle"), [
    ({SHIFT: {0.0: {"greedy_agreement": 1.0}, 1.0: {"acceptance_z": 0.4}},
      OFFSET: {0.0: {"greedy_agreement": 0.3}, 1.0: {"acceptance_z": -7.0}}},
     "block layout shifted by one (the rounds replayed so: 100% of greedy rounds at T = 0; "
     "acceptance z +0.40 at T = 1): mine in vllm, replayed with"),
    ({SHIFT: {0.0: {"greedy_agreement": 0.5}, 1.0: {"acceptance_z": 0.4}},
      OFFSET: {0.0: {"greedy_agreement": 0.95}, 1.0: {"acceptance_z": -1.0}}},
     "target-layer index offset by +1 (the rounds replayed so: 95% of greedy rounds at T = 0; "
     "acceptance z -1.00 at T = 1): mine in vllm"),
    ({SHIFT: {0.0: {"greedy_agreement": 0.5}, 1.0: {"acceptance_z": 0.4}}},
     "engine or layout fault (none of block layout shifted by one fits): mine in vllm"),
])
def test_a_served_fault_is_named_by_the_replay_it_fits(summaries, hypotheses, needle) -> None:
    from dataclasses import replace

    from floorgap.reports.check import build_check

    spec = {**check_spec(drafters=("mine",), pairs=()), "served": ["mine"], "engine": "vllm"}
    check = replace(served(acceptance_z=-9.5, agreement=0.4, first=FIRST),
                    hypotheses=hypotheses)
    verdict = build_check(*summaries, spec, served={"mine": check}).drafters[0].verdicts[1]
    assert verdict.text.startswith(needle) and verdict.flag
    # a faithful folder is named nothing, whatever a fault's replay would say
    fine = build_check(*summaries, spec, served={"mine": replace(served(), hypotheses=hypotheses)})
    assert fine.drafters[0].verdicts[1].text.startswith("the engine serves what the weights")


def test_a_fault_that_moves_q_little_is_named_by_the_greedy_rounds_it_reproduces(
        summaries) -> None:
    """The faithful replay passes (94% of greedy rounds), but the taps-offset replay reproduces
    10 more rounds and loses none: the engine ran that reading."""
    from dataclasses import replace

    from floorgap.reports.check import build_check

    spec = {**check_spec(drafters=("mine",), pairs=()), "served": ["mine"], "engine": "vllm"}
    closer = {0.0: {"greedy_agreement": 0.994, "greedy_gain": 10.0, "sign_p": 2.0 ** -10},
              1.0: {"acceptance_z": 0.5}}
    far = {0.0: {"greedy_agreement": 0.9, "greedy_gain": -5.0, "sign_p": 0.98},
           1.0: {"acceptance_z": -1.6}}
    check = replace(served(agreement=0.94), hypotheses={OFFSET: closer, SHIFT: far})
    verdict = build_check(*summaries, spec, served={"mine": check}).drafters[0].verdicts[1]
    assert verdict.flag and verdict.text.startswith(
        "target-layer index offset by +1 (its replay reproduces 10 more greedy rounds, 99% of "
        "them; sign test p = 0.001): mine in vllm")
    fine = replace(served(agreement=0.99), hypotheses={OFFSET: far, SHIFT: far})
    verdict = build_check(*summaries, spec, served={"mine": fine}).drafters[0].verdicts[1]
    assert not verdict.flag and verdict.text.startswith("the engine serves what the weights")


def test_rounds_that_accept_nothing_name_no_fault(summaries) -> None:
    """An engine that accepted nothing (a mask row fed as a plain token) fits a layout shift's
    replay as well as any reading that predicts little: no fault is named."""
    from dataclasses import replace

    from floorgap.reports.check import build_check

    spec = {**check_spec(drafters=("mine",), pairs=()), "served": ["mine"], "engine": "vllm"}
    check = replace(served(acceptance_z=-10.9, agreement=0.68, drafts=(0, 56.4), active=70),
                    hypotheses={SHIFT: {0.0: {"greedy_agreement": 0.97},
                                        1.0: {"acceptance_z": -2.8}}})
    verdict = build_check(*summaries, spec, served={"mine": check}).drafters[0].verdicts[1]
    assert verdict.flag and verdict.text.startswith(
        "engine or layout fault (the engine accepted no draft, which any reading that predicts "
        "little fits, so no named fault can be told): mine in vllm")


def _reading(z1=0.3, records_accepted=25):
    engine = {"drafts": 50, "draft_tokens": 150, "accepted": 25, "accepted_per_pos": [15, 7, 3]}
    records = {**engine, "accepted": records_accepted}
    return {1.0: {"engine": engine, "records": records,
                  "differs": [] if records == engine else ["accepted"],
                  "slots": [{"slot": 0, "trials": 50, "observed": 15, "expected": 14.2, "z": 0.3},
                            {"slot": 1, "trials": 15, "observed": 7, "expected": 6.1, "z": z1},
                            {"slot": 2, "trials": 7, "observed": 3, "expected": 3.4, "z": -0.2}]}}


@pytest.mark.parametrize(("reading", "needle", "flag"), [
    (_reading(), "the engine's counters agree with the replay at every slot: mine in vllm, "
                 "accepted/reached by slot at T = 1: 15/50 (predicted 14.2, z +0.30), 7/15 "
                 "(predicted 6.1, z +0.30), 3/7 (predicted 3.4, z -0.20) (|z| at most 4); they "
                 "equal the per-request records (50 rounds, 25 accepted drafts at T = 1)", False),
    (_reading(z1=-6.0), "the engine's counters disagree with the replay at slots 1: ", True),
    (_reading(records_accepted=24), "fault of the reading: mine in vllm: at T = 1 the engine "
                                    "counted accepted 25 and the per-request records sum to "
                                    "accepted 24 (they count the same rounds and must be equal)",
     True),
    ({}, "mine: the engine's own counters were not read (vllm keeps no speculative-decoding "
         "counters, or serving.engine_counters is false)", False),
])
def test_the_counters_verdict_sets_the_engine_count_beside_records_and_replay(
        summaries, reading, needle, flag) -> None:
    from dataclasses import replace

    from floorgap.reports.check import build_check

    spec = {**check_spec(drafters=("mine",), pairs=()), "served": ["mine"], "engine": "vllm"}
    report = build_check(*summaries, spec, served={"mine": replace(served(),
                                                                    engine_reading=reading)})
    verdict = report.drafters[0].verdicts[2]
    assert verdict.kind == "counters" and needle in verdict.text and verdict.flag == flag


def test_an_engine_without_rounds_cannot_tell(summaries) -> None:
    from floorgap.reports.check import ServedCheck, build_check
    from floorgap.reports.check_page import to_html, to_markdown

    spec = {**check_spec(drafters=("mine",), pairs=()), "served": ["mine"], "engine": "sglang"}
    check = ServedCheck(engine="sglang", replayed_with="", by_temperature={},
                        note="the engine reports no per-round counts")
    report = build_check(*summaries, spec, served={"mine": check})
    verdict = report.drafters[0].verdicts[1]
    assert verdict.text.startswith("the served rounds cannot tell whether the engine serves what "
                                   "the weights predict: mine in sglang: the engine reports no "
                                   "per-round counts; serve in vllm") and not verdict.flag
    assert len(re.findall(r"<img ", to_html(report))) == 1 and "Served in" not in \
        to_markdown(report)


def test_a_check_serves_in_its_own_engine() -> None:
    cfg = smoke_with_checks({"c": {"drafters": ["mine"], "engine": "sglang"}})
    with pytest.raises(ConfigError, match="check.c serves in sglang, which runs on CUDA only"):
        resolve(cfg)
    for t in cfg["targets"].values():
        t["device"] = "cuda"
    spec = resolve(cfg)
    serving = spec.serving_spec(spec.primary, "mine")["serving"]
    assert (serving["engine"], serving["python"]) == ("sglang", ".venv-sglang/bin/python")
    # the configured systems keep the serving section's engine
    assert spec.serving_spec(spec.primary, "dflash")["serving"]["engine"] == "vllm"
    cfg["check"]["c"].update(engine="vllm")
    serving = resolve(cfg).serving_spec(spec.primary, "mine")["serving"]
    assert (serving["engine"], serving["python"]) == ("vllm", cfg["serving"]["python"])
    cfg["check"]["d"] = {"drafters": ["mine"], "engine": "sglang"}
    with pytest.raises(ConfigError, match=r"the checks name mine with the engines \['sglang', "
                                          r"'vllm'\]"):
        resolve(cfg)


def test_why_a_folder_was_not_served(summaries) -> None:
    from floorgap.reports.check import build_check

    spec = {**check_spec(drafters=("mine",), pairs=()), "served": [], "engine": "vllm",
            "not_served": {"mine": "its folder is in the speculators layout; the engines load "
                                   "dflash and dspark folders"}}
    text = build_check(*summaries, spec).drafters[0].verdicts[1].text
    assert "mine was not served: its folder is in the speculators layout" in text


def test_the_config_says_why_a_folder_is_not_served() -> None:
    cfg = smoke_with_checks({"c": {"drafters": ["mine", "theirs", "other"]}})
    cfg["decompose"]["other"]["checkpoint"]["format"] = "speculators"
    cfg["decompose"]["other"]["kind"] = "dspark"
    spec = resolve(cfg)
    # the smoke target is on the CPU: vLLM's CPU build has no DSpark runner
    why = spec.check_not_served("c")
    assert spec.check_served("c") == ["mine"] and set(why) == {"theirs", "other"}
    assert why["theirs"].startswith("vLLM's CPU build has no DSpark runner")
    assert why["other"].startswith("its folder is in the speculators layout")
    assert spec.check_spec("c")["not_served"] == why
    for t in cfg["targets"].values():
        t["device"] = "cuda"
    assert resolve(cfg).check_served("c") == ["mine", "theirs"]
    cfg["check"]["c"]["serve"] = False
    assert set(resolve(cfg).check_not_served("c").values()) == {
        "the check does not serve (--no-serve)"}


def test_comparisons_are_the_paired_differences_with_their_intervals(summaries) -> None:
    from floorgap.reports.check import build_check
    from floorgap.reports.common import GapSummary

    report = build_check(*summaries, check_spec())
    gaps = GapSummary(summaries[0])
    same, mixed = report.comparisons
    for c in (same, mixed):
        est, lo, hi = (gaps.get("diff_tau", f"{c.a}-{c.b}", -1, field=f)
                       for f in ("estimate", "lower", "upper"))
        assert c.diff_tau == pytest.approx((est, lo, hi))
        resolved = lo > 0 or hi < 0
        assert c.verdict.flag == resolved
        assert ("accepts longer" in c.verdict.text) == resolved
        assert ("no difference in tau resolved" in c.verdict.text) == (not resolved)
    # one order: the risk by slot too; two orders: tau only
    assert same.risk_statistic == "R" and len(same.diff_risk) == 3
    assert same.diff_risk["estimate"].tolist() == pytest.approx(
        [gaps.get("diff_R", "mine-other", k) for k in range(3)])
    assert mixed.risk_statistic == "" and mixed.diff_risk.empty


def test_a_pair_missing_from_the_summary_is_refused(summaries) -> None:
    from floorgap.reports.check import build_check

    with pytest.raises(ValueError, match="no paired difference 'other-theirs'"):
        build_check(*summaries, check_spec(pairs=[("other", "theirs")]))


def test_the_page_holds_the_verdicts_figures_tables_and_command(summaries) -> None:
    from floorgap.reports.check import build_check
    from floorgap.reports.check_page import to_html, to_markdown

    report = build_check(*summaries, check_spec())
    page = to_html(report)
    # verdicts first, each escaped into one list item
    verdict_block = page[page.index('id="verdicts"'):page.index("</ul>")]
    items = re.findall(r"<li[^>]*>(.*?)</li>", verdict_block)
    import html

    assert [html.unescape(i) for i in items] == [v.text for v in report.verdicts]
    # one figure per drafter and one side by side, each a real PNG inline
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(images) == 4
    assert all(base64.b64decode(i)[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert page.count('<table class="dataframe numbers">') == 3 + 1  # + mine - other by slot
    assert "floorgap check /models/mine /models/other" in page
    md = to_markdown(report)
    assert all(v.text in md for v in report.verdicts)
    assert md.count("| slot |") == 3


def test_one_drafter_has_no_comparison_section(summaries) -> None:
    from floorgap.reports.check import build_check
    from floorgap.reports.check_page import to_html

    report = build_check(*summaries, check_spec(drafters=("mine",), pairs=()))
    page = to_html(report)
    assert "Side by side" not in page and len(re.findall(r"<img ", page)) == 1


def test_the_stage_writes_the_page_and_the_summary(summaries, tmp_path) -> None:
    from floorgap.stages._cli import run_stage
    from floorgap.stages.check_report import build_parser, main

    out = tmp_path / "check" / "c"
    config = tmp_path / "config.yaml"
    config.write_text("seed: 1\n")
    spec = {**check_spec(), "configfiles": [str(config)]}
    args = ["--spec", json.dumps(spec), "--gaps", str(summaries[0]), "--floors",
            str(summaries[1]), "--out-html", str(out / "index.html"), "--out-md",
            str(out / "summary.md")]
    assert run_stage(main, build_parser(), args) == 0
    page = (out / "index.html").read_text()
    assert "seed: 1" in page and str(config) in page
    assert (out / "summary.md").read_text().startswith("# floorgap check mine+other+theirs")
    bad = {**spec, "pairs": [["other", "theirs"]]}
    out2 = tmp_path / "bad"
    assert run_stage(main, build_parser(), ["--spec", json.dumps(bad), *args[2:6],
                                            "--out-html", str(out2 / "index.html"),
                                            "--out-md", str(out2 / "summary.md")]) == 2
    assert not out2.exists() or not any(out2.iterdir())


def test_the_stage_reads_the_replayed_rounds_of_the_served_folders(summaries, tmp_path) -> None:
    """check_report with a vLLM-like replay record (rounds) and an SGLang-like one (none)."""
    from dataclasses import asdict

    from floorgap.probes.serving_replay import ReplayRound
    from floorgap.records import write_table
    from floorgap.stages._cli import run_stage
    from floorgap.stages.check_report import build_parser, main

    rounds = [ReplayRound(target="t", system="mine", task=task, row_id=f"{task}:0",
                          temperature=temp, concurrency=1, round=r, start=1 + 2 * r,
                          accepted=1, complete=True, p_tok=[0.5, 0.5, 0.5],
                          q_tok=[0.5, 0.5, 0.5], tv=[0.0, 1.0, 0.0] if temp == 0 else [0.5] * 3,
                          lossless_score=math.nan if temp == 0 else 0.1,
                          lossless_var=math.nan if temp == 0 else 1.0)
              for task in ("a", "b") for temp in (0.0, 1.0) for r in range(3)]
    mine, other = tmp_path / "mine.parquet", tmp_path / "other.parquet"
    write_table(mine, pd.DataFrame([asdict(r) for r in rounds]),
                {"system": "mine", "engine": "vllm", "replayed_with": "/w/final.pt"})
    write_table(other, pd.DataFrame(columns=list(asdict(rounds[0]))),
                {"system": "other", "engine": "sglang",
                 "note": "the engine reports no per-round counts"})
    spec = {**check_spec(drafters=("mine", "other"), pairs=(("mine", "other"),)),
            "served": ["mine", "other"], "engine": "vllm", "tasks": ["a", "b"],
            "bootstrap": 20, "seed": 1}
    out = tmp_path / "c"
    args = ["--spec", json.dumps(spec), "--gaps", str(summaries[0]), "--floors",
            str(summaries[1]), "--out-html", str(out / "index.html"), "--out-md",
            str(out / "summary.md")]
    assert run_stage(main, build_parser(), [*args, "--replay", str(mine), str(other)]) == 0
    md = (out / "summary.md").read_text()
    assert "mine in vllm, replayed with /w/final.pt: " in md
    assert "100% of 6 rounds reproduced at T = 0" in md   # each greedy round accepts 1, as replayed
    assert "other in sglang: the engine reports no per-round counts" in md
    # a served folder without its record is refused by name
    assert run_stage(main, build_parser(), [*args, "--replay", str(mine)]) == 2
    # with its serving records, what the engine counted itself: every round accepted 1 draft
    requests = pd.DataFrame([{"system": "mine", "task": task, "row_id": f"{task}:0",
                              "temperature": temp, "verify_steps": 3, "draft_tokens": 9,
                              "accepted_drafts": 3, "step_accepted": [1, 1, 1]}
                             for task in ("a", "b") for temp in (0.0, 1.0)])
    counts = {"drafts": 6, "draft_tokens": 18, "accepted": 6, "accepted_per_pos": [6, 0, 0]}
    runs = pd.DataFrame([{"system": "mine", "task": "a", "temperature": temp, "wall_s": 1.0,
                          "engine_counts": counts} for temp in (0.0, 1.0)])
    write_table(tmp_path / "requests.parquet", requests, {"system": "mine"})
    write_table(tmp_path / "runs.parquet", runs, {"system": "mine"})
    write_table(mine, pd.DataFrame([asdict(r) for r in rounds]),
                {"system": "mine", "engine": "vllm", "replayed_with": "/w/final.pt", "gamma": 3})
    served = ["--served", str(tmp_path / "requests.parquet"), str(tmp_path / "runs.parquet")]
    assert run_stage(main, build_parser(), [*args, "--replay", str(mine), str(other),
                                            *served]) == 0
    md = (out / "summary.md").read_text()
    # TV 0.5 at every slot: the 6 rounds at T = 1 reach slot 0 and accept it (3 predicted),
    # reach slot 1 and reject it
    assert "accepted/reached by slot at T = 1: 6/6 (predicted 3.0, z +2.45), 0/6 (predicted " \
           "3.0, z -2.45), 0/0 (predicted 0.0, z +0.00)" in md
    assert "equal the per-request records (6 rounds, 6 accepted drafts at T = 0; 6 rounds" in md


# ------------------------------------------------------------------ floorgap check


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Two exported DFlash folders and a speculators DSpark one on a tiny random Llama."""
    import torch
    import transformers

    from floorgap.models.drafters import DrafterConfig, build_drafter
    from floorgap.models.engine_formats import export_drafter

    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False))
    root = tmp_path_factory.mktemp("folders")
    out = {}
    for name, kind, fmt in (("Draft_A", "dflash", "dflash"), ("draft-b", "dflash", "dflash"),
                            ("spec", "dspark", "speculators")):
        cfg = DrafterConfig(kind=kind, gamma=3, hidden_size=32, n_layers=1, n_heads=4,
                            intermediate_size=64, taps=[0, 1], markov_rank=4)
        out[name] = export_drafter(build_drafter(cfg, target), root / name, fmt)
    return out


def test_the_command_writes_one_overlay_for_all_folders_and_runs_snakemake(
        folders, checkout, monkeypatch, capsys) -> None:
    from floorgap import cli

    calls = []

    def fake_run(cmd, cwd, check):
        calls.append((cmd, cwd))
        md = Path(cwd) / "results/check/draft_a+draft-b+spec/summary.md"
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text("# floorgap check draft_a+draft-b+spec\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    argv = ["check", *(str(folders[n]) for n in ("Draft_A", "draft-b", "spec")), "--cores", "2"]
    assert cli.main(argv) == 0
    (cmd, _), = calls
    overlay_path = checkout / "results" / "check" / "draft_a+draft-b+spec.yaml"
    overlay = yaml.safe_load(overlay_path.read_text())
    assert list(overlay["decompose"]) == ["draft_a", "draft-b", "spec"]
    assert overlay["decompose"]["spec"] == {"checkpoint": {
        "format": "speculators", "path": str(folders["spec"].resolve())}, "kind": "dspark"}
    entry = overlay["check"]["draft_a+draft-b+spec"]
    assert entry["drafters"] == ["draft_a", "draft-b", "spec"]
    assert entry["target"] == "tiny-random" and entry["command"].startswith("floorgap check ")
    assert entry["configfiles"] == [str(checkout / "config.yaml"), str(overlay_path)]
    files = [f"results/check/draft_a+draft-b+spec/{f}" for f in ("index.html", "summary.md")]
    assert all(cmd.index(f) < cmd.index("--configfile") for f in files)
    assert cmd[cmd.index("--configfile") + 1:] == [str(checkout / "config.yaml"),
                                                   str(overlay_path)]
    out = capsys.readouterr().out
    assert "# floorgap check draft_a+draft-b+spec" in out and "index.html" in out
    # the overlay merged over the base resolves
    base = yaml.safe_load((checkout / "config.yaml").read_text())
    spec = resolve({**copy.deepcopy(base), **overlay})
    assert spec.check_contrasts() == [["draft_a", "draft-b"], ["draft_a", "spec"],
                                      ["draft-b", "spec"]]


def test_the_command_refuses_bad_invocations(folders, checkout, monkeypatch, capsys) -> None:
    from floorgap import cli

    monkeypatch.setattr(cli.subprocess, "run", lambda *a, **k: pytest.fail("ran Snakemake"))
    a, b = str(folders["Draft_A"]), str(folders["draft-b"])
    assert cli.main(["check", a, b, "--name", "x"]) == 2
    assert "1 --name for 2 folders" in capsys.readouterr().err
    assert cli.main(["check", a, b, "--name", "x", "--name", "x"]) == 2
    assert "repeat" in capsys.readouterr().err
    assert cli.main(["check", a, "--target", "nope"]) == 2
    assert "target 'nope' is not one of the targets" in capsys.readouterr().err
    assert cli.main(["check", str(checkout)]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert cli.main(["check", a, b, "--reference", "w.pt"]) == 2
    assert "1 --reference for 2 folders" in capsys.readouterr().err


def test_a_dflash_folder_must_declare_its_layout_and_a_mismatch_is_said_first(
        folders, checkout, monkeypatch, capsys, tmp_path) -> None:
    """Before Snakemake runs: a DFlash folder without a layout key is refused naming the key;
    one that declares anchor-first, which vLLM's DFlash runs 1+N, is flagged on stderr."""
    import shutil

    from floorgap import cli

    ran = []
    monkeypatch.setattr(cli.subprocess, "run",
                        lambda *a, **k: ran.append(a) or subprocess.CompletedProcess(a, 1))
    folder = Path(shutil.copytree(folders["Draft_A"], tmp_path / "undeclared"))
    config = json.loads((folder / "config.json").read_text())
    del config["sample_from_anchor"]
    (folder / "config.json").write_text(json.dumps(config))
    assert cli.main(["check", str(folder), "--dry-run"]) == 2 and not ran
    err = capsys.readouterr().err
    assert 'config.json declares no block layout: add "sample_from_anchor": false if the ' \
           "drafter was trained 1+N" in err and err.count("\n") == 1
    config["sample_from_anchor"] = True
    (folder / "config.json").write_text(json.dumps(config))
    cli.main(["check", str(folder), "--dry-run"])
    assert ran and "block layout shifted by one: undeclared's folder declares anchor-first " \
        "(sample_from_anchor), but vllm runs a dflash folder 1+N, reading no layout field: " \
        "served, it proposes at slot k what weights trained as declared predict for slot " \
        "k + 1" in \
        capsys.readouterr().err


def test_a_reference_per_folder_reaches_the_check_entry(folders, checkout, monkeypatch) -> None:
    from floorgap import cli

    monkeypatch.setattr(cli.subprocess, "run",
                        lambda cmd, cwd, check: subprocess.CompletedProcess(cmd, 0))
    a, b = str(folders["Draft_A"]), str(folders["draft-b"])
    assert cli.main(["check", a, b, "--reference", "results/t/drafters/v/final.pt",
                     "--reference", "-", "--report", "pair", "--no-serve", "--serve-rows", "3",
                     "--engine", "vllm", "--dry-run"]) == 0
    overlay = yaml.safe_load((checkout / "results" / "check" / "pair.yaml").read_text())
    assert overlay["check"]["pair"]["references"] == {
        "draft_a": "results/t/drafters/v/final.pt"}
    assert overlay["check"]["pair"]["serve"] is False
    assert overlay["check"]["pair"]["serve_rows"] == 3
    assert overlay["check"]["pair"]["engine"] == "vllm"
    base = yaml.safe_load((checkout / "config.yaml").read_text())
    spec = resolve({**base, **overlay})
    assert spec.fidelity_files("pair") == ["results/check/pair/fidelity/draft_a.json"]
    fid = spec.fidelity_spec("pair", "draft_a")
    assert fid["folder"] == str(folders["Draft_A"].resolve())
    assert fid["reference"] == "results/t/drafters/v/final.pt" and fid["anchors_per_domain"] == 4


# ------------------------------------------------------------------ in a real browser


def _browser():
    """Headless Chromium from the distribution's packages, driven by Selenium; skipped where
    it is not installed unless FLOORGAP_REQUIRE_BROWSER is set (CI sets it)."""
    import os
    import shutil

    driver_path = shutil.which("chromedriver")
    browser_path = shutil.which("chromium") or shutil.which("chromium-browser")
    if not (driver_path and browser_path):
        if os.environ.get("FLOORGAP_REQUIRE_BROWSER"):
            pytest.fail("chromium and chromedriver are required (apt install chromium "
                        "chromium-driver)")
        pytest.skip("no chromium/chromedriver (apt install chromium chromium-driver)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = browser_path
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"):
        options.add_argument(arg)
    return webdriver.Chrome(service=Service(driver_path), options=options)


def test_the_page_opens_in_a_browser_with_every_figure_and_verdict(summaries, tmp_path) -> None:
    from floorgap.reports.check import build_check
    from floorgap.reports.check_page import write_check

    # one drafter served too: its served figure and table are on the page
    spec = {**check_spec(), "served": ["mine"], "engine": "vllm"}
    report = build_check(*summaries, spec, served={"mine": served()})
    page = tmp_path / "check" / "index.html"
    write_check(report, page, tmp_path / "check" / "summary.md")
    driver = _browser()
    try:
        driver.get(page.as_uri())
        images = driver.execute_script(
            "return Array.from(document.images).map(i => [i.complete, i.naturalWidth, i.alt]);")
        shown = driver.execute_script(
            "return Array.from(document.querySelectorAll('#verdicts li')).map(li => li.innerText);")
        title = driver.title
    finally:
        driver.quit()
    assert title == f"floorgap check {report.name}"
    assert len(images) == 5 and all(done and width > 100 for done, width, _ in images), images
    assert "served against replayed tau of mine" in [alt for _, _, alt in images]
    assert shown == [v.text for v in report.verdicts]


def test_no_slot_to_fix_when_no_best_response_gains() -> None:
    from floorgap.reports.check import fix_first_verdict

    gains = pd.DataFrame({"slot": [0, 1], "estimate": [0.0, -0.01], "lower": [0.0, -0.02],
                          "upper": [0.0, 0.0]})
    assert fix_first_verdict("x", gains).text == (
        "x: no single slot's best response gains tau (the largest held-out gain is 0.000)")
    gains.loc[1, "estimate"] = 0.2
    assert fix_first_verdict("x", gains).text.startswith("fix slot 1 of x first")


def test_a_name_floorgap_picks_never_collides_and_a_given_one_that_does_is_refused(
        folders, checkout, monkeypatch, capsys, tmp_path) -> None:
    """A folder named like one of the config's drafters (the default's own export,
    ``.../dflash``) runs as ``dflash-user``; ``--name dflash`` is refused in one line naming
    the option, before Snakemake starts."""
    import shutil

    from floorgap import cli

    calls = []

    def fake_run(cmd, cwd, check):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    own = tmp_path / "export" / "dflash"
    shutil.copytree(folders["draft-b"], own)
    cli.main(["check", str(own), "--cores", "1"])
    overlay = yaml.safe_load((checkout / "results" / "check" / "dflash-user.yaml").read_text())
    assert list(overlay["decompose"]) == ["dflash-user"]
    base = yaml.safe_load((checkout / "config.yaml").read_text())
    resolve({**copy.deepcopy(base), **overlay})   # no name the config already has
    assert len(calls) == 1
    assert cli.main(["check", str(own), "--name", "dflash"]) == 2
    err = capsys.readouterr().err
    assert "--name dflash" in err and "already has a drafter named 'dflash'" in err
    assert cli.main(["decompose", str(own), "--name", "dspark"]) == 2
    assert "--name dspark" in capsys.readouterr().err
    assert len(calls) == 1
