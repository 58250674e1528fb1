"""``floorgap floor_variants --spec JSON --model-dir DIR --corpus C... --anchors A... --out F``

One robustness variant of the floor measurement (floorgap.probes.floor_variants) on the first
``anchors_per_domain`` anchors of each domain: ``finite_m`` (App. C.3: every M of ``paths`` on
nested paths), ``block16`` (App. C.4: ``gamma`` slots, on the anchors whose response leaves
room) or ``sampling_law`` (App. C.7: the floors under ``law`` and under the evaluation law, on the
same anchors). The spec holds ``variant`` (name and settings), ``law`` (the evaluation law),
``gamma``, ``paths`` and ``forward_batch`` (the rollouts' defaults) and ``target``. Writes the
per anchor-slot records and their summary (floorgap.analysis.floor_variants).
"""

from __future__ import annotations

import argparse
import logging

import pandas as pd

from floorgap.analysis.floor_variants import summarise_variant
from floorgap.data.anchors import leading_anchors
from floorgap.errors import StageError
from floorgap.models.targets import load_target
from floorgap.probes.floor_variants import variant_floor_rows
from floorgap.records import read_table, write_table
from floorgap.sampling import SamplingLaw
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap floor_variants",
                          "Floors with one setting changed (M, gamma or the sampling law).")
    add_files(parser, "--model-dir", "--out", "--out-summary", "--corpus+", "--anchors+")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    variant, target = spec["variant"], spec["target"]
    name = variant["name"]
    gamma = int(variant.get("gamma", spec["gamma"]))
    paths = [int(m) for m in variant.get("paths", [spec["paths"]])]
    laws = {"evaluation": spec["law"], **({"variant": variant["law"]} if "law" in variant else {})}
    corpus = pd.concat([read_table(f) for f in args.corpus], ignore_index=True)
    anchors = leading_anchors(pd.concat([read_table(f) for f in args.anchors], ignore_index=True),
                              int(spec["anchors_per_domain"]),
                              room=gamma if gamma != int(spec["gamma"]) else None)
    if not len(anchors):
        raise StageError(f"variant {name}: no anchor leaves room for a block of {gamma} tokens; "
                         "lower its gamma or raise corpus.max_new_tokens")
    logger.info("variant %s: %d anchors, gamma %d, M %s, laws %s", name, len(anchors), gamma,
                paths, laws)
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    out = pd.concat([pd.DataFrame(variant_floor_rows(
        model, anchors, corpus, paths=paths, gamma=gamma, law=SamplingLaw.from_spec(law),
        forward_batch=int(spec["forward_batch"]), desc=f"{name} ({label} law)")).assign(law=label)
        for label, law in laws.items()], ignore_index=True)
    meta = {"stage": "floor_variants", "variant": variant, "target": target["name"],
            "gamma": gamma, "paths": paths, "laws": laws, "anchors": len(anchors),
            "anchors_per_domain": int(spec["anchors_per_domain"])}
    write_table(args.out, out, meta)
    summary = summarise_variant(out)
    write_table(args.out_summary, summary, meta)
    last = summary[summary["slot"] == gamma - 1]
    for r in last.itertuples(index=False):
        logger.info("%s law, M=%d, slot %d: T0 %.4f, T1 %.4f (split, covered), fit diff %+.4f",
                    r.law, r.paths, r.slot, r.t0, r.t1_split, r.fit_diff)
