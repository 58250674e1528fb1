rule anchors:
    """Stratified anchors (context bucket x relative third) with inclusion probabilities."""
    input:
        corpus="results/{target}/corpus/{domain}.parquet",
    output:
        "results/{target}/anchors/{domain}.parquet",
    params:
        spec=lambda w: as_json(W.anchors_spec(w.target, w.domain)),
    log:
        f"{LOGS}/anchors/{{target}}/{{domain}}.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CONDA_ENV
    shell:
        "floorgap anchors --spec {params.spec:q} --corpus {input.corpus} --out {output}"
        " --log {log} --threads {threads}"
