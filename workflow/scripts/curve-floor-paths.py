"""The data curve's arms on the default's floor paths (README, "data-curve.yaml").

    .venv/bin/python workflow/scripts/curve-floor-paths.py DEFAULT_RUN STUDY_RUN [--out DIR]

DEFAULT_RUN is a checkout whose default DAG has run (its anchors and stored target paths),
STUDY_RUN one whose data-curve study has run (its arms' weights). Every size's DFlash and ours
arms and the two bigram tables fitted on the same subset are evaluated on the default's paths by
`floorgap drafter_eval` (the study job's spec, one job per domain and shard, all drafters
together), then summarised by `floorgap gaps` (the config's analysis settings: Hajek weights,
the prompt bootstrap and its seed), each arm paired with the table of its order. Prints the
README's table; the records, the summary and the stages' logs go to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml
from snakemake.utils import validate

import pandas as pd

from floorgap.config import resolve

SIZES = (12600, 25000, 50000, 100000, 200000)
#: (drafter, table, paired difference, risk): DFlash against the committed-token bigram on R,
#: ours against the predecessor bigram on R^oracle (order 1)
PAIRS = (("curve-dflash-scaled-{n}", "curve-bigram-committed-{n}", "diff_R", "R"),
         ("curve-ours-scaled-{n}", "curve-bigram-{n}", "diff_R_oracle", "R_oracle"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("default_run", type=Path)
    ap.add_argument("study_run", type=Path)
    ap.add_argument("--out", type=Path, default=Path("results/curve-floor-paths"))
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    args = ap.parse_args()
    run = args.default_run.resolve()
    out = args.out.resolve()
    config = yaml.safe_load((run / "config.yaml").read_text())
    validate(config, schema=str(run / "workflow/schemas/config.schema.yaml"))
    spec_of = resolve(config)
    target = spec_of.primary
    names = [p.format(n=n) for n in args.sizes for pair in PAIRS for p in pair[:2]]
    weights = [args.study_run.resolve() / f"results/{target}/drafters/{n}/final.pt" for n in names]
    missing = [str(w) for w in weights if not w.exists()]
    if missing:
        sys.exit(f"the study's weights are missing (run the data-curve study first): {missing}")
    res = run / "results" / target
    shards = int(spec_of.settings(target)["rollouts"]["shards"])
    floorgap = str(Path(sys.executable).parent / "floorgap")  # this interpreter's console script
    for domain in spec_of.domains:
        for shard in range(shards):
            spec = {**spec_of.drafter_eval_spec(target, shard, "study"), "variants": names}
            rec = [out / n / "final" / domain for n in names]
            for d in rec:
                d.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [floorgap, "drafter_eval", "--spec", json.dumps(spec),
                 "--model-dir", str(run / "results/models" / target),
                 "--corpus", str(res / "corpus" / f"{domain}.parquet"),
                 "--anchors", str(res / "anchors" / f"{domain}.parquet"),
                 "--rollouts", str(res / "rollouts" / domain / f"paths-{shard}.parquet"),
                 "--drafter", *map(str, weights),
                 "--out-paths", *(str(d / f"paths-{shard}.parquet") for d in rec),
                 "--out-slots", *(str(d / f"slots-{shard}.parquet") for d in rec),
                 "--log", str(out / f"drafter_eval-{domain}-{shard}.log")], check=True)
    contrasts = [[a.format(n=n), t.format(n=n)] for n in args.sizes for a, t, _, _ in PAIRS]
    gaps = spec_of.analysis_spec(contrasts=contrasts, sweeps=False,
                                 lookups=[t for _, t in contrasts])
    subprocess.run(
        [floorgap, "gaps", "--spec", json.dumps(gaps),
         "--anchor-slot", str(res / "floors" / "anchor_slot.parquet"),
         "--paths", *map(str, sorted(out.glob("*/final/*/paths-*.parquet"))),
         "--slots", *map(str, sorted(out.glob("*/final/*/slots-*.parquet"))),
         "--out-summary", str(out / "summary.parquet"), "--log", str(out / "gaps.log")],
        check=True)
    summary = pd.read_parquet(out / "summary.parquet")
    every = summary[summary["domain"] == "all"]

    def cell(stat: str, variant: str, slot: int):
        return every[(every["statistic"] == stat) & (every["variant"] == variant)
                     & (every["slot"] == slot)].iloc[0]

    print("| blocks | DFlash | committed-token bigram | DFlash - table, slot 0 | ours "
          "| predecessor bigram | ours - table, slot 0 |\n|---|---|---|---|---|---|---|")
    for n in args.sizes:
        row = [f"{n:,}"]
        for a, t, diff, risk in PAIRS:
            a, t = a.format(n=n), t.format(n=n)
            row += [" / ".join(f"{cell(risk, v, k)['estimate']:.3f}" for k in (0, 6))
                    for v in (a, t)]
            d = cell(diff, f"{a}-{t}", 0)
            row.append(f"{d['estimate']:+.3f} [{d['lower']:+.3f}, {d['upper']:+.3f}]")
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
