"""The stage commands: one module per Snakemake rule (or rule family), named like the rule and
its results folder, each a thin argparse wrapper over library code (``build_parser()`` and
``main(args, logger)``). ``floorgap <stage> ...`` runs one; ``floorgap --help`` lists them.
"""

from __future__ import annotations

#: Stage name -> one line of help, in DAG order. The name is the module under
#: ``floorgap.stages``, the rule (or rule prefix) and the results folder.
STAGES: dict[str, str] = {
    "models": "materialise a target model into a local folder (results/models/<target>)",
    "corpus": "target responses to one domain's prompts under the evaluation law",
    "anchors": "stratified anchor sample of one domain, with inclusion probabilities",
    "rollouts": "M target paths per anchor with full-vocabulary p_k and the exact floors",
    "floors": "T^(0), T^(1), bounds, support, K-median and bootstrap summaries of one target",
    "mi": "mutual-information recovery rho_{k,m} on one domain's screened anchors",
    "drafter_data": "drafter training data: target responses and evaluation-law targets",
    "drafters": "train one drafter variant (resumable, per-epoch checkpoints) or import one",
    "drafter_eval": "R, R^oracle, R^self and accept factors of drafters on the rollout paths",
    "gaps": "model gaps, exposure, serving risk, dependence and best responses",
    "decomposition": "one decompose drafter's floor and model gap by slot (csv, tex, md)",
    "export_fidelity": "a checked folder against the weights it was exported from (q by slot)",
    "check_report": "one check's page and summary (results/check/<name>): verdicts, figures",
    "export": "one trained drafter as a checkpoint folder that serving engines load",
    "serving_rows": "the serving benchmark's rows: nine tasks, disjoint from other prompts",
    "serving": "one system (AR or a drafter) served in a real engine over the benchmark rows",
    "serving_replay": "each served round of a drafter replayed offline: accept factors and TV",
    "serving_summary": "served accepted length and speedup by task, temperature, concurrency",
    "floor_variants": "floors with M, gamma or the sampling law changed (App. C.3, C.4, C.7)",
    "api_floors": "floors with omitted-mass bounds read through an OpenAI-compatible API",
    "report": "one paper figure or table (and its values fragment) from analysis summaries",
    "values": "concatenate the items' values fragments into paper/values.tex",
    "paper": "compile paper/main.tex with latexmk",
    "manifest": "row counts and SHA-256 of a target's record files",
    "bench": "benchmarks of the hot paths, as ratios against an in-run baseline",
}
