"""The workflow's decisions (floorgap.config) and the report registry, without Snakemake."""

from __future__ import annotations

import ast
import copy
import json
import sys
from pathlib import Path

import pytest
import yaml

from conftest import REPO, SHIPPED_CONFIGS, SMOKE_CONFIG, load_config
from floorgap.config import ConfigError, Evaluation, as_json, resolve
from floorgap.errors import StageError
from floorgap.reports.registry import ITEMS, ReportItem, report_items


def smoke() -> dict:
    return load_config(SMOKE_CONFIG)


def default() -> dict:
    return load_config(REPO / "config.yaml")


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
    for target in cfg["targets"].values():
        own = target.get("settings", {}).get("drafters", {})
        if "variants" in own:
            own["variants"] = {names.get(k, k): v for k, v in own["variants"].items()}
    return cfg


def test_evaluation_groups_and_labels() -> None:
    cfg = default()
    spec = resolve(cfg)
    # the drafters and, beside them, the lookup tables
    assert spec.eval_groups["summary"] == [Evaluation(v, "final") for v in
                                           [*cfg["drafters"]["variants"], *cfg["drafters"]["lookups"]]]
    variants = cfg["drafters"]["variants"]
    epochs = {v: variants[v].get("epochs", cfg["drafters"]["train"]["epochs"]) for v in variants}
    # every epoch of each trajectory variant (its final weights are the best held-out one)
    assert [e.label for e in spec.eval_groups["trajectory"]] == [
        f"ours@epoch-{e}" for e in range(1, epochs["ours"] + 1)]
    assert [e.variant for e in spec.eval_groups["components"]] == list(
        cfg["drafters"]["components"]["arms"])
    assert spec.summary_evaluations("trajectory", spec.primary) == spec.eval_groups["trajectory"]
    assert "labels" not in spec.gaps_spec("trajectory", spec.primary)
    # the budget study: every epoch of its variants, the kept weights of its arms
    budget = cfg["drafters"]["budget"]
    assert [e.label for e in spec.eval_groups["budget"]] == [
        f"{v}@epoch-{e}" for v in budget["variants"] for e in range(1, epochs[v] + 1)] + list(
        budget["arms"])


def test_component_arms_share_one_seed_key_and_epochs() -> None:
    cfg = default()
    spec = resolve(cfg)
    entries = [spec.variant_entry(a, spec.primary) for a in spec.arms]
    assert {e["seed_key"] for e in entries} == {"components"}
    assert {spec.variant_epochs(a, spec.primary) for a in spec.arms} == \
        {cfg["drafters"]["components"]["epochs"]}
    assert "seed_key" not in spec.variant_entry("dflash", spec.primary)


def test_contrasts_come_from_the_roles() -> None:
    spec = resolve(default())
    # ours against the order-1 baseline, then each drafter against the tables of its order
    assert spec.gaps_spec("summary", spec.primary)["contrasts"] == [
        ["ours", "dspark"], ["dflash", "unigram"], ["dflash", "bigram_committed"],
        ["dspark", "bigram"], ["ours", "bigram"]]
    assert spec.gaps_spec("summary", spec.primary)["lookups"] == [
        "unigram", "bigram_committed", "bigram"]
    base = default()["drafters"]["components"]["baseline"]
    assert spec.gaps_spec("components", spec.primary)["contrasts"] == [
        [a, base] for a in spec.arms if a != base]


def test_renamed_variants_carry_through_every_spec() -> None:
    names = {"dflash": "blockwise", "dspark": "markov", "ours": "prefix-head"}
    spec = resolve(rename_drafters(smoke(), names))
    assert spec.roles == {"order0": "blockwise", "order1": "markov", "ours": "prefix-head"}
    assert spec.gaps_spec("summary", spec.primary)["contrasts"][0] == ["prefix-head", "markov"]
    assert ["blockwise", "bigram_committed"] in spec.gaps_spec("summary", spec.primary)["contrasts"]
    assert spec.report_spec("gaps", "table")["roles"] == spec.roles
    text = json.dumps([spec.drafter_eval_spec("tiny-random", 0, g) for g in spec.eval_jobs])
    for old in names:
        assert f'"{old}"' not in text


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda d: d["components"]["arms"].update(dspark={"kind": "dspark", "layers": 1}),
         "reuses the variant"),
        (lambda d: d["components"].update(baseline="nope"), "is not one of the arms"),
        (lambda d: d.update(trajectory=["nope"]), "which are not drafters.variants"),
        (lambda d: d["roles"].update(ours="nope"), "drafters.roles.ours"),
        (lambda d: d["roles"].update(order1="nope"), "drafters.roles.order1"),
        (lambda d: d["roles"].update(order0="dspark"), "must be of kind dflash"),
    ],
    ids=["arm-like-variant", "unknown-baseline", "unknown-trajectory", "unknown-role",
         "unknown-order1", "order0-kind"],
)
def test_inconsistent_sections_are_refused(mutate, needle: str) -> None:
    cfg = smoke()
    mutate(cfg["drafters"])
    with pytest.raises(ConfigError, match=needle):
        resolve(cfg)


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda c: c["anchors"].update(per_domian=3), "per_domian"),
        (lambda c: c.update(sed=1), "sed"),
        (lambda c: c["anchors"].update(per_domain=-4), "-4"),
        (lambda c: c["corpus"].update(batch_size="eight"), "eight"),
    ],
    ids=["misspelt-nested-key", "unknown-top-key", "negative-count", "wrong-type"],
)
def test_the_schema_refuses_a_bad_config_by_name(mutate, needle: str) -> None:
    """What the Snakefile's validation (workflow/rules/common.smk) refuses before any job; the
    real command's refusal is tested in tests/integration/test_workflow.py."""
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import validate

    cfg = smoke()
    mutate(cfg)
    with pytest.raises(WorkflowError, match="Error validating config file") as err:
        validate(cfg, schema=str(REPO / "workflow" / "schemas" / "config.schema.yaml"))
    assert needle in str(err.value)


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


def test_a_report_item_reading_a_new_summary_is_two_places(tmp_path: Path, monkeypatch) -> None:
    """ARCHITECTURE.md, "A report item reading a new summary": one REPORT_SUMMARIES entry and
    the item (here a plugin module); the rule's inputs and spec and the stage follow."""
    import logging

    import pandas as pd

    from floorgap.config import REPORT_SUMMARIES
    from floorgap.config.reports import ReportSummary
    from floorgap.stages import report as report_stage

    monkeypatch.setitem(REPORT_SUMMARIES, "exposure", ReportSummary(
        lambda w: {"summary": f"results/{w.primary}/exposure/summary.parquet"},
        lambda w: {"gamma": w.config["anchors"]["gamma"]}))
    (tmp_path / "exposure_items.py").write_text(
        "import pandas as pd\n"
        "from floorgap.reports.common import macro_name\n"
        "from floorgap.reports.registry import ReportItem\n"
        "ITEMS = [ReportItem('tableX_exposure', 'table', 'exposure', 'Gaps',\n"
        "                    'exposure_items:tableX_exposure', in_paper=False)]\n"
        "def tableX_exposure(inputs, spec, out_dir):\n"
        "    df = pd.read_parquet(inputs['summary'])\n"
        "    df.to_csv(out_dir / 'tableX_exposure.csv', index=False)\n"
        "    (out_dir / 'tableX_exposure.tex').write_text(df.to_latex(index=False))\n"
        "    return {macro_name('exposure', 'slots'): str(len(df)),\n"
        "            macro_name('exposure', 'gamma'): str(spec['gamma'])}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        row = report_items(["exposure_items"])["tableX_exposure"]
        spec = resolve(smoke())
        inputs = spec.report_inputs(row.reads)
        assert inputs == {"summary": f"results/{spec.primary}/exposure/summary.parquet"}
        assert spec.report_spec(row.reads, row.kind) == {"gamma": spec.config["anchors"]["gamma"]}
        summary = tmp_path / inputs["summary"]
        summary.parent.mkdir(parents=True)
        pd.DataFrame({"slot": range(3), "exposure": [0.1, 0.2, 0.3]}).to_parquet(summary)
        out_dir, values = tmp_path / "paper/tables", tmp_path / row.values
        out_dir.mkdir(parents=True)
        args = report_stage.build_parser().parse_args([
            row.name, "--input", f"summary={summary}", "--plugin", "exposure_items",
            "--spec", as_json(spec.report_spec(row.reads, row.kind)),
            "--out-dir", str(out_dir), "--out-values", str(values)])
        report_stage.main(args, logging.getLogger("test"))
        assert "\\newcommand{\\fgExposureSlots}{3}" in values.read_text()
        assert (out_dir / "tableX_exposure.csv").exists()
    finally:
        sys.modules.pop("exposure_items", None)
    with pytest.raises(ValueError, match="reads must be one of"):
        ReportItem("tableY", "table", "no_such_summary", "Gaps", "m:f")


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


def test_settings_merge_key_by_key_and_replace_drafter_entries_whole() -> None:
    from floorgap.config import merge_settings

    base = {"rollouts": {"paths": 64, "reveal_paths": 4},
            "drafters": {"train": {"lr": 0.003, "epochs": 1},
                         "variants": {"dflash": {"kind": "dflash", "layers": 2, "init": "target"}}}}
    merged = merge_settings(base, {"rollouts": {"reveal_paths": 2},
                                   "drafters": {"train": {"lr": 0.001}, "variants": {
                                       "dflash": {"checkpoint": {"format": "dflash", "path": "x"}}}}})
    assert merged["rollouts"] == {"paths": 64, "reveal_paths": 2}
    assert merged["drafters"]["train"] == {"lr": 0.001, "epochs": 1}
    # a released checkpoint stands in for the trained entry: no training keys survive
    assert merged["drafters"]["variants"]["dflash"] == {"checkpoint": {"format": "dflash",
                                                                       "path": "x"}}
    assert base["rollouts"]["reveal_paths"] == 4  # the shared sections are not touched


def test_a_cross_target_target_runs_only_what_fig5_reads() -> None:
    cfg = default()
    spec = resolve(cfg)
    second = [t for t in spec.targets if t != spec.primary]
    assert second and all(spec.scope(t) == "cross_target" for t in second)
    t = second[0]
    roles = [spec.roles["order0"], spec.roles["order1"]]
    assert spec.target_drafters(t) == roles
    assert spec.target_drafters(spec.primary) == spec.drafter_names
    assert spec.eval_job_names(t) == ["roles"] and spec.eval_job_names(spec.primary) == ["study"]
    assert spec.eval_job_targets("roles") == second
    assert spec.summaries(t) == ["summary"]
    assert [e.variant for e in spec.summary_evaluations("summary", t)] == roles
    assert spec.summary_evaluations("trajectory", t) == []
    assert spec.gaps_spec("summary", t)["contrasts"] == []
    assert spec.gaps_spec("summary", spec.primary)["contrasts"][0] == [
        spec.roles["ours"], spec.roles["order1"]]
    assert spec.decomposition_files(t) == []
    # the model entry every stage receives leaves the workflow keys out
    assert "scope" not in spec.target(t) and "settings" not in spec.target(t)
    assert spec.target(t)["chat_template"] is False


def test_per_target_settings_reach_that_targets_specs_only() -> None:
    cfg = default()
    spec = resolve(cfg)
    t = [t for t in spec.targets if t != spec.primary][0]
    own = cfg["targets"][t]["settings"]
    assert spec.anchors_spec(t, "gsm8k")["anchors"]["per_domain"] == own["anchors"]["per_domain"]
    assert spec.anchors_spec(spec.primary, "gsm8k")["anchors"] == cfg["anchors"]
    assert spec.corpus_spec(t, "gsm8k")["domain"]["prompts"] == own["domains"]["gsm8k"]["prompts"]
    assert spec.corpus_spec(t, "gsm8k")["corpus"]["max_prompt_tokens"] == \
        cfg["corpus"]["max_prompt_tokens"]  # merged: the keys it does not set stay shared
    rollouts = spec.rollouts_spec(t, 0)["rollouts"]
    assert rollouts["reveal_paths"] == own["rollouts"]["reveal_paths"]
    assert rollouts["forward_batch"] == cfg["rollouts"]["forward_batch"]
    data = spec.drafter_data_spec(t)
    assert data["training_data"]["prompts_per_domain"] == \
        own["drafters"]["training_data"]["prompts_per_domain"]
    assert spec.drafters_spec(t, "dflash")["variant"]["vocab"] == 8192
    assert "training_data" in own["drafters"]   # the second target's own (smaller) data
    assert spec.drafter_data_spec(spec.primary)["training_data"]["prompts_per_domain"] == \
        cfg["drafters"]["training_data"]["prompts_per_domain"]
    # the primary's specs are those of a config without the second target
    alone = copy.deepcopy(cfg)
    del alone["targets"][t]
    one = resolve(alone)
    for name in ("corpus_spec", "rollouts_spec"):
        arg = "gsm8k" if name == "corpus_spec" else 0
        assert as_json(getattr(spec, name)(spec.primary, arg)) == \
            as_json(getattr(one, name)(spec.primary, arg))
    assert as_json(spec.drafters_spec(spec.primary, "ours")) == \
        as_json(one.drafters_spec(spec.primary, "ours"))


@pytest.mark.parametrize("mutate, needle", [
    (lambda c, t: c["targets"][c["primary_target"] if "primary_target" in c else
                               next(iter(c["targets"]))].update(scope="cross_target"),
     "primary target runs every stage"),
    (lambda c, t: c["targets"][t]["settings"].update(domains={"nope": {"prompts": 1}}),
     "cannot add one"),
    (lambda c, t: c["targets"][t]["settings"]["drafters"]["variants"].update(
        other={"kind": "dflash", "layers": 1}), "replaces the entry of an existing drafter"),
    (lambda c, t: c["targets"][t]["settings"]["drafters"]["variants"].update(
        dflash={"kind": "dspark", "layers": 1}), "must be of kind dflash"),
    (lambda c, t: c["targets"][t]["settings"]["drafters"]["variants"].update(
        dflash={"kind": "dflash", "epochs": 1, "checkpoint": {"format": "dflash", "path": "x"}}),
     "imports a checkpoint but also sets"),
])
def test_inconsistent_target_settings_are_refused(mutate, needle: str) -> None:
    cfg = default()
    second = [t for t in cfg["targets"]][1]
    mutate(cfg, second)
    with pytest.raises(ConfigError, match=needle):
        resolve(cfg)


def test_a_full_target_may_not_import_a_variant_it_studies_by_epoch() -> None:
    cfg = default()
    primary = next(iter(cfg["targets"]))
    cfg["targets"][primary]["settings"] = {"drafters": {"variants": {"ours": {
        "checkpoint": {"format": "dflash", "path": "x"}}}}}
    with pytest.raises(ConfigError, match="drafters.trajectory names"):
        resolve(cfg)


@pytest.mark.parametrize("settings", [{"rollouts": {"shards": 4}}, {"anchors": {"gamma": 16}},
                                      {"mi": {"paths": 8}}])
def test_settings_cannot_change_the_dag_shape(settings: dict) -> None:
    import jsonschema

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    cfg = default()
    jsonschema.validate(cfg, schema)
    second = [t for t in cfg["targets"]][1]
    cfg["targets"][second]["settings"] = settings
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(cfg, schema)


def test_a_targets_merged_settings_are_validated_like_the_config() -> None:
    """resolve validates each target's merged config: a bad value in settings fails there
    even though the settings object itself is only checked by key."""
    import jsonschema

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    cfg = default()
    second = [t for t in cfg["targets"]][1]
    cfg["targets"][second]["settings"]["rollouts"] = {"paths": 1}
    jsonschema.validate(cfg, schema)
    from snakemake.exceptions import WorkflowError

    with pytest.raises(WorkflowError) as err:
        resolve(cfg)
    assert "1 is less than the minimum of 2" in str(err.value)


@pytest.mark.parametrize("path", SHIPPED_CONFIGS + [REPO / "config.yaml"],
                         ids=lambda p: p.name)
def test_every_shipped_config_validates_and_resolves(path: Path) -> None:
    import jsonschema

    schema = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
    cfg = yaml.safe_load(path.read_text())
    jsonschema.validate(cfg, schema)
    spec = resolve(cfg)
    for target in spec.targets:
        jsonschema.validate(spec.settings(target), schema)
        # the drafters rule asks every drafter job its priority when the DAG is built
        assert all(spec.drafter_priority(name, target) >= 0
                   for name in spec.target_drafters(target))


def test_the_paper_config_compares_the_qwen3_targets_with_their_own_released_drafters() -> None:
    cfg = yaml.safe_load((REPO / "workflow" / "configs" / "paper-cross-target.yaml").read_text())
    spec = resolve(cfg)
    assert spec.primary == "qwen3-4b" and len(spec.targets) == 3
    assert [spec.scope(t) for t in spec.targets] == ["full"] + ["cross_target"] * 2
    hubs = set()
    for t in spec.targets:
        for role in ("order0", "order1"):
            name = spec.roles[role]
            assert spec.is_imported(name, t)
            hub = spec.variant_entry(name, t)["checkpoint"]["hub"]
            assert hub.startswith("deepseek-ai/") and hub not in hubs
            hubs.add(hub)
        # imported baselines need no training data on the compared targets
        assert all(spec.is_imported(v, t) for v in spec.target_drafters(t)) or t == spec.primary
    assert len(hubs) == 6


def test_training_prompts_may_be_counted_per_domain_naming_every_domain() -> None:
    cfg = default()
    counts = {d: 3 for d in cfg["domains"]}
    cfg["drafters"]["training_data"]["prompts_per_domain"] = counts
    spec = resolve(cfg).drafter_data_spec(next(iter(cfg["targets"])))
    assert spec["training_data"]["prompts_per_domain"] == counts
    cfg["drafters"]["training_data"]["prompts_per_domain"] = dict(counts, nope=3)
    with pytest.raises(ConfigError, match="give a count for every domain"):
        resolve(cfg)


@pytest.mark.parametrize("overlay", sorted((REPO / "workflow" / "configs" / "studies")
                                           .glob("*.yaml")), ids=lambda p: p.name)
def test_a_study_overlay_merged_into_the_default_validates_and_resolves(overlay) -> None:
    """A study is run as `--configfile config.yaml <overlay>`: Snakemake merges the two
    mappings, and the merged config must pass the schema and the cross-section checks; every
    drafter the overlay adds is one the DAG can build."""
    import jsonschema
    from snakemake.utils import update_config

    cfg = default()
    study = yaml.safe_load(overlay.read_text())
    update_config(cfg, study)
    jsonschema.validate(cfg, yaml.safe_load(
        (REPO / "workflow" / "schemas" / "config.schema.yaml").read_text()))
    spec = resolve(cfg)
    added = [name for section in ("variants", "lookups") for name in
             (study["drafters"].get(section) or {})]
    added += list((study["drafters"].get("budget") or {}).get("arms") or {})
    assert added and set(added) <= set(spec.drafter_names)
    target = spec.primary
    for name in added:
        entry = spec.variant_entry(name, target)
        assert entry["kind"]


def test_a_table_fitted_on_a_budget_subset_is_set_beside_the_arms_of_that_subset() -> None:
    """A lookup table with ``blocks`` belongs to the budget study: evaluated in its group,
    paired with each arm of its order trained on as many blocks, and with no drafter of the
    summary (those meet the tables fitted on all the data)."""
    from snakemake.utils import update_config

    cfg = default()
    update_config(cfg, yaml.safe_load(
        (REPO / "workflow/configs/studies/data-curve.yaml").read_text()))
    spec = resolve(cfg)
    budget = {e.variant for e in spec.eval_groups["budget"]}
    summary = {e.variant for e in spec.eval_groups["summary"]}
    assert {"curve-bigram-12600", "curve-bigram-committed-200000"} <= budget
    assert not {t for t in summary if t.startswith("curve-")}
    assert set(spec.reference_lookups) == {"unigram", "bigram", "bigram_committed"}
    contrasts = spec.gaps_spec("budget", spec.primary)["contrasts"]
    assert ["curve-dflash-scaled-50000", "curve-bigram-committed-50000"] in contrasts
    assert ["curve-ours-scaled-50000", "curve-bigram-50000"] in contrasts
    assert all(a.rsplit("-", 1)[1] == t.rsplit("-", 1)[1] for a, t in contrasts)
    assert ["curve-dflash-scaled-50000", "curve-bigram-50000"] not in contrasts  # order 1
    assert spec.gaps_spec("budget", spec.primary)["lookups"] == spec.budget_lookups
    assert not any(t.startswith("curve-") for _, t in spec.lookup_contrasts(["dflash"]))
    options = spec.report_spec("gaps_budget", "table")
    assert options["budget"]["curve-bigram-25000"]["blocks"] == 25000
    assert "curve-bigram-25000" not in options["train_epochs"]
    # the default has no such table: its budget study is unchanged
    plain = resolve(default())
    assert plain.budget_lookups == [] and plain.gaps_spec("budget", plain.primary)[
        "contrasts"] == []


def knob_schema(tmp_path: Path, section: str, key: str, default: int) -> Path:
    """The config schema with a new integer knob ``section.key`` and its default."""
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    schema["properties"][section]["properties"][key] = {
        "type": "integer", "minimum": 1, "default": default, "description": "a new knob"}
    path = tmp_path / "config.schema.yaml"
    path.write_text(yaml.safe_dump(schema))
    return path


def test_a_config_knob_is_its_schema_entry(tmp_path, monkeypatch) -> None:
    """ARCHITECTURE.md, "A config knob": a key added to the schema with its default reaches
    the stage whose spec carries its section, shared and per target, with nothing else
    changed; without the entry the config fails validation naming the key."""
    from snakemake.exceptions import WorkflowError

    cfg = smoke()
    cfg["rollouts"]["chunk_paths"] = 8
    with pytest.raises(WorkflowError) as err:
        resolve(copy.deepcopy(cfg))
    assert "chunk_paths" in str(err.value)

    monkeypatch.setattr("floorgap.config.base.SCHEMA", knob_schema(tmp_path, "rollouts",
                                                                    "chunk_paths", 16))
    spec = resolve(smoke())  # fills the default
    assert {spec.rollouts_spec(t, 0)["rollouts"]["chunk_paths"] for t in spec.targets} == {16}

    target = spec.targets[-1]
    own = smoke()
    own["targets"][target].setdefault("settings", {}).setdefault("rollouts", {})[
        "chunk_paths"] = 4
    spec = resolve(own)
    for t in spec.targets:
        assert spec.rollouts_spec(t, 0)["rollouts"]["chunk_paths"] == (4 if t == target else 16)


@pytest.mark.slow
def test_a_config_knob_reaches_the_record_of_the_stage_that_reads_it(
        smoke_domain_records, tmp_path, monkeypatch) -> None:
    """The knob's second place is the line that reads it: here the anchors stage's library
    call passes ``spec["anchors"][key]`` on (into its record). The rule's spec, as the
    resolver writes it, carries the default and a target's own value to that line."""
    from floorgap.records import read_metadata
    from floorgap.stages import anchors as anchors_cli
    from floorgap.stages._cli import run_stage

    corpus = smoke_domain_records[3]
    monkeypatch.setattr("floorgap.config.base.SCHEMA", knob_schema(tmp_path, "anchors",
                                                                    "min_context", 16))
    reads = anchors_cli.anchors_from_corpus_file

    def reading_the_knob(path, stage_spec):  # the stage-side line of the new knob
        result = reads(path, stage_spec)
        result.metadata["min_context"] = stage_spec["anchors"]["min_context"]
        return result

    monkeypatch.setattr(anchors_cli, "anchors_from_corpus_file", reading_the_knob)
    cfg = smoke()
    target = list(cfg["targets"])[-1]
    cfg["targets"][target].setdefault("settings", {})["anchors"] = {"min_context": 4}
    spec = resolve(cfg)
    for t in spec.targets:
        out = tmp_path / f"{t}.parquet"
        assert run_stage(anchors_cli.main, anchors_cli.build_parser(),
                         ["--spec", as_json(spec.anchors_spec(t, "gsm8k")), "--corpus",
                          str(corpus), "--out", str(out), "--threads", "1"]) == 0
        assert read_metadata(out)["min_context"] == (4 if t == target else 16)


def test_the_drafters_on_all_the_data_are_scheduled_first() -> None:
    """The gap half's chain first, longest first: the variants trained on all the data get
    their epochs as the training job's priority, the tables fitted on all of it 1, subset and
    component arms 0."""
    spec = resolve(default())
    smol, gemma = spec.primary, "gemma3-270m"
    assert spec.drafter_priority("ours", smol) == spec.variant_epochs("ours", smol) > 0
    assert spec.drafter_priority("dflash", smol) == spec.variant_epochs("dflash", smol)
    assert spec.drafter_priority("dspark", smol) == spec.variant_epochs("dspark", smol)
    assert spec.drafter_priority("dflash", gemma) == spec.variant_epochs("dflash", gemma)
    assert min(spec.drafter_priority(t, smol) for t in spec.reference_lookups) == 1
    for name in [*spec.budget_arms, "vanilla", "head"]:
        assert spec.drafter_priority(name, smol) == 0, name


# ----------------------------------------------------------- a knob's default has one home

def schema_keys(schema: dict) -> dict[str, list[object]]:
    """Each property name of the config schema -> the defaults it has where it appears
    (``...`` where a place gives none)."""
    keys: dict[str, list[object]] = {}

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in (node.get("properties") or {}).items():
                if isinstance(value, dict):
                    keys.setdefault(key, []).append(value.get("default", ...))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(schema)
    return keys


#: Keys a drafter entry reads with a fallback in code, because the entry may have no default:
#: a checkpoint entry carries only name, kind, layers and checkpoint (the folder decides).
ENTRY_FALLBACKS = {"init", "objective"}
#: Reads of a record's metadata, not of the config, under a key of the same name: a record
#: written before the key existed (or a summary the figure reads alone) says nothing of it.
RECORD_READS = {
    ("src/floorgap/reports/common.py", "device"),
    ("src/floorgap/reports/floor_items.py", "level"),
    ("src/floorgap/reports/floor_items.py", "kmedian_restarts"),
    ("src/floorgap/reports/robustness_items.py", "temperature"),
    ("src/floorgap/reports/robustness_items.py", "top_p"),
    ("src/floorgap/stages/serving_replay.py", "draft_sampling"),
}


def code_defaults(source: str, keys: dict[str, list[object]], path: str = "") -> list[str]:
    """``.get("key", constant)`` calls that duplicate a schema default (the key has one) or
    replace one (a key of a single schema place with none): the knob's default then has a
    second home, or a home outside the schema."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "get" and len(node.args) == 2
                and isinstance(node.args[0], ast.Constant) and node.args[0].value in keys):
            continue
        key, fallback = node.args[0].value, node.args[1]
        if (path, key) in RECORD_READS:
            continue
        # an empty fallback (``{}``, ``[]``, ``""``) reads an optional section as absent
        constant = isinstance(fallback, ast.Constant) and fallback.value not in (None, "")
        defaults = keys[key]
        duplicates = any(d is not ... for d in defaults)
        replaces = constant and len(defaults) == 1 and key not in ENTRY_FALLBACKS
        if duplicates or replaces:
            found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_code_default_duplicates_or_replaces_a_schema_default() -> None:
    keys = schema_keys(yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text()))
    found = {path: bad for p in sorted((REPO / "src").rglob("*.py"))
             if (bad := code_defaults(p.read_text(), keys, path := str(p.relative_to(REPO))))}
    assert found == {}, ("give the knob its default in the schema and read it with [key]: "
                         f"{found}")


def test_the_code_default_check_finds_both() -> None:
    keys = {"port": [8011, 8031], "warmup_steps": [...], "paths": [..., ...]}
    source = ("a = cfg.get('port', 8031)\nb = tr.get('warmup_steps', 0)\n"
              "c = meta.get('paths', '--')\nd = tr.get('warmup_steps')\n")
    assert code_defaults(source, keys) == ["1: cfg.get('port', 8031)",
                                           "2: tr.get('warmup_steps', 0)"]
    assert code_defaults("e = cfg.get('port', {})\nf = tr.get('warmup_steps', [])\n",
                         keys) == ["1: cfg.get('port', {})"]
