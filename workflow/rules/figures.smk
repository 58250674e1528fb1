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


# Gap half: items from the serving_risk stage's summary of the primary target.
GAPS_SUMMARY = f"results/{PRIMARY}/gaps/summary.parquet"


rule fig4_drafter_decomposition:
    """Fig. 4: DFlash risk as T0 + gap; DSpark self risk as T1 + gap + exposure."""
    input:
        summary=GAPS_SUMMARY,
    output:
        pdf="figures/fig4_drafter_decomposition.pdf",
        png=report(
            "figures/fig4_drafter_decomposition.png",
            caption="../report/fig4_drafter_decomposition.rst",
            category="Gaps",
        ),
        values="paper/values/fig4_drafter_decomposition.tex",
    params:
        spec=figures_spec(),
    log:
        f"{LOGS}/report/fig4_drafter_decomposition.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report fig4_drafter_decomposition --summary {input.summary} --spec {params.spec:q}"
        " --out-dir figures --out-values {output.values} --log {log} --threads {threads}"


rule fig6_slot_priority:
    """Fig. 6: model gap by slot and held-out single-slot best-response gain by slot."""
    input:
        summary=GAPS_SUMMARY,
    output:
        pdf="figures/fig6_slot_priority.pdf",
        png=report(
            "figures/fig6_slot_priority.png",
            caption="../report/fig6_slot_priority.rst",
            category="Gaps",
        ),
        values="paper/values/fig6_slot_priority.tex",
    params:
        spec=figures_spec(),
    log:
        f"{LOGS}/report/fig6_slot_priority.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report fig6_slot_priority --summary {input.summary} --spec {params.spec:q}"
        " --out-dir figures --out-values {output.values} --log {log} --threads {threads}"


rule fig7_prefix_attention:
    """Fig. 7: ours vs DSpark per slot: model gap, exposure, self risk."""
    input:
        summary=GAPS_SUMMARY,
    output:
        pdf="figures/fig7_prefix_attention.pdf",
        png=report(
            "figures/fig7_prefix_attention.png",
            caption="../report/fig7_prefix_attention.rst",
            category="Gaps",
        ),
        values="paper/values/fig7_prefix_attention.tex",
    params:
        spec=figures_spec(),
    log:
        f"{LOGS}/report/fig7_prefix_attention.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report fig7_prefix_attention --summary {input.summary} --spec {params.spec:q}"
        " --out-dir figures --out-values {output.values} --log {log} --threads {threads}"
