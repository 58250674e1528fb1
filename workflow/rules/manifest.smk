def target_records(target):
    """Every record file of one target that the manifest covers."""
    per_domain_files = [
        f"results/{target}/{kind}/{domain}.parquet"
        for kind in ("corpus", "anchors")
        for domain in W.domains
    ]
    rollouts = [
        f"results/{target}/rollouts/{domain}/{kind}-{shard}.parquet"
        for domain in W.domains
        for shard in W.shards()
        for kind in ("paths", "floors")
    ]
    # the MI probe runs on full targets only (a cross_target target runs what Fig. 5 reads)
    mi = ([f"results/{target}/mi/{domain}.parquet" for domain in W.domains]
          if W.scope(target) == "full" else [])
    floors = [f"results/{target}/floors/{name}.parquet" for name in ("anchor_slot", "summary")]
    gaps = [f"results/{target}/gaps/{name}.parquet" for name in W.summaries(target)]
    return per_domain_files + rollouts + mi + floors + gaps


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
        CONDA_ENV
    shell:
        "floorgap manifest --out {output} --log {log} {input}"
