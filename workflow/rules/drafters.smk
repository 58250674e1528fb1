# The drafters of the gap half (paper Secs. 3.3, 4) and the one-epoch component arms of table 13
# share one namespace under results/<target>/drafters/, with the drafters of the decompose section.
# A drafter entry with `checkpoint` is imported, not trained: it needs no training data, and a
# local checkpoint folder's files are inputs (an edited folder is imported again).


rule drafters:
    """One drafter variant trained on the target's blocks; per-epoch checkpoints (resumable,
    not a declared output so that a rerun keeps them) under checkpoints/; the weights of every
    epoch under epochs/ for the variants of the training trajectory (table 10). A checkpoint
    variant is imported instead (empty train log and epochs/)."""
    input:
        model=lambda w: model_dir(w.target),
        data=training_data,
        checkpoint=checkpoint_files,
    output:
        final="results/{target}/drafters/{variant}/final.pt",
        train_log="results/{target}/drafters/{variant}/train_log.jsonl",
        epochs=directory("results/{target}/drafters/{variant}/epochs"),
    params:
        spec=lambda w: as_json(W.drafters_spec(w.target, w.variant)),
        checkpoints=lambda w: f"results/{w.target}/drafters/{w.variant}/checkpoints",
        data=lambda w, input: f"--data {input.data}" if input.data else "",
    log:
        f"{LOGS}/drafters/{{target}}/{{variant}}.log",
    # the gap half's chain first (the variants on all the data, longest first, then the tables
    # fitted on all of it), so it does not wait on a long job started last
    priority: lambda w: W.drafter_priority(w.variant, w.target)
    threads: 1
    resources:
        mem_mb=12000,
        runtime=lambda w: 60 if W.is_imported(w.variant, w.target) else 1440,
        gpu=lambda w: (W.gpus(w.target) if W.is_imported(w.variant, w.target)
                       else W.drafter_gpus(w.target)),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap drafters --spec {params.spec:q} --model-dir {input.model} {params.data}"
        " --out {output.final} --checkpoints {params.checkpoints} --train-log {output.train_log}"
        " --log {log} --threads {threads} --no-progress --epochs-dir {output.epochs}"
