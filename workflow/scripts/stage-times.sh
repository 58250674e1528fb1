#!/usr/bin/env bash
# Job-seconds per stage and target: the sum of the "done in" lines of a run's rule logs.
#   bash workflow/scripts/stage-times.sh [RUN_DIR]      (default: the current directory)
# A stage's logs are results/logs/<stage>/<target>.log or results/logs/<stage>/<target>/*.log;
# the rest (report items, paper, values) count under their stage with target "-". Engine logs
# (*.engine.log) are not rule logs. A rule log without "done in" (a job still running, or one
# that failed) is listed as unfinished.
set -euo pipefail
cd "${1:-.}/results/logs"
targets=$(ls ../ | grep -v '^logs$' | paste -sd' ')
find . -name '*.log' ! -name '*.engine.log' | sort | while read -r log; do
    secs=$(grep -ho 'done in [0-9.]* s' "$log" | tail -n 1 | awk '{print $3}' || true)
    echo "${secs:-unfinished} ${log#./}"
done | awk -v targets="$targets" '
    BEGIN { split(targets, names, " "); for (i in names) known[names[i]] = 1 }
    {
        n = split($2, part, "/")
        stage = part[1]
        target = part[2]
        sub(/\.log$/, "", target)
        if (n < 2 || !(target in known)) target = "-"
        if ($1 == "unfinished") { unfinished = unfinished " " $2; next }
        key = sprintf("%-18s %s", stage, target)
        secs[key] += $1; jobs[key]++; total += $1; by_target[target] += $1
    }
    END {
        for (k in secs) printf "%9.1f  %3d  %s\n", secs[k], jobs[k], k | "sort -rn"
        close("sort -rn")
        for (name in by_target) printf "%9.1f  total %s\n", by_target[name], name
        printf "%9.1f  total\n", total
        if (unfinished != "") print "unfinished:" unfinished
    }'
