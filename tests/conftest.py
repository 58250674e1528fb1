"""Shared fixtures: paths of the repository and helpers to run the workflow."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SMOKE_CONFIG = REPO / "workflow" / "configs" / "smoke.yaml"


def snakemake(*args: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """Run the repository's workflow with the Snakemake CLI of this interpreter's environment."""
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(REPO / "Snakefile"), *args]
    env = dict(os.environ)
    # Rules call `python -m floorgap...`: make sure that python is this environment's.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO
