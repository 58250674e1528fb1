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
import sys
from pathlib import Path

from floorgap.errors import StageError
from floorgap.stages._cli import run_stage, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap rollouts", "Sample target rollouts at one shard of anchors.")
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--anchors", required=True, type=Path)
    parser.add_argument("--out-paths", required=True, type=Path)
    parser.add_argument("--out-floors", required=True, type=Path)
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    from floorgap.progress import progress
    from floorgap.data.anchors import anchor_contexts, shard_rows
    from floorgap.models.targets import load_target
    from floorgap.probes.rollouts import anchor_records, sample_block
    from floorgap.sampling import SamplingLaw
    from floorgap.records import dataclass_rows, read_metadata, read_table, write_table

    spec = args.spec
    cfg, target = spec["rollouts"], spec["target"]
    anchors = shard_rows(read_table(args.anchors), int(spec["shard"]), int(cfg["shards"]))
    if not len(anchors):
        raise StageError(f"shard {spec['shard']} of {args.anchors} holds no anchors; "
                         f"lower rollouts.shards (now {cfg['shards']})")
    corpus = read_table(args.corpus)
    anchor_meta = read_metadata(args.anchors)
    gamma = int(spec["gamma"])
    if int(anchor_meta.get("gamma", gamma)) != gamma:
        raise StageError(f"{args.anchors} was drawn for gamma={anchor_meta.get('gamma')}, "
                         f"not {gamma}; rebuild the anchors")
    law = SamplingLaw.from_spec(spec["law"])
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    contexts = anchor_contexts(corpus, anchors)
    path_rows, floor_rows, seconds = [], [], []
    bar = progress(total=len(anchors), desc=f"rollouts shard {spec['shard']}", unit="anchor")
    for a, ctx in zip(anchors.itertuples(index=False), contexts):
        block = sample_block(model, ctx, n_paths=int(cfg["paths"]), gamma=gamma, law=law,
                             anchor_seed=int(a.anchor_seed),
                             forward_batch=int(cfg["forward_batch"]),
                             reveal_paths=int(cfg["reveal_paths"]))
        paths, floors = anchor_records(a.anchor_id, block, store_top_k=int(cfg["store_top_k"]))
        path_rows += paths
        floor_rows += floors
        seconds.append(block.seconds)
        logger.info("anchor %s: context %d tokens, %.2f s, T0 by slot %s", a.anchor_id,
                    len(ctx), block.seconds, " ".join(f"{f.t0:.3f}" for f in floors))
        bar.update()
    bar.close()
    meta = {"target": target["name"], "domain": anchor_meta.get("domain"),
            "rollouts": cfg, "law": spec["law"], "gamma": gamma, "shard": spec["shard"],
            "anchors": len(anchors), "dtype": target["dtype"], "device": target["device"],
            "stand_in_for": anchor_meta.get("stand_in_for")}
    write_table(args.out_paths, dataclass_rows(path_rows), meta)
    write_table(args.out_floors, dataclass_rows(floor_rows), meta)
    logger.info("wrote %d anchors x %d paths; mean %.2f s per anchor", len(anchors),
                int(cfg["paths"]), sum(seconds) / len(seconds))

