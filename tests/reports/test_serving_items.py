"""Tables 1, 9 and 11 from a serving summary (floorgap.reports.serving_items)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from floorgap.analysis.serving import summarise_serving
from floorgap.records import write_table
from floorgap.reports.serving_items import (
    table1_serving,
    table9_serving_per_task,
    table11_concurrency,
)


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
