# The floors stage (CPU): per anchor x slot floors, top-K bands, K-median and effective support
# from every rollouts shard of one target, and their Hajek / prompt-bootstrap summary.


rule floors:
    """T0, T1 (importance route, split-half bounds), top-K band, K-median, N_eff; summary."""
    input:
        anchors=per_domain("results/{target}/anchors/{domain}.parquet"),
        paths=per_shard("results/{target}/rollouts/{domain}/paths-{shard}.parquet"),
        floors=per_shard("results/{target}/rollouts/{domain}/floors-{shard}.parquet"),
    output:
        anchor_slot="results/{target}/floors/anchor_slot.parquet",
        summary="results/{target}/floors/summary.parquet",
    params:
        spec=as_json(W.analysis_spec()),
    log:
        f"{LOGS}/floors/{{target}}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "floorgap floors --spec {params.spec:q} --anchors {input.anchors} --paths {input.paths}"
        " --floors {input.floors} --out-anchor-slot {output.anchor_slot}"
        " --out-summary {output.summary} --log {log} --threads {threads}"
