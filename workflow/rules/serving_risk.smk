# The gap half (CPU): model gaps against the floors, exposure, free vs serving risk, dependence
# and best-response gains of every drafter variant of one target.


def drafter_eval_records(kind):
    """Every drafter_eval shard of one target for one record kind ("paths" or "slots")."""

    def files(wildcards):
        return [
            f"results/{wildcards.target}/drafter_eval/{variant}/{domain}/{kind}-{shard}.parquet"
            for variant in config["drafters"]["variants"]
            for domain in DOMAINS
            for shard in shards()
        ]

    return files


rule serving_risk:
    """G0, G1, exposure, R^serve vs R, D_k, tau vs tau_indep, single-slot gains, sweeps."""
    input:
        anchor_slot="results/{target}/floors/anchor_slot.parquet",
        paths=drafter_eval_records("paths"),
        slots=drafter_eval_records("slots"),
    output:
        summary="results/{target}/gaps/summary.parquet",
    params:
        spec=analysis_spec(),
    log:
        f"{LOGS}/serving_risk/{{target}}.log",
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
