VARIANTS = list(config["drafters"]["variants"])


wildcard_constraints:
    variant="|".join(map(str, VARIANTS)) or "NONE",


def drafter_data_spec(wildcards):
    return as_json(
        {
            "target": target_spec(wildcards.target),
            "domains": [domain_spec(d) for d in DOMAINS],
            "training_data": config["drafters"]["training_data"],
            "corpus": config["corpus"],
            "gamma": config["anchors"]["gamma"],
            "seed": config["seed"],
        }
    )


def drafter_train_spec(wildcards):
    return as_json(
        {
            "target": target_spec(wildcards.target),
            "variant": {"name": wildcards.variant, **config["drafters"]["variants"][wildcards.variant]},
            "taps": config["drafters"]["taps"],
            "train": config["drafters"]["train"],
            "gamma": config["anchors"]["gamma"],
            "seed": config["seed"],
        }
    )


def drafter_processes():
    return int(config["drafters"]["train"].get("processes", 1))


rule drafter_data:
    """Training blocks: target responses to training prompts (disjoint from the evaluation
    corpus) under the training law, with top-K target distributions at every slot."""
    input:
        model=lambda w: model_dir(w.target),
        corpus=expand("results/{{target}}/corpus/{domain}.parquet", domain=DOMAINS),
    output:
        "results/{target}/drafters/train_data.pt",
    params:
        spec=drafter_data_spec,
    log:
        f"{LOGS}/drafters/{{target}}/train_data.log",
    threads: 1
    resources:
        mem_mb=12000,
        runtime=240,
        gpu=lambda w: gpus_for(w.target),
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.training_data --spec {params.spec:q} --model-dir {input.model}"
        " --corpus {input.corpus} --out {output} --log {log} --threads {threads}"


rule drafter:
    """One drafter variant trained on the target's blocks; per-epoch checkpoints (resumable,
    not a declared output so that a rerun keeps them) under checkpoints/."""
    input:
        model=lambda w: model_dir(w.target),
        data="results/{target}/drafters/train_data.pt",
    output:
        final="results/{target}/drafters/{variant}/final.pt",
        train_log="results/{target}/drafters/{variant}/train_log.jsonl",
    params:
        spec=drafter_train_spec,
        checkpoints=lambda w: f"results/{w.target}/drafters/{w.variant}/checkpoints",
    log:
        f"{LOGS}/drafters/{{target}}/{{variant}}.log",
    threads: 1
    resources:
        mem_mb=24000,
        runtime=1440,
        gpu=lambda w: gpus_for(w.target) * drafter_processes(),
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.drafter_train --spec {params.spec:q} --model-dir {input.model} --data {input.data}"
        " --out {output.final} --checkpoints {params.checkpoints} --train-log {output.train_log}"
        " --log {log} --threads {threads} --no-progress"
