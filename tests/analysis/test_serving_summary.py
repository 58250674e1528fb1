"""The serving summary from request records (floorgap.analysis.serving) on hand-made records."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from floorgap.analysis.serving import summarise_replay, summarise_serving
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


def _rounds() -> pd.DataFrame:
    """Replayed rounds of one drafter at T=1, gamma 2: task a (rows a:0, a:1), task b (b:0)."""
    half, nan = [0.5, 0.5], [float("nan")] * 2
    rows = []
    for task, row, conc, accepted, p_tok, q_tok, tv, complete in (
            ("a", "a:0", 1, 2, half, [1.0, 1.0], [0.0, 0.0], True),     # tau_hat 3
            ("a", "a:0", 2, 0, half, [0.25, 0.25], [0.5, 0.5], True),   # tau_hat 1.75
            ("a", "a:1", 1, 1, half, [0.0, 0.5], [1.0, 0.0], True),     # tau_hat 1
            ("a", "a:1", 1, 0, nan, nan, nan, False),                   # cut by the limit
            ("b", "b:0", 1, 1, half, [0.25, 1.0], [0.5, 0.0], True)):   # tau_hat 2
        rows.append({"system": "dflash", "task": task, "row_id": row, "temperature": 1.0,
                     "concurrency": conc, "accepted": accepted, "complete": complete,
                     "p_tok": p_tok, "q_tok": q_tok, "tv": tv, "lossless_score": -1.0,
                     "lossless_var": 2.0})
    return pd.DataFrame(rows)


def test_served_against_offline_by_hand() -> None:
    out = summarise_replay(_rounds(), n_boot=50, level=0.9, seed=1, tasks=["a", "b"])
    get = lambda stat, task: float(out[(out["statistic"] == stat)  # noqa: E731
                                       & (out["task"] == task)]["estimate"].iloc[0])
    # complete rounds only; ratio of sums over the task's rows (and concurrencies)
    assert get("tau_matched", "a") == pytest.approx((3 + 1 + 2) / 3)
    assert get("tau_offline", "a") == pytest.approx((3 + 1.75 + 1) / 3)
    assert get("tau_matched", "b") == 2 and get("tau_offline", "b") == 2
    assert get("tau_offline", "macro") == pytest.approx(((3 + 1.75 + 1) / 3 + 2) / 2)
    # trials: round 1 slots 0, 1 (alpha 1, 1); round 2 slot 0 (0.5); round 3 slots 0, 1 (0, 1);
    # round 5 slots 0, 1 (0.5, 1)
    assert get("accepted_observed", "all") == 4 and get("rounds", "all") == 4
    assert get("accepted_expected", "all") == pytest.approx(1 + 1 + 0.5 + 0 + 1 + 0.5 + 1)
    assert get("accepted_sd", "all") == pytest.approx((0.25 + 0.25) ** 0.5)
    assert get("acceptance_z", "all") == pytest.approx((4 - 5) / 0.5 ** 0.5)
    # the lossless test counts every round, the incomplete one too
    assert get("lossless_z", "all") == pytest.approx(-5 / 10 ** 0.5)


def test_a_served_check_reads_its_temperatures_and_the_first_divergent_round() -> None:
    from floorgap.analysis.serving import first_divergent_round, served_check

    hot = _rounds().assign(round=range(5))
    cold = hot.copy().assign(temperature=0.0, lossless_score=float("nan"),
                             lossless_var=float("nan"))
    # greedy rounds: tv 0 where the argmaxes agree; the third accepts 1 where the replay says 0
    cold["tv"] = [[0.0, 0.0], [1.0, 0.0], [1.0, 0.0], [float("nan")] * 2, [0.0, 1.0]]
    cold["accepted"] = [2, 0, 1, 0, 1]
    out = served_check(pd.concat([hot, cold], ignore_index=True), tasks=["a", "b"], n_boot=50,
                       level=0.9, seed=1)
    t1, t0 = out["by_temperature"][1.0], out["by_temperature"][0.0]
    assert t1["acceptance_z"] == pytest.approx((4 - 5) / 0.5 ** 0.5)
    assert t1["lossless_z"] == pytest.approx(-5 / 10 ** 0.5)
    assert t1["tau_offline"][0] == pytest.approx(((3 + 1.75 + 1) / 3 + 2) / 2)
    assert t1["tau_offline"][1] <= t1["tau_offline"][0] <= t1["tau_offline"][2]
    assert t0["greedy_agreement"] == pytest.approx(3 / 4) and t0["rounds"] == 4
    assert t0["active_rounds"] == 3     # the second complete round accepts nothing either way
    assert (t1["accepted_observed"], t1["accepted_expected"]) == (4, pytest.approx(5))
    assert math.isnan(t0["acceptance_z"]) and math.isnan(t1["greedy_agreement"])
    assert out["first_divergent"] == {"task": "a", "row_id": "a:1", "round": 2, "served": 1,
                                      "replayed": 0}
    cold["accepted"] = [2, 0, 0, 0, 1]
    assert first_divergent_round(cold) is None


def test_the_rounds_are_tested_against_each_named_fault_and_the_engine_counts() -> None:
    """hypothesis_tests: the served greedy rounds reproduced under a fault's replay; the engine
    reading: the records' sums beside the engine's, and per slot its count against the
    complete rounds' prediction (the cut round's count taken off)."""
    import json

    from floorgap.analysis.serving import engine_reading, hypothesis_tests

    hot = _rounds().assign(round=range(5))
    cold = hot.copy().assign(temperature=0.0)
    cold["accepted"] = [2, 0, 1, 0, 1]
    # the faithful greedy tv reproduces 2 of the 4 complete rounds, the shifted one all four
    cold["tv"] = [[1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [float("nan")] * 2, [0.0, 1.0]]
    shifted = [[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [float("nan")] * 2, [0.0, 1.0]]
    cold["hypotheses_tv"] = [json.dumps({"shift": s, "offset": t}) for s, t in
                             zip(shifted, cold["tv"])]
    hot["hypotheses_tv"] = [json.dumps({"shift": t, "offset": [1.0, 1.0]}) for t in hot["tv"]]
    tests = hypothesis_tests(pd.concat([hot, cold], ignore_index=True))
    assert tests["shift"][0.0]["greedy_agreement"] == 1.0
    assert tests["offset"][0.0]["greedy_agreement"] == pytest.approx(2 / 4)
    # paired: the shift reproduces the two rounds the faithful replay misses, loses none
    assert tests["shift"][0.0]["greedy_gain"] == 2 and tests["shift"][0.0]["sign_p"] == 0.25
    assert tests["offset"][0.0] == {"greedy_agreement": 0.5, "greedy_gain": 0.0, "sign_p": 1.0}
    assert tests["shift"][1.0]["acceptance_z"] == pytest.approx((4 - 5) / 0.5 ** 0.5)
    # the offset's replay predicts no acceptance at all: 4 accepted against 0 expected
    assert tests["offset"][1.0]["acceptance_z"] == float("inf")
    # engine counts: the records of T = 1 (accepted 2, 0, 1, 0, 1 in one request each)
    requests = pd.DataFrame([{"temperature": 1.0, "verify_steps": 5, "draft_tokens": 10,
                              "accepted_drafts": 4, "step_accepted": [2, 0, 1, 0, 1]}])
    engine = {"drafts": 5, "draft_tokens": 10, "accepted": 4, "accepted_per_pos": [3, 1]}
    runs = pd.DataFrame([{"temperature": 1.0, "engine_counts": engine}])
    out = engine_reading(requests, runs, hot, gamma=2)[1.0]
    assert out["records"] == engine and out["differs"] == []
    # complete rounds: slot 0 reached 4 times, accepted 3 (alpha 1, 0.5, 0, 0.5); slot 1
    # reached by the round that accepted 2 and the two that accepted 1 (alpha 1, 1, 1)
    assert [s["trials"] for s in out["slots"]] == [4, 3]
    assert [s["observed"] for s in out["slots"]] == [3, 1]
    assert [s["expected"] for s in out["slots"]] == pytest.approx([2.0, 3.0])
    wrong = engine_reading(requests, runs.assign(engine_counts=[{**engine, "accepted": 5}]), hot,
                           gamma=2)[1.0]
    assert wrong["differs"] == ["accepted"]
