"""The workflow end to end on the smoke config, and its refusal of bad configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, SMOKE_CONFIG, snakemake

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FIGURES = ["fig2_floor_by_slot", "fig3_floor_by_domain", "figD2_kmedian",
           "fig4_drafter_decomposition", "fig6_slot_priority", "fig7_prefix_attention"]
TABLES = ["table3_floor_intervals", "table4_mi_locality", "tableD1_concentration",
          "table5_dflash", "table6_dspark", "table7_serving_risk", "table8_dependence",
          "table10_trajectory", "table12_ours_vs_dspark", "table13_components",
          "tableF5_single_slot", "tableF6_sweeps"]


def _write_config(path: Path, mutate) -> Path:
    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())
    mutate(cfg)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # domain order is part of the specs
    return path


def test_default_config_dry_run_lists_jobs(tmp_path: Path) -> None:
    res = snakemake("-n", "--cores", "1", "--configfile", str(REPO / "config.yaml"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    for rule in ("model", "corpus", "anchors", "manifest"):
        assert rule in out


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
def test_bad_config_is_refused_before_any_job(tmp_path: Path, mutate, needle: str) -> None:
    cfg = _write_config(tmp_path / "bad.yaml", mutate)
    res = snakemake("--cores", "1", "--configfile", str(cfg), cwd=tmp_path)
    assert res.returncode != 0
    err = res.stdout + res.stderr
    assert "Error validating config file" in err
    assert needle in err
    assert not (tmp_path / "results").exists(), "a job ran despite the invalid config"


@pytest.mark.parametrize(
    ("mutate", "needle"),
    [
        (lambda c: c["drafters"]["components"]["arms"].update(dspark={"kind": "dspark",
                                                                      "layers": 1}),
         "reuses the variant name"),
        (lambda c: c["drafters"]["components"].update(baseline="nope"), "is not one of the arms"),
        (lambda c: c["drafters"].update(trajectory=["nope"]), "which are not drafters.variants"),
    ],
    ids=["arm-named-like-a-variant", "unknown-baseline", "unknown-trajectory-variant"],
)
def test_inconsistent_drafter_sections_are_refused(tmp_path: Path, mutate, needle: str) -> None:
    cfg = _write_config(tmp_path / "bad.yaml", mutate)
    res = snakemake("--cores", "1", "--configfile", str(cfg), "-n", cwd=tmp_path)
    assert res.returncode != 0
    assert needle in res.stdout + res.stderr
    assert not (tmp_path / "results").exists()


def _jobs(dry_run_output: str) -> dict[str, int]:
    """Rule -> job count from the "Job stats" table of a dry run."""
    lines = dry_run_output.split("Job stats:")[1].splitlines()[3:]
    jobs = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The whole smoke DAG, run once in a scratch working directory."""
    work = tmp_path_factory.mktemp("smoke-dag")
    # Without LaTeX (CI installs it) everything but the compiled paper is built.
    (target,) = yaml.safe_load(SMOKE_CONFIG.read_text())["targets"]
    targets = [] if shutil.which("latexmk") else ["paper/values.tex",
                                                  f"results/{target}/manifest.json"]
    # Targets go before --configfile, which takes every following word as a config file.
    res = snakemake(*targets, "--cores", "2", "--configfile", str(SMOKE_CONFIG), cwd=work)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return work


def test_smoke_dag_end_to_end(smoke_run: Path) -> None:
    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())
    (target,) = cfg["targets"]
    results = smoke_run / "results" / target
    manifest = json.loads((results / "manifest.json").read_text())
    listed = {Path(e["path"]).name for e in manifest["files"]}
    shards = cfg["rollouts"]["shards"]
    # corpus, anchors, mi + paths/floors per shard per domain; floors and gaps summaries
    assert len(manifest["files"]) == (3 + 2 * shards) * len(cfg["domains"]) + 2 + 3
    for domain in cfg["domains"]:
        assert f"{domain}.parquet" in listed
        anchors = pd.read_parquet(results / "anchors" / f"{domain}.parquet")
        assert len(anchors) == cfg["anchors"]["per_domain"]
        assert ((anchors["pi"] > 0) & (anchors["pi"] <= 1)).all()
    for item in FIGURES:
        assert (smoke_run / "figures" / f"{item}.pdf").stat().st_size > 0
        assert (smoke_run / "figures" / f"{item}.png").stat().st_size > 0
    for item in TABLES:
        assert "\\begin{tabular}" in (smoke_run / "paper" / "tables" / f"{item}.tex").read_text()
        assert len(pd.read_csv(smoke_run / "paper" / "tables" / f"{item}.csv")) > 0
    values = (smoke_run / "paper" / "values.tex").read_text()
    for macro in ("fgFloorTZeroLast", "fgDsparkGapLast", "fgOursVsDsparkTauChange",
                  "fgOursTrajectoryTauLast", "fgComponentsBest"):
        assert f"\\newcommand{{\\{macro}}}" in values, macro
    # every drafter, trajectory epoch and component arm was trained and evaluated
    drafters = cfg["drafters"]
    trained = {p.parent.name for p in (results / "drafters").glob("*/final.pt")}
    assert trained == set(drafters["variants"]) | set(drafters["components"]["arms"])
    for v in drafters["trajectory"]:
        epochs = drafters["variants"][v].get("epochs", drafters["train"]["epochs"])
        assert len(list((results / "drafters" / v / "epochs").glob("epoch-*.pt"))) == epochs
    if shutil.which("latexmk"):
        assert (smoke_run / "paper" / "main.pdf").read_bytes()[:4] == b"%PDF"
    # A second run has nothing to do.
    again = snakemake("--cores", "2", "--configfile", str(SMOKE_CONFIG), "-n", cwd=smoke_run)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr


@pytest.mark.parametrize("item", ["fig2_floor_by_slot", "fig7_prefix_attention"])
def test_one_figure_rebuilds_alone(smoke_run: Path, item: str) -> None:
    figure = smoke_run / "figures" / f"{item}.pdf"
    figure.unlink()
    res = snakemake(f"figures/{item}.pdf", "--cores", "1", "--configfile",
                    str(SMOKE_CONFIG), "-n", cwd=smoke_run)
    assert res.returncode == 0, res.stderr
    assert _jobs(res.stdout) == {item: 1, "total": 1}
    res = snakemake(f"figures/{item}.pdf", "--cores", "1", "--configfile",
                    str(SMOKE_CONFIG), cwd=smoke_run)
    assert res.returncode == 0, res.stderr
    assert figure.exists()


def test_plotting_option_reruns_nothing_upstream(smoke_run: Path, tmp_path: Path) -> None:
    cfg = _write_config(tmp_path / "wider.yaml",
                        lambda c: c["figures"].update(width_in=c["figures"]["width_in"] + 1))
    res = snakemake("--cores", "1", "--configfile", str(cfg), "-n", cwd=smoke_run)
    assert res.returncode == 0, res.stderr
    jobs = _jobs(res.stdout)
    upstream = {"model", "corpus", "anchors", "rollouts", "floors", "mi", "manifest",
                "drafter_data", "drafter", "drafter_eval_summary", "drafter_eval_components",
                "serving_risk"}
    assert not upstream & set(jobs), jobs
    assert set(FIGURES) <= set(jobs)


def test_html_report(smoke_run: Path) -> None:
    res = snakemake("--configfile", str(SMOKE_CONFIG), "--report", "report.html", cwd=smoke_run)
    assert res.returncode == 0, res.stderr[-3000:]
    html = (smoke_run / "report.html").read_text(errors="replace")
    assert "fig2_floor_by_slot" in html and "table4_mi_locality" in html
    assert "fig7_prefix_attention" in html and "table13_components" in html
