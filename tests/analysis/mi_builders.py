"""Synthetic MI records (``results/<target>/mi/<domain>.parquet``) for the Table 4 tests.

Each domain has prompts with two anchors; one anchor of prompt 0 is screened out, and every
screened-in anchor has slots 1..GAMMA-1 x ORDERS cells with rho close to a known value.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from floorgap.records import write_table as write_records

GAMMA = 7
ORDERS = [1, 2, 4]
MI_CFG = {"screen_paths": 8, "paths": 16, "threshold_nats": 0.05, "orders": ORDERS}


def records(domain: str, n_prompts: int, seed: int) -> pd.DataFrame:
    """The MI record rows of one domain."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        for t in range(2):
            aid = f"{domain}:p{p}@{t}"
            screen = float(rng.uniform(0.0, 1.0))
            screened = screen > 0.05 and not (p == 0 and t == 1)
            for k in range(1, GAMMA):
                c_kk = float(rng.uniform(0.5, 2.0))
                d = float(rng.uniform(0.1, 1.0))
                for m in ORDERS:
                    ok = screened and m < k
                    rho = {1: 0.9, 2: 0.97, 4: 0.995}[m] + float(rng.normal(0, 0.02))
                    rows.append({
                        "anchor_id": aid, "prompt_id": f"{domain}:p{p}", "domain": domain,
                        "pi": 0.5 if t else 0.25, "slot": k, "order": m, "token": 3,
                        "c_k0": c_kk + d if screened else math.nan,
                        "c_km": c_kk + d * (1 - rho) if ok else math.nan,
                        "c_kk": c_kk if screened else math.nan,
                        "ess": float(rng.uniform(1, 15)) if ok else math.nan,
                        "screened": screened if p else (t == 0), "screen": screen})
    return pd.DataFrame(rows)


def write_record_files(root: Path, domains: tuple[str, ...] = ("gsm8k", "alpaca"),
                       n_prompts: int = 4) -> list[Path]:
    """One MI record file per domain under ``root/mi``."""
    files = []
    for i, dom in enumerate(domains):
        path = root / "mi" / f"{dom}.parquet"
        write_records(path, records(dom, n_prompts, i), {"target": "t", "mi": MI_CFG, "law": {},
                                                         "gamma": GAMMA, "forward_batch": 4,
                                                         "domain": dom})
        files.append(path)
    return files
