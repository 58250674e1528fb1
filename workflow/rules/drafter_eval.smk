def drafter_eval_spec(wildcards):
    return as_json(
        {
            "target": target_spec(wildcards.target),
            "rollouts": config["rollouts"],
            "law": config["evaluation_law"],
            "gamma": config["anchors"]["gamma"],
            "shard": int(wildcards.shard),
            "variant": eval_label(wildcards.variant, wildcards.weights),
        }
    )


def eval_label(variant, weights):
    """The name a drafter's records carry: the variant for its final weights, variant@epoch-e
    for an earlier epoch of the training trajectory."""
    return variant if weights == "final" else f"{variant}@{weights}"


def drafter_weights_input(wildcards):
    """final.pt, or the epochs/ folder that holds epoch-<e>.pt."""
    folder = f"results/{wildcards.target}/drafters/{wildcards.variant}"
    return f"{folder}/final.pt" if wildcards.weights == "final" else f"{folder}/epochs"


def drafter_weights_file(wildcards, input):
    if wildcards.weights == "final":
        return input.drafter
    return f"{input.drafter}/{wildcards.weights}.pt"


rule drafter_eval:
    """A trained drafter's q on the stored target paths of one shard: R, R^oracle, R^self,
    exposure per slot; p, q, TV and accept factors per path and slot."""
    input:
        model=lambda w: model_dir(w.target),
        corpus="results/{target}/corpus/{domain}.parquet",
        anchors="results/{target}/anchors/{domain}.parquet",
        rollouts="results/{target}/rollouts/{domain}/paths-{shard}.parquet",
        drafter=drafter_weights_input,
    output:
        paths="results/{target}/drafter_eval/{variant}/{weights}/{domain}/paths-{shard}.parquet",
        slots="results/{target}/drafter_eval/{variant}/{weights}/{domain}/slots-{shard}.parquet",
    params:
        spec=drafter_eval_spec,
        drafter=drafter_weights_file,
    log:
        f"{LOGS}/drafter_eval/{{target}}/{{variant}}/{{weights}}/{{domain}}-{{shard}}.log",
    threads: 1
    resources:
        mem_mb=16000,
        runtime=120,
        gpu=lambda w: gpus_for(w.target),
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.drafter_eval --spec {params.spec:q} --model-dir {input.model}"
        " --corpus {input.corpus} --anchors {input.anchors} --rollouts {input.rollouts}"
        " --drafter {params.drafter} --out-paths {output.paths} --out-slots {output.slots}"
        " --log {log} --threads {threads}"
