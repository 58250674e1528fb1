# floorgap: the paper "Beyond Parallel Blindness: Information Floors and Model Gaps in Block
# Drafting" as one DAG. `snakemake --cores all` runs the embedded default (config.yaml);
# `--configfile workflow/configs/<name>.yaml` selects a paper-scale or smoke config.
# Wiring only: every rule calls a small CLI `python -m floorgap.<stage>`.
from pathlib import Path

# The embedded default, unless `--configfile` names another config: that one then *replaces*
# config.yaml instead of being merged into it (a smoke run must not inherit the default target).
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


include: "workflow/rules/common.smk"


# Stages in DAG order; a stage's rule file joins the workflow as soon as it exists.
STAGES = [
    "models",
    "corpus",
    "anchors",
    "rollouts",
    "floors",
    "mi",
    "drafters",
    "drafter_eval",
    "serving_risk",
    "bench",
    "figures",
    "tables",
    "paper",
]
for _stage in STAGES:
    if Path(workflow.basedir, "workflow", "rules", f"{_stage}.smk").exists():

        include: f"workflow/rules/{_stage}.smk"


rule all:
    default_target: True
    input:
        final_outputs(),
