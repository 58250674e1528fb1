# The gap half (CPU): model gaps against the floors, exposure, free vs serving risk, dependence
# and best-response gains of the drafters of one target. Three summaries share the rule:
#   summary     the drafters of drafters.variants (final weights), every statistic;
#   trajectory  every epoch of the drafters.trajectory variants (table 10);
#   components  the one-epoch arms of drafters.components, each against the baseline (table 13).


wildcard_constraints:
    summary="summary|trajectory|components",


def evaluated(summary):
    """(variant, weights) pairs whose drafter_eval records a summary reads: its evaluation
    group, and for the trajectory also the final weights (the last epoch)."""
    if summary == "trajectory":
        return EVAL_GROUPS["trajectory"] + [(v, "final") for v in TRAJECTORY]
    return EVAL_GROUPS[summary]


def drafter_eval_records(kind):
    """Every drafter_eval shard a summary reads, for one record kind ("paths" or "slots")."""

    def files(wildcards):
        return [
            f"results/{wildcards.target}/drafter_eval/{variant}/{weights}/{domain}/{kind}-{shard}.parquet"
            for variant, weights in evaluated(wildcards.summary)
            for domain in DOMAINS
            for shard in shards()
        ]

    return files


def serving_risk_spec(wildcards):
    if wildcards.summary == "trajectory":
        # The final weights are the last epoch's: label them so.
        return analysis_spec(
            labels={v: f"{v}@epoch-{variant_epochs(v)}" for v in TRAJECTORY},
            contrasts=[],
            sweeps=False,
        )
    if wildcards.summary == "components":
        base = COMPONENTS["baseline"]
        return analysis_spec(contrasts=[[arm, base] for arm in ARMS if arm != base], sweeps=False)
    return analysis_spec()


rule serving_risk:
    """G0, G1, exposure, R^serve vs R, D_k, tau vs tau_indep, single-slot gains, sweeps."""
    input:
        anchor_slot="results/{target}/floors/anchor_slot.parquet",
        paths=drafter_eval_records("paths"),
        slots=drafter_eval_records("slots"),
    output:
        summary="results/{target}/gaps/{summary}.parquet",
    params:
        spec=serving_risk_spec,
    log:
        f"{LOGS}/serving_risk/{{target}}/{{summary}}.log",
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.serving_risk --spec {params.spec:q} --anchor-slot {input.anchor_slot}"
        " --paths {input.paths} --slots {input.slots} --out-summary {output.summary}"
        " --log {log} --threads {threads}"
