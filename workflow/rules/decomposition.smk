# A user's own drafters (the config's `decompose` section, written by `floorgap decompose`):
# each one's rejection split into information floor and model gap by slot, from the gaps summary
# of the decompose group and the floors summary. Wired only when the section names a drafter.

if W.decompose:

    rule decomposition:
        """One decompose drafter: floor, risk, model gap and its share, exposure and R^self
        (order 1) and tau, as a long csv, a LaTeX tabular and a markdown table."""
        input:
            gaps="results/{target}/gaps/decompose.parquet",
            floors="results/{target}/floors/summary.parquet",
        output:
            csv="results/{target}/decomposition/{drafter}.csv",
            tex="results/{target}/decomposition/{drafter}.tex",
            md="results/{target}/decomposition/{drafter}.md",
        wildcard_constraints:
            drafter="|".join(W.decompose),
        params:
            spec=lambda w: as_json(W.decomposition_spec(w.target, w.drafter)),
        log:
            f"{LOGS}/decomposition/{{target}}/{{drafter}}.log",
        threads: 1
        resources:
            mem_mb=2000,
            runtime=10,
        conda:
            CONDA_ENV
        shell:
            "floorgap decomposition --spec {params.spec:q} --gaps {input.gaps}"
            " --floors {input.floors} --out-csv {output.csv} --out-tex {output.tex}"
            " --out-md {output.md} --log {log} --threads {threads}"
