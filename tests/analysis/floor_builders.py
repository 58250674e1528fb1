"""Hand-built rollouts records (anchors, paths, floors parquet files) for the floors analysis.

Each anchor has M paths over a small vocabulary; slot 0 is one distribution shared by every
path (as at a real anchor), later slots draw one distribution per path. The floors file holds
what the probe would compute from the full distributions; the paths file holds their top-K
reads with the residual mass, exactly as ``floorgap.probes.rollouts`` writes them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch

from floorgap.estimators.floors import (
    alternating_split,
    floor_order0,
    floor_order0_split,
    floor_order1_plugin,
    floor_order1_split,
    order0_path_tv,
)
from floorgap.estimators.support import effective_support
from floorgap.records import write_table

ROLLOUTS = {"paths": 8, "forward_batch": 8, "shards": 1, "store_top_k": 4, "reveal_paths": 2}


def anchor_block(rng: np.random.Generator, M: int, gamma: int, V: int, spread: float):
    """[gamma, M, V] distributions and [M, gamma] tokens of one synthetic anchor."""
    P = np.empty((gamma, M, V))
    P[0] = rng.dirichlet(np.full(V, spread))
    for k in range(1, gamma):
        P[k] = rng.dirichlet(np.full(V, spread), size=M)
    tokens = np.stack([[rng.choice(V, p=P[k, r]) for k in range(gamma)] for r in range(M)])
    return P, tokens


def records_of(anchor_id: str, P: np.ndarray, tokens: np.ndarray, K: int):
    gamma, M, _ = P.shape
    Pt = torch.tensor(P)
    tok = torch.tensor(tokens)
    t0 = floor_order0(Pt)
    t0s = floor_order0_split(Pt, alternating_split(M))
    floors = []
    for k in range(gamma):
        pred = None if k == 0 else tok[:, k - 1]
        t1 = floor_order1_split(Pt[k], pred)
        plug = float(floor_order1_plugin(Pt[k], pred))
        tv0 = order0_path_tv(Pt[k])
        t0_cov = float(tv0[t1.covered].mean()) if bool(t1.covered.any()) else float("nan")
        floors.append({
            "anchor_id": anchor_id, "slot": k, "t0": float(t0[k]), "t0_split": float(t0s[k]),
            "t0_covered": t0_cov,
            "t1_split_cov": float(t1.value_covered), "t1_covered_mass": float(t1.covered_mass),
            "t1_lower": float(t1.lower), "t1_upper": float(t1.upper),
            "t1_uncovered_paths": int(t1.n_uncovered_paths), "t1_plugin": plug,
            "t1_reweighted": float("nan") if k == 0 else plug,
            "t1_reweighted_ess_min": float("nan") if k == 0 else M - 2.0,
            "t1_reweighted_ess_mean": float("nan") if k == 0 else M - 1.0,
            "t1_reweighted_undefined": 0,
            "n_eff": effective_support(tok[:, :k]).n_eff})
    order = np.argsort(-P, axis=-1)[..., :K]  # [gamma, M, K]
    vals = np.take_along_axis(P, order, -1)
    resid = np.clip(1 - vals.sum(-1), 0, None)
    paths = []
    for r in range(M):
        logp = [float(np.log(P[k, r, tokens[r, k]])) for k in range(gamma)]
        paths.append({"anchor_id": anchor_id, "path": r, "tokens": tokens[r].tolist(),
                      "logp": logp, "topk_ids": order[:, r].reshape(-1).tolist(),
                      "topk_probs": vals[:, r].reshape(-1).tolist(),
                      "residual": resid[:, r].tolist()})
    return floors, paths


def build_records(root: Path, *, domains=("gsm8k", "mbpp"), anchors_per_domain: int = 4,
                  prompts_per_domain: int = 2, gamma: int = 3, V: int = 6, seed: int = 0,
                  identical: bool = False, pis: dict | None = None, K: int | None = None
                  ) -> dict[str, list[Path]]:
    """Write anchors/<domain>.parquet and rollouts/<domain>/{paths,floors}-0.parquet.

    ``identical``: every anchor gets the same distributions and tokens (so every anchor-level
    value is equal). ``pis``: optional anchor_id -> inclusion probability. mbpp is recorded as
    a HumanEval stand-in, as the shipped default does.
    """
    M, K = ROLLOUTS["paths"], K or ROLLOUTS["store_top_k"]
    rng = np.random.default_rng(seed)
    shared = anchor_block(rng, M, gamma, V, 0.5) if identical else None
    files = {"anchors": [], "paths": [], "floors": []}
    for d in domains:
        rows, floors, paths = [], [], []
        for i in range(anchors_per_domain):
            prompt = f"{d}:p{i % prompts_per_domain}"
            aid = f"{prompt}@{10 + i}"
            pi = (pis or {}).get(aid, 0.05 + 0.01 * i)
            rows.append({"anchor_id": aid, "prompt_id": prompt, "domain": d,
                         "stand_in_for": "MBPP" if d == "mbpp" else None,
                         "stratum": f"s{i % 2}", "pi": pi})
            P, tokens = shared if identical else anchor_block(rng, M, gamma, V, 0.3 + 0.2 * i)
            f, p = records_of(aid, P, tokens, K)
            floors += f
            paths += p
        meta = {"domain": d, "gamma": gamma, "stand_in_for": "MBPP" if d == "mbpp" else None,
                "provenance": {"dataset": "HumanEval (OpenAI)" if d == "mbpp" else d.upper()}}
        a_path = root / "anchors" / f"{d}.parquet"
        write_table(a_path, pd.DataFrame(rows), meta)
        rmeta = {"target": "tiny", "domain": d, "gamma": gamma,
                 "rollouts": {**ROLLOUTS, "store_top_k": K},
                 "shard": 0}
        p_path = root / "rollouts" / d / "paths-0.parquet"
        f_path = root / "rollouts" / d / "floors-0.parquet"
        write_table(p_path, pd.DataFrame(paths), rmeta)
        write_table(f_path, pd.DataFrame(floors), rmeta)
        files["anchors"].append(a_path)
        files["paths"].append(p_path)
        files["floors"].append(f_path)
    return files


def rewrite(path: Path, edit) -> None:
    """Apply ``edit(df) -> df`` to a record file, keeping its metadata."""
    from floorgap.records import read_metadata, read_table

    meta = read_metadata(path)
    write_table(path, edit(read_table(path)), meta)
