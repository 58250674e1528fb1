rule mi:
    """Mutual-information recovery at every anchor of one domain: an independent screening
    pass, then C_{k,0}, C_{k,m}, C_{k,k} on fresh paths for the screened-in anchors."""
    input:
        model=lambda w: model_dir(w.target),
        corpus="results/{target}/corpus/{domain}.parquet",
        anchors="results/{target}/anchors/{domain}.parquet",
    output:
        "results/{target}/mi/{domain}.parquet",
    params:
        spec=lambda w: as_json(W.mi_spec(w.target)),
    log:
        f"{LOGS}/mi/{{target}}/{{domain}}.log",
    threads: 1
    resources:
        # sized from the model once it exists (floorgap.resources); 12000 in a dry run
        mem_mb=lambda w, input: W.host_mem_mb(w.target, "mi", input.model, 12000),
        runtime=240,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap mi --spec {params.spec:q} --model-dir {input.model} --corpus {input.corpus}"
        " --anchors {input.anchors} --out {output} --log {log} --threads {threads}"
