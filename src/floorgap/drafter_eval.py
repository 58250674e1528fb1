"""``python -m floorgap.drafter_eval --spec JSON --model-dir DIR --corpus C --anchors A
--rollouts PATHS.parquet --drafter FINAL.pt --out-paths P.parquet --out-slots S.parquet --log LOG``

A trained drafter on one shard of one domain's anchors (see floorgap.probes.drafter_eval): on
exactly the target paths the rollouts stage stored for that shard, the drafter's warped proposal
at every slot, per path x slot scalars (p, q, TV, accept factor, self chain) and per slot risks
(R, R^oracle, R^self, exposure). The spec holds ``target`` (config entry with ``name``),
``rollouts`` (``forward_batch``, ``shards``), ``law``, ``gamma``, ``shard`` and ``variant``.
The shard's anchors are those of ``floorgap.rollouts.shard_rows``; every one must have its
stored paths.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from floorgap.cli import StageError, run_stage, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap.drafter_eval",
                          "Evaluate a drafter on the stored target paths of one shard.")
    parser.add_argument("--model-dir", required=True, type=Path)
    parser.add_argument("--corpus", required=True, type=Path)
    parser.add_argument("--anchors", required=True, type=Path)
    parser.add_argument("--rollouts", required=True, type=Path,
                        help="the rollouts stage's paths-{shard}.parquet of this shard")
    parser.add_argument("--drafter", required=True, type=Path, help="trained final.pt")
    parser.add_argument("--out-paths", required=True, type=Path)
    parser.add_argument("--out-slots", required=True, type=Path)
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    from floorgap.cli import progress
    from floorgap.data.anchors import anchor_contexts
    from floorgap.models.targets import load_target
    from floorgap.probes.drafter_eval import (
        anchor_eval_records,
        evaluate_anchor,
        load_trained_drafter,
        path_arrays,
    )
    from floorgap.records import dataclass_rows, read_metadata, read_table, write_table
    from floorgap.rollouts import shard_rows
    from floorgap.sampling import SamplingLaw

    spec = args.spec
    cfg, target = spec["rollouts"], spec["target"]
    anchors = shard_rows(read_table(args.anchors), int(spec["shard"]), int(cfg["shards"]))
    if not len(anchors):
        raise StageError(f"shard {spec['shard']} of {args.anchors} holds no anchors")
    gamma = int(spec["gamma"])
    law = SamplingLaw.from_spec(spec["law"])
    stored = read_table(args.rollouts)
    roll_meta = read_metadata(args.rollouts)
    if int(roll_meta.get("gamma", gamma)) != gamma:
        raise StageError(f"{args.rollouts} holds gamma={roll_meta.get('gamma')}, not {gamma}")
    if roll_meta.get("law", spec["law"]) != spec["law"]:
        raise StageError(f"{args.rollouts} was sampled under law {roll_meta.get('law')}, "
                         f"not {spec['law']}; rerun the rollouts")
    by_anchor = {a: g for a, g in stored.groupby("anchor_id", sort=False)}
    missing = [a for a in anchors.anchor_id if a not in by_anchor]
    if missing:
        raise StageError(f"{args.rollouts} lacks paths of {len(missing)} anchors of this shard "
                         f"(first {missing[0]}); rerun the rollouts")
    corpus = read_table(args.corpus)
    anchor_meta = read_metadata(args.anchors)
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    try:
        drafter = load_trained_drafter(args.drafter, model)
    except ValueError as exc:
        raise StageError(str(exc)) from exc
    if drafter.gamma != gamma:
        raise StageError(f"{args.drafter} drafts {drafter.gamma} slots, the anchors {gamma}")
    contexts = anchor_contexts(corpus, anchors)
    path_rows, slot_rows, seconds, mismatches = [], [], [], 0
    bar = progress(total=len(anchors), desc=f"drafter_eval {spec['variant']} shard "
                   f"{spec['shard']}", unit="anchor")
    for a, ctx in zip(anchors.itertuples(index=False), contexts):
        tokens, logp = path_arrays(by_anchor[a.anchor_id], gamma)
        ev = evaluate_anchor(model, drafter, ctx, tokens, logp, law=law,
                             anchor_seed=int(a.anchor_seed),
                             forward_batch=int(cfg["forward_batch"]))
        paths, slots = anchor_eval_records(a.anchor_id, ev)
        path_rows += paths
        slot_rows += slots
        seconds.append(ev.seconds)
        n_bad = sum(s.logp_mismatches for s in slots)
        mismatches += n_bad
        logger.info("anchor %s: %.2f s, %d logp mismatches (max |dp| %.2e), R by slot %s",
                    a.anchor_id, ev.seconds, n_bad, max(s.logp_max_abs_diff for s in slots),
                    " ".join(f"{s.risk:.3f}" for s in slots))
        bar.update()
    bar.close()
    meta = {"stage": "drafter_eval", "target": target["name"], "variant": spec["variant"],
            "domain": anchor_meta.get("domain"), "order": int(drafter.order),
            "drafter_kind": drafter.cfg.kind, "rollouts": cfg, "law": spec["law"],
            "gamma": gamma, "shard": spec["shard"], "anchors": len(anchors),
            "logp_mismatches": mismatches, "dtype": target["dtype"],
            "device": target["device"], "stand_in_for": anchor_meta.get("stand_in_for")}
    write_table(args.out_paths, dataclass_rows(path_rows), meta)
    write_table(args.out_slots, dataclass_rows(slot_rows), meta)
    if mismatches:
        logger.warning("%d path-slots differ from the stored logp by more than the tolerance",
                       mismatches)
    logger.info("wrote %d anchors; mean %.2f s per anchor", len(anchors),
                sum(seconds) / len(seconds))


if __name__ == "__main__":
    sys.exit(run_stage(main, build_parser()))
