# A notebook over the floors and gaps summaries of a finished run, for a user's own plots:
#   snakemake --cores 1 results/<target>/explore/overview.csv             # run it
#   snakemake --cores 1 --edit-notebook results/<target>/explore/overview.csv   # open it in Jupyter
# Not part of `all`; the executed notebook is kept as the rule's log.


rule explore:
    """The records of one target in pandas: floors and gaps summaries, per-anchor floors."""
    input:
        floors="results/{target}/floors/summary.parquet",
        anchor_slot="results/{target}/floors/anchor_slot.parquet",
        gaps="results/{target}/gaps/summary.parquet",
    output:
        overview="results/{target}/explore/overview.csv",
        figure="results/{target}/explore/floor_and_risk.png",
    params:
        roles=W.roles,
    log:
        notebook=f"{LOGS}/explore/{{target}}.ipynb",
    threads: 1
    resources:
        mem_mb=2000,
        runtime=10,
    conda:
        CONDA_ENV
    notebook:
        "../notebooks/explore.py.ipynb"
