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
