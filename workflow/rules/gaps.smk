# The gap half (CPU): model gaps against the floors, exposure, free vs serving risk, dependence
# and best-response gains of the drafters of one target. One summary per evaluation group:
#   summary     the drafters of drafters.variants (final weights), every statistic;
#   trajectory  every epoch of the drafters.trajectory variants (table 10);
#   components  the one-epoch arms of drafters.components, each against the baseline (table 13);
#   budget      every epoch of drafters.budget.variants and the budget arms (Appendix E);
#   decompose   the user's checkpoints of the decompose section beside the lookup tables of
#               their orders (floorgap decompose).
# `summary` and `decompose` hold lookup tables (drafters.lookups) and each drafter's paired
# difference to the tables of its order.
# A cross_target target has only `summary`, of its two baselines (Fig. 5).


rule gaps:
    """G0, G1, exposure, R^serve vs R, D_k, tau vs tau_indep, single-slot gains, sweeps."""
    input:
        anchor_slot="results/{target}/floors/anchor_slot.parquet",
        paths=gaps_records("paths"),
        slots=gaps_records("slots"),
    output:
        summary="results/{target}/gaps/{summary}.parquet",
    params:
        spec=lambda w: as_json(W.gaps_spec(w.summary, w.target)),
    log:
        f"{LOGS}/gaps/{{target}}/{{summary}}.log",
    threads: 1
    resources:
        mem_mb=8000,
        runtime=60,
    conda:
        CONDA_ENV
    shell:
        "floorgap gaps --spec {params.spec:q} --anchor-slot {input.anchor_slot}"
        " --paths {input.paths} --slots {input.slots} --out-summary {output.summary}"
        " --log {log} --threads {threads}"
