# The paper: the values of every paper item and paper/main.pdf. The items are the registry's
# rows with in_paper (floorgap.reports.registry).
PAPER_ITEMS = [item for item in ITEMS.values() if item.in_paper]
# The text lives in the repository; the build happens in the working directory's paper/, which
# holds the generated values and tables (the same folder when the workflow runs in the repo).
PAPER_SOURCE = Path(workflow.basedir, "paper", "main.tex").resolve()


rule values:
    """paper/values.tex: the macros of every item, so the text cites only computed numbers."""
    input:
        [item.values for item in PAPER_ITEMS],
    output:
        "paper/values.tex",
    log:
        f"{LOGS}/values/values.log",
    threads: 1
    resources:
        mem_mb=500,
        runtime=5,
    conda:
        CONDA_ENV
    shell:
        "floorgap values --out {output} --log {log} {input}"


rule paper:
    """Compile paper/main.tex (text in the repository; numbers, tables, figures generated)."""
    input:
        tex=PAPER_SOURCE,
        values="paper/values.tex",
        item_files=[path for item in PAPER_ITEMS for path in item.files],
    output:
        "paper/main.pdf",
    log:
        f"{LOGS}/paper/paper.log",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CONDA_ENV
    shell:
        "floorgap paper --tex {input.tex:q} --out {output} --log {log}"
