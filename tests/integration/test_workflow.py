"""The workflow end to end on the smoke config, and its refusal of bad configs."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from conftest import (REPO, SMOKE_CONFIG, copy_results, dry_run_jobs, load_config,
                      snakemake, snakemake_cmd, snakemake_env)

# the shared smoke DAG (conftest.smoke_run) is built in the first test that asks for it: up to
# 50 minutes on 2 busy cores
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(3600)]

from floorgap.reports.registry import ITEMS

FIGURES = [i.name for i in ITEMS if i.kind == "figure"]
TABLES = [i.name for i in ITEMS if i.kind == "table"]


def _write_config(path: Path, mutate) -> Path:
    cfg = load_config(SMOKE_CONFIG)
    mutate(cfg)
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))  # domain order is part of the specs
    return path


def test_default_config_dry_run_lists_jobs(tmp_path: Path) -> None:
    res = snakemake("-n", "--cores", "1", "--configfile", str(REPO / "config.yaml"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out = res.stdout + res.stderr
    for rule in ("models", "corpus", "anchors", "manifest"):
        assert rule in out


# The refusals by the schema and by the consistency checks are tested case by case in
# tests/test_config.py (in process); here one case of each goes through the real command.
@pytest.mark.parametrize(
    ("mutate", "needle"),
    [(lambda c: c["anchors"].update(per_domian=3), "per_domian")],
    ids=["misspelt-nested-key"],
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
    [(lambda c: c["drafters"]["roles"].update(order1="nope"), "drafters.roles.order1")],
    ids=["unknown-role"],
)
def test_inconsistent_drafter_sections_are_refused(tmp_path: Path, mutate, needle: str) -> None:
    cfg = _write_config(tmp_path / "bad.yaml", mutate)
    res = snakemake("--cores", "1", "--configfile", str(cfg), "-n", cwd=tmp_path)
    assert res.returncode != 0
    assert needle in res.stdout + res.stderr
    assert not (tmp_path / "results").exists()


def test_smoke_dag_end_to_end(smoke_run: Path) -> None:
    cfg = load_config(SMOKE_CONFIG)
    target, second = cfg["targets"]
    results = smoke_run / "results" / target
    manifest = json.loads((results / "manifest.json").read_text())
    listed = {Path(e["path"]).name for e in manifest["files"]}
    shards = cfg["rollouts"]["shards"]
    # corpus, anchors, mi + paths/floors per shard per domain; the two floors tables and the
    # gaps summaries of the non-empty groups (summary, trajectory, components, budget)
    assert len(manifest["files"]) == (3 + 2 * shards) * len(cfg["domains"]) + 2 + 4
    for domain in cfg["domains"]:
        assert f"{domain}.parquet" in listed
        anchors = pd.read_parquet(results / "anchors" / f"{domain}.parquet")
        assert len(anchors) == cfg["anchors"]["per_domain"]
        assert ((anchors["pi"] > 0) & (anchors["pi"] <= 1)).all()
    for item in FIGURES:
        assert (smoke_run / "figures" / f"{item}.pdf").stat().st_size > 0
        assert (smoke_run / "figures" / f"{item}.png").stat().st_size > 0
    for item in TABLES:
        assert re.search(r"\\begin\{(tabular|longtable)\}",
                         (smoke_run / "paper" / "tables" / f"{item}.tex").read_text())
        assert len(pd.read_csv(smoke_run / "paper" / "tables" / f"{item}.csv")) > 0
    values = (smoke_run / "paper" / "values.tex").read_text()
    for macro in ("fgFloorTZeroLast", "fgDsparkGapLast", "fgOursVsDsparkTauChange",
                  "fgOursTrajectoryTauLast", "fgComponentsBest", "fgLookupVerdict",
                  "fgBudgetDataSentence", "fgClaimsHeld"):
        assert f"\\newcommand{{\\{macro}}}" in values, macro
    # every drafter, trajectory epoch, component arm and budget-study arm was trained, and
    # every lookup table estimated
    drafters = cfg["drafters"]
    trained = {p.parent.name for p in (results / "drafters").glob("*/final.pt")}
    assert trained == (set(drafters["variants"]) | set(drafters["components"]["arms"])
                       | set(drafters["budget"]["arms"]) | set(drafters["lookups"]))
    # the drafters keep their best held-out epoch; the trimmed one serves as exported
    log = [json.loads(line) for line in
           (results / "drafters" / "dflash" / "train_log.jsonl").read_text().splitlines()]
    held = [r["heldout"]["score"] for r in log if r.get("kind") == "epoch"]
    assert len(held) == drafters["variants"]["dflash"]["epochs"]
    final = torch.load(results / "drafters" / "dflash" / "final.pt", weights_only=True)
    assert final["kept_epoch"] == 1 + held.index(min(held))
    assert len(final["drafter_config"]["draft_vocab"]) == drafters["variants"]["dflash"]["vocab"]
    exported = results / "export" / "dflash" / "dflash"
    assert (exported / "mask_embedding.pt").is_file()
    summary = pd.read_parquet(results / "gaps" / "summary.parquet")
    assert set(drafters["lookups"]) <= set(summary.variant)
    assert "dflash-bigram_committed" in set(summary.variant)
    for v in drafters["trajectory"]:
        epochs = drafters["variants"][v].get("epochs", drafters["train"]["epochs"])
        assert len(list((results / "drafters" / v / "epochs").glob("epoch-*.pt"))) == epochs
    if shutil.which("latexmk"):
        assert (smoke_run / "paper" / "main.pdf").read_bytes()[:4] == b"%PDF"
    # The second target (scope cross_target) ran only what Fig. 5 reads, on its own anchors
    other = smoke_run / "results" / second
    own = cfg["targets"][second]["settings"]
    manifest = json.loads((other / "manifest.json").read_text())
    assert len(manifest["files"]) == (2 + 2 * shards) * len(cfg["domains"]) + 2 + 1
    for domain in cfg["domains"]:
        anchors = pd.read_parquet(other / "anchors" / f"{domain}.parquet")
        assert len(anchors) == own["anchors"]["per_domain"]
    assert not (other / "mi").exists()
    roles = {drafters["roles"]["order0"], drafters["roles"]["order1"]}
    assert {p.parent.name for p in (other / "drafters").glob("*/final.pt")} == roles
    # its layers are sliding and full attention of one shape (Gemma-3's layout), and its
    # drafters trained on it
    layers = json.loads((smoke_run / "results" / "models" / second / "config.json").read_text())
    assert set(layers["layer_types"]) == {"sliding_attention", "full_attention"}
    assert set(pd.read_parquet(other / "gaps" / "summary.parquet").variant) == roles
    # every record says how its target's prompts were formatted (the second: a base model's)
    from floorgap.records import read_metadata

    for run, prompts in ((results, "chat"), (other, "plain")):
        for record in ("rollouts/gsm8k/paths-0.parquet", "floors/summary.parquet",
                       "gaps/summary.parquet"):
            assert read_metadata(run / record)["prompts"] == prompts, (run, record)
    assert "\\newcommand{\\fgCrossTargets}{2}" in values
    # A second run has nothing to do.
    again = snakemake("--cores", "2", "--configfile", str(SMOKE_CONFIG), "-n", cwd=smoke_run)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr


def test_the_smoke_paper_names_only_its_config_and_follows_an_edited_summary(
        smoke_run: Path, tmp_path: Path) -> None:
    """The smoke run's paper as text cites only defined macros and no literal of another
    config; with the floors summary edited so that T^(0) falls with the slot, the rebuilt
    claims table says the finding does not hold and the text says the floor falls."""
    from floorgap.records import read_metadata, read_table, write_table
    from floorgap.reports.paper_text import expand, load_values, paper_problems

    configs = [REPO / "config.yaml", *sorted((REPO / "workflow" / "configs").glob("*.yaml"))]
    main_tex = REPO / "paper" / "main.tex"
    assert paper_problems(smoke_run, main_tex, SMOKE_CONFIG, configs) == []
    values = load_values(smoke_run / "paper" / "values.tex")
    assert "\\fgClaimsHeld" in values and "\\fgSettingTaps" in values
    work = copy_results(smoke_run, tmp_path)
    target = next(iter(load_config(SMOKE_CONFIG)["targets"]))
    path = work / "results" / target / "floors" / "summary.parquet"
    df, meta = read_table(path), read_metadata(path)
    t0 = (df["statistic"] == "T0") & (df["domain"] == "all") & (df["slot"] >= 1)
    last = int(df.loc[t0, "slot"].max())
    flipped = df.loc[t0].assign(slot=lambda d: last + 1 - d["slot"])
    df = pd.concat([df.loc[~t0], flipped], ignore_index=True)
    # a strictly falling floor whatever the smoke target's values were
    df.loc[(df["statistic"] == "T0") & (df["domain"] == "all") & (df["slot"] >= 1),
           ["estimate", "lower", "upper"]] = [[0.9 - 0.1 * k, 0.88 - 0.1 * k, 0.92 - 0.1 * k]
                                              for k in flipped["slot"]]
    write_table(path, df, meta)
    res = snakemake("paper/values.tex", "--cores", "2", "--configfile", str(SMOKE_CONFIG),
                    cwd=work)
    assert res.returncode == 0, res.stderr[-3000:]
    table = pd.read_csv(work / "paper" / "tables" / "claims.csv").drop_duplicates("claim")
    verdict = dict(zip(table["claim"], table["verdict"]))
    assert verdict["floor_rises_with_slot"] == "does not hold"
    edited = load_values(work / "paper" / "values.tex")
    text = " ".join(expand(main_tex.read_text(), edited).split())
    assert "all-parallel floor falls from" in text
    assert "the floor rises with the slot does not hold on this run" in text


@pytest.mark.parametrize("item", ["fig2_floor_by_slot", "fig7_prefix_attention"])
def test_one_figure_rebuilds_alone(smoke_run: Path, item: str) -> None:
    figure = smoke_run / "figures" / f"{item}.pdf"
    figure.unlink()
    res = snakemake(f"figures/{item}.pdf", "--cores", "1", "--configfile",
                    str(SMOKE_CONFIG), "-n", cwd=smoke_run)
    assert res.returncode == 0, res.stderr
    assert dry_run_jobs(res.stdout) == {item: 1, "total": 1}
    res = snakemake(f"figures/{item}.pdf", "--cores", "1", "--configfile",
                    str(SMOKE_CONFIG), cwd=smoke_run)
    assert res.returncode == 0, res.stderr
    assert figure.exists()


def test_plotting_option_reruns_nothing_upstream(smoke_run: Path, tmp_path: Path) -> None:
    cfg = _write_config(tmp_path / "wider.yaml",
                        lambda c: c["figures"].update(width_in=c["figures"]["width_in"] + 1))
    res = snakemake("--cores", "1", "--configfile", str(cfg), "-n", cwd=smoke_run)
    assert res.returncode == 0, res.stderr
    jobs = dry_run_jobs(res.stdout)
    upstream = {"models", "corpus", "anchors", "rollouts", "floors", "mi", "manifest",
                "drafter_data", "drafters", "drafter_eval_study",
                "gaps", "export", "serving_rows", "serving", "serving_replay",
                "serving_summary"}
    assert not upstream & set(jobs), jobs
    assert set(FIGURES) <= set(jobs)


def test_html_report(smoke_run: Path) -> None:
    res = snakemake("--configfile", str(SMOKE_CONFIG), "--report", "report.html", cwd=smoke_run)
    assert res.returncode == 0, res.stderr[-3000:]
    html = (smoke_run / "report.html").read_text(errors="replace")
    assert "fig2_floor_by_slot" in html and "table4_mi_locality" in html
    assert "fig7_prefix_attention" in html and "table13_components" in html


def _record_hashes(work: Path) -> dict[str, str]:
    """SHA-256 of every Parquet record under results/ (the manifests' files and the drafter
    evaluations), by path relative to the working directory. The serving records hold wall
    times, measurements that no rerun repeats, and the replays follow the served completions
    (an engine batches concurrent requests differently from run to run): they are left out."""
    timed = {"serving", "serving_replay", "serving_summary"}
    return {str(p.relative_to(work)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((work / "results").rglob("*.parquet"))
            if not timed & set(p.relative_to(work).parts)}


PLUGIN = '''
"""A report item outside the package: T0 by slot as a bar chart."""
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd

from floorgap.reports.registry import ReportItem

ITEMS = [ReportItem("figZ_floor_bars", "figure", "floors", "Floors",
                    "fixture_items:figZ_floor_bars", in_paper=False)]


def figZ_floor_bars(inputs, spec, out_dir):
    s = pd.read_parquet(inputs["summary"])
    t0 = s[(s.statistic == "T0") & (s.domain == "all") & (s.slot >= 0)]
    fig, ax = plt.subplots(figsize=(spec["width_in"], spec["height_in"]))
    ax.bar(t0.slot, t0.estimate)
    out_dir.mkdir(parents=True, exist_ok=True)
    for ext in ("pdf", "png"):
        fig.savefig(out_dir / f"figZ_floor_bars.{ext}")
    return {"\\\\fgFixtureSlots": str(len(t0))}
'''


def test_a_new_figure_is_a_function_and_a_registry_row(smoke_run: Path, tmp_path: Path) -> None:
    """A figure added outside the package (a plugin module: one function, one row) is built by
    name, alone, from the finished run's records."""
    (tmp_path / "fixture_items.py").write_text(PLUGIN)
    cfg = _write_config(tmp_path / "plugin.yaml",
                        lambda c: c.update(report={"plugins": ["fixture_items"]}))
    env = {"PYTHONPATH": str(tmp_path)}
    target = "figures/figZ_floor_bars.pdf"
    res = snakemake(target, "--cores", "1", "--configfile", str(cfg), "-n", cwd=smoke_run, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert dry_run_jobs(res.stdout) == {"figZ_floor_bars": 1, "total": 1}
    res = snakemake(target, "--cores", "1", "--configfile", str(cfg), cwd=smoke_run, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    assert (smoke_run / target).stat().st_size > 0
    assert "fgFixtureSlots" in (smoke_run / "paper/values/figZ_floor_bars.tex").read_text()


def test_renamed_drafters_build_every_item(smoke_run: Path, tmp_path: Path) -> None:
    """Every variant renamed (and the roles with them): every figure and table still builds.
    The floor half's records and the drafter training data are reused from the smoke run
    (their specs do not name drafters)."""
    names = {"dflash": "blockwise", "dspark": "markov", "ours": "prefix-head"}

    def rename(c):
        d = c["drafters"]
        d["variants"] = {names[k]: v for k, v in d["variants"].items()}
        d["roles"] = {r: names[v] for r, v in d["roles"].items()}
        d["trajectory"] = [names[v] for v in d["trajectory"]]
        d["budget"]["variants"] = [names[v] for v in d["budget"]["variants"]]
        c["serving"]["systems"] = [names.get(v, v) for v in c["serving"]["systems"]]
        for t in c["targets"].values():
            own = t.get("settings", {}).get("drafters", {})
            if "variants" in own:
                own["variants"] = {names[k]: v for k, v in own["variants"].items()}

    cfg = _write_config(tmp_path / "renamed.yaml", rename)
    work = tmp_path / "work"
    target = next(iter(load_config(SMOKE_CONFIG)["targets"]))
    # the floor half and the drafter training data name no drafter: reused; the items and the
    # values they print are the targets (the PDF, manifests and notebook read no drafter name)
    copy_results(smoke_run, work, {"drafters", "drafter_eval", "gaps"})
    items = [path for item in ITEMS for path in item.files]
    res = snakemake("paper/values.tex", *items, "--cores", "2", "--configfile", str(cfg),
                    cwd=work)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    trained = {p.parent.name for p in (work / "results" / target / "drafters").glob("*/final.pt")}
    assert set(names.values()) <= trained and not set(names) & trained
    for item in ITEMS:
        for path in item.files:
            assert (work / path).stat().st_size > 0, path
    values = (work / "paper" / "values.tex").read_text()
    assert "\\newcommand{\\fgOursVsDsparkTauChange}" in values
    gaps = pd.read_parquet(work / "results" / target / "gaps" / "summary.parquet")
    tables = {"unigram", "bigram_committed", "bigram"}
    assert set(gaps.variant) == {"blockwise", "markov", "prefix-head", "prefix-head-markov",
                                 *tables, "blockwise-unigram", "blockwise-bigram_committed",
                                 "markov-bigram", "prefix-head-bigram"}


def test_kill_mid_dag_then_rerun_gives_the_same_records(smoke_run: Path, tmp_path: Path) -> None:
    """kill -9 of Snakemake and its running jobs in the middle of the smoke DAG, then
    `--unlock` and a rerun: the final records equal those of the uninterrupted run. The
    floor half's records and the drafter training data are copied from the smoke run, so what
    is killed and rerun is the drafter half, the DAG's longest jobs: killed once DFlash (two
    epochs, every epoch evaluated for the budget study) has written its first epoch's
    checkpoint, and finished by the rerun, which resumes DFlash from that checkpoint and trains
    the second epoch (a resumption that trains nothing would not test the restored optimiser
    and generators). Both runs target exactly the records the hashes compare (the drafter
    evaluations and the gap summaries), not the reports and serving after them."""
    work = tmp_path / "killed"
    drafter_half = {"drafters", "drafter_eval", "gaps", "export", "serving", "serving_replay",
                    "serving_summary", "decomposition", "explore", "logs"}
    copy_results(smoke_run, work, drafter_half)
    hashed = _record_hashes(smoke_run)
    rerun = sorted(p for p in hashed if Path(p).parts[2] in drafter_half)
    assert {Path(p).parts[2] for p in rerun} == {"drafter_eval", "gaps"}
    proc = subprocess.Popen(snakemake_cmd(*rerun, "--cores", "2", "--configfile",
                                          str(SMOKE_CONFIG)),
                            cwd=work, env=snakemake_env(), start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # Kill once DFlash has written its first epoch's checkpoint: some outputs exist, some jobs
    # are half done.
    cfg = load_config(SMOKE_CONFIG)
    target = next(iter(cfg["targets"]))           # the target that trains the shared variants
    epochs = cfg["drafters"]["variants"]["dflash"]["epochs"]
    assert epochs >= 2 and "settings" not in cfg["targets"][target]
    deadline = time.monotonic() + 900
    first = work / "results" / target / "drafters" / "dflash" / "checkpoints" / "epoch-0001.pt"
    while not first.exists() and time.monotonic() < deadline:
        assert proc.poll() is None, "the DAG ended before the kill"
        time.sleep(0.2)
    assert proc.poll() is None, "the DAG ended before the kill"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    # A kill during DFlash's second epoch leaves its first epoch's checkpoint and none of its
    # outputs (checkpoints are written whole). Its epochs take milliseconds on the smoke data,
    # too short to aim a kill at, so that state is made from wherever the kill landed.
    folder = first.parent.parent
    for later in first.parent.glob("epoch-*.pt"):
        if later != first:
            later.unlink()
    for name in ("final.pt", "train_log.jsonl"):
        (folder / name).unlink(missing_ok=True)
    shutil.rmtree(folder / "epochs", ignore_errors=True)
    assert not all((work / p).exists() for p in rerun)
    assert snakemake("--unlock", "--cores", "1", "--configfile", str(SMOKE_CONFIG),
                     cwd=work).returncode == 0
    res = snakemake(*rerun, "--cores", "2", "--rerun-incomplete", "--configfile",
                    str(SMOKE_CONFIG), cwd=work)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    logs = [log.read_text() for log in (work / "results" / "logs" / "drafters").rglob("*.log")]
    assert any("resuming after epoch 1" in t and f"trained epochs 2..{epochs}" in t
               for t in logs), "no drafter resumed mid-schedule"
    after = _record_hashes(work)
    assert len(after) > 50 and after == hashed


def test_the_served_trimmed_drafter_accepts_as_replayed(smoke_run: Path) -> None:
    """The smoke DAG serves its DFlash drafter, trained with a trimmed draft vocabulary and a
    mask embedding and exported as vLLM's DFlash model loads them (draft_vocab_size, d2t,
    mask_embedding.pt), and replays every served round on the project's import of the same
    folder. The engine reads the map and the embedding as the project does: every request
    drafts gamma tokens per round; at temperature 0 every complete round accepts exactly the
    drafts before the first whose argmax differs from the target's (TV > 0); at temperature 1
    the accepted drafts agree with the exact trial probabilities 1 - TV (|z| < 4) and the
    served tokens are draws from the target's law (lossless test, |z| < 4)."""
    from floorgap.estimators.served import acceptance_test, lossless_z

    cfg = load_config(SMOKE_CONFIG)
    target = next(iter(cfg["targets"]))
    gamma = int(cfg["anchors"]["gamma"])
    entry = cfg["drafters"]["variants"]["dflash"]
    assert entry.get("vocab") and entry.get("mask_embedding")
    run = smoke_run / "results" / target
    served = json.loads((run / "export" / "dflash" / "dflash" / "config.json").read_text())
    assert served["draft_vocab_size"] == entry["vocab"]
    assert (run / "export" / "dflash" / "dflash" / "mask_embedding.pt").is_file()
    requests = pd.read_parquet(run / "serving" / "dflash" / "requests.parquet")
    assert len(requests) and (requests.draft_tokens == gamma * requests.verify_steps).all()
    rounds = pd.read_parquet(run / "serving_replay" / "dflash" / "rounds.parquet")
    done = rounds[rounds.complete]
    greedy = done[done.temperature == 0.0]
    assert len(greedy) >= 10
    for accepted, tv in zip(greedy.accepted, greedy.tv):
        matches = [float(x) == 0.0 for x in tv] + [False]
        assert accepted == matches.index(False), (accepted, tv)
    sampled = done[done.temperature == 1.0]
    test = acceptance_test(torch.tensor(sampled.accepted.to_numpy()),
                           torch.tensor([list(t) for t in sampled.tv], dtype=torch.float64))
    assert test.trials >= 30 and abs(test.z) < 4, test
    every = rounds[rounds.temperature == 1.0].dropna(subset=["lossless_score"])
    z = lossless_z(torch.tensor(every.lossless_score.to_numpy()),
                   torch.tensor(every.lossless_var.to_numpy()))
    assert len(every) and abs(z) < 4, z


def test_explore_notebook_runs_on_the_records(smoke_run: Path) -> None:
    """The exploration notebook (Snakemake `notebook:`) runs over a finished run's summaries."""
    target = next(iter(load_config(SMOKE_CONFIG)["targets"]))
    out = f"results/{target}/explore/overview.csv"
    res = snakemake(out, "--cores", "1", "--configfile", str(SMOKE_CONFIG), cwd=smoke_run)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    overview = pd.read_csv(smoke_run / out, index_col=0)
    cfg = load_config(SMOKE_CONFIG)
    assert len(overview) == cfg["anchors"]["gamma"]
    assert {"T0", "R dflash", "R_oracle dspark", "R_oracle ours"} <= set(overview.columns)
    assert (smoke_run / "results" / "logs" / "explore" / f"{target}.ipynb").exists()
