"""``floorgap serving --spec JSON --model-dir DIR --rows ROWS.parquet [--drafter-dir DIR]
--out-requests R.parquet --out-runs U.parquet --engine-log LOG``

One system of one target served in a real engine (see floorgap.probes.serving): AR decoding
(``kind`` null) or a drafter exported in the engine's layout (``--drafter-dir``), or the target
drafting for itself (``kind: target``, a check: tau = gamma + 1 at temperature 0). The stage
starts the engine's server from the engine's own environment (``serving.python``), sends every
row of every task at each temperature and concurrency of the spec (one client-side run per
task, temperature and concurrency, with at most that many requests in flight), stops the
server, and writes one record per request and one per run. A server that fails to start is a
one-line error naming the engine log.

Resumable: each finished run (task x temperature x concurrency) is journalled in ``--journal``
(not a rule output, so a job that is killed or runs out of its SLURM time keeps it); a rerun
serves only the runs the journal lacks and says how many it took over in the record's
metadata (``resumed_runs``: their wall times were measured by the earlier job). The journal is
removed once the records are written, so a later forced rerun measures everything again.

The engine's own counters (``serving.engine_counters``, vLLM): read from its ``/metrics``
before and after each run of a drafting system, the difference stored with the run
(``engine_counts``), so the check can set what the engine counted beside the per-request
records and the replay. An endpoint that is off or lacks a counter stops the job with the
counter's name and how to turn it on.

Seeds: a request's sampling seed is ``derive_seed(seed, "serving", row_id, temperature)``, the
same for every system and concurrency, so AR and the drafters sample with the same keys.

The spec holds ``target`` (config entry with ``name``), ``system`` (``name``, ``kind``),
``serving`` (the config section: ``engine``, ``python``, ``temperatures``, ``concurrency``,
``max_tokens``, ``port``, and for a check's folder ``rows_per_task``), ``gamma`` and ``seed``.
"""

from __future__ import annotations

import argparse
import logging
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from floorgap.config import ENGINE_KINDS
from floorgap.errors import StageError
from floorgap.probes.engine_counts import settled_engine_counts
from floorgap.probes.serving import (EngineSpec, ServedRequest, ServedRun, ServingRow,
                                     engine_context_length, running_engine, serve_run)
from floorgap.progress import progress
from floorgap.records import Journal, fingerprint, read_table, sha256_file, write_table
from floorgap.seeds import derive_seed
from floorgap.stages._cli import add_files, stage_parser


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap serving", "Serve one system in a real engine and time it.")
    add_files(parser, "--model-dir", "--rows", "--out-requests", "--out-runs", "--engine-log",
              help={"--rows": "the serving_rows stage's rows.parquet",
                    "--engine-log": "the engine server's own output"})
    parser.add_argument("--drafter-dir", type=Path, default=None,
                        help="the drafter's exported folder (in the engine's layout)")
    parser.add_argument("--journal", type=Path, default=None,
                        help="journal of finished runs (default: beside --out-requests)")
    return parser


def engine_python(configured: str) -> str:
    """The engine environment's interpreter: ``FLOORGAP_SERVING_PYTHON`` when set (a run
    outside the repository, e.g. a scratch copy, points at the repository's .venv-serving; it is
    not part of the spec, so it reruns nothing), else ``serving.python``. A missing one names
    the set-up step."""
    configured = os.environ.get("FLOORGAP_SERVING_PYTHON") or configured
    path = Path(configured).expanduser()
    if not path.exists():
        raise StageError(f"serving python {configured!r} does not exist: the serving engine runs "
                         "in its own environment; create it with `bash envs/install.sh` (which "
                         "builds .venv-serving) or point serving.python at an interpreter that "
                         "has the engine installed")
    return str(path.absolute())


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    target, system, cfg = spec["target"], spec["system"], spec["serving"]
    kind = system.get("kind")
    if kind in ENGINE_KINDS and args.drafter_dir is None:
        raise StageError(f"system {system['name']} is a {kind} drafter: give --drafter-dir")
    table = read_table(args.rows)
    tasks = list(dict.fromkeys(table["task"]))
    # a check serves the first rows of each task only
    keep = int(cfg["rows_per_task"]) if cfg.get("rows_per_task") else None
    rows = {t: [ServingRow(t, str(r.row_id), tuple(int(i) for i in r.prompt_ids))
                for r in table[table["task"] == t].itertuples()][:keep] for t in tasks}
    longest = max(len(r.prompt_ids) for task_rows in rows.values() for r in task_rows)
    max_model_len = engine_context_length(int(cfg["max_model_len"]), longest,
                                          int(cfg["max_tokens"]), args.model_dir)
    engine = EngineSpec(engine=cfg["engine"], python=engine_python(cfg["python"]),
                        target_dir=str(Path(args.model_dir).absolute()),
                        dtype=cfg.get("dtype") or target["dtype"], device=target["device"],
                        gamma=int(spec["gamma"]), kind=kind,
                        drafter_dir=str(args.drafter_dir.absolute()) if args.drafter_dir else None,
                        layout=system.get("format"), port=int(cfg["port"]),
                        max_model_len=max_model_len,
                        startup_timeout_s=float(cfg["startup_timeout_s"]),
                        draft_sampling=str(cfg["draft_sampling"]), threads=args.threads,
                        max_concurrency=max(int(c) for c in cfg["concurrency"]),
                        engine_counters=bool(kind) and bool(cfg["engine_counters"])
                        and cfg["engine"] == "vllm")
    if kind and cfg["engine_counters"] and not engine.engine_counters:
        logger.warning("%s keeps no speculative-decoding counters of its own: the check sets "
                       "only its per-request counts beside the replay", cfg["engine"])
    logger.info("engine context length %d (longest prompt %d + %d new tokens)", max_model_len,
                longest, int(cfg["max_tokens"]))
    requests, runs, resumed = serve_runs(engine, spec, rows, args, logger)
    meta = {"stage": "serving", "target": target["name"], "system": system["name"],
            "kind": kind, "engine": cfg["engine"], "device": target["device"],
            "dtype": engine.dtype, "gamma": int(spec["gamma"]), "rows": str(args.rows),
            "max_tokens": int(cfg["max_tokens"]), "drafter_dir": engine.drafter_dir,
            "resumed_runs": resumed,
            "draft_sampling": engine.draft_sampling if cfg["engine"] == "vllm" else "engine",
            "note": "CPU timings: speedups are not comparable to the paper's GPU numbers"
                    if not target["device"].startswith("cuda") else None}
    write_table(args.out_requests, pd.DataFrame([asdict(q) for q in requests]), meta)
    write_table(args.out_runs, pd.DataFrame([asdict(r) for r in runs]), meta)
    logger.info("wrote %d requests in %d runs", len(requests), len(runs))
    journal_path(args).unlink(missing_ok=True)


def journal_path(args: argparse.Namespace) -> Path:
    return args.journal or args.out_requests.with_name("journal.jsonl")


def serve_runs(engine: Any, spec: dict[str, Any], rows: dict[str, list[Any]],
               args: argparse.Namespace, logger: logging.Logger
               ) -> tuple[list[Any], list[Any], int]:
    """(requests, runs, how many runs were read back): every run of the spec, journalled ones
    read back and the others served and journalled, in the order temperature, concurrency,
    task."""
    target, system, cfg = spec["target"], spec["system"], spec["serving"]
    settings = [(float(temp), int(c), task) for temp in cfg["temperatures"]
                for c in cfg["concurrency"] for task in rows]
    journal = Journal(journal_path(args), fingerprint(
        {"spec": spec, "rows": sha256_file(args.rows), "drafter": engine.drafter_dir}))
    done = journal.load_entries()
    todo = [s for s in settings if _run_key(*s) not in done]
    resumed = len(settings) - len(todo)
    if resumed:
        logger.info("%d of %d runs journalled by an earlier job; serving the other %d",
                    resumed, len(settings), len(todo))
    if todo:
        args.engine_log.parent.mkdir(parents=True, exist_ok=True)
        with running_engine(engine, args.engine_log):
            for temp, conc, task in progress(todo, desc=f"serving {system['name']}", unit="run"):
                seeds = [derive_seed(int(spec["seed"]), "serving", r.row_id, temp)
                         for r in rows[task]]
                before = settled_engine_counts(engine) if engine.engine_counters else None
                reqs, run = serve_run(engine, target=target["name"], system=system["name"],
                                      task=task, rows=rows[task], temperature=temp,
                                      concurrency=conc, seeds=seeds,
                                      max_tokens=int(cfg["max_tokens"]))
                if before is not None:
                    run.engine_counts = asdict(settled_engine_counts(engine) - before)
                entry = {"requests": [asdict(q) for q in reqs], "run": asdict(run)}
                journal.append_entry(_run_key(temp, conc, task), entry)
                done[_run_key(temp, conc, task)] = entry
                tau = sum(q.verified_tokens for q in reqs) / max(
                    1, sum(q.verify_steps for q in reqs))
                logger.info("%s T=%g C=%d %s: %d requests, %d tokens in %.2f s, tau %.3f",
                            system["name"], temp, conc, task, len(reqs), run.completion_tokens,
                            run.wall_s, tau)
    requests, runs = [], []
    for key in (_run_key(*s) for s in settings):
        requests += [ServedRequest(**q) for q in done[key]["requests"]]
        runs.append(ServedRun(**done[key]["run"]))
    return requests, runs, resumed


def _run_key(temperature: float, concurrency: int, task: str) -> str:
    return f"T={temperature:g}|C={concurrency}|{task}"
