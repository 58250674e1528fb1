# The paper: every figure and table item, the values they export, and paper/main.pdf.
PAPER_FIGURES = [
    "fig2_floor_by_slot",
    "fig3_floor_by_domain",
    "figD2_kmedian",
    "fig4_drafter_decomposition",
    "fig6_slot_priority",
    "fig7_prefix_attention",
]
PAPER_TABLES = [
    "table3_floor_intervals",
    "table4_mi_locality",
    "tableD1_concentration",
    "table5_dflash",
    "table6_dspark",
    "table7_serving_risk",
    "table8_dependence",
    "table10_trajectory",
    "table12_ours_vs_dspark",
    "table13_components",
    "tableF5_single_slot",
    "tableF6_sweeps",
]
PAPER_ITEMS = PAPER_FIGURES + PAPER_TABLES
# The text lives in the repository; the build happens in the working directory's paper/, which
# holds the generated values and tables (the same folder when the workflow runs in the repo).
PAPER_SOURCE = Path(workflow.basedir, "paper", "main.tex").resolve()


rule values:
    """paper/values.tex: the macros of every item, so the text cites only computed numbers."""
    input:
        [f"paper/values/{item}.tex" for item in PAPER_ITEMS],
    output:
        "paper/values.tex",
    log:
        f"{LOGS}/paper/values.log",
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "{PY}.report values --out {output} --log {log} {input}"


rule paper:
    """Compile paper/main.tex (text in the repository; numbers, tables, figures generated)."""
    input:
        tex=PAPER_SOURCE,
        values="paper/values.tex",
        figures=[f"figures/{item}.pdf" for item in PAPER_FIGURES],
        tables=[f"paper/tables/{item}.tex" for item in PAPER_TABLES],
    output:
        "paper/main.pdf",
    log:
        f"{LOGS}/paper/latexmk.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        "../../envs/floorgap.yaml"
    shell:
        "(cd paper && latexmk -pdf -interaction=nonstopmode -halt-on-error {input.tex:q})"
        " > {log} 2>&1"
