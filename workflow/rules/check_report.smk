# Checks of a user's own drafters (the config's `check` section, written by `floorgap check`):
# one page per check from the decompose group's gaps summary and the floors summary of its
# target, the export fidelity of folders with a reference, and of the folders it serves the
# serving records (with the engine's own counters) and their replayed rounds (the serving and
# serving_replay rules, a few rows per task). Wired only when the
# section names a check.

if W.checks:

    rule check_report:
        """One check: verdicts, floor and model gap by slot beside the lookup tables, tau,
        best-response gains, and paired differences between its drafters, as a page and a
        markdown summary."""
        input:
            gaps=lambda w: f"results/{W.check_target(w.name)}/gaps/decompose.parquet",
            floors=lambda w: f"results/{W.check_target(w.name)}/floors/summary.parquet",
            fidelity=lambda w: W.fidelity_files(w.name),
            replay=lambda w: W.check_replay_files(w.name),
            served=lambda w: W.check_serving_files(w.name),
        output:
            html="results/check/{name}/index.html",
            md="results/check/{name}/summary.md",
        wildcard_constraints:
            name="|".join(re.escape(n) for n in W.checks),
        params:
            spec=lambda w: as_json(W.check_spec(w.name)),
        log:
            f"{LOGS}/check_report/{{name}}.log",
        threads: 1
        resources:
            mem_mb=2000,
            runtime=10,
        conda:
            CONDA_ENV
        shell:
            "floorgap check_report --spec {params.spec:q} --gaps {input.gaps}"
            " --floors {input.floors} --fidelity {input.fidelity} --replay {input.replay}"
            " --served {input.served} --out-html {output.html} --out-md {output.md}"
            " --log {log} --threads {threads}"
