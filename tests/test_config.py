"""The workflow's decisions (floorgap.config) and the report registry, without Snakemake."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SMOKE_CONFIG
from floorgap.config import ConfigError, Evaluation, as_json, resolve
from floorgap.errors import StageError
from floorgap.reports.registry import ITEMS, ReportItem, report_items


def smoke() -> dict:
    return yaml.safe_load(SMOKE_CONFIG.read_text())


def default() -> dict:
    return yaml.safe_load((REPO / "config.yaml").read_text())


def rename_drafters(cfg: dict, names: dict[str, str]) -> dict:
    """The config with drafters.variants renamed (and every place that names them)."""
    cfg = copy.deepcopy(cfg)
    drafters = cfg["drafters"]
    drafters["variants"] = {names.get(k, k): v for k, v in drafters["variants"].items()}
    drafters["roles"] = {r: names.get(v, v) for r, v in drafters["roles"].items()}
    drafters["trajectory"] = [names.get(v, v) for v in drafters["trajectory"]]
    budget = drafters.get("budget", {})
    budget["variants"] = [names.get(v, v) for v in budget.get("variants", [])]
    if "serving" in cfg:
        cfg["serving"]["systems"] = [names.get(v, v) for v in cfg["serving"]["systems"]]
    return cfg


def test_evaluation_groups_and_labels() -> None:
    cfg = default()
    spec = resolve(cfg)
    assert spec.eval_groups["summary"] == [Evaluation(v, "final") for v in cfg["drafters"]["variants"]]
    epochs = cfg["drafters"]["train"]["epochs"]
    # every epoch but the last (the final weights) of each trajectory variant
    assert [e.label for e in spec.eval_groups["trajectory"]] == [
        f"ours@epoch-{e}" for e in range(1, epochs)]
    assert [e.variant for e in spec.eval_groups["components"]] == list(
        cfg["drafters"]["components"]["arms"])
    assert spec.summary_evaluations("trajectory")[-1] == Evaluation("ours", "final")
    assert spec.gaps_spec("trajectory")["labels"] == {"ours": f"ours@epoch-{epochs}"}


def test_component_arms_share_one_seed_key_and_epochs() -> None:
    cfg = default()
    spec = resolve(cfg)
    entries = [spec.variant_entry(a) for a in spec.arms]
    assert {e["seed_key"] for e in entries} == {"components"}
    assert {spec.variant_epochs(a) for a in spec.arms} == {cfg["drafters"]["components"]["epochs"]}
    assert "seed_key" not in spec.variant_entry("dflash")


def test_contrasts_come_from_the_roles() -> None:
    spec = resolve(default())
    assert spec.gaps_spec("summary")["contrasts"] == [["ours", "dspark"]]
    base = default()["drafters"]["components"]["baseline"]
    assert spec.gaps_spec("components")["contrasts"] == [[a, base] for a in spec.arms if a != base]


def test_renamed_variants_carry_through_every_spec() -> None:
    names = {"dflash": "blockwise", "dspark": "markov", "ours": "prefix-head"}
    spec = resolve(rename_drafters(smoke(), names))
    assert spec.roles == {"order0": "blockwise", "order1": "markov", "ours": "prefix-head"}
    assert spec.gaps_spec("summary")["contrasts"] == [["prefix-head", "markov"]]
    assert spec.report_spec("gaps", "table")["roles"] == spec.roles
    text = json.dumps([spec.drafter_eval_spec("tiny-random", 0, g) for g in spec.eval_jobs])
    for old in names:
        assert f'"{old}"' not in text


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["components"]["arms"].update(dspark={"kind": "dspark"}), "reuses the variant"),
        (lambda d: d["components"].update(baseline="nope"), "is not one of the arms"),
        (lambda d: d.update(trajectory=["nope"]), "which are not drafters.variants"),
        (lambda d: d["roles"].update(ours="nope"), "drafters.roles.ours"),
        (lambda d: d["roles"].update(order0="dspark"), "must be of kind dflash"),
    ],
    ids=["arm-like-variant", "unknown-baseline", "unknown-trajectory", "unknown-role", "order0-kind"],
)
def test_inconsistent_sections_are_refused(mutate, needle: str) -> None:
    cfg = smoke()
    mutate(cfg["drafters"])
    with pytest.raises(ConfigError, match=needle):
        resolve(cfg)


def test_unknown_primary_target_is_refused() -> None:
    cfg = smoke()
    cfg["primary_target"] = "nope"
    with pytest.raises(ConfigError, match="primary_target 'nope'"):
        resolve(cfg)


def test_plotting_options_reach_only_figures() -> None:
    spec = resolve(smoke())
    assert "dpi" in spec.report_spec("floors", "figure")
    assert spec.report_spec("floors", "table") == {}
    mi = spec.report_spec("mi", "table")
    assert set(mi) == {"analysis", "ess_gates"}
    assert spec.report_spec("gaps_components", "table")["arms"] == spec.arms


def test_specs_are_stable_json() -> None:
    a, b = resolve(smoke()), resolve(smoke())
    assert as_json(a.corpus_spec("tiny-random", "gsm8k")) == as_json(b.corpus_spec("tiny-random",
                                                                                   "gsm8k"))
    assert as_json({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'


# ---------------------------------------------------------------- the registry


def test_every_item_has_a_caption_and_a_function() -> None:
    for item in ITEMS:
        assert (REPO / "workflow" / "report" / f"{item.name}.rst").is_file(), item.name
        assert callable(item.function()), item.name


def test_registry_rows_are_checked() -> None:
    with pytest.raises(ValueError, match="kind"):
        ReportItem("x", "plot", "floors", "Floors", "m:f")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reads"):
        ReportItem("x", "figure", "nowhere", "Floors", "m:f")


def test_plugins_add_items_and_clashes_are_refused(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "my_items.py").write_text(
        "from floorgap.reports.registry import ReportItem\n"
        "ITEMS = [ReportItem('figX_mine', 'figure', 'floors', 'Floors', 'my_items:figX_mine',"
        " in_paper=False)]\n"
        "def figX_mine(inputs, spec, out_dir):\n    return {}\n")
    (tmp_path / "clash_items.py").write_text(
        "from floorgap.reports.registry import ReportItem\n"
        "ITEMS = [ReportItem('fig2_floor_by_slot', 'figure', 'floors', 'Floors', 'x:y')]\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    items = report_items(["my_items"])
    assert list(items)[-1] == "figX_mine" and len(items) == len(ITEMS) + 1
    assert items["figX_mine"].files == ["figures/figX_mine.pdf", "figures/figX_mine.png"]
    with pytest.raises(StageError, match="registered twice"):
        report_items(["clash_items"])
    with pytest.raises(StageError, match="cannot be imported"):
        report_items(["no_such_module_here"])
    sys.modules.pop("my_items", None)
    sys.modules.pop("clash_items", None)


def test_api_reads_share_the_endpoint_and_the_replication_takes_its_own_settings() -> None:
    spec = resolve(default())
    target = next(iter(spec.targets))
    api = spec.api_floors_spec(target, "api")
    rep = spec.api_floors_spec(target, "replication")
    assert api["read"] == "api" and rep["read"] == "replication"
    assert rep["api_floors"]["top_k"] == spec.config["replication"]["top_k"]
    assert rep["api_floors"]["matched"] is False
    assert rep["api_floors"]["endpoint"]["port"] == api["api_floors"]["endpoint"]["port"] + 1
    with pytest.raises(ConfigError, match="unknown api_floors read"):
        spec.api_floors_spec(target, "other")


def test_published_taus_rerun_no_engine_and_a_target_may_name_its_own_taps() -> None:
    cfg = default()
    target = next(iter(cfg["targets"]))
    before = as_json(resolve(cfg).serving_spec(target, "ar"))
    cfg["serving"]["published"] = [{"label": "x", "tau": 2.0, "gamma": 3, "source": "y"}]
    spec = resolve(cfg)
    assert as_json(spec.serving_spec(target, "ar")) == before
    assert spec.report_spec("serving", "table")["published"][0]["tau"] == 2.0
    cfg["targets"][target]["taps"] = [1, 2]
    spec = resolve(cfg)
    assert spec.taps(target) == [1, 2]
    assert spec.drafters_spec(target, spec.roles["order0"])["taps"] == [1, 2]
