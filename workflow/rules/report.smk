# Report items (CPU): one rule per row of floorgap.reports.registry (and of the plugin modules
# named in the config's report.plugins), named after the item. Each reads an analysis summary of
# the primary target and gets its options (plotting options for figures, drafter roles for the
# gap half) as its only params, so a plotting change reruns the figure rules and nothing upstream.
REPORT_PLUGINS = list(config.get("report", {}).get("plugins", []))
ITEMS = report_items(REPORT_PLUGINS)


def item_outputs(item):
    """pdf + png (figures) or tex + csv (tables), the second one in the HTML report."""
    caption = item.caption or f"../report/{item.name}.rst"
    (first, second) = item.files
    return {
        first.rsplit(".", 1)[1]: first,
        second.rsplit(".", 1)[1]: report(second, caption=caption, category=item.section),
        "values": item.values,
    }


for _item in ITEMS.values():

    rule:
        name:
            _item.name
        input:
            **W.report_inputs(_item.reads),
        output:
            **item_outputs(_item),
        params:
            spec=as_json(W.report_spec(_item.reads, _item.kind)),
            inputs=lambda w, input: " ".join(f"--input {k}={v}" for k, v in input.items()),
            plugins=" ".join(f"--plugin {p}" for p in REPORT_PLUGINS),
            item=_item.name,
            # the folder of the item's first file (figures/ or paper/tables/)
            out_dir=lambda w, output: os.path.dirname(output[0]),
        log:
            f"{LOGS}/report/{_item.name}.log",
        threads: 1
        resources:
            mem_mb=2000,
            runtime=10,
        # On a cluster the items that wait on one summary go as one job (the SLURM profile's
        # group-components); a local run ignores groups.
        group:
            f"report_{_item.reads}"
        conda:
            CONDA_ENV
        shell:
            "floorgap report {params.item} {params.inputs} --spec {params.spec:q} {params.plugins}"
            " --out-dir {params.out_dir} --out-values {output.values} --log {log}"
            " --threads {threads}"
