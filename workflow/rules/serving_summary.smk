# Served accepted length and speedup over AR (floorgap.analysis.serving): tables 1, 9 and 11;
# served against offline-predicted tau on the replayed rounds (figH_served_vs_offline).


rule serving_summary:
    """tau and speedup by system, task, temperature and concurrency, with task macros and
    row-bootstrap intervals."""
    input:
        requests=lambda w: [f"results/{w.target}/serving/{s}/requests.parquet"
                            for s in W.serving["systems"]],
        runs=lambda w: [f"results/{w.target}/serving/{s}/runs.parquet"
                        for s in W.serving["systems"]],
        replay=lambda w: [f"results/{w.target}/serving_replay/{s}/rounds.parquet"
                          for s in W.replayed_systems],
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
        " --runs {input.runs} --replay {input.replay} --out {output} --log {log} --threads {threads}"
