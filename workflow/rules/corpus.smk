rule corpus:
    """Prompts of one domain and the target's responses under the evaluation law."""
    input:
        model=lambda w: model_dir(w.target),
    output:
        "results/{target}/corpus/{domain}.parquet",
    params:
        spec=lambda w: as_json(W.corpus_spec(w.target, w.domain)),
    log:
        f"{LOGS}/corpus/{{target}}/{{domain}}.log",
    threads: 1
    resources:
        # sized from the model once it exists (floorgap.resources); 8000 in a dry run
        mem_mb=lambda w, input: W.host_mem_mb(w.target, "corpus", input.model, 8000),
        runtime=60,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap corpus --spec {params.spec:q} --model-dir {input.model} --out {output}"
        " --log {log} --threads {threads}"
