#!/usr/bin/env bash
# The export faults through the served path: the default target's DFlash export, and one copy of
# it with each fault of floorgap.models.export_faults injected (layout flipped, taps offset by
# one, fc columns permuted, mask token), checked together with `floorgap check`: each folder
# imported, evaluated, compared with the weights it was exported from (unless --no-reference)
# and served in vLLM's CPU build with its rounds replayed. Prints the verdict lines of each.
#   bash workflow/scripts/served-faults.sh [--no-reference] [FAULT ...]
# Run in a checkout whose default DAG has finished (it reads results/smollm2-135m/); the
# folders go to results/served-faults/, the page to results/check/served-faults[-noref]/.
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET=smollm2-135m
EXPORT=results/$TARGET/export/dflash/dflash
WEIGHTS=results/$TARGET/drafters/dflash/final.pt
OUT=results/served-faults
REFERENCE=1
FAULTS=()
for arg in "$@"; do
    case "$arg" in
        --no-reference) REFERENCE=0 ;;
        -*) echo "usage: bash workflow/scripts/served-faults.sh [--no-reference] [FAULT ...]" >&2
            exit 2 ;;
        *) FAULTS+=("$arg") ;;
    esac
done
if [ ${#FAULTS[@]} = 0 ]; then
    FAULTS=(layout-flipped taps-offset fc-permuted mask-token)
fi
for need in "$EXPORT/config.json" "$WEIGHTS"; do
    if [ ! -e "$need" ]; then
        echo "$need is missing: run the default DAG first (.venv/bin/snakemake --cores all)" >&2
        exit 2
    fi
done
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$OUT"
folders=()
for name in exported "${FAULTS[@]}"; do
    rm -rf "${OUT:?}/$name"
    cp -r "$EXPORT" "$OUT/$name"
    if [ "$name" != exported ]; then
        "$PY" -c 'import sys; from floorgap.models.export_faults import inject_fault
inject_fault(sys.argv[1], sys.argv[2])' "$OUT/$name" "$name"
    fi
    folders+=("$OUT/$name")
done
report=served-faults
refs=()
if [ "$REFERENCE" = 1 ]; then
    for _ in "${folders[@]}"; do refs+=(--reference "$WEIGHTS"); done
else
    report=served-faults-noref
fi
start=$SECONDS
"$PY" -m floorgap check "${folders[@]}" "${refs[@]}" --report "$report" > "$OUT/$report.out"
echo "floorgap check of ${#folders[@]} folders: $((SECONDS - start)) s"
grep -E '^- ' "results/check/$report/summary.md"
