"""``floorgap api_floors --spec JSON --model-dir DIR --corpus C... --anchors A...
--journal J --out-reads R --out-floors F --out-summary S --engine-log LOG``

Floors measured through an OpenAI-compatible endpoint (floorgap.probes.api_floors, paper Sec.
3.4 and App. C.6), on the first ``anchors_per_domain`` anchors of each domain (by anchor id):
M continuations per anchor with top-K reads, T~^(0) and T~^(1) with omitted-mass bounds. With
``endpoint.server: local`` the stage starts vLLM's OpenAI server on the target itself (from
``serving.python``) and stops it after the reads; otherwise it reads ``base_url`` and ``model``
(the key from the variable ``api_key_env``). With ``matched: true`` the same paths are then
teacher-forced through the local target and the full-vocabulary floors are compared with the
API's bounds (the matched-path check).

Resumable: complete anchors are journalled in ``--journal`` (not a rule output, so a failed job
keeps it); a rerun reads only the anchors the journal lacks. The anchor's request seed is
``derive_seed(seed, "api_floors", anchor_id)``, so a resumed run sends the same requests.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from floorgap.analysis.api_floors import anchor_slot_floors, reads_table, summarise
from floorgap.data.anchors import anchor_contexts, leading_anchors
from floorgap.errors import StageError
from floorgap.models.targets import load_target, load_tokenizer
from floorgap.probes.api_floors import (AnchorJournal, Endpoint, RateLimiter, anchor_prompt,
                                        full_vocab_floors, read_anchor, token_ids)
from floorgap.probes.serving import EngineSpec, engine_context_length, running_engine
from floorgap.progress import progress
from floorgap.records import fingerprint, read_table, write_table
from floorgap.sampling import SamplingLaw
from floorgap.seeds import derive_seed
from floorgap.stages._cli import add_files, stage_parser
from floorgap.stages.serving import engine_python

log = logging.getLogger("floorgap.api_floors")

#: endpoint keys that change how requests are sent, not what they return (left out of the
#: journal's fingerprint, so raising a timeout does not discard finished anchors)
TRANSPORT_KEYS = ("max_retries", "timeout_s", "requests_per_minute", "port", "api_key_env",
                  "startup_timeout_s", "python")


def build_parser() -> argparse.ArgumentParser:
    parser = stage_parser("floorgap api_floors",
                          "Floors with omitted-mass bounds through an OpenAI-compatible API.")
    add_files(parser, "--model-dir", "--journal", "--out-reads", "--out-floors", "--out-summary",
              "--engine-log", "--corpus+", "--anchors+")
    return parser


@contextlib.contextmanager
def endpoint_for(spec: Mapping[str, Any], model_dir: Path, engine_log: Path,
                 threads: int | None = None, longest_context: int = 0) -> Iterator[Any]:
    """The :class:`Endpoint` to read: a local vLLM server on the target, started here and
    stopped on exit (its context length raised to ``longest_context`` + gamma if the configured
    one is shorter), or the configured remote one."""
    cfg = dict(spec["api_floors"]["endpoint"])
    common = dict(route=cfg["route"], top_k=int(spec["api_floors"]["top_k"]),
                  extra_body=cfg.get("extra_body") or {},
                  assistant_fields=cfg.get("assistant_fields") or {},
                  max_retries=int(cfg["max_retries"]), timeout_s=float(cfg["timeout_s"]),
                  requests_per_minute=cfg.get("requests_per_minute"))
    if cfg.get("server") != "local":
        yield Endpoint(base_url=cfg["base_url"], model=cfg["model"],
                       api_key_env=cfg.get("api_key_env"), **common)
        return
    target = spec["target"]
    folder = str(Path(model_dir).absolute())
    engine = EngineSpec(engine="vllm",
                        python=engine_python(cfg.get("python") or spec["serving_python"]),
                        target_dir=folder, dtype=target["dtype"], device=target["device"],
                        gamma=int(spec["gamma"]), port=int(cfg["port"]),
                        max_model_len=engine_context_length(int(cfg["max_model_len"]),
                                                            longest_context, int(spec["gamma"]),
                                                            model_dir),
                        startup_timeout_s=float(cfg["startup_timeout_s"]), threads=threads,
                        extra_args=("--max-logprobs", str(int(spec["api_floors"]["top_k"]))))
    engine_log.parent.mkdir(parents=True, exist_ok=True)
    with running_engine(engine, engine_log) as url:
        yield Endpoint(base_url=f"{url}/v1", model=folder, **common)


def run_fingerprint(spec: Mapping[str, Any], anchor_ids: list[str]) -> str:
    cfg = spec["api_floors"]
    endpoint = {k: v for k, v in cfg["endpoint"].items() if k not in TRANSPORT_KEYS}
    return fingerprint({"target": spec["target"]["name"], "endpoint": endpoint,
                        "paths": cfg["paths"], "top_k": cfg["top_k"], "law": spec["law"],
                        "gamma": spec["gamma"], "seed": spec["seed"], "anchors": anchor_ids})


def read_missing(spec: Mapping[str, Any], args: argparse.Namespace, anchors: Any, corpus: Any,
                 contexts: Mapping[str, list[int]], journal: Any) -> dict[str, Any]:
    """Every journalled anchor's reads, after reading (and journalling) the missing ones."""
    cfg = spec["api_floors"]
    done = journal.load()
    todo = anchors[~anchors["anchor_id"].isin(list(done))]
    log.info("%d anchors (%d per domain), %d already journalled, %d to read", len(anchors),
             cfg["anchors_per_domain"], len(done), len(todo))
    if not len(todo):
        return done
    route = cfg["endpoint"]["route"]
    law = SamplingLaw.from_spec(spec["law"])
    texts = _chat_texts(args.model_dir, corpus, todo) if route == "chat" else {}
    longest = max(len(contexts[a]) for a in todo["anchor_id"])
    with endpoint_for(spec, args.model_dir, args.engine_log, args.threads,
                      longest_context=longest) as endpoint:
        client, limiter = endpoint.client(), RateLimiter(endpoint.requests_per_minute)
        for a in progress(todo.itertuples(index=False), total=len(todo), desc="api_floors",
                          unit="anchor"):
            prompt = anchor_prompt(route, contexts[a.anchor_id],
                                   *texts.get(a.anchor_id, (None, None)),
                                   assistant_fields=endpoint.assistant_fields)
            seed = derive_seed(int(spec["seed"]), "api_floors", a.anchor_id) % 2**31
            reads = read_anchor(client, endpoint, prompt, n_paths=int(cfg["paths"]),
                                gamma=int(spec["gamma"]), law=law, seed=seed, limiter=limiter)
            journal.append(a.anchor_id, reads)
            done[a.anchor_id] = reads
    return done


def matched_floors(spec: Mapping[str, Any], model_dir: Path, reads: Any,
                   contexts: Mapping[str, list[int]]) -> Any:
    """The full-vocabulary floors on the endpoint's own paths (the local target teacher-forced
    along them), one row per anchor and slot."""
    cfg, target, gamma = spec["api_floors"], spec["target"], int(spec["gamma"])
    law = SamplingLaw.from_spec(spec["law"])
    forward_batch = int(cfg.get("forward_batch", cfg["paths"]))
    model, _ = load_target(model_dir, target["dtype"], target["device"])
    rows = []
    for anchor_id, paths in reads.groupby("anchor_id", sort=False):
        if (paths["tokens"].map(len) < gamma).any():
            raise StageError(f"{anchor_id}: a path ended before slot {gamma - 1}; the matched "
                             "check needs full blocks (vLLM: extra_body ignore_eos: true)")
        toks = torch.tensor([token_ids(t) for t in paths.sort_values("path")["tokens"]])
        rows += [{"anchor_id": anchor_id, "slot": f.slot, "t0": f.t0, "t1_plugin": f.t1_plugin,
                  "t1_split_cov": f.t1_split_cov, "t1_covered_mass": f.t1_covered_mass}
                 for f in full_vocab_floors(model, contexts[anchor_id], toks, law=law,
                                            forward_batch=forward_batch)]
    return pd.DataFrame(rows)


def main(args: argparse.Namespace, logger: logging.Logger) -> None:
    spec = args.spec
    cfg, target, gamma = spec["api_floors"], spec["target"], int(spec["gamma"])
    corpus = pd.concat([read_table(f) for f in args.corpus], ignore_index=True)
    anchors = leading_anchors(pd.concat([read_table(f) for f in args.anchors],
                                        ignore_index=True), cfg["anchors_per_domain"])
    contexts = dict(zip(anchors["anchor_id"], anchor_contexts(corpus, anchors)))
    journal = AnchorJournal(args.journal, run_fingerprint(spec, list(anchors["anchor_id"])))
    reads = reads_table(read_missing(spec, args, anchors, corpus, contexts, journal), anchors)
    full = matched_floors(spec, args.model_dir, reads, contexts) if cfg.get("matched") else None
    floors = anchor_slot_floors(reads, gamma, int(cfg["top_k"]), full,
                                float(cfg["tolerance"]))
    summary = summarise(floors)
    endpoint = cfg["endpoint"]
    meta = {"stage": "api_floors", "read": spec.get("read", "api"), "target": target["name"],
            "route": endpoint["route"],
            "endpoint": "local vLLM server on the target" if endpoint.get("server") == "local"
            else f"{endpoint['base_url']} ({endpoint['model']})",
            "top_k": int(cfg["top_k"]), "paths": int(cfg["paths"]), "gamma": gamma,
            "law": spec["law"], "anchors": len(anchors),
            "anchors_per_domain": int(cfg["anchors_per_domain"]),
            "matched": bool(cfg.get("matched")), "tolerance": float(cfg["tolerance"]),
            "journal_corrupt_lines": journal.corrupt_lines,
            "chat_template": bool(target["chat_template"])}
    write_table(args.out_reads, reads, meta)
    write_table(args.out_floors, floors, meta)
    write_table(args.out_summary, summary, meta)
    last = summary[(summary["scope"] == "all") & (summary["slot"] == gamma - 1)].iloc[0]
    logger.info("slot %d: T0 %.4f [%.4f, %.4f], T1 plug-in %.4f, omitted %.2e over %d anchors",
                gamma - 1, last["t0"], last["t0_lower"], last["t0_upper"], last["t1_plugin"],
                last["omitted"], last["anchors"])


def _chat_texts(model_dir: Path, corpus: Any, anchors: Any) -> dict[str, tuple[str, str]]:
    """Prompt text and the response text before the anchor, for the chat route."""
    tok = load_tokenizer(model_dir)
    by_prompt = {r.prompt_id: r for r in corpus.itertuples(index=False)}
    return {a.anchor_id: (by_prompt[a.prompt_id].prompt_text,
                          tok.decode(list(by_prompt[a.prompt_id].response_token_ids[:a.t])))
            for a in anchors.itertuples(index=False)}
