# Trained drafters as the checkpoint folders serving engines load (floorgap.models.engine_formats):
# `all` builds every drafter of drafters.variants of the primary target in its natural formats
# (W.export_targets); any drafter can be asked for by naming its folder.


rule export:
    """One drafter's final.pt as a checkpoint folder (config.json, model.safetensors in fp32),
    with the target's depth, positions, name and architecture in its config."""
    input:
        drafter="results/{target}/drafters/{variant}/final.pt",
        model=lambda w: model_dir(w.target),
    output:
        folder=directory("results/{target}/export/{variant}/{format}"),
    wildcard_constraints:
        # floorgap.models.engine_formats.FORMATS (not imported here: it would load torch)
        format="dflash|dspark|speculators|floorgap",
    params:
        spec=lambda w: as_json(
            {"target": W.target(w.target), "variant": w.variant, "format": w.format}
        ),
    log:
        f"{LOGS}/export/{{target}}/{{variant}}/{{format}}.log",
    threads: 1
    resources:
        mem_mb=12000,
        runtime=60,
        gpu=lambda w: W.gpus(w.target),
        slurm_partition=lambda w: W.partition(w.target),
        gpu_model=lambda w: W.gpu_model(w.target),
    conda:
        CONDA_ENV
    shell:
        "floorgap export --spec {params.spec:q} --model-dir {input.model}"
        " --drafter {input.drafter} --out {output.folder} --log {log} --threads {threads}"
