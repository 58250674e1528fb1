# Shared wiring: config validation (before any job runs), wildcard constraints, and the
# per-stage specs handed to the CLIs. Specs travel as `params`, so a rule reruns exactly when
# the part of the config it reads changes, and never when an unrelated key does.
import json
import os
import sys

from snakemake.utils import validate


validate(config, schema="../schemas/config.schema.yaml")

# Rules call `python -m floorgap...`: put the interpreter running Snakemake (for instance
# .venv/bin of `.venv/bin/snakemake`) first on PATH, so the jobs find the package without an
# activated environment. `--sdm conda` jobs activate their env in front of it.
os.environ["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])

TARGETS = list(config["targets"])
DOMAINS = list(config["domains"])
PRIMARY = config.get("primary_target", TARGETS[0])
if PRIMARY not in TARGETS:
    raise ValueError(
        f"primary_target {PRIMARY!r} is not a key of targets ({', '.join(TARGETS)}); "
        "name one of them or drop primary_target to use the first"
    )
PY = "python -m floorgap"
LOGS = "results/logs"


wildcard_constraints:
    target="|".join(map(str, TARGETS)) or "NONE",
    domain="|".join(DOMAINS) or "NONE",
    shard=r"\d+",


def as_json(obj):
    """A spec as compact, key-sorted JSON (stable across runs, so params compare equal)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def figures_spec():
    """Plotting options, handed only to figure rules (so they rerun nothing upstream)."""
    return as_json(config["figures"])


def analysis_spec(**extra):
    """Estimation settings; the config seed keys the bootstrap and K-median draws. ``extra``
    adds stage-specific keys (the serving_risk summaries' contrasts, labels, sweeps)."""
    return as_json({**config["analysis"], "seed": config["seed"], **extra})


def target_spec(target):
    return {"name": target, **config["targets"][target]}


def domain_spec(domain):
    return {"name": domain, **config["domains"][domain]}


def corpus_spec(wildcards):
    return as_json(
        {
            "target": target_spec(wildcards.target),
            "domain": domain_spec(wildcards.domain),
            "corpus": config["corpus"],
            "law": config["evaluation_law"],
            "seed": config["seed"],
        }
    )


def anchors_spec(wildcards):
    return as_json(
        {"domain": wildcards.domain, "anchors": config["anchors"], "seed": config["seed"]}
    )


def rollouts_spec(wildcards):
    return as_json(
        {
            "target": target_spec(wildcards.target),
            "rollouts": config["rollouts"],
            "law": config["evaluation_law"],
            "gamma": config["anchors"]["gamma"],
            "shard": int(wildcards.shard),
        }
    )


def gpus_for(target):
    """GPUs a model-running job of this target requests (0 on CPU targets)."""
    return 1 if config["targets"][target]["device"].startswith("cuda") else 0


def shards():
    return range(config["rollouts"]["shards"])


def model_dir(target):
    return f"results/models/{target}"


def target_records(target):
    """Every record file of one target that the manifest covers."""
    return [
        f"results/{target}/{kind}/{domain}.parquet"
        for kind in ("corpus", "anchors")
        for domain in DOMAINS
    ] + [
        f"results/{target}/rollouts/{domain}/{kind}-{shard}.parquet"
        for domain in DOMAINS
        for shard in shards()
        for kind in ("paths", "floors")
    ] + [f"results/{target}/mi/{domain}.parquet" for domain in DOMAINS] + [
        f"results/{target}/floors/{name}.parquet" for name in ("anchor_slot", "summary")
    ] + [
        f"results/{target}/gaps/{name}.parquet" for name in ("summary", "trajectory", "components")
    ]


def final_outputs():
    """What `rule all` builds: the compiled paper and one record manifest per target."""
    return ["paper/main.pdf"] + [f"results/{target}/manifest.json" for target in TARGETS]


rule manifest:
    """Row counts and SHA-256 of every record file of one target."""
    input:
        lambda w: target_records(w.target),
    output:
        "results/{target}/manifest.json",
    log:
        f"{LOGS}/manifest/{{target}}.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.manifest --out {output} {input} > {log} 2>&1"
