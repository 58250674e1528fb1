"""Checkpoint variants and the decompose section in the config, the decomposition report and
stage, and the `floorgap decompose` command (its Snakemake run replaced by a stub; the real run
is tests/integration/test_decompose_workflow.py)."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, SMOKE_CONFIG, load_builders, load_config
from floorgap.config import (
    SUMMARIES,
    ConfigError,
    Evaluation,
    decompose_overlay,
    resolve,
    variant_kind,
    write_overlay,
)

SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "config.schema.yaml").read_text())
FOLDER = "/models/my-drafter"


def smoke() -> dict:
    return load_config(SMOKE_CONFIG)


def validate(cfg: dict) -> None:
    import jsonschema

    jsonschema.validate(cfg, SCHEMA)


def ckpt(fmt: str = "dflash", **extra) -> dict:
    return {"checkpoint": {"format": fmt, "path": FOLDER}, **extra}


# ------------------------------------------------------------------ checkpoint variants


@pytest.mark.parametrize(("entry", "kind"), [
    (ckpt("dflash"), "dflash"),
    (ckpt("dspark"), "dspark"),
    (ckpt("speculators", kind="dspark"), "dspark"),
    (ckpt("dflash", kind="dflash", layers=5), "dflash"),
    ({"kind": "prefix_attention", "layers": 1}, "prefix_attention"),
])
def test_checkpoint_kind_comes_from_the_format(entry, kind) -> None:
    assert variant_kind(entry) == kind


@pytest.mark.parametrize(("entry", "needle"), [
    (ckpt("speculators"), "add kind: dflash or kind: dspark"),
    (ckpt("dflash", kind="dspark"), "contradicts checkpoint.format dflash"),
    ({"layers": 2}, "neither 'kind' nor 'checkpoint'"),
    (ckpt("speculators", kind="prefix_attention"), "not prefix_attention"),
])
def test_unresolvable_kinds_are_refused(entry, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        variant_kind(entry)


def with_checkpoint_baselines(cfg: dict) -> dict:
    """The smoke config with its DFlash and DSpark baselines imported from checkpoints, as the
    paper-scale config does with the released ones (no kind, no layers)."""
    cfg = copy.deepcopy(cfg)
    d = cfg["drafters"]
    d["variants"]["dflash"] = ckpt("dflash")
    d["variants"]["dspark"] = {"kind": "dspark", "checkpoint": {
        "format": "speculators", "hub": "org/drafter", "revision": "abc"}}
    d["budget"]["variants"] = []
    return cfg


def test_checkpoint_baselines_resolve() -> None:
    cfg = with_checkpoint_baselines(smoke())
    validate(cfg)
    spec = resolve(cfg)
    assert spec.variant_entry("dflash", spec.primary) == {
        "name": "dflash", "kind": "dflash", **ckpt()}
    assert spec.variant_entry("dspark", spec.primary)["kind"] == "dspark"
    assert spec.is_imported("dflash", spec.primary) and not spec.is_imported("ours", spec.primary)
    # an import reads no training settings: changing them reruns no import
    assert set(spec.drafters_spec("tiny-random", "dflash")) == {"target", "variant", "gamma"}
    assert "train" in spec.drafters_spec("tiny-random", "ours")
    assert spec.eval_groups["summary"] == [Evaluation(v, "final")
                                           for v in spec.variants + spec.lookups]


@pytest.mark.parametrize(("mutate", "needle"), [
    (lambda d: d["variants"].update(dflash=ckpt("dspark")), "must be of kind dflash"),
    (lambda d: d.update(trajectory=["dflash"]), "drafters.trajectory names \\['dflash'\\]"),
    (lambda d: d["budget"].update(variants=["dflash"]), "drafters.budget.variants names"),
    (lambda d: d["components"]["arms"].update(vanilla=ckpt("dspark")),
     "drafters.components.arms \\['vanilla'\\] name a checkpoint"),
    (lambda d: d["budget"]["arms"].update({"dflash-ce": ckpt()}), "drafters.budget.arms"),
    (lambda d: d["variants"].update(dflash=ckpt("dflash", epochs=2)), "also sets \\['epochs'\\]"),
    (lambda d: d["variants"].update(dflash=ckpt("dflash", kind="dspark")), "contradicts"),
], ids=["order0-from-format", "in-trajectory", "in-budget", "component-arm", "budget-arm",
        "training-key", "kind-vs-format"])
def test_checkpoint_variants_are_refused_where_they_cannot_go(mutate, needle) -> None:
    cfg = smoke()
    cfg["drafters"]["variants"]["dflash"] = ckpt("dflash")
    cfg["drafters"]["budget"]["variants"] = []
    mutate(cfg["drafters"])
    with pytest.raises(ConfigError, match=needle):
        resolve(cfg)


def test_shipped_configs_validate_and_resolve() -> None:
    """The smoke config and the paper-scale Qwen3-4B config (released baselines imported)."""
    for path in (SMOKE_CONFIG, REPO / "workflow" / "configs" / "qwen3-4b.yaml"):
        cfg = yaml.safe_load(path.read_text())
        validate(cfg)
        resolve(cfg)
    spec = resolve(yaml.safe_load((REPO / "workflow/configs/qwen3-4b.yaml").read_text()))
    # the paper's own baselines (App. A): DeepSpec's block-7 releases, both Qwen3DSparkModel
    dflash = spec.variant_entry("dflash", spec.primary)
    dspark = spec.variant_entry("dspark", spec.primary)
    assert dflash["checkpoint"] == {"format": "dspark",
                                    "hub": "deepseek-ai/dflash_qwen3_4b_block7"}
    assert dspark["checkpoint"]["hub"] == "deepseek-ai/dspark_qwen3_4b_block7"
    assert (dflash["kind"], dspark["kind"]) == ("dflash", "dspark")
    # DeepSpec's DFlash is exported and served in its own layout (the engines' DSpark method)
    assert spec.export_formats("dflash") == ["dspark"]
    assert spec.serving_system("dflash") == {"name": "dflash", "kind": "dflash",
                                             "format": "dspark"}
    assert not spec.is_imported("ours", spec.primary)


# ------------------------------------------------------------------ the decompose section


def with_decompose(cfg: dict, **entries) -> dict:
    cfg = copy.deepcopy(cfg)
    cfg["decompose"] = entries or {"mine": ckpt("dflash")}
    return cfg


def test_decompose_section_is_its_own_group_and_summary() -> None:
    cfg = with_decompose(smoke(), mine=ckpt("dflash"),
                         theirs=ckpt("speculators", kind="dspark"))
    validate(cfg)
    spec = resolve(cfg)
    assert "decompose" in SUMMARIES
    assert spec.decompose == ["mine", "theirs"]
    # the lookup tables are evaluated beside the user's drafters, on the same paths
    # their records are the decompose job's own: the study job may evaluate the same tables
    assert spec.eval_groups["decompose"] == [Evaluation(n, "final", "decompose") for n in (
        "mine", "theirs", "unigram", "bigram_committed", "bigram")]
    assert not {(e.variant, e.job) for e in spec.eval_jobs["decompose"]} & {
        (e.variant, e.job) for e in spec.eval_jobs["study"]}
    assert spec.lookups == ["unigram", "bigram_committed", "bigram"]
    assert spec.summary_evaluations("decompose", spec.primary) == spec.eval_groups["decompose"]
    assert {"mine", "theirs"} <= set(spec.drafter_names)
    assert spec.variant_entry("theirs", spec.primary) == {
        "name": "theirs", **ckpt("speculators", kind="dspark")}
    assert spec.variant_entry("mine", spec.primary)["kind"] == "dflash"
    gaps = spec.gaps_spec("decompose", spec.primary)
    # each drafter against the tables of its order
    assert gaps == spec.analysis_spec(contrasts=[["mine", "unigram"], ["mine", "bigram_committed"],
                                                 ["theirs", "bigram"]],
                                      sweeps=False, lookups=spec.lookups)
    assert spec.drafter_eval_spec("tiny-random", 0, "decompose")["variants"] == [
        "mine", "theirs", *spec.lookups]
    assert spec.decomposition_spec("tiny-random", "mine")["entry"]["kind"] == "dflash"
    assert spec.decomposition_spec("tiny-random", "mine")["lookups"] == ["unigram",
                                                                         "bigram_committed"]
    assert spec.decomposition_spec("tiny-random", "theirs")["lookups"] == ["bigram"]
    assert spec.decomposition_files("tiny-random") == [
        f"results/tiny-random/decomposition/{n}.{e}" for n in ("mine", "theirs")
        for e in ("csv", "tex", "md")]
    # the other groups do not change
    assert spec.eval_groups["summary"] == resolve(smoke()).eval_groups["summary"]


def test_without_a_decompose_section_nothing_is_wired() -> None:
    spec = resolve(smoke())
    assert spec.decompose == [] and spec.eval_groups["decompose"] == []
    assert spec.decomposition_files("tiny-random") == []


@pytest.mark.parametrize(("entries", "needle"), [
    ({"dspark": ckpt()}, "decompose reuses the drafter name\\(s\\) \\['dspark'\\]"),
    ({"vanilla": ckpt()}, "decompose reuses"),
    ({"dflash-ce": ckpt()}, "decompose reuses"),
    ({"mine": {"kind": "dflash", "layers": 1}}, "decompose.mine has no checkpoint"),
    ({"mine": ckpt("speculators")}, "decompose.mine: a speculators checkpoint"),
])
def test_bad_decompose_entries_are_refused(entries, needle) -> None:
    with pytest.raises(ConfigError, match=needle):
        resolve(with_decompose(smoke(), **entries))


def test_overlay_writer(tmp_path: Path) -> None:
    overlay = decompose_overlay("my-drafter_1", tmp_path / "x" / ".." / "folder", "dflash")
    assert overlay == {"decompose": {"my-drafter_1": {"checkpoint": {
        "format": "dflash", "path": str((tmp_path / "folder").resolve())}}}}
    path = write_overlay(tmp_path / "results" / "decompose" / "my-drafter_1.yaml", overlay)
    assert yaml.safe_load(path.read_text()) == overlay
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left
    # Snakemake merges the overlay over the base config: the result validates and resolves
    merged = {**smoke(), **yaml.safe_load(path.read_text())}
    validate(merged)
    assert resolve(merged).eval_groups["decompose"] == [
        Evaluation(n, "final", "decompose")
        for n in ("my-drafter_1", "unigram", "bigram_committed")]
    spec = decompose_overlay("u", tmp_path, "speculators", "dspark")
    assert spec["decompose"]["u"]["kind"] == "dspark"
    with pytest.raises(ConfigError, match="must match"):
        decompose_overlay("My Drafter", tmp_path, "dflash")
    with pytest.raises(ConfigError, match="add kind"):
        decompose_overlay("u", tmp_path, "speculators")


# ------------------------------------------------------------------ the decomposition report


@pytest.fixture(scope="module")
def summaries(tmp_path_factory) -> tuple[Path, Path]:
    """A real gaps summary of synthetic records (one order-0, one order-1 drafter) and a
    floors summary with the other-order floors, of the same target and gamma."""
    return load_builders("gap_builders").decompose_summaries(
        tmp_path_factory.mktemp("decomposition"),
        {"mine": {"order": 0}, "theirs": {"order": 1}, "table0": {"order": 0},
         "table1": {"order": 1}}, [["mine", "table0"], ["theirs", "table1"]])


def test_order0_decomposition_adds_up(summaries) -> None:
    from floorgap.reports.decomposition import decompose, to_latex, to_markdown

    d = decompose(*summaries, "mine", kind="dflash", level=0.9)
    assert d.order == 0 and d.gamma == 3
    t = d.table
    assert list(t.columns) == ["statistic", "slot", "estimate", "lower", "upper"]
    assert set(t.statistic) == {"T0", "R", "G0", "G0_share", "floors_T1", "tau"}
    for k in range(3):
        assert d.value("T0", k) + d.value("G0", k) == pytest.approx(d.value("R", k))
        assert d.value("floors_T1", k) == pytest.approx(0.1 + 0.01 * k)
    assert t[t.statistic == "tau"].slot.tolist() == [-1] and d.value("tau") >= 1
    md = to_markdown(d)
    assert "| slot | T0 (floor) | R | G0 (gap) | G0 90% CI | G0/R | T1 (order-1 floor) |" in md
    assert len([ln for ln in md.splitlines() if ln.startswith("| ")]) == 2 + 3  # head, rule
    assert f"tau (offline accepted length) = {d.value('tau'):.3f}" in md
    tex = to_latex(d)
    assert tex.startswith("\\begin{tabular}{lrrrrrr}") and "$G^{(0)}/R$" in tex
    assert "$\\tau$" in tex and "90\\% CI" in tex


def test_order1_decomposition_adds_up(summaries) -> None:
    from floorgap.reports.decomposition import ORDER_STATS, decompose, to_markdown

    d = decompose(*summaries, "theirs", kind="dspark")
    assert d.order == 1
    assert set(d.table.statistic) == {*ORDER_STATS[1], "floors_T0", "tau"}
    for k in range(3):
        if d.value("covered_mass", k) > 0:
            assert d.value("T1", k) + d.value("G1", k) == pytest.approx(d.value("R_oracle", k))
            assert d.value("R_oracle", k) + d.value("exposure", k) == pytest.approx(
                d.value("R_self", k))
    assert "exposure" in to_markdown(d) and "R_self" in to_markdown(d)


@pytest.mark.parametrize(("drafter", "table", "risk"), [("mine", "table0", "R"),
                                                        ("theirs", "table1", "R_oracle")])
def test_decomposition_sets_the_lookup_table_beside_the_drafter(summaries, drafter, table,
                                                                 risk) -> None:
    from floorgap.reports.decomposition import decompose, to_latex, to_markdown

    d = decompose(*summaries, drafter, lookups=[table])
    diff = f"diff_{risk}@{table}"
    assert {f"{risk}@{table}", diff} <= set(d.table.statistic)
    for k in range(3):
        # the paired difference is the drafter's risk minus the table's on the same cells
        assert d.value(diff, k) == pytest.approx(d.value(risk, k) - d.value(f"{risk}@{table}", k),
                                                 abs=1e-9)
        assert d.value(diff, k, "lower") <= d.value(diff, k) <= d.value(diff, k, "upper")
    [verdict] = d.verdicts
    assert verdict.loses == [k for k in range(3) if not d.value(diff, k) < 0]
    md = to_markdown(d)
    assert f"| {risk} {table} | 95% CI minus {table} |" in md
    assert f"- {verdict.sentence()}" in md
    assert ("loses to a lookup table" in md) == bool(verdict.loses)
    assert f"vs {table}" in to_latex(d)
    # a table of the other order is no baseline for this drafter
    with pytest.raises(ValueError, match="not of order"):
        decompose(*summaries, drafter, lookups=["table1" if table == "table0" else "table0"])


def test_decomposition_refuses_mismatched_inputs(summaries, tmp_path) -> None:
    from floorgap.records import write_table
    from floorgap.reports.decomposition import decompose

    gaps, floors = summaries
    with pytest.raises(ValueError, match="has no variant 'nope'"):
        decompose(gaps, floors, "nope")
    other = tmp_path / "floors.parquet"
    write_table(other, pd.read_parquet(floors), {"target": "another", "gamma": 3})
    with pytest.raises(ValueError, match="same target"):
        decompose(gaps, other, "mine")


def test_decomposition_stage_writes_three_files(summaries, tmp_path) -> None:
    from floorgap.stages._cli import run_stage
    from floorgap.stages.decomposition import build_parser, main

    gaps, floors = summaries
    out = {ext: tmp_path / "decomposition" / f"mine.{ext}" for ext in ("csv", "tex", "md")}
    spec = {"target": "t", "drafter": "mine", "entry": {"kind": "dflash"}, "level": 0.9,
            "lookups": ["table0"]}
    argv = ["--spec", json.dumps(spec), "--gaps", str(gaps), "--floors", str(floors),
            "--out-csv", str(out["csv"]), "--out-tex", str(out["tex"]),
            "--out-md", str(out["md"]), "--threads", "1"]
    assert run_stage(main, build_parser(), argv) == 0
    csv = pd.read_csv(out["csv"])
    assert {"T0", "R", "G0", "G0_share", "tau", "R@table0", "diff_R@table0"} <= set(csv.statistic)
    assert "lookup table (table0)" in out["md"].read_text() or "beats the table0" in out[
        "md"].read_text()
    assert "\\begin{tabular}" in out["tex"].read_text()
    assert "drafter mine (dflash, order 0)" in out["md"].read_text()
    assert sorted(p.name for p in out["csv"].parent.iterdir()) == ["mine.csv", "mine.md",
                                                                   "mine.tex"]
    bad = ["--spec", json.dumps(dict(spec, drafter="nope")), *argv[2:]]
    assert run_stage(main, build_parser(), bad) == 2


# ------------------------------------------------------------------ floorgap decompose


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """Exported drafter folders on a tiny random Llama target: dflash, speculators (dspark)
    and floorgap (prefix attention, which no engine runs)."""
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
    for kind, fmt in (("dflash", "dflash"), ("dspark", "speculators"),
                      ("prefix_attention", "floorgap")):
        cfg = DrafterConfig(kind=kind, gamma=3, hidden_size=32, n_layers=1, n_heads=4,
                            intermediate_size=64, taps=[0, 1], markov_rank=4, head_width=8,
                            head_heads=2, head_mlp=16, nominate_k=4)
        out[fmt] = export_drafter(build_drafter(cfg, target), root / fmt, fmt)
    return out


def test_checkpoint_detection(folders, tmp_path) -> None:
    from floorgap.cli import DecomposeError, detect_checkpoint

    assert detect_checkpoint(folders["dflash"], "auto", None) == ("dflash", None)
    assert detect_checkpoint(folders["speculators"], "auto", None) == ("speculators", "dspark")
    assert detect_checkpoint(folders["speculators"], "speculators", "dspark") == (
        "speculators", "dspark")
    with pytest.raises(DecomposeError, match="holds a dflash checkpoint, not dspark"):
        detect_checkpoint(folders["dflash"], "dspark", None)
    with pytest.raises(DecomposeError, match="holds a dspark drafter, not dflash"):
        detect_checkpoint(folders["speculators"], "auto", "dflash")
    with pytest.raises(DecomposeError, match="floorgap's own layout"):
        detect_checkpoint(folders["floorgap"], "auto", None)
    with pytest.raises(DecomposeError, match="has no config.json"):
        detect_checkpoint(tmp_path, "auto", None)


def test_decompose_command_writes_the_overlay_and_runs_snakemake(folders, checkout, monkeypatch,
                                                                 capsys) -> None:
    from floorgap import cli

    calls = []

    def fake_run(cmd, cwd, check):
        calls.append((cmd, cwd))
        md = Path(cwd) / "results/tiny-random/decomposition/spec-d.md"
        md.parent.mkdir(parents=True, exist_ok=True)
        md.write_text("| slot | T1 (floor) |\n")
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(cli.subprocess, "run", fake_run)
    assert cli.main(["decompose", str(folders["speculators"]), "--name", "spec-d",
                     "--cores", "3"]) == 0
    (cmd, cwd), = calls
    assert Path(cwd) == checkout
    overlay = checkout / "results" / "decompose" / "spec-d.yaml"
    assert yaml.safe_load(overlay.read_text()) == {"decompose": {"spec-d": {
        "checkpoint": {"format": "speculators", "path": str(folders["speculators"].resolve())},
        "kind": "dspark"}}}
    files = [f"results/tiny-random/decomposition/spec-d.{e}" for e in ("csv", "tex", "md")]
    # the files before --configfile (which takes every following word), the overlay last
    assert cmd[1:3] == ["-m", "snakemake"]
    assert cmd[cmd.index("--configfile") + 1:] == [str(checkout / "config.yaml"), str(overlay)]
    assert all(cmd.index(f) < cmd.index("--configfile") for f in files)
    assert cmd[cmd.index("--cores") + 1] == "3" and "--dry-run" not in cmd
    assert "| slot | T1 (floor) |" in capsys.readouterr().out


def test_decompose_command_refuses_bad_invocations(folders, checkout, monkeypatch,
                                                   capsys) -> None:
    from floorgap import cli

    monkeypatch.setattr(cli.subprocess, "run", lambda *a, **k: pytest.fail("ran Snakemake"))
    assert cli.main(["decompose", str(folders["dflash"]), "--target", "nope"]) == 2
    assert "target 'nope' is not one of the targets" in capsys.readouterr().err
    assert cli.main(["decompose", str(folders["dflash"]), "--name", "Bad Name"]) == 2
    assert "pass another --name" in capsys.readouterr().err
    assert cli.main(["decompose", str(folders["dflash"]), "--configfile", "nope.yaml"]) == 2
    assert "does not exist" in capsys.readouterr().err
    # a failed workflow passes Snakemake's status on and prints no table
    monkeypatch.setattr(cli.subprocess, "run",
                        lambda cmd, cwd, check: subprocess.CompletedProcess(cmd, 1))
    assert cli.main(["decompose", str(folders["dflash"]), "--dry-run"]) == 1
    assert "Snakemake exited with status 1" in capsys.readouterr().err
