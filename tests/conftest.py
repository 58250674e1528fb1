"""Shared fixtures: paths of the repository and helpers to run the workflow."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import functools
import importlib.util
import json
from types import ModuleType

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
SMOKE_CONFIG = REPO / "workflow" / "configs" / "smoke.yaml"
#: Not a config: the sizes `floorgap rehearsal` applies to a paper config.
REHEARSAL_OVERLAY = REPO / "workflow" / "configs" / "rehearsal.yaml"
#: Every shipped config (the overlay is not one).
SHIPPED_CONFIGS = sorted(p for p in (REPO / "workflow" / "configs").glob("*.yaml")
                         if p != REHEARSAL_OVERLAY)
DEFAULT_CONFIG = REPO / "config.yaml"
SERVING_PYTHON = REPO / ".venv-serving" / "bin" / "python"


def load_config(path: Path = SMOKE_CONFIG) -> dict:
    """A config as the workflow reads it: validated, the schema's defaults filled in."""
    from floorgap.config import validate_config

    cfg = yaml.safe_load(path.read_text())
    validate_config(cfg)
    return cfg


#: Free bytes in the temporary folder when the run started: a full disk makes every test that
#: writes a checkpoint error in its fixture, so the summary says how much room there was.
_DISK_FREE_AT_START = pytest.StashKey[int]()


def pytest_configure(config) -> None:
    """The tests never reach a SLURM controller (the rehearsal through SLURM is CI's next
    step). Every Snakemake process imports the SLURM executor plugin, which asks `scontrol show
    config` for MinJobAge; where SLURM's client is installed and no controller runs (CI installs
    the cluster first and starts it after the tests), that call waits ~9 s in each of the
    suite's Snakemake runs. An empty SLURM configuration makes it fail at once."""
    import tempfile

    empty = Path(tempfile.gettempdir()) / "floorgap-tests-no-slurm.conf"
    empty.write_text("")
    os.environ["SLURM_CONF"] = str(empty)
    config.stash[_DISK_FREE_AT_START] = shutil.disk_usage(tempfile.gettempdir()).free


def snakemake_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a workflow run: PATH without this environment's bin folder (the
    workflow itself must make its jobs find the `floorgap` command), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    # runs in scratch folders serve from the repository's engine environment
    env.setdefault("FLOORGAP_SERVING_PYTHON", str(SERVING_PYTHON))
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)
    return {**env, **(extra or {})}


def snakemake_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *args]


def snakemake(*args: str, cwd: Path, timeout: float = 1800,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the repository's workflow with the Snakemake CLI of this interpreter's environment."""
    return subprocess.run(snakemake_cmd(*args), cwd=cwd, env=snakemake_env(env),
                          capture_output=True, text=True, timeout=timeout)


@functools.cache
def load_builders(name: str) -> ModuleType:
    """A synthetic-record builder module of tests/analysis (``floor_builders``,
    ``gap_builders``), loaded once by path: test folders are not packages."""
    path = Path(__file__).resolve().parent / "analysis" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"floorgap_tests_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


def _materialise(cfg: dict, tmp: Path) -> tuple[dict, Path]:
    """The config's first target materialised under ``tmp/models`` by the models stage."""
    from floorgap.stages._cli import run_stage
    from floorgap.stages.models import build_parser, main

    name, target = next(iter(cfg["targets"].items()))
    model_dir = tmp / "models" / name
    spec = json.dumps(dict(target, name=name))
    assert run_stage(main, build_parser(), ["--spec", spec, "--out", str(model_dir),
                                            "--threads", "1"]) == 0
    return dict(target, name=name), model_dir


def _domain_records(cfg: dict, target: dict, model_dir: Path, out: Path, prompts: int
                    ) -> tuple[Path, Path]:
    """Corpus and anchors of the gsm8k domain (``prompts`` prompts), built by the stage CLIs."""
    from floorgap.stages import anchors as anchors_cli
    from floorgap.stages import corpus as corpus_cli
    from floorgap.stages._cli import run_stage

    corpus, anchors = out / "corpus.parquet", out / "anchors.parquet"
    spec = {"target": target, "domain": {"name": "gsm8k", "prompts": prompts},
            "corpus": cfg["corpus"], "law": cfg["evaluation_law"], "seed": cfg["seed"]}
    assert run_stage(corpus_cli.main, corpus_cli.build_parser(),
                     ["--spec", json.dumps(spec), "--model-dir", str(model_dir),
                      "--out", str(corpus), "--threads", "1"]) == 0
    spec = {"domain": "gsm8k", "anchors": cfg["anchors"], "seed": cfg["seed"]}
    assert run_stage(anchors_cli.main, anchors_cli.build_parser(),
                     ["--spec", json.dumps(spec), "--corpus", str(corpus),
                      "--out", str(anchors), "--threads", "1"]) == 0
    return corpus, anchors


@pytest.fixture(scope="session")
def smoke_target(tmp_path_factory):
    """The smoke config's tiny random target, materialised once per test session.

    Returns ``(config, target entry with its name, model folder, scratch folder)``.
    """
    cfg = load_config(SMOKE_CONFIG)
    tmp = tmp_path_factory.mktemp("smoke")
    target, model_dir = _materialise(cfg, tmp)
    return cfg, target, model_dir, tmp


@pytest.fixture(scope="session")
def smoke_domain_records(smoke_target):
    """Corpus and anchors of one smoke domain (gsm8k, 2 prompts), built by the stage CLIs.

    Returns ``(config, target entry, model folder, corpus file, anchors file, scratch folder)``.
    """
    cfg, target, model_dir, tmp = smoke_target
    out = tmp / "domain-records"
    corpus, anchors = _domain_records(cfg, target, model_dir, out, prompts=2)
    return cfg, target, model_dir, corpus, anchors, out


@pytest.fixture(scope="session")
def default_domain_records(tmp_path_factory):
    """The embedded default's real target (SmolLM2-135M-Instruct from its package) with a short
    corpus (2 gsm8k prompts, 48 tokens) and its anchors: for checks that need a peaked, real
    distribution. Same tuple as :func:`smoke_domain_records`."""
    cfg = load_config(DEFAULT_CONFIG)
    cfg["corpus"] = {**cfg["corpus"], "max_new_tokens": 48, "censored_share_max": 1.0}
    cfg["anchors"] = {**cfg["anchors"], "per_domain": 3, "context_buckets": [128, 256]}
    tmp = tmp_path_factory.mktemp("default-target")
    target, model_dir = _materialise(cfg, tmp)
    corpus, anchors = _domain_records(cfg, target, model_dir, tmp / "domain-records", prompts=2)
    return cfg, target, model_dir, corpus, anchors, tmp


def dry_run_jobs(dry_run_output: str) -> dict[str, int]:
    """Rule -> job count from the "Job stats" table of a dry run."""
    lines = dry_run_output.split("Job stats:")[1].splitlines()[3:]
    jobs = {}
    for line in lines:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            break
        jobs[parts[0]] = int(parts[1])
    return jobs


def smoke_targets() -> list[str]:
    """What the smoke runs build: everything, or without LaTeX everything but the PDF."""
    targets = load_config(SMOKE_CONFIG)["targets"]
    return [] if shutil.which("latexmk") else ["paper/values.tex", *(
        f"results/{target}/manifest.json" for target in targets)]


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """The whole smoke DAG, run once per test session in a scratch working directory and shared
    by every test that reads its records; a test that changes results works on a copy
    (:func:`copy_results`). ``FLOORGAP_SMOKE_RUN=<folder>`` reuses the finished smoke DAG in
    that folder instead, when iterating on one integration test (CI never sets it)."""
    reuse = os.environ.get("FLOORGAP_SMOKE_RUN")
    if reuse:
        res = snakemake(*smoke_targets(), "-n", "--cores", "1", "--configfile",
                        str(SMOKE_CONFIG), cwd=Path(reuse), timeout=600)
        assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr, (
            f"FLOORGAP_SMOKE_RUN={reuse} is not a finished smoke DAG of this checkout")
        return Path(reuse)
    work = tmp_path_factory.mktemp("smoke-dag")
    # Targets go before --configfile, which takes every following word as a config file.
    res = snakemake(*smoke_targets(), "--cores", "2", "--configfile", str(SMOKE_CONFIG),
                    cwd=work, timeout=3000)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return work


@pytest.fixture
def checkout(tmp_path, monkeypatch) -> Path:
    """A folder that looks like the repository root (Snakefile, workflow/rules, the smoke
    config as config.yaml), made the working directory: the launchers (`floorgap decompose`,
    `floorgap check`) run from it with their Snakemake run replaced."""
    root = tmp_path / "checkout"
    (root / "workflow" / "rules").mkdir(parents=True)
    (root / "Snakefile").write_text("# stub\n")
    (root / "config.yaml").write_text(SMOKE_CONFIG.read_text())
    monkeypatch.chdir(root)
    return root


def copy_results(run: Path, dest: Path, leave_out: set[str] = frozenset()) -> Path:
    """``run``'s results/ copied into ``dest`` (times kept, so Snakemake sees them up to date)
    without the folders named in ``leave_out`` nor the logs."""
    shutil.copytree(run / "results", dest / "results",
                    ignore=lambda d, names: [n for n in names if n in leave_out or n == "logs"])
    return dest


def permute_taps(folder: Path) -> None:
    """Swap the first two taps' blocks of an exported folder's ``fc`` input columns, in place:
    the taps' features in the wrong order, a fault every engine loads without complaint."""
    from floorgap.models.export_faults import inject_fault

    inject_fault(folder, "fc-permuted")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """How many of the package's modules this run imported in its own process (a module only
    a subprocess imports is not counted), and which were not."""
    import sys as _sys

    src = REPO / "src"
    modules = sorted(".".join(p.relative_to(src).with_suffix("").parts).removesuffix(".__init__")
                     for p in (src / "floorgap").rglob("*.py"))
    seen = [m for m in modules if m in _sys.modules]
    missing = [m for m in modules if m not in _sys.modules]
    terminalreporter.write_line(f"floorgap modules imported by this run: {len(seen)} of "
                                f"{len(modules)}" + (f" (not: {', '.join(missing)})"
                                                     if missing else ""))
    import tempfile

    gib = 2 ** 30
    start = config.stash.get(_DISK_FREE_AT_START, None)
    end = shutil.disk_usage(tempfile.gettempdir()).free
    if start is not None:
        terminalreporter.write_line(f"free disk in {tempfile.gettempdir()}: {start / gib:.1f} GiB "
                                    f"at the start, {end / gib:.1f} GiB at the end")
