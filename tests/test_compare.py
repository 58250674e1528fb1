"""``floorgap compare``: two runs' records, numbers and verdicts side by side, and its one-line
refusals (not a run, a corrupt record, runs of different configs)."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from floorgap.cli import COMPARE_EXIT, main
from floorgap.records import write_table


def _run(root: Path, *, t0: float = 0.2, paths: int = 64, wall: float = 1.0) -> Path:
    """A minimal finished run: one target's manifest, floors summary (with intervals and its
    settings) and a training log with a timing field."""
    res = root / "results" / "t"
    (res / "floors").mkdir(parents=True)
    (res / "manifest.json").write_text(json.dumps({"files": []}))
    rows = [{"statistic": "T0", "domain": "all", "slot": k, "estimate": t0 * k,
             "lower": t0 * k - 0.01, "upper": t0 * k + 0.01, "n_anchors": 8} for k in range(3)]
    write_table(res / "floors" / "summary.parquet", pd.DataFrame(rows),
                {"target": "t", "rollouts": {"paths": paths}, "gamma": 3})
    (res / "drafters" / "d").mkdir(parents=True)
    (res / "drafters" / "d" / "train_log.jsonl").write_text(
        json.dumps({"epoch": 1, "loss": 0.5, "seconds": wall}) + "\n")
    (root / "paper" / "tables").mkdir(parents=True)
    pd.DataFrame({"claim": ["a", "b"], "verdict": ["holds", "does not hold"]}).to_csv(
        root / "paper" / "tables" / "claims.csv", index=False)
    return root


def test_two_runs_that_differ_in_timing_alone_are_identical(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", wall=7.0)
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "out")]) == \
        COMPARE_EXIT["identical"]
    out = capsys.readouterr().out
    assert "**identical**" in out and "seconds" in out
    assert (tmp_path / "out" / "compare.html").read_text().startswith("<!doctype html>")


def test_a_float_change_within_tolerance_keeps_the_conclusions(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", t0=0.2 + 1e-12)
    assert main(["compare", str(a), str(b)]) == COMPARE_EXIT["same conclusions"]
    assert "floors | 1 | 0 | 1 | 0" in capsys.readouterr().out


def test_a_number_beyond_its_interval_and_a_changed_verdict_are_named(tmp_path, capsys):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b", t0=0.3)
    claims = b / "paper" / "tables" / "claims.csv"
    pd.DataFrame({"claim": ["a", "b"], "verdict": ["holds", "holds"]}).to_csv(claims, index=False)
    assert main(["compare", str(a), str(b)]) == COMPARE_EXIT["a number moved"]
    out = capsys.readouterr().out
    assert "| t/floors/summary.parquet | T0/all/2 | 0.4 | 0.6 |" in out
    assert "| b | does not hold | holds |" in out
    # slot 0 (0 in both) did not move
    assert "T0/all/0" not in out


@pytest.mark.parametrize("break_it, needle", [
    (lambda b: shutil.rmtree(b / "results"), "is not a finished run of the workflow"),
    (lambda b: (b / "results" / "t" / "floors" / "summary.parquet").write_bytes(b"not parquet"),
     "results/t/floors/summary.parquet"),
    (lambda b: _run(b.parent / "c", paths=32) and shutil.copytree(
        b.parent / "c" / "results", b / "results", dirs_exist_ok=True),
     "different configs: rollouts.paths: 64 vs 32"),
])
def test_bad_runs_are_refused_in_one_line(tmp_path, capsys, break_it, needle):
    a, b = _run(tmp_path / "a"), _run(tmp_path / "b")
    break_it(b)
    assert main(["compare", str(a), str(b)]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_tolerance_and_nan_positions():
    from floorgap.analysis.compare import _compare_arrays

    assert _compare_arrays([1.0, math.nan], [1.0, math.nan], "x", 1e-6, 1e-9)[0] == "equal"
    assert _compare_arrays([1.0, math.nan], [1.0, 2.0], "x", 1e-6, 1e-9)[0] == "different"
    status, detail, worst = _compare_arrays([1.0, 2.0], [1.0, 2.0 + 1e-10], "x", 1e-6, 1e-9)
    assert status == "close" and worst == pytest.approx(1e-10, rel=1e-3)
