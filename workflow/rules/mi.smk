def mi_spec(wildcards):
    """What the MI probe reads; the ESS gates only enter the report, so they are left out."""
    return as_json(
        {
            "target": target_spec(wildcards.target),
            "mi": {k: v for k, v in config["mi"].items() if k != "ess_gates"},
            "law": config["evaluation_law"],
            "gamma": config["anchors"]["gamma"],
            "forward_batch": config["rollouts"]["forward_batch"],
        }
    )


rule mi:
    """Mutual-information recovery at every anchor of one domain: an independent screening
    pass, then C_{k,0}, C_{k,m}, C_{k,k} on fresh paths for the screened-in anchors."""
    input:
        model=lambda w: model_dir(w.target),
        corpus="results/{target}/corpus/{domain}.parquet",
        anchors="results/{target}/anchors/{domain}.parquet",
    output:
        "results/{target}/mi/{domain}.parquet",
    params:
        spec=mi_spec,
    log:
        f"{LOGS}/mi/{{target}}/{{domain}}.log",
    threads: 1
    resources:
        mem_mb=12000,
        runtime=240,
        gpu=lambda w: gpus_for(w.target),
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.mi --spec {params.spec:q} --model-dir {input.model} --corpus {input.corpus}"
        " --anchors {input.anchors} --out {output} --log {log} --threads {threads}"
