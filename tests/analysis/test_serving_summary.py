"""The serving summary from request records (floorgap.analysis.serving) on hand-made records."""

from __future__ import annotations

import pandas as pd
import pytest

from floorgap.analysis.serving import summarise_serving
from floorgap.errors import StageError


def _records():
    """Two tasks (a: 2 rows, b: 1 row), AR and one drafter at T=0, C in {1, 2}."""
    req, runs = [], []
    for system, steps_per_token, speed in (("ar", 1.0, 1.0), ("dflash", 0.5, 2.0)):
        for conc in (1, 2):
            for task, rows in (("a", ["a:0", "a:1"]), ("b", ["b:0"])):
                total = 0
                for i, row in enumerate(rows):
                    n = 10 * (i + 1)
                    steps = n * steps_per_token
                    req.append({"system": system, "task": task, "row_id": row,
                                "temperature": 0.0, "concurrency": conc, "completion_tokens": n,
                                "verify_steps": steps, "verified_tokens": n,
                                "latency_s": n / speed, "engine": "vllm"})
                    total += n
                runs.append({"system": system, "task": task, "temperature": 0.0,
                             "concurrency": conc, "wall_s": total / speed / conc})
    return pd.DataFrame(req), pd.DataFrame(runs)


def _get(summary, stat, system, task, conc):
    hit = summary[(summary.statistic == stat) & (summary.system == system)
                  & (summary.task == task) & (summary.concurrency == conc)]
    assert len(hit) == 1
    return float(hit.estimate.iloc[0])


def test_tau_and_speedup_by_hand() -> None:
    req, runs = _records()
    s = summarise_serving(req, runs, n_boot=200, level=0.95, seed=3, task_order=["b", "a"])
    assert _get(s, "tau", "dflash", "a", 1) == pytest.approx(2.0)
    assert _get(s, "tau", "ar", "macro", 0) == pytest.approx(1.0)
    assert _get(s, "tau", "dflash", "macro", 0) == pytest.approx(2.0)
    assert _get(s, "speedup", "dflash", "b", 2) == pytest.approx(2.0)
    assert _get(s, "speedup", "ar", "macro", 1) == pytest.approx(1.0)
    assert _get(s, "rows", "", "a", 0) == 2
    assert list(dict.fromkeys(s[s.statistic == "rows"].task)) == ["b", "a"]


def test_systems_must_serve_the_same_rows_and_ar_must_be_there() -> None:
    req, runs = _records()
    with pytest.raises(StageError, match="did not serve exactly the rows"):
        summarise_serving(req.drop(index=0), runs, n_boot=100, level=0.95, seed=0)
    with pytest.raises(StageError, match="no AR run"):
        summarise_serving(req[req.system != "ar"], runs, n_boot=100, level=0.95, seed=0)
