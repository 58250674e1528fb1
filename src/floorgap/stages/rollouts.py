"""``floorgap rollouts --spec JSON --model-dir DIR --corpus C --anchors A
--out-paths PATHS.parquet --out-floors FLOORS.parquet --log LOG``

Target rollouts for one shard of one domain's anchors (see floorgap.probes.rollouts): M paths
of gamma tokens per anchor, their top-K reads, and the exact floors computed from the full
vocabulary while it is on the device. The spec holds ``target`` (config entry with ``name``),
``rollouts`` (``paths``, ``forward_batch``, ``store_top_k``, ``reveal_paths``, ``shards``),
``law``, ``gamma`` and ``shard`` (this job's index). Anchor i of the domain (sorted by id)
belongs to shard i mod shards, so records do not depend on the number of shards once the
shards are concatenated in anchor order.
"""

from __future__ import annotations

import argparse
import logging

from floorgap.data.anchors import read_shard
from floorgap.models.targets import load_target
from floorgap.probes.rollouts import roll_out_anchors
from floorgap.records import dataclass_rows, prompt_format, write_table
from floorgap.sampling import SamplingLaw
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap rollouts", "Sample target rollouts at one shard of anchors.")
    add_files(parser, "--model-dir", "--corpus", "--anchors", "--out-paths", "--out-floors")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    cfg, target = spec["rollouts"], spec["target"]
    gamma = int(spec["gamma"])
    anchors, anchor_meta, corpus = read_shard(
        args.anchors, args.corpus, shard=int(spec["shard"]), shards=int(cfg["shards"]),
        gamma=gamma)
    law = SamplingLaw.from_spec(spec["law"])
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    run = roll_out_anchors(model, anchors, corpus, cfg=cfg, gamma=gamma, law=law,
                           desc=f"rollouts shard {spec['shard']}")
    meta = {"target": target["name"], "prompts": prompt_format(target),
            "domain": anchor_meta.get("domain"), "rollouts": cfg, "law": spec["law"],
            "gamma": gamma, "shard": spec["shard"], "anchors": len(anchors),
            "dtype": target["dtype"], "device": target["device"],
            "stand_in_for": anchor_meta.get("stand_in_for")}
    write_table(args.out_paths, dataclass_rows(run.path_rows), meta)
    write_table(args.out_floors, dataclass_rows(run.floor_rows), meta)
    logger.info("wrote %d anchors x %d paths; mean %.2f s per anchor", len(anchors),
                int(cfg["paths"]), sum(run.seconds) / len(run.seconds))
