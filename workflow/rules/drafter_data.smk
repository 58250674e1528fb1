rule drafter_data:
    """Training data: target responses to training prompts (disjoint from the evaluation
    corpus), with the top-K of the evaluation-law distribution at every response position."""
    input:
        model=lambda w: model_dir(w.target),
        corpus=per_domain("results/{target}/corpus/{domain}.parquet"),
    output:
        "results/{target}/drafter_data/blocks.pt",
    params:
        spec=lambda w: as_json(W.drafter_data_spec(w.target)),
    log:
        f"{LOGS}/drafter_data/{{target}}.log",
    # the longest job on the gap half's chain: start it before the floor half's shards
    priority: 10
    # two threads double the decode's pace (measured on SmolLM2), more than a second job gains
    threads: 2
    resources:
        # sized from the model once it exists (floorgap.resources); 12000 in a dry run
        mem_mb=lambda w, input: W.host_mem_mb(w.target, "drafter_data", input.model, 12000),
        runtime=240,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        REUSE_FREED_MEMORY + "floorgap drafter_data --spec {params.spec:q} --model-dir {input.model}"
        " --corpus {input.corpus} --out {output} --log {log} --threads {threads}"
