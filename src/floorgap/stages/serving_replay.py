"""``floorgap serving_replay --spec JSON --model-dir DIR --rows ROWS --requests R
--drafter-dir DIR [--reference FINAL.pt] --out ROUNDS``

Every verification round a drafter system ran in the engine, replayed offline (see
floorgap.probes.serving_replay): the same target and the same exported folder the engine loaded
(imported by floorgap.models.engine_formats), and per round the engine's accepted drafts with
p and q of the served continuation's tokens and TV(p_j, q_j) per slot. With ``--reference``
(a checked folder's trained weights, floorgap check) the rounds are replayed with those weights
instead of the folder, so a folder the engine reads differently from the weights it was
exported from shows as served != offline. The spec holds ``target`` (config entry), ``system``
(``name``, ``kind``) and ``gamma``.

An engine that reports no per-round counts (SGLang reports totals) leaves nothing to replay:
the stage then writes an empty record that says so, and the summary has no offline rows.
"""

from __future__ import annotations

import argparse
import logging
from dataclasses import asdict, fields
from pathlib import Path

import pandas as pd

from floorgap.errors import StageError
from floorgap.models.targets import load_target
from floorgap.probes.drafter_eval import load_drafters
from floorgap.probes.serving_replay import ReplayRound, replay_requests
from floorgap.progress import progress
from floorgap.records import read_metadata, read_table, write_table
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap serving_replay",
                          "Replay a drafter's served rounds offline (accept factors, TV).")
    add_files(parser, "--model-dir", "--drafter-dir", "--rows", "--requests", "--out",
              help={"--drafter-dir": "the exported folder the engine served"})
    parser.add_argument("--reference", type=Path, default=None,
                        help="replay with these weights (a final.pt the folder was exported "
                             "from) instead of floorgap's import of the folder")
    return parser


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    target, system, gamma = spec["target"], spec["system"], int(spec["gamma"])
    requests = read_table(args.requests)
    engine = read_metadata(args.requests).get("engine")
    prompts = {str(r.row_id): [int(i) for i in r.prompt_ids]
               for r in read_table(args.rows).itertuples()}
    meta = {"stage": "serving_replay", "target": target["name"], "system": system["name"],
            "engine": engine, "gamma": gamma, "drafter_dir": str(args.drafter_dir),
            "requests": str(args.requests)}
    counted = requests["step_accepted"].map(len) > 0 if "step_accepted" in requests else None
    if counted is None or not counted.any():
        logger.warning("%s reported no per-round accepted counts: nothing to replay", engine)
        empty = pd.DataFrame(columns=[f.name for f in fields(ReplayRound)])
        write_table(args.out, empty, {**meta, "note": "the engine reports no per-round counts"})
        return
    if not counted.all():
        raise StageError(f"{args.requests}: {int((~counted).sum())} of {len(requests)} requests "
                         "lack per-round counts; rerun the serving stage")
    # records written before the option existed were served with probabilistic drafts
    draft_sampling = str(read_metadata(args.requests).get("draft_sampling", "probabilistic"))
    meta["draft_sampling"] = draft_sampling
    model, _ = load_target(args.model_dir, target["dtype"], target["device"])
    replayed_with = args.reference or args.drafter_dir
    meta["replayed_with"] = str(replayed_with)
    drafter = load_drafters([replayed_with], model, gamma)[0]
    logger.info("replaying with %s on %s (%s)", replayed_with, target["device"], target["dtype"])
    with progress(total=len(requests), desc=f"replay {system['name']}", unit="request") as bar:
        rounds, distinct = replay_requests(
            model, drafter, requests.itertuples(), prompts, target_name=target["name"],
            system=system["name"], draft_sampling=draft_sampling, on_request=bar.update,
            name_faults=bool(spec.get("name_faults")))
    table = pd.DataFrame([asdict(x) for x in rounds])
    write_table(args.out, table, meta)
    done = table[table["complete"]]
    logger.info("replayed %d rounds of %d requests (%d complete; %d distinct requests replayed)",
                len(table), len(requests), len(done), distinct)
