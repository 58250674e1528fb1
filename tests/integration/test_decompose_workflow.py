"""`floorgap decompose` end to end: a drafter folder of one's own, decomposed on the smoke
config by the real workflow in a copy of the repository (nothing trained). The smoke run's
records are copied in, so what runs is what decompose adds: the drafter's import, its
evaluation beside the lookup tables, and the decomposition."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from conftest import REPO, copy_results, snakemake_env

# reads the shared smoke DAG (conftest.smoke_run), which the first test to ask builds
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(3600)]


def _copy_repository(dest: Path) -> Path:
    """The workflow's files (what `floorgap decompose` runs from), without results."""
    dest.mkdir(parents=True)
    for name in ("Snakefile", "config.yaml"):
        shutil.copy2(REPO / name, dest / name)
    for name in ("workflow", "paper", "envs"):
        shutil.copytree(REPO / name, dest / name,
                        ignore=shutil.ignore_patterns("__pycache__", ".snakemake"))
    return dest


def _export(smoke_target, folder: Path) -> Path:
    """A randomly initialised DFlash drafter on the smoke target, as a dflash folder."""
    from floorgap.models.drafters import DrafterConfig, build_drafter
    from floorgap.models.engine_formats import export_drafter
    from floorgap.models.targets import load_target

    cfg, _, model_dir, _ = smoke_target
    model, _ = load_target(model_dir, "float32", "cpu")
    torch.manual_seed(3)
    drafter = build_drafter(DrafterConfig(
        kind="dflash", gamma=cfg["anchors"]["gamma"], hidden_size=model.config.hidden_size,
        n_layers=1, n_heads=4, n_kv_heads=2, head_dim=16, intermediate_size=64,
        taps=cfg["drafters"]["taps"]), model)
    return export_drafter(drafter, folder, "dflash", num_target_layers=2)


def test_decompose_command_runs_the_workflow(smoke_target, smoke_run, tmp_path: Path) -> None:
    work = copy_results(smoke_run, _copy_repository(tmp_path / "repo"))
    folder = _export(smoke_target, tmp_path / "my-drafter")
    smoke = work / "workflow" / "configs" / "smoke.yaml"
    res = subprocess.run([sys.executable, "-m", "floorgap", "decompose", str(folder),
                          "--configfile", str(smoke), "--cores", "2"],
                         cwd=work, env=snakemake_env(), capture_output=True, text=True,
                         timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    target = next(iter(yaml.safe_load(smoke.read_text())["targets"]))
    results = work / "results" / target
    out = results / "decomposition"
    csv = pd.read_csv(out / "user.csv")
    assert list(csv.columns) == ["statistic", "slot", "estimate", "lower", "upper"]
    # beside the drafter: the order-0 lookup tables and its paired difference to each
    tables = ("unigram", "bigram_committed")
    assert {"T0", "R", "G0", "G0_share", "floors_T1", "tau",
            *(f"{s}@{t}" for s in ("R", "diff_R") for t in tables)} == set(csv.statistic)
    est = csv.set_index(["statistic", "slot"])["estimate"]
    assert 1 <= est[("tau", -1)] <= 8
    for k in range(7):
        assert est[("T0", k)] + est[("G0", k)] == pytest.approx(est[("R", k)])
    assert "\\begin{tabular}" in (out / "user.tex").read_text()
    md = (out / "user.md").read_text()
    assert "drafter user (dflash, order 0)" in md and md.strip() in res.stdout
    assert all(t in md for t in tables)
    # nothing was trained: the drafter was imported; the tables were fitted from the training
    # data
    record = torch.load(results / "drafters" / "user" / "final.pt", weights_only=True)
    assert record["provenance"]["imported"] and record["provenance"]["path"] == str(folder)
    assert (results / "drafters" / "user" / "train_log.jsonl").read_text() == ""
    assert all(torch.load(results / "drafters" / t / "final.pt", weights_only=True)
               for t in tables)
    overlay = yaml.safe_load((work / "results" / "decompose" / "user.yaml").read_text())
    assert overlay["decompose"]["user"]["checkpoint"] == {"format": "dflash",
                                                          "path": str(folder)}
    gaps = pd.read_parquet(results / "gaps" / "decompose.parquet")
    assert set(gaps.variant) == {"user", *tables, *(f"user-{t}" for t in tables)}  # contrasts
    # a second run has nothing to do
    again = subprocess.run([sys.executable, "-m", "floorgap", "decompose", str(folder),
                            "--configfile", str(smoke), "--cores", "1", "--dry-run"],
                           cwd=work, env=snakemake_env(), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "Nothing to be done" in again.stdout + again.stderr
    json.dumps(record["provenance"])  # plain values only
