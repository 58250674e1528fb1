# The drafters of the gap half (paper Secs. 3.3, 4) and the one-epoch component arms of table 13
# share one namespace under results/<target>/drafters/.
VARIANTS = list(config["drafters"]["variants"])
COMPONENTS = config["drafters"]["components"]
ARMS = list(COMPONENTS["arms"])
TRAJECTORY = list(config["drafters"]["trajectory"])
if set(VARIANTS) & set(ARMS):
    raise ValueError(
        f"drafters.components.arms reuses the variant name(s) {sorted(set(VARIANTS) & set(ARMS))}; "
        "give the component arms their own names"
    )
if COMPONENTS["baseline"] not in ARMS:
    raise ValueError(
        f"drafters.components.baseline {COMPONENTS['baseline']!r} is not one of the arms ({', '.join(ARMS)})"
    )
if set(TRAJECTORY) - set(VARIANTS):
    raise ValueError(
        f"drafters.trajectory names {sorted(set(TRAJECTORY) - set(VARIANTS))}, which are not "
        "drafters.variants; list variant names"
    )


wildcard_constraints:
    variant="|".join(map(str, VARIANTS + ARMS)) or "NONE",


def variant_entry(name):
    """A drafter's config entry with its name; component arms train for components.epochs
    and share one seed key (the same initial draws)."""
    if name in config["drafters"]["variants"]:
        return {"name": name, **config["drafters"]["variants"][name]}
    return {"name": name, "epochs": COMPONENTS["epochs"], "seed_key": "components",
            **COMPONENTS["arms"][name]}


def variant_epochs(name):
    return int(variant_entry(name).get("epochs", config["drafters"]["train"]["epochs"]))


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
            "variant": variant_entry(wildcards.variant),
            "export_epochs": wildcards.variant in TRAJECTORY,
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
    not a declared output so that a rerun keeps them) under checkpoints/; the weights of every
    epoch under epochs/ for the variants of the training trajectory (table 10)."""
    input:
        model=lambda w: model_dir(w.target),
        data="results/{target}/drafters/train_data.pt",
    output:
        final="results/{target}/drafters/{variant}/final.pt",
        train_log="results/{target}/drafters/{variant}/train_log.jsonl",
        epochs=directory("results/{target}/drafters/{variant}/epochs"),
    params:
        spec=drafter_train_spec,
        checkpoints=lambda w: f"results/{w.target}/drafters/{w.variant}/checkpoints",
    log:
        f"{LOGS}/drafters/{{target}}/{{variant}}.log",
    threads: 1
    resources:
        mem_mb=12000,
        runtime=1440,
        gpu=lambda w: gpus_for(w.target) * drafter_processes(),
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.drafter_train --spec {params.spec:q} --model-dir {input.model} --data {input.data}"
        " --out {output.final} --checkpoints {params.checkpoints} --train-log {output.train_log}"
        " --log {log} --threads {threads} --no-progress"
        " --epochs-dir {output.epochs}"
