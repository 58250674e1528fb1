"""Tables 1, 9, 11 and Fig. H from a serving summary (floorgap.reports.serving_items)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from floorgap.analysis.serving import summarise_replay, summarise_serving
from floorgap.records import write_table
from floorgap.reports.serving_items import (
    figH_served_vs_offline,
    table1_serving,
    table9_serving_per_task,
    table11_concurrency,
)

#: The plotting options every figure item reads (the config's ``figures`` section).
FIGURES = {"width_in": 3.4, "height_in": 2.4, "font_size": 8, "dpi": 60}


def _replay() -> pd.DataFrame:
    """dflash replayed at both temperatures (gamma 2): every round accepts one draft, the
    offline prediction 1 + 1/2 + 1/4."""
    rows = []
    for temp in (0.0, 1.0):
        for task in ("gsm8k", "alpaca"):
            for r in range(4):
                rows.append({"system": "dflash", "task": task, "row_id": f"{task}:0",
                             "temperature": temp, "concurrency": 1, "accepted": 1,
                             "complete": True, "p_tok": [0.4, 0.4], "q_tok": [0.2, 0.1],
                             "tv": [0.5, 0.5] if temp else [0.0, 1.0],
                             "lossless_score": 0.5 if temp else float("nan"),
                             "lossless_var": 1.0 if temp else float("nan")})
    return pd.DataFrame(rows)


def _summary(tmp_path: Path) -> Path:
    req, runs = [], []
    for system, frac in (("ar", 1.0), ("dflash", 0.5), ("dspark", 0.4)):
        for temp in (0.0, 1.0):
            for conc in (1, 4):
                for task in ("gsm8k", "alpaca"):
                    n = 20
                    req.append({"system": system, "task": task, "row_id": f"{task}:0",
                                "temperature": temp, "concurrency": conc,
                                "completion_tokens": n, "verify_steps": n * frac,
                                "verified_tokens": n, "latency_s": n * frac, "engine": "vllm"})
                    runs.append({"system": system, "task": task, "temperature": temp,
                                 "concurrency": conc, "wall_s": n * frac})
    summary = summarise_serving(pd.DataFrame(req), pd.DataFrame(runs), n_boot=100, level=0.95,
                                seed=1, task_order=["gsm8k", "alpaca"])
    replay = summarise_replay(_replay(), n_boot=100, level=0.95, seed=1,
                              tasks=["gsm8k", "alpaca"])
    summary = pd.concat([summary, replay], ignore_index=True)
    path = tmp_path / "summary.parquet"
    write_table(path, summary, {"device": "cpu"})
    return path


def test_tables_and_values(tmp_path: Path) -> None:
    inputs = {"summary": _summary(tmp_path)}
    v1 = table1_serving(inputs, {}, tmp_path)
    assert v1["\\fgServingDflashTZeroTau"] == "2.00" and v1["\\fgServingDsparkTOneTau"] == "2.50"
    assert v1["\\fgServingDflashTZeroSpeedup"] == "2.00" and v1["\\fgServingDevice"] == "CPU"
    assert v1["\\fgServingRows"] == "2"
    tex = (tmp_path / "table1_serving.tex").read_text()
    assert "dflash" in tex and "2.00$\\times$" in tex
    table9_serving_per_task(inputs, {}, tmp_path)
    t9 = (tmp_path / "table9_serving_per_task.tex").read_text()
    assert "gsm8k" in t9 and "Macro" in t9
    v11 = table11_concurrency(inputs, {}, tmp_path)
    assert v11["\\fgServingLevels"] == "1, 4"
    t11 = (tmp_path / "table11_concurrency.tex").read_text()
    assert "+25.00\\%" in t11  # dspark over dflash: 2.5 / 2.0 - 1
    assert len(pd.read_csv(tmp_path / "table11_concurrency.csv")) > 0


def test_served_against_offline_figure(tmp_path: Path) -> None:
    values = figH_served_vs_offline({"summary": _summary(tmp_path)}, FIGURES, tmp_path)
    assert (tmp_path / "figH_served_vs_offline.pdf").stat().st_size > 0
    assert values["\\fgServedOfflineDflashTOneTauMatched"] == "2.000"
    assert values["\\fgServedOfflineDflashTOneTauOffline"] == "1.625"
    assert values["\\fgServedOfflineDflashTZeroRounds"] == "8"
    # 8 rounds x 2 trials at alpha 1/2: observed 8, expected 8
    assert values["\\fgServedOfflineDflashTOneZ"] == "+0.00"
    assert values["\\fgServedOfflineDflashTOneLossless"] == f"{4 / 8 ** 0.5:+.2f}"
    # T = 0: one accepted draft, and the argmaxes agree at slot 0 only: every round reproduced
    assert values["\\fgServedOfflineDflashTZeroAgreement"] == "100.0"
    # dspark was served without per-round counts: its panel is empty, its values say so
    assert values["\\fgServedOfflineDsparkTOneZ"] == "--"
    # with roles, the paper's macros follow the role, whatever the variant is called: here
    # the replayed system fills the order-1 role, and the order-0 variant was not served
    by_role = figH_served_vs_offline({"summary": _summary(tmp_path)},
                                     {**FIGURES, "roles": {"order0": "blockwise",
                                                           "order1": "dflash", "ours": "head"}},
                                     tmp_path)
    assert by_role["\\fgServedOfflineDsparkTOneTauMatched"] == "2.000"
    assert by_role["\\fgServedOfflineDflashTOneTauMatched"] == "--"
