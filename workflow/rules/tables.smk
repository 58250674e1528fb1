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


# Gap half: items from the serving_risk stage's summary of the primary target.
GAPS_SUMMARY = f"results/{PRIMARY}/gaps/summary.parquet"


rule table5_dflash:
    """Table 5: DFlash T0, R, G0 (interval) and G0/R per slot."""
    input:
        summary=GAPS_SUMMARY,
    output:
        tex="paper/tables/table5_dflash.tex",
        csv=report(
            "paper/tables/table5_dflash.csv",
            caption="../report/table5_dflash.rst",
            category="Gaps",
        ),
        values="paper/values/table5_dflash.tex",
    params:
        spec=as_json({}),
    log:
        f"{LOGS}/report/table5_dflash.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table5_dflash --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule table6_dspark:
    """Table 6: DSpark T1, R^oracle, G1 (interval), exposure and R^self per slot."""
    input:
        summary=GAPS_SUMMARY,
    output:
        tex="paper/tables/table6_dspark.tex",
        csv=report(
            "paper/tables/table6_dspark.csv",
            caption="../report/table6_dspark.rst",
            category="Gaps",
        ),
        values="paper/values/table6_dspark.tex",
    params:
        spec=as_json({}),
    log:
        f"{LOGS}/report/table6_dspark.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table6_dspark --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule table7_serving_risk:
    """Table 7: free vs serving-weighted risk for both released drafters (slots >= 1)."""
    input:
        summary=GAPS_SUMMARY,
    output:
        tex="paper/tables/table7_serving_risk.tex",
        csv=report(
            "paper/tables/table7_serving_risk.csv",
            caption="../report/table7_serving_risk.rst",
            category="Gaps",
        ),
        values="paper/values/table7_serving_risk.tex",
    params:
        spec=as_json({}),
    log:
        f"{LOGS}/report/table7_serving_risk.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table7_serving_risk --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule table8_dependence:
    """Table 8: D_k, joint survival over the product of marginal acceptances."""
    input:
        summary=GAPS_SUMMARY,
    output:
        tex="paper/tables/table8_dependence.tex",
        csv=report(
            "paper/tables/table8_dependence.csv",
            caption="../report/table8_dependence.rst",
            category="Gaps",
        ),
        values="paper/values/table8_dependence.tex",
    params:
        spec=as_json({}),
    log:
        f"{LOGS}/report/table8_dependence.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table8_dependence --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule table12_ours_vs_dspark:
    """Table 12: T1, R^oracle, R^self per slot for DSpark and ours."""
    input:
        summary=GAPS_SUMMARY,
    output:
        tex="paper/tables/table12_ours_vs_dspark.tex",
        csv=report(
            "paper/tables/table12_ours_vs_dspark.csv",
            caption="../report/table12_ours_vs_dspark.rst",
            category="Gaps",
        ),
        values="paper/values/table12_ours_vs_dspark.tex",
    params:
        spec=as_json({}),
    log:
        f"{LOGS}/report/table12_ours_vs_dspark.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table12_ours_vs_dspark --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule tableF5_single_slot:
    """Table F.5: held-out single-slot best-response gains per slot."""
    input:
        summary=GAPS_SUMMARY,
    output:
        tex="paper/tables/tableF5_single_slot.tex",
        csv=report(
            "paper/tables/tableF5_single_slot.csv",
            caption="../report/tableF5_single_slot.rst",
            category="Gaps",
        ),
        values="paper/values/tableF5_single_slot.tex",
    params:
        spec=as_json({}),
    log:
        f"{LOGS}/report/tableF5_single_slot.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report tableF5_single_slot --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule tableF6_sweeps:
    """Table F.6: coordinate sweeps in both directions vs the sum of isolated gains."""
    input:
        summary=GAPS_SUMMARY,
    output:
        tex="paper/tables/tableF6_sweeps.tex",
        csv=report(
            "paper/tables/tableF6_sweeps.csv",
            caption="../report/tableF6_sweeps.rst",
            category="Gaps",
        ),
        values="paper/values/tableF6_sweeps.tex",
    params:
        spec=as_json({}),
    log:
        f"{LOGS}/report/tableF6_sweeps.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report tableF6_sweeps --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule table10_trajectory:
    """Table 10: offline accepted length after every epoch of the trajectory variants."""
    input:
        summary=f"results/{PRIMARY}/gaps/trajectory.parquet",
    output:
        tex="paper/tables/table10_trajectory.tex",
        csv=report(
            "paper/tables/table10_trajectory.csv",
            caption="../report/table10_trajectory.rst",
            category="Gaps",
        ),
        values="paper/values/table10_trajectory.tex",
    params:
        spec=as_json({}),
    log:
        f"{LOGS}/report/table10_trajectory.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table10_trajectory --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"


rule table13_components:
    """Table 13: one-epoch component arms, accepted length and paired change from the baseline."""
    input:
        summary=f"results/{PRIMARY}/gaps/components.parquet",
    output:
        tex="paper/tables/table13_components.tex",
        csv=report(
            "paper/tables/table13_components.csv",
            caption="../report/table13_components.rst",
            category="Gaps",
        ),
        values="paper/values/table13_components.tex",
    params:
        spec=as_json({"baseline": COMPONENTS["baseline"], "arms": ARMS}),
    log:
        f"{LOGS}/report/table13_components.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report table13_components --summary {input.summary} --spec {params.spec:q}"
        " --out-dir paper/tables --out-values {output.values} --log {log} --threads {threads}"
