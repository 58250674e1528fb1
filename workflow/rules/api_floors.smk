# Floors read through an OpenAI-compatible endpoint with omitted-mass bounds (paper Sec. 3.4, App.
# C.6): a local vLLM server on the target by default, or any remote endpoint the config names.
# Two reads: `api` (top-20, with the matched-path check) and `replication` (App. C.2: top-256
# reads of a second engine on the same anchors). The journal beside the outputs is not an
# output: a failed job keeps it and a rerun resumes.


rule api_floors:
    """Top-K reads of M continuations per anchor, T~^(0) and T~^(1) with their bounds, and the
    matched-path check against the full vocabulary."""
    input:
        model=lambda w: model_dir(w.target),
        corpus=lambda w: [f"results/{w.target}/corpus/{d}.parquet" for d in W.domains],
        anchors=lambda w: [f"results/{w.target}/anchors/{d}.parquet" for d in W.domains],
    output:
        reads="results/{target}/api_floors/{read}/reads.parquet",
        floors="results/{target}/api_floors/{read}/floors.parquet",
        summary="results/{target}/api_floors/{read}/summary.parquet",
    params:
        spec=lambda w: as_json(W.api_floors_spec(w.target, w.read)),
        journal="results/{target}/api_floors/{read}/journal.jsonl",
    log:
        f"{LOGS}/api_floors/{{target}}/{{read}}.log",
    wildcard_constraints:
        read="|".join(W.API_READS),
    # the reads are not timed, so the job shares the machine: its server computes on this many
    # CPUs (plus one for the server's own scheduler and API; floorgap.probes.serving)
    threads: 1
    resources:
        mem_mb=8000,
        runtime=120,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap api_floors --spec {params.spec:q} --model-dir {input.model}"
        " --corpus {input.corpus} --anchors {input.anchors} --journal {params.journal}"
        " --out-reads {output.reads} --out-floors {output.floors} --out-summary {output.summary}"
        " --engine-log {log}.engine --log {log} --threads {threads}"
