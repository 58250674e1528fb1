# floorgap: the paper "Beyond Parallel Blindness: Information Floors and Model Gaps in Block
# Drafting" as one DAG. `snakemake --cores all` runs the embedded default (config.yaml);
# `--configfile workflow/configs/<name>.yaml` selects a paper-scale or smoke config.
# Wiring only: every rule calls the console command `floorgap <stage>`; the decisions live in
# floorgap.config and the report items in floorgap.reports.registry.
from pathlib import Path

# The embedded default, unless `--configfile` names another config: that one then *replaces*
# config.yaml instead of being merged into it (a smoke run must not inherit the default target).
if not workflow.overwrite_configfiles:

    configfile: "config.yaml"


# One rule file per stage, in DAG order; each must exist.
include: "workflow/rules/common.smk"
include: "workflow/rules/models.smk"
include: "workflow/rules/corpus.smk"
include: "workflow/rules/anchors.smk"
include: "workflow/rules/rollouts.smk"
include: "workflow/rules/floors.smk"
include: "workflow/rules/mi.smk"
include: "workflow/rules/drafter_data.smk"
include: "workflow/rules/drafters.smk"
include: "workflow/rules/drafter_eval.smk"
include: "workflow/rules/gaps.smk"
include: "workflow/rules/decomposition.smk"
include: "workflow/rules/export_fidelity.smk"
include: "workflow/rules/check_report.smk"
include: "workflow/rules/export.smk"
include: "workflow/rules/serving_rows.smk"
include: "workflow/rules/serving.smk"
include: "workflow/rules/serving_replay.smk"
include: "workflow/rules/serving_summary.smk"
include: "workflow/rules/floor_variants.smk"
include: "workflow/rules/api_floors.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/paper.smk"
include: "workflow/rules/manifest.smk"
include: "workflow/rules/explore.smk"


rule all:
    default_target: True
    input:
        "paper/main.pdf",
        [f"results/{target}/manifest.json" for target in W.targets],
        # report items outside the paper (plugins): built by `all` too
        [path for item in ITEMS.values() if not item.in_paper for path in item.files],
        # the decompose section's drafters (none unless the config names some)
        [path for target in W.targets for path in W.decomposition_files(target)],
        # the check section's pages (none unless the config names a check)
        W.check_files(),
        # every drafter of the primary target as the checkpoint folders serving engines load
        W.export_targets(),


# The run ends with how many of the paper's findings held on it (floorgap claims).
onsuccess:
    if Path("paper/tables/claims.csv").exists():
        shell("floorgap claims --table paper/tables/claims.csv")
