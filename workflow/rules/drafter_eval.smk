# Drafter evaluation on the stored rollout paths. One job per target x domain x shard and
# evaluation group (floorgap.config: summary, trajectory, components) evaluates every drafter of
# the group: the target's p_k along the paths, the costly part, is computed once per anchor and
# shared. The rules are drafter_eval_<group>.


def weights_input(evaluation):
    """The job's input: final.pt, or the epochs/ folder (the drafters rule's output)."""
    path = weights_file("{target}", evaluation)
    return path if evaluation.weights == "final" else os.path.dirname(path)


for _group, _evals in W.eval_groups.items():
    if not _evals:
        continue

    rule:
        """Drafters of one evaluation group on the stored target paths of one shard: R,
        R^oracle, R^self, exposure per slot; p, q, TV and accept factors per path and slot."""
        name:
            f"drafter_eval_{_group}"
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
            spec=lambda w, group=_group: as_json(W.drafter_eval_spec(w.target, w.shard, group)),
            drafters=lambda w, evals=_evals: [weights_file(w.target, e) for e in evals],
        log:
            f"{LOGS}/drafter_eval/{{target}}/{_group}/{{domain}}-{{shard}}.log",
        threads: 1
        resources:
            mem_mb=12000,
            runtime=120,
            gpu=lambda w: W.gpus(w.target),
        conda:
            CONDA_ENV
        shell:
            "floorgap drafter_eval --spec {params.spec:q} --model-dir {input.model}"
            " --corpus {input.corpus} --anchors {input.anchors} --rollouts {input.rollouts}"
            " --drafter {params.drafters} --out-paths {output.paths} --out-slots {output.slots}"
            " --log {log} --threads {threads}"
