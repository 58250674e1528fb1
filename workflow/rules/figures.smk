# Figures of the paper (CPU), one rule per item, named after it. Each reads the primary target's
# analysis summary and gets the plotting options (config `figures`) as its only params, so a
# plotting change reruns the figure rules and nothing upstream.

FLOORS_SUMMARY = f"results/{PRIMARY}/floors/summary.parquet"


rule fig2_floor_by_slot:
    """Fig. 2: T0 and T1 by slot (importance route, split-half bounds) with intervals."""
    input:
        summary=FLOORS_SUMMARY,
    output:
        pdf="figures/fig2_floor_by_slot.pdf",
        png=report(
            "figures/fig2_floor_by_slot.png",
            caption="../report/fig2_floor_by_slot.rst",
            category="Floors",
        ),
        values="paper/values/fig2_floor_by_slot.tex",
    params:
        spec=figures_spec(),
    log:
        f"{LOGS}/report/fig2_floor_by_slot.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report fig2_floor_by_slot --summary {input.summary} --spec {params.spec:q}"
        " --out-dir figures --out-values {output.values} --log {log} --threads {threads}"


rule fig3_floor_by_domain:
    """Fig. 3: T0 by slot per domain with intervals."""
    input:
        summary=FLOORS_SUMMARY,
    output:
        pdf="figures/fig3_floor_by_domain.pdf",
        png=report(
            "figures/fig3_floor_by_domain.png",
            caption="../report/fig3_floor_by_domain.rst",
            category="Floors",
        ),
        values="paper/values/fig3_floor_by_domain.tex",
    params:
        spec=figures_spec(),
    log:
        f"{LOGS}/report/fig3_floor_by_domain.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report fig3_floor_by_domain --summary {input.summary} --spec {params.spec:q}"
        " --out-dir figures --out-values {output.values} --log {log} --threads {threads}"


rule figD2_kmedian:
    """Fig. D.2: share of T0 removed by K oracle-routed prototypes, with restart spread."""
    input:
        summary=FLOORS_SUMMARY,
    output:
        pdf="figures/figD2_kmedian.pdf",
        png=report(
            "figures/figD2_kmedian.png",
            caption="../report/figD2_kmedian.rst",
            category="Floors",
        ),
        values="paper/values/figD2_kmedian.tex",
    params:
        spec=figures_spec(),
    log:
        f"{LOGS}/report/figD2_kmedian.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report figD2_kmedian --summary {input.summary} --spec {params.spec:q}"
        " --out-dir figures --out-values {output.values} --log {log} --threads {threads}"
