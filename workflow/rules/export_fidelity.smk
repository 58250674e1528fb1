# A checked folder against the weights it was exported from (the check section's references):
# both run on a few anchors of every domain, their proposals compared slot by slot. Wired only
# when a check names a reference.

FIDELITY = [(name, d) for name in W.checks for d in (W.checks[name].get("references") or {})]

if FIDELITY:

    rule export_fidelity:
        """One folder and its reference weights on the same anchors: the largest |q_ref - q|,
        the mean TV and the argmax agreement by slot, or the error when the folder does not
        read with the reference's structure."""
        input:
            model=lambda w: model_dir(W.check_target(w.name)),
            corpus=lambda w: [f"results/{W.check_target(w.name)}/corpus/{d}.parquet"
                              for d in W.domains],
            anchors=lambda w: [f"results/{W.check_target(w.name)}/anchors/{d}.parquet"
                               for d in W.domains],
            reference=lambda w: W.checks[w.name]["references"][w.drafter],
            folder=lambda w: W.variant_entry(
                w.drafter, W.check_target(w.name))["checkpoint"]["path"],
        output:
            "results/check/{name}/fidelity/{drafter}.json",
        wildcard_constraints:
            name="|".join(re.escape(n) for n, _ in FIDELITY),
            drafter="|".join(re.escape(d) for _, d in FIDELITY),
        params:
            spec=lambda w: as_json(W.fidelity_spec(w.name, w.drafter)),
        log:
            f"{LOGS}/export_fidelity/{{name}}/{{drafter}}.log",
        threads: 1
        resources:
            mem_mb=12000,
            runtime=30,
            gpu=lambda w: W.gpus(W.check_target(w.name)),
            slurm_partition=lambda w: W.partition(W.check_target(w.name)),
            gpu_model=lambda w: W.gpu_model(W.check_target(w.name)),
        conda:
            CONDA_ENV
        shell:
            "floorgap export_fidelity --spec {params.spec:q} --model-dir {input.model}"
            " --corpus {input.corpus} --anchors {input.anchors} --out {output} --log {log}"
            " --threads {threads}"
