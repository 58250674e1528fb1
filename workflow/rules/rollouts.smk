rule rollouts:
    """M target paths at every anchor of one shard; full-vocabulary floors on the device."""
    input:
        model=lambda w: model_dir(w.target),
        corpus="results/{target}/corpus/{domain}.parquet",
        anchors="results/{target}/anchors/{domain}.parquet",
    output:
        paths="results/{target}/rollouts/{domain}/paths-{shard}.parquet",
        floors="results/{target}/rollouts/{domain}/floors-{shard}.parquet",
    params:
        spec=lambda w: as_json(W.rollouts_spec(w.target, w.shard)),
    log:
        f"{LOGS}/rollouts/{{target}}/{{domain}}-{{shard}}.log",
    threads: 1
    resources:
        # sized from the model once it exists (floorgap.resources); 12000 in a dry run
        mem_mb=lambda w, input: W.host_mem_mb(w.target, "rollouts", input.model, 12000),
        runtime=120,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap rollouts --spec {params.spec:q} --model-dir {input.model} --corpus {input.corpus}"
        " --anchors {input.anchors} --out-paths {output.paths} --out-floors {output.floors}"
        " --log {log} --threads {threads}"
