# The floors stage (CPU): per anchor x slot floors, top-K bands, K-median and effective support
# from every rollouts shard of one target, and their Hajek / prompt-bootstrap summary.


def floors_records(kind):
    """Every rollouts shard of one target for one record kind ("paths" or "floors")."""

    def files(wildcards):
        return [
            f"results/{wildcards.target}/rollouts/{domain}/{kind}-{shard}.parquet"
            for domain in DOMAINS
            for shard in shards()
        ]

    return files


rule floors:
    """T0, T1 (importance route, split-half bounds), top-K band, K-median, N_eff; summary."""
    input:
        anchors=lambda w: [f"results/{w.target}/anchors/{d}.parquet" for d in DOMAINS],
        paths=floors_records("paths"),
        floors=floors_records("floors"),
    output:
        anchor_slot="results/{target}/floors/anchor_slot.parquet",
        summary="results/{target}/floors/summary.parquet",
    params:
        spec=analysis_spec(),
    log:
        f"{LOGS}/floors/{{target}}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.floors --spec {params.spec:q} --anchors {input.anchors} --paths {input.paths}"
        " --floors {input.floors} --out-anchor-slot {output.anchor_slot}"
        " --out-summary {output.summary} --log {log} --threads {threads}"
