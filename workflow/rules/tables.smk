# Tables of the paper (CPU), one rule per item, named after it: paper/tables/<name>.tex (a bare
# tabular) and .csv (full precision), plus the item's values fragment.


rule table3_floor_intervals:
    """Table 3: per-slot prompt-bootstrap intervals of T0, T1 and the share removed."""
    input:
        summary=f"results/{PRIMARY}/floors/summary.parquet",
    output:
        tex="paper/tables/table3_floor_intervals.tex",
        csv=report(
            "paper/tables/table3_floor_intervals.csv",
            caption="../report/table3_floor_intervals.rst",
            category="Floors",
        ),
        values="paper/values/table3_floor_intervals.tex",
    log:
        f"{LOGS}/report/table3_floor_intervals.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table3_floor_intervals --summary {input.summary}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule tableD1_concentration:
    """Table D.1: concentration of the floor over anchors; effective support and correlation."""
    input:
        summary=f"results/{PRIMARY}/floors/summary.parquet",
    output:
        tex="paper/tables/tableD1_concentration.tex",
        csv=report(
            "paper/tables/tableD1_concentration.csv",
            caption="../report/tableD1_concentration.rst",
            category="Floors",
        ),
        values="paper/values/tableD1_concentration.tex",
    log:
        f"{LOGS}/report/tableD1_concentration.log",
    threads: 1
    resources:
        mem_mb=1000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report tableD1_concentration --summary {input.summary}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule table4_mi_locality:
    """Table 4: rho_{k,m} by slot and pooled on the screened anchors, ESS-gate sensitivity."""
    input:
        expand(f"results/{PRIMARY}/mi/{{domain}}.parquet", domain=DOMAINS),
    output:
        tex="paper/tables/table4_mi_locality.tex",
        csv=report(
            "paper/tables/table4_mi_locality.csv",
            caption="../report/table4_mi_locality.rst",
            category="Floors",
        ),
        values="paper/values/table4_mi_locality.tex",
    params:
        spec=lambda w: as_json(
            {
                "analysis": {
                    "bootstrap": config["analysis"]["bootstrap"],
                    "level": config["analysis"]["level"],
                    "seed": config["seed"],
                },
                "ess_gates": config["mi"]["ess_gates"],
            }
        ),
        inputs=lambda w, input: " ".join(f"--input {d}={p}" for d, p in zip(DOMAINS, input)),
    log:
        f"{LOGS}/report/table4_mi_locality.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table4_mi_locality {params.inputs} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"
