"""What every job asks SLURM for, read from dry runs of the shipped configs: a job that loads
a model on a cuda target asks for a GPU in the GPU partition, with memory and a time limit;
on a CPU config nothing asks for a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import SHIPPED_CONFIGS, SMOKE_CONFIG, snakemake
from floorgap.cli import dry_run_jobs

# The stages that load the target (or its engine) on the target's device.
MODEL_RULES = {"corpus", "rollouts", "mi", "floor_variants", "drafter_data", "drafters",
               "export", "serving", "serving_replay", "api_floors"}
PAPER_CONFIGS = [p for p in SHIPPED_CONFIGS if p != SMOKE_CONFIG]

# every test here is a Snakemake dry run of a whole config (seconds each)
pytestmark = pytest.mark.slow


def planned_jobs(config: Path, work: Path) -> list[tuple[str, dict[str, str]]]:
    """(rule, resources) of every job of a dry run."""
    res = snakemake("-n", "--cores", "all", "--configfile", str(config), cwd=work)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return [(rule, res) for rule, _, res in dry_run_jobs(res.stdout)]


def _is_model_rule(rule: str) -> bool:
    return rule in MODEL_RULES or rule.startswith("drafter_eval_")


@pytest.mark.parametrize("config", PAPER_CONFIGS, ids=lambda p: p.name)
def test_every_gpu_job_asks_for_a_gpu_partition_memory_and_time(config: Path,
                                                                tmp_path: Path) -> None:
    cfg = yaml.safe_load(config.read_text())
    assert all(t["device"].startswith("cuda") for t in cfg["targets"].values())
    gpu_partition = cfg.get("cluster", {}).get("gpu_partition", "gpu")
    jobs = planned_jobs(config, tmp_path)
    seen = {rule for rule, _ in jobs if _is_model_rule(rule)}
    assert {"corpus", "rollouts", "drafters", "serving"} <= seen
    for rule, res in jobs:
        if _is_model_rule(rule):
            assert int(res.get("gpu", 0)) >= 1, (rule, res)
            assert res.get("slurm_partition") == gpu_partition, (rule, res)
            assert int(res["mem_mb"]) > 0 and int(res["runtime"]) > 0, (rule, res)
        else:
            assert int(res.get("gpu", 0)) == 0, (rule, res)


def test_a_cpu_config_asks_for_no_gpu(tmp_path: Path) -> None:
    jobs = planned_jobs(SMOKE_CONFIG, tmp_path)
    assert jobs and all(int(res.get("gpu", 0)) == 0 for _, res in jobs)
    assert {res["slurm_partition"] for rule, res in jobs if _is_model_rule(rule)} == {"cpu"}


def test_a_named_gpu_model_reaches_every_gpu_job_and_no_cpu_job(tmp_path: Path) -> None:
    cfg = yaml.safe_load(PAPER_CONFIGS[0].read_text())
    cfg["cluster"] = {"gpu_model": "h100"}
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(cfg, sort_keys=False))
    jobs = planned_jobs(config, tmp_path)
    for rule, res in jobs:
        if int(res.get("gpu", 0)):
            assert res.get("gpu_model") == "h100", (rule, res)
        else:
            assert not res.get("gpu_model"), (rule, res)
    assert any(int(res.get("gpu", 0)) for _, res in jobs)


def test_the_slurm_profile_sends_the_items_of_one_summary_as_one_job(tmp_path: Path) -> None:
    """Each report item is a short CPU job: through the SLURM profile the items that wait on one
    summary are one group job (one submission, one queue wait), and every item is in one."""
    import re

    from conftest import REPO
    from floorgap.reports.registry import report_items

    res = snakemake("-n", "--profile", str(REPO / "workflow" / "profiles" / "slurm"),
                    "--configfile", str(PAPER_CONFIGS[0]), cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    # the dry run lists each group job once, its member jobs indented under it
    groups = re.split(r"^\S.*Group job (\S+) \(jobs in lexicogr\. order\):$", res.stdout,
                      flags=re.M)
    members = {name: set(re.findall(r"^    rule (\w+):$", body, flags=re.M))
               for name, body in zip(groups[1::2], groups[2::2])}
    items = report_items([]).values()
    assert sorted(members) == sorted({f"report_{item.reads}" for item in items})
    for item in items:
        assert item.name in members[f"report_{item.reads}"], item.name
