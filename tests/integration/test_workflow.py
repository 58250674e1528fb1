"""The workflow end to end on the smoke config, and its refusal of bad configs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import REPO, SMOKE_CONFIG, snakemake

pytestmark = [pytest.mark.slow, pytest.mark.integration]


def _write_config(path: Path, mutate) -> Path:
    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())
    mutate(cfg)
    path.write_text(yaml.safe_dump(cfg))
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


def test_smoke_dag_end_to_end(tmp_path: Path) -> None:
    res = snakemake("--cores", "2", "--configfile", str(SMOKE_CONFIG), cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    cfg = yaml.safe_load(SMOKE_CONFIG.read_text())
    (target,) = cfg["targets"]
    results = tmp_path / "results" / target
    manifest = json.loads((results / "manifest.json").read_text())
    listed = {Path(e["path"]).name for e in manifest["files"]}
    shards = cfg["rollouts"]["shards"]
    assert len(manifest["files"]) == (3 + 2 * shards) * len(cfg["domains"]) + 2
    for domain in cfg["domains"]:
        assert f"{domain}.parquet" in listed
        anchors = pd.read_parquet(results / "anchors" / f"{domain}.parquet")
        assert len(anchors) == cfg["anchors"]["per_domain"]
        assert ((anchors["pi"] > 0) & (anchors["pi"] <= 1)).all()
    # A second run has nothing to do.
    again = snakemake("--cores", "2", "--configfile", str(SMOKE_CONFIG), "-n", cwd=tmp_path)
    assert again.returncode == 0
    assert "Nothing to be done" in again.stdout + again.stderr
