def drafter_eval_spec(wildcards):
    return as_json(
        {
            "target": target_spec(wildcards.target),
            "rollouts": config["rollouts"],
            "law": config["evaluation_law"],
            "gamma": config["anchors"]["gamma"],
            "shard": int(wildcards.shard),
            "variant": wildcards.variant,
        }
    )


rule drafter_eval:
    """A trained drafter's q on the stored target paths of one shard: R, R^oracle, R^self,
    exposure per slot; p, q, TV and accept factors per path and slot."""
    input:
        model=lambda w: model_dir(w.target),
        corpus="results/{target}/corpus/{domain}.parquet",
        anchors="results/{target}/anchors/{domain}.parquet",
        rollouts="results/{target}/rollouts/{domain}/paths-{shard}.parquet",
        drafter="results/{target}/drafters/{variant}/final.pt",
    output:
        paths="results/{target}/drafter_eval/{variant}/{domain}/paths-{shard}.parquet",
        slots="results/{target}/drafter_eval/{variant}/{domain}/slots-{shard}.parquet",
    params:
        spec=drafter_eval_spec,
    log:
        f"{LOGS}/drafter_eval/{{target}}/{{variant}}/{{domain}}-{{shard}}.log",
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
        " --drafter {input.drafter} --out-paths {output.paths} --out-slots {output.slots}"
        " --log {log} --threads {threads}"
