"""`floorgap decompose` and `floorgap check` end to end: drafter folders of one's own,
decomposed and checked on the smoke config by the real workflow in a copy of the repository
(nothing trained). The smoke run's records are copied in, so what runs is what the commands
add: the drafters' import, their evaluation beside the lookup tables, the decomposition and
the check page."""

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

from conftest import REPO, copy_results, permute_taps, snakemake_env

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


def _export(smoke_target, folder: Path, seed: int = 3) -> Path:
    """A randomly initialised DFlash drafter on the smoke target, as a dflash folder (head_dim
    32: vLLM's CPU attention has no kernel for 16)."""
    from floorgap.models.drafters import DrafterConfig, build_drafter
    from floorgap.models.engine_formats import export_drafter
    from floorgap.models.targets import load_target

    cfg, _, model_dir, _ = smoke_target
    model, _ = load_target(model_dir, "float32", "cpu")
    torch.manual_seed(seed)
    drafter = build_drafter(DrafterConfig(
        kind="dflash", gamma=cfg["anchors"]["gamma"], hidden_size=model.config.hidden_size,
        n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32, intermediate_size=64,
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


def _permute_taps(export: Path, dest: Path) -> Path:
    """A copy of an exported DFlash folder with its taps' columns permuted (conftest)."""
    shutil.copytree(export, dest)
    permute_taps(dest)
    return dest


def test_check_command_writes_the_page_and_reuses_the_floors(smoke_target, smoke_run,
                                                             tmp_path: Path) -> None:
    """`floorgap check E F` on the smoke config, in one workflow run: the smoke run's own DFlash
    as exported for vLLM (trimmed vocabulary, mask embedding) and the same export with its
    taps' columns permuted, both with the weights they were exported from as their reference;
    imported, evaluated and compared on the smoke run's paths, each served in vLLM on one row
    per task and its rounds replayed with the reference; one page and summary. Then a check of
    a folder of one's own plans no job of the floor half (the floors are reused). (Several
    drafters without a reference, and a folder replayed with its own import, are the unit
    tests' and the smoke DAG's.)"""
    work = copy_results(smoke_run, _copy_repository(tmp_path / "repo"))
    smoke = work / "workflow" / "configs" / "smoke.yaml"
    cfg = yaml.safe_load(smoke.read_text())
    target = next(iter(cfg["targets"]))
    export = work / "results" / target / "export" / "dflash" / "dflash"
    weights = f"results/{target}/drafters/dflash/final.pt"
    faulty = _permute_taps(export, tmp_path / "faulty")
    res = subprocess.run([sys.executable, "-m", "floorgap", "check", str(export), str(faulty),
                          "--name", "exported", "--name", "faulty", "--reference", weights,
                          "--reference", weights, "--report", "two", "--configfile", str(smoke),
                          "--cores", "2"],
                         cwd=work, env=snakemake_env(), capture_output=True, text=True,
                         timeout=1800)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = work / "results" / "check" / "two"
    page, md = (out / "index.html").read_text(), (out / "summary.md").read_text()
    assert md.strip() in res.stdout and str(out / "index.html") in res.stdout
    names = ("exported", "faulty")
    for name in names:
        assert f"## {name} (dflash, order 0)" in md
        assert f"{name} loses to a lookup table" in md or f"{name} beats the" in md
    assert ("exported accepts longer than faulty" in md or "faulty accepts longer than exported"
            in md or "exported and faulty: no difference in tau resolved" in md)
    # two drafters with their served figures, one side by side
    assert page.count('<img src="data:image/png;base64,') == 2 + 2 + 1
    assert "floorgap check " in page and target in page
    gaps = pd.read_parquet(work / "results" / target / "gaps" / "decompose.parquet")
    assert "exported-faulty" in set(gaps.variant)  # the paired difference
    # offline: the export reads as its trained weights, the permuted one does not
    fidelity = json.loads((out / "fidelity" / "exported.json").read_text())
    assert fidelity["error"] is None and fidelity["anchors"] == 4 * 4
    assert max(s["max_abs_dq"] for s in fidelity["slots"]) < 1e-5
    assert "exported's folder reads as the weights it was exported from" in md
    assert "export or layout fault: faulty's folder does not read as" in md
    assert "fc input columns permuted: the folder's fusion reads the taps' feature blocks" in md
    # served: one row per task at each temperature, one request in flight
    tasks, temps = list(cfg["serving"]["tasks"]), cfg["serving"]["temperatures"]
    for name in names:
        served = pd.read_parquet(work / "results" / target / "serving" / name /
                                 "requests.parquet")
        assert len(served) == len(tasks) * len(temps) and set(served.concurrency) == {1}
    # the smoke target has random weights: its drafters accept (almost) nothing, served or
    # replayed, so the served tests say what they can; never a fault for a faithful folder
    engine = {n: next(line for line in md.splitlines() if f" {n} in vllm, replayed with " in line)
              for n in names}
    for name in names:
        assert f"{name} in vllm, replayed with {weights}" in engine[name]
    assert ("the engine serves what the weights predict" in engine["exported"]
            or "the served rounds cannot tell" in engine["exported"]), engine["exported"]
    # what vLLM counted itself (its /metrics) equals its per-request records, slot by slot
    for name in names:
        counted = next(line for line in md.splitlines()
                       if f" {name} in vllm, accepted/reached by slot at T = 1" in line)
        assert "they equal the per-request records" in counted, counted
    assert "the engine's counters agree with the replay at every slot: exported" in md
    # the export declares its layout, the one vLLM runs
    assert "exported's folder declares 1+N (sample_from_anchor), the layout vllm runs" in md
    later = _export(smoke_target, tmp_path / "draft-c", seed=5)
    # another drafter on the same target: only what depends on the drafter would run
    again = subprocess.run([sys.executable, "-m", "floorgap", "check", str(later),
                            "--configfile", str(smoke), "--cores", "1", "--dry-run"],
                           cwd=work, env=snakemake_env(), capture_output=True, text=True,
                           timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    stages = {"corpus", "anchors", "rollouts", "floors", "drafter_data", "drafters",
              "drafter_eval_decompose", "gaps", "check_report", "serving", "serving_replay",
              "serving_rows"}
    planned = {line.split()[0] for line in again.stdout.splitlines()
               if line and line.split()[0] in stages}
    assert {"drafters", "check_report", "serving", "serving_replay"} <= planned
    assert not planned & {"corpus", "anchors", "rollouts", "floors", "drafter_data",
                          "serving_rows"}
