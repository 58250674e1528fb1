# Floors with one setting changed, on the first anchors of each domain (App. C.3 finite M, C.4
# gamma = 16, C.7 the training law): one job per variant of the floor_variants section.


rule floor_variants:
    """Floor records and their summary for one robustness variant."""
    input:
        model=lambda w: model_dir(w.target),
        corpus=lambda w: [f"results/{w.target}/corpus/{d}.parquet" for d in W.domains],
        anchors=lambda w: [f"results/{w.target}/anchors/{d}.parquet" for d in W.domains],
    output:
        records="results/{target}/floor_variants/{variant}.parquet",
        summary="results/{target}/floor_variants/{variant}_summary.parquet",
    params:
        spec=lambda w: as_json(W.floor_variants_spec(w.target, w.variant)),
    log:
        f"{LOGS}/floor_variants/{{target}}/{{variant}}.log",
    wildcard_constraints:
        variant="|".join(W.FLOOR_VARIANTS),
    threads: 1
    resources:
        # sized from the model once it exists (floorgap.resources); 12000 in a dry run
        mem_mb=lambda w, input: W.host_mem_mb(w.target, "floor_variants", input.model, 12000),
        runtime=120,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap floor_variants --spec {params.spec:q} --model-dir {input.model}"
        " --corpus {input.corpus} --anchors {input.anchors} --out {output.records}"
        " --out-summary {output.summary} --log {log} --threads {threads}"
