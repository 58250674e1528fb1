"""``floorgap drafter_eval --spec JSON --model-dir DIR --corpus C --anchors A
--rollouts PATHS.parquet --drafter D1.pt [D2.pt ...] --out-paths P1.parquet [P2 ...]
--out-slots S1.parquet [S2 ...] --log LOG``

Trained drafters on one shard of one domain's anchors (see floorgap.probes.drafter_eval, whose
:func:`~floorgap.probes.drafter_eval.evaluate_shard` this command wraps): on
exactly the target paths the rollouts stage stored for that shard, each drafter's warped
proposal at every slot, per path x slot scalars (p, q, TV, accept factor, self chain) and per
slot risks (R, R^oracle, R^self, exposure), one pair of record files per drafter. The target's
p_k along the paths is computed once per anchor and shared by the drafters. The spec holds
``target`` (config entry with ``name``), ``rollouts`` (``forward_batch``, ``shards``), ``law``,
``gamma``, ``shard`` and ``variants`` (the label each drafter's records carry, in the order of
``--drafter``). The shard's anchors are those of ``floorgap.data.anchors.shard_rows``; every one
must have its stored paths.
"""

from __future__ import annotations

import argparse
import logging

from floorgap.data.anchors import anchor_contexts, read_shard
from floorgap.errors import StageError
from floorgap.models.targets import load_target
from floorgap.probes.drafter_eval import evaluate_shard, load_drafters, stored_paths
from floorgap.records import dataclass_rows, prompt_format, write_table
from floorgap.sampling import SamplingLaw
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap drafter_eval",
                          "Evaluate drafters on the stored target paths of one shard.")
    add_files(parser, "--model-dir", "--corpus", "--anchors", "--rollouts", "--drafter+",
              "--out-paths+", "--out-slots+",
              help={"--rollouts": "the rollouts stage's paths-{shard}.parquet of this shard",
                    "--drafter": "trained drafters (final.pt or epochs/epoch-<e>.pt)",
                    "--out-paths": "one per drafter, in the same order",
                    "--out-slots": "one per drafter, in the same order"})
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    cfg, target = spec["rollouts"], spec["target"]
    gamma = int(spec["gamma"])
    anchors, anchor_meta, corpus = read_shard(args.anchors, args.corpus, shard=int(spec["shard"]),
                                              shards=int(cfg["shards"]), gamma=gamma)
    law = SamplingLaw.from_spec(spec["law"])
    by_anchor = stored_paths(args.rollouts, list(anchors.anchor_id), gamma, spec["law"])
    labels = [str(v) for v in spec["variants"]]
    if not len(labels) == len(args.drafter) == len(args.out_paths) == len(args.out_slots):
        raise StageError(f"{len(labels)} variant labels, {len(args.drafter)} --drafter, "
                         f"{len(args.out_paths)} --out-paths and {len(args.out_slots)} "
                         "--out-slots: give one of each per drafter, in the same order")
    if len(set(labels)) != len(labels):
        raise StageError(f"variant labels repeat ({labels}); each drafter needs its own")
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    drafters = load_drafters(args.drafter, model, gamma)
    ev = evaluate_shard(model, drafters, labels, anchors, anchor_contexts(corpus, anchors),
                        by_anchor, law=law, gamma=gamma, forward_batch=int(cfg["forward_batch"]),
                        desc=f"drafter_eval {len(drafters)} drafters shard {spec['shard']}",
                        logger=logger)
    for label, drafter, out_paths, out_slots in zip(labels, drafters, args.out_paths,
                                                    args.out_slots, strict=True):
        meta = {"stage": "drafter_eval", "target": target["name"],
                "prompts": prompt_format(target), "variant": label,
                "domain": anchor_meta.get("domain"), "order": int(drafter.order),
                "drafter_kind": drafter.cfg.kind, "rollouts": cfg, "law": spec["law"],
                "gamma": gamma, "shard": spec["shard"], "anchors": len(anchors),
                "logp_mismatches": ev.mismatches[label], "dtype": target["dtype"],
                "device": target["device"], "stand_in_for": anchor_meta.get("stand_in_for")}
        write_table(out_paths, dataclass_rows(ev.paths[label]), meta)
        write_table(out_slots, dataclass_rows(ev.slots[label]), meta)
    if any(ev.mismatches.values()):
        logger.warning("path-slots whose recomputed p differs from the stored logp by more "
                       "than the tolerance: %s", ev.mismatches)
    logger.info("wrote %d anchors x %d drafters; per anchor: target %.2f s, %s", len(anchors),
                len(drafters), sum(ev.target_seconds) / len(ev.target_seconds),
                ", ".join(f"{label} {sum(v) / len(v):.2f} s" for label, v in ev.seconds.items()))
