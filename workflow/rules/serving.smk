# One system (AR, a drafter in its exported engine layout, or the target drafting for itself)
# served in a real engine over the benchmark rows (floorgap.probes.serving). The engine runs from
# its own environment (serving.python) and asks for 8 threads, which Snakemake caps at --cores
# (--max-threads on a cluster): on a small machine it then has every core, so its runs are
# timed on an otherwise idle machine; each system has its own port, so servers never clash.
# A check's served drafters (floorgap check) are systems too, on a few rows per task.


rule serving:
    """Per request: prompt and completion tokens, verify steps, accepted drafts, latency and
    TTFT; per task run (task x temperature x concurrency): its client-side wall time."""
    input:
        model=lambda w: model_dir(w.target),
        rows="results/{target}/serving_rows/rows.parquet",
        drafter=served_drafter,
    output:
        requests="results/{target}/serving/{system}/requests.parquet",
        runs="results/{target}/serving/{system}/runs.parquet",
    params:
        spec=lambda w: as_json(W.serving_spec(w.target, w.system)),
        drafter=lambda w, input: f"--drafter-dir {input.drafter}" if input.drafter else "",
        engine_log=lambda w: f"{LOGS}/serving/{w.target}/{w.system}.engine.log",
    log:
        f"{LOGS}/serving/{{target}}/{{system}}.log",
    threads: 8
    resources:
        mem_mb=16000,
        runtime=240,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap serving --spec {params.spec:q} --model-dir {input.model} --rows {input.rows}"
        " {params.drafter} --out-requests {output.requests} --out-runs {output.runs}"
        " --engine-log {params.engine_log} --log {log}"
