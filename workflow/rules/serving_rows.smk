# The serving benchmark's rows (paper Sec. 4, App. H.3): nine tasks, disjoint from the floors'
# evaluation prompts and the drafter training prompts. Only with a `serving` config section.


rule serving_rows:
    """Rows of every serving task with the target-formatted prompt token ids."""
    input:
        model=lambda w: model_dir(w.target),
        corpus=per_domain("results/{target}/corpus/{domain}.parquet"),
        training="results/{target}/drafter_data/blocks.pt",
    output:
        "results/{target}/serving_rows/rows.parquet",
    params:
        spec=lambda w: as_json(W.serving_rows_spec(w.target)),
    log:
        f"{LOGS}/serving_rows/{{target}}.log",
    threads: 1
    resources:
        mem_mb=4000,
        runtime=30,
    conda:
        CONDA_ENV
    shell:
        "floorgap serving_rows --spec {params.spec:q} --model-dir {input.model}"
        " --corpus {input.corpus} --training-data {input.training} --out {output}"
        " --log {log} --threads {threads}"
