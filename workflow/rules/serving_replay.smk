# Every verification round a drafter ran in the engine, replayed offline on the same target and
# the same exported folder (floorgap.probes.serving_replay): the accept factors and TV along the
# served continuation, for the served-vs-offline check (App. H.3, figH_served_vs_offline). A
# checked folder with a reference is replayed with those weights instead (floorgap check): an
# export fault then shows as served != offline.


rule serving_replay:
    """Per served round: the engine's accepted drafts, and per slot p and q of the served token
    and TV(p_j, q_j)."""
    input:
        model=lambda w: model_dir(w.target),
        rows="results/{target}/serving_rows/rows.parquet",
        requests="results/{target}/serving/{system}/requests.parquet",
        drafter=served_drafter,
        reference=lambda w: W.replay_reference(w.system),
    output:
        "results/{target}/serving_replay/{system}/rounds.parquet",
    params:
        spec=lambda w: as_json(W.serving_replay_spec(w.target, w.system)),
        reference=lambda w, input: f"--reference {input.reference}" if input.reference else "",
    log:
        f"{LOGS}/serving_replay/{{target}}/{{system}}.log",
    # it waits for the served requests, so on a small machine it runs last and alone
    threads: 2
    resources:
        mem_mb=8000,
        runtime=60,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap serving_replay --spec {params.spec:q} --model-dir {input.model}"
        " --rows {input.rows} --requests {input.requests} --drafter-dir {input.drafter}"
        " {params.reference} --out {output} --log {log} --threads {threads}"
