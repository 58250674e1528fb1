# Served accepted length and speedup over AR (floorgap.analysis.serving): tables 1, 9 and 11.


rule serving_summary:
    """tau and speedup by system, task, temperature and concurrency, with task macros and
    row-bootstrap intervals."""
    input:
        requests=lambda w: [f"results/{w.target}/serving/{s}/requests.parquet"
                            for s in W.serving["systems"]],
        runs=lambda w: [f"results/{w.target}/serving/{s}/runs.parquet"
                        for s in W.serving["systems"]],
    output:
        "results/{target}/serving_summary/summary.parquet",
    params:
        spec=lambda w: as_json(W.serving_summary_spec(w.target)),
    log:
        f"{LOGS}/serving_summary/{{target}}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "floorgap serving_summary --spec {params.spec:q} --requests {input.requests}"
        " --runs {input.runs} --out {output} --log {log} --threads {threads}"
