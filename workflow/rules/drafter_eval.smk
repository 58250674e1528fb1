# Drafter evaluation on the stored rollout paths. One job per target x domain x shard and
# evaluation job (floorgap.config eval_jobs: `study`, every drafter of the summary, trajectory,
# components and budget groups; `decompose`, a user's own drafters) evaluates all of its
# drafters: the target's p_k along the paths, the costly part, is computed once per anchor and
# shared; a cross_target target has one job, `roles`, its two baselines. The rules are
# drafter_eval_<job>, each constrained to the targets that run it.


def weights_input(evaluation):
    """The job's input: final.pt, or the epochs/ folder (the drafters rule's output)."""
    path = weights_file("{target}", evaluation)
    return path if evaluation.weights == "final" else os.path.dirname(path)


for _job, _evals in W.eval_jobs.items():
    if not _evals or not W.eval_job_targets(_job):
        continue

    rule:
        """Drafters of one evaluation job on the stored target paths of one shard: R,
        R^oracle, R^self, exposure per slot; p, q, TV and accept factors per path and slot."""
        name:
            f"drafter_eval_{_job}"
        wildcard_constraints:
            target="|".join(map(str, W.eval_job_targets(_job))) or "NONE",
        input:
            model=lambda w: model_dir(w.target),
            corpus="results/{target}/corpus/{domain}.parquet",
            anchors="results/{target}/anchors/{domain}.parquet",
            rollouts="results/{target}/rollouts/{domain}/paths-{shard}.parquet",
            drafters=[weights_input(e) for e in _evals],
        output:
            paths=[eval_record("{target}", e, "paths") for e in _evals],
            slots=[eval_record("{target}", e, "slots") for e in _evals],
        params:
            spec=lambda w, job=_job: as_json(W.drafter_eval_spec(w.target, w.shard, job)),
            drafters=lambda w, evals=_evals: [weights_file(w.target, e) for e in evals],
        log:
            f"{LOGS}/drafter_eval/{{target}}/{_job}/{{domain}}-{{shard}}.log",
        threads: 1
        resources:
            mem_mb=12000,
            runtime=120,
            gpu=lambda w: W.gpus(w.target),
            slurm_partition=lambda w: W.partition(w.target),
            gpu_model=lambda w: W.gpu_model(w.target),
        conda:
            CONDA_ENV
        shell:
            "floorgap drafter_eval --spec {params.spec:q} --model-dir {input.model}"
            " --corpus {input.corpus} --anchors {input.anchors} --rollouts {input.rollouts}"
            " --drafter {params.drafters} --out-paths {output.paths} --out-slots {output.slots}"
            " --log {log} --threads {threads}"
