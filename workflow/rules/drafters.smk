# The drafters of the gap half (paper Secs. 3.3, 4) and the one-epoch component arms of table 13
# share one namespace under results/<target>/drafters/.


rule drafters:
    """One drafter variant trained on the target's blocks; per-epoch checkpoints (resumable,
    not a declared output so that a rerun keeps them) under checkpoints/; the weights of every
    epoch under epochs/ for the variants of the training trajectory (table 10)."""
    input:
        model=lambda w: model_dir(w.target),
        data="results/{target}/drafter_data/blocks.pt",
    output:
        final="results/{target}/drafters/{variant}/final.pt",
        train_log="results/{target}/drafters/{variant}/train_log.jsonl",
        epochs=directory("results/{target}/drafters/{variant}/epochs"),
    params:
        spec=lambda w: as_json(W.drafters_spec(w.target, w.variant)),
        checkpoints=lambda w: f"results/{w.target}/drafters/{w.variant}/checkpoints",
    log:
        f"{LOGS}/drafters/{{target}}/{{variant}}.log",
    threads: 1
    resources:
        mem_mb=12000,
        runtime=1440,
        gpu=lambda w: W.drafter_gpus(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap drafters --spec {params.spec:q} --model-dir {input.model} --data {input.data}"
        " --out {output.final} --checkpoints {params.checkpoints} --train-log {output.train_log}"
        " --log {log} --threads {threads} --no-progress --epochs-dir {output.epochs}"
