"""Synthetic drafter evaluation records and a floors table built from real distributions.

Each anchor has a tiny Markov target over V tokens (Dirichlet rows): p_0 and p_k(. | z_{k-1}).
Paths are sampled from it; the floors come from the estimators on the per-path rows (T0
in-sample; T1 by split-half grouping on the realised predecessor with its covered mass, and
the in-sample grouping plug-in written as the importance-route column, NaN at slot 0 as the
probe writes it).
Drafters: "dflash" (order 0, one Dirichlet row per slot, or q = p when ``exact``), "dspark"
and "ours" (order 1: a Dirichlet table per slot fed the predecessor; the self chain uses the
same table along the drafter's own draw). ``blind`` makes an order-1 drafter ignore its
predecessor, so its self and oracle proposals coincide.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from floorgap.estimators.barycentre import tv_distance
from floorgap.estimators.floors import floor_order0, floor_order1_plugin, floor_order1_split
from floorgap.estimators.serving import accept_factors
from floorgap.records import write_table


def _dirichlet(gen: torch.Generator, shape: tuple[int, ...], conc: float = 0.7) -> torch.Tensor:
    g = torch._standard_gamma(torch.full(shape, conc, dtype=torch.float64))
    # torch._standard_gamma takes no generator (seeded globally in build); a little generator
    # noise keeps the draws keyed by the anchor order as well
    noise = torch.rand(shape, generator=gen, dtype=torch.float64) * 1e-3
    x = g + noise
    return x / x.sum(-1, keepdim=True)


def build(root: Path, *, domains=("gsm8k", "alpaca"), anchors_per_domain=4, gamma=3, M=8,
          V=5, variants=None, seed=0) -> dict[str, list[Path]]:
    """Write ``floors/anchor_slot.parquet`` and drafter_eval shards under ``root``.

    ``variants`` maps name -> dict(order=0|1, exact=bool, blind=bool).
    """
    variants = variants or {"dflash": {"order": 0}, "dspark": {"order": 1},
                            "ours": {"order": 1}}
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    floor_rows, files = [], {"paths": [], "slots": []}
    per_variant: dict[str, dict[str, list]] = {v: {d: ([], []) for d in domains} for v in variants}
    for d_i, domain in enumerate(domains):
        for a in range(anchors_per_domain):
            aid = f"{domain}-{a}"
            prompt = f"{domain}-p{a // 2}"
            p0 = _dirichlet(gen, (V,))
            trans = _dirichlet(gen, (gamma, V, V))
            tokens = torch.empty(M, gamma, dtype=torch.long)
            P = torch.empty(gamma, M, V, dtype=torch.float64)
            for r in range(M):
                for k in range(gamma):
                    row = p0 if k == 0 else trans[k, tokens[r, k - 1]]
                    P[k, r] = row
                    tokens[r, k] = int(torch.multinomial(row, 1, generator=gen))
            committed = 7 + a
            for k in range(gamma):
                pred = None if k == 0 else tokens[:, k - 1]
                split = floor_order1_split(P[k], pred)
                floor_rows.append({
                    "anchor_id": aid, "prompt_id": prompt, "domain": domain, "stratum": "",
                    "pi": 0.5 + 0.1 * a,
                    "slot": k, "status": "ok", "t0": float(floor_order0(P[k])),
                    "t1_split_cov": float(split.value_covered),
                    "t1_covered_mass": float(split.covered_mass),
                    "t1_reweighted": (float("nan") if k == 0
                                      else float(floor_order1_plugin(P[k], pred)))})
            for name, opts in variants.items():
                order = int(opts.get("order", 0))
                q0 = P[0, 0].clone() if opts.get("exact") else _dirichlet(gen, (V,))
                table = _dirichlet(gen, (gamma, V, V))
                if opts.get("blind"):
                    table = table[:, :1].expand(gamma, V, V)
                prow, srow = per_variant[name][domain]
                for r in range(M):
                    prev_self = -1
                    for k in range(gamma):
                        p = P[k, r]
                        if opts.get("exact"):
                            q = p
                        elif order == 0 or k == 0:
                            q = q0 if order == 1 or k == 0 else table[k, 0]
                        else:
                            q = table[k, tokens[r, k - 1]]
                        if order == 1 and not opts.get("exact"):
                            q_self = q0 if k == 0 else table[k, prev_self]
                            self_tok = int(torch.multinomial(q_self, 1, generator=gen))
                        else:
                            q_self, self_tok = q, -1
                        z = int(tokens[r, k])
                        pt, qt = p[z], q[z]
                        prow.append({
                            "anchor_id": aid, "path": r, "slot": k, "committed_token": committed, "token": z,
                            "p_tok": float(pt), "q_tok": float(qt), "tv": float(tv_distance(p, q)),
                            "accept": float(accept_factors(pt, qt)), "self_token": self_tok,
                            "q_self_tok": float(q_self[z]) if order == 1 else float("nan"),
                            "tv_self": float(tv_distance(p, q_self)) if order == 1 else float("nan")})
                        prev_self = self_tok
                df = pd.DataFrame([x for x in prow if x["anchor_id"] == aid])
                for k in range(gamma):
                    dk = df[df["slot"] == k]
                    ro = float(dk["tv"].mean())
                    rs = float(dk["tv_self"].mean()) if order == 1 else ro
                    srow.append({"anchor_id": aid, "slot": k, "order": order, "risk": ro,
                                     "risk_oracle": ro, "risk_self": rs, "exposure": rs - ro,
                                     "logp_mismatches": 0, "logp_max_abs_diff": 0.0})
    floors = root / "floors" / "anchor_slot.parquet"
    write_table(floors, pd.DataFrame(floor_rows), {"target": "toy"})
    for name, opts in variants.items():
        for domain in domains:
            prow, srow = per_variant[name][domain]
            meta = {"stage": "drafter_eval", "target": "toy", "variant": name,
                    "domain": domain, "order": int(opts.get("order", 0)), "gamma": gamma}
            base = root / "drafter_eval" / name / domain
            write_table(base / "paths-0.parquet", pd.DataFrame(prow), meta)
            write_table(base / "slots-0.parquet", pd.DataFrame(srow), meta)
            files["paths"].append(base / "paths-0.parquet")
            files["slots"].append(base / "slots-0.parquet")
    files["anchor_slot"] = [floors]
    return files


def decompose_summaries(root: Path, variants: dict, contrasts: list[list[str]]
                        ) -> tuple[Path, Path]:
    """A real ``decompose`` gaps summary of synthetic records (gamma 3) with ``contrasts``, run
    through the gaps stage, and a floors summary of the same target and gamma with T0 and the
    split-half T1 (the other-order floors a decomposition reads)."""
    import json

    from floorgap.records import read_metadata
    from floorgap.stages._cli import run_stage
    from floorgap.stages.gaps import build_parser, main

    files = build(root, gamma=3, M=6, anchors_per_domain=3, variants=variants)
    gaps = root / "gaps" / "decompose.parquet"
    assert run_stage(main, build_parser(), [
        "--spec", json.dumps({"bootstrap": 50, "level": 0.9, "contrasts": contrasts,
                              "sweeps": False}),
        "--anchor-slot", str(files["anchor_slot"][0]), "--paths", *map(str, files["paths"]),
        "--slots", *map(str, files["slots"]), "--out-summary", str(gaps), "--threads", "1"]) == 0
    target = read_metadata(gaps)["target"]
    rows = [{"statistic": s, "domain": d, "slot": k, "estimate": v + 0.01 * k,
             "lower": v, "upper": v + 0.1, "n_anchors": 6, "note": ""}
            for s, v in (("T0", 0.3), ("T1_split_covered", 0.1)) for d in ("all", "gsm8k")
            for k in range(3)]
    floors = root / "floors" / "summary.parquet"
    write_table(floors, pd.DataFrame(rows), {"stage": "floors", "target": target, "gamma": 3})
    return gaps, floors
