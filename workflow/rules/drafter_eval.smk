# Drafter evaluation on the stored rollout paths. One job per target x domain x shard and
# evaluation group evaluates every drafter of the group: the target's p_k along the paths, the
# costly part, is computed once per anchor and shared. Groups:
#   summary     the final weights of drafters.variants;
#   trajectory  the earlier epochs of the drafters.trajectory variants (the last is final);
#   components  the final weights of the drafters.components arms.
EVAL_GROUPS = {
    "summary": [(v, "final") for v in VARIANTS],
    "trajectory": [(v, f"epoch-{e}") for v in TRAJECTORY for e in range(1, variant_epochs(v))],
    "components": [(arm, "final") for arm in ARMS],
}


def eval_label(variant, weights):
    """The name a drafter's records carry: the variant for its final weights, variant@epoch-e
    for an earlier epoch of the training trajectory."""
    return variant if weights == "final" else f"{variant}@{weights}"


def eval_record(variant, weights, kind):
    """A drafter_eval record with target, domain and shard left as wildcards."""
    return f"results/{{target}}/drafter_eval/{variant}/{weights}/{{domain}}/{kind}-{{shard}}.parquet"


def weights_file(target, variant, weights):
    """final.pt, or epochs/epoch-<e>.pt of an earlier epoch."""
    folder = f"results/{target}/drafters/{variant}"
    return f"{folder}/final.pt" if weights == "final" else f"{folder}/epochs/{weights}.pt"


def weights_input(variant, weights):
    """The job's input: final.pt, or the epochs/ folder (the drafter rule's output)."""
    path = weights_file("{target}", variant, weights)
    return path if weights == "final" else os.path.dirname(path)


def weights_files(evals):
    return lambda wildcards: [weights_file(wildcards.target, v, w) for v, w in evals]


def drafter_eval_spec(evals):
    def spec(wildcards):
        return as_json(
            {
                "target": target_spec(wildcards.target),
                "rollouts": config["rollouts"],
                "law": config["evaluation_law"],
                "gamma": config["anchors"]["gamma"],
                "shard": int(wildcards.shard),
                "variants": [eval_label(v, w) for v, w in evals],
            }
        )

    return spec


for _group, _evals in EVAL_GROUPS.items():
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
            drafters=[weights_input(v, w) for v, w in _evals],
        output:
            paths=[eval_record(v, w, "paths") for v, w in _evals],
            slots=[eval_record(v, w, "slots") for v, w in _evals],
        params:
            spec=drafter_eval_spec(_evals),
            drafters=weights_files(_evals),
        log:
            f"{LOGS}/drafter_eval/{{target}}/{_group}/{{domain}}-{{shard}}.log",
        threads: 1
        resources:
            mem_mb=12000,
            runtime=120,
            gpu=lambda w: gpus_for(w.target),
        conda:
            "../../envs/floorgap.yaml"
        shell:
            "{PY}.drafter_eval --spec {params.spec:q} --model-dir {input.model}"
            " --corpus {input.corpus} --anchors {input.anchors} --rollouts {input.rollouts}"
            " --drafter {params.drafters} --out-paths {output.paths} --out-slots {output.slots}"
            " --log {log} --threads {threads}"
