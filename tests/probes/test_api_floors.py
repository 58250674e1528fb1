"""Floors through an OpenAI-compatible endpoint (floorgap.probes.api_floors, the api_floors stage):
response parsing and its errors, the journal, and, against a real local server (vLLM's OpenAI
server on CPU serving the smoke target), the matched-path check (the API's top-K bounds contain
the full-vocabulary floors on the same anchors and paths) and a run whose server is killed
mid-way (the rerun completes with records identical to an uninterrupted run)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from floorgap.errors import StageError
from floorgap.probes.api_floors import (
    AnchorJournal,
    Endpoint,
    RateLimiter,
    anchor_prompt,
    parse_choice,
    token_ids,
)

from conftest import SERVING_PYTHON


def _completion_choice(index: int = 0) -> dict:
    return {"index": index, "finish_reason": "length", "logprobs": {
        "tokens": ["token_id:5", "token_id:7"], "token_logprobs": [-0.1, -2.0],
        "top_logprobs": [{"token_id:5": -0.1, "token_id:6": -2.5},
                         {"token_id:8": -0.5, "token_id:7": -2.0}]}}


def test_completion_and_chat_choices_parse_to_the_same_read() -> None:
    read = parse_choice(_completion_choice(), "completions", 0)
    assert read.tokens == ["token_id:5", "token_id:7"] and read.logp == [-0.1, -2.0]
    assert read.top_tokens == [["token_id:5", "token_id:6"], ["token_id:8", "token_id:7"]]
    chat = {"index": 0, "finish_reason": "length", "logprobs": {"content": [
        {"token": "token_id:5", "logprob": -0.1, "top_logprobs": [
            {"token": "token_id:5", "logprob": -0.1}, {"token": "token_id:6", "logprob": -2.5}]},
        {"token": "token_id:7", "logprob": -2.0, "top_logprobs": [
            {"token": "token_id:8", "logprob": -0.5}, {"token": "token_id:7", "logprob": -2.0}]}]}}
    assert parse_choice(chat, "chat", 0) == read
    assert token_ids(read.tokens) == [5, 7]


@pytest.mark.parametrize("route,choice", [
    ("completions", {"index": 0, "logprobs": None}),
    ("completions", {"index": 0, "logprobs": {"tokens": ["a"], "token_logprobs": [-1.0],
                                              "top_logprobs": None}}),
    ("chat", {"index": 0, "logprobs": {"content": [{"token": "a", "logprob": -1.0,
                                                    "top_logprobs": []}]}}),
])
def test_a_response_without_logprobs_is_an_error_naming_the_fix(route, choice) -> None:
    with pytest.raises(StageError, match="no log-probabilities.*top_logprobs"):
        parse_choice(choice, route, 0)


def test_string_tokens_cannot_be_teacher_forced() -> None:
    with pytest.raises(StageError, match="return_tokens_as_token_ids"):
        token_ids(["hello"])


def test_the_key_comes_from_the_environment_only(monkeypatch) -> None:
    ep = Endpoint(base_url="http://x/v1", model="m", api_key_env="FLOORGAP_TEST_KEY")
    monkeypatch.delenv("FLOORGAP_TEST_KEY", raising=False)
    with pytest.raises(StageError, match="FLOORGAP_TEST_KEY is not set"):
        ep.api_key()
    monkeypatch.setenv("FLOORGAP_TEST_KEY", "sk-secret")
    assert ep.api_key() == "sk-secret"
    assert Endpoint(base_url="http://x/v1", model="m").api_key() == "EMPTY"
    with pytest.raises(StageError, match="unknown API route"):
        Endpoint(base_url="http://x/v1", model="m", route="embeddings")


def test_chat_prompts_continue_the_response() -> None:
    msgs = anchor_prompt("chat", [1, 2], "Q?", "So far", {"prefix": True})
    assert msgs == [{"role": "user", "content": "Q?"},
                    {"role": "assistant", "content": "So far", "prefix": True}]
    assert anchor_prompt("completions", [1, 2]) == [1, 2]


def test_the_rate_limiter_spaces_requests() -> None:
    limiter = RateLimiter(600)  # 0.1 s apart
    start = time.monotonic()
    for _ in range(4):
        limiter.wait()
    assert time.monotonic() - start >= 0.29
    RateLimiter(None).wait()


def test_the_journal_resumes_drops_a_cut_line_and_sets_aside_another_run(tmp_path) -> None:
    path = tmp_path / "journal.jsonl"
    read = parse_choice(_completion_choice(), "completions", 0)
    journal = AnchorJournal(path, "abc")
    assert journal.load() == {}
    journal.append("a1", [read])
    journal.append("a2", [read])
    with open(path, "a") as fh:  # a write cut by a kill
        fh.write('{"anchor_id": "a3", "paths": [{"path": 0, "tok')
    again = AnchorJournal(path, "abc")
    done = again.load()
    assert list(done) == ["a1", "a2"] and done["a1"] == [read] and again.corrupt_lines == 1
    again.append("a3", [read])  # appended after the rewrite, not after the cut line
    assert list(AnchorJournal(path, "abc").load()) == ["a1", "a2", "a3"]
    other = AnchorJournal(path, "changed")
    assert other.load() == {}
    assert (tmp_path / "journal.jsonl.stale").exists()


# ------------------------------------------------------------------------- a real local server


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _args(inputs, out: Path, spec: dict) -> list[str]:
    cfg, target, model_dir, corpus, anchors, _ = inputs
    return ["--spec", json.dumps(spec), "--model-dir", str(model_dir), "--corpus", str(corpus),
            "--anchors", str(anchors), "--journal", str(out / "journal.jsonl"),
            "--out-reads", str(out / "reads.parquet"), "--out-floors", str(out / "floors.parquet"),
            "--out-summary", str(out / "summary.parquet"), "--engine-log", str(out / "engine.log"),
            "--log", str(out / "stage.log"), "--threads", "1"]


def _spec(inputs, port: int, **endpoint) -> dict:
    cfg, target, *_ = inputs
    section = cfg["api_floors"]  # validated: the schema's defaults of what is not set here
    return {"target": target, "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
            "seed": cfg["seed"], "serving_python": str(SERVING_PYTHON),
            "api_floors": {**section, "anchors_per_domain": 3, "paths": 16, "top_k": 20,
                           "matched": True,
                           "endpoint": {**section["endpoint"], "server": "local", "port": port,
                                        "max_model_len": 1024,
                                        "extra_body": {"return_tokens_as_token_ids": True,
                                                       "ignore_eos": True}, **endpoint}}}


@pytest.fixture(scope="module")
def api_inputs(default_domain_records):
    """The default's real target (a random one's rows are near uniform: top-K bands vacuous)."""
    if not SERVING_PYTHON.exists():
        pytest.fail(f"{SERVING_PYTHON} is missing: `bash envs/install.sh` builds the engine's "
                    "environment")
    return default_domain_records


@pytest.fixture(scope="module")
def served_target(api_inputs, tmp_path_factory):
    """One vLLM server on the default target, started as the stage starts its own
    (``endpoint.server: local``), shared as an endpoint by the tests that only read through
    one; the killed-server test starts (and kills) its own."""
    from floorgap.stages.api_floors import endpoint_for

    log = tmp_path_factory.mktemp("api-server") / "engine.log"
    with endpoint_for(_spec(api_inputs, _free_port()), api_inputs[2], log, threads=1) as ep:
        yield ep.base_url, ep.model


def _through(spec: dict, served: tuple[str, str]) -> dict:
    """``spec`` reading through the shared server instead of starting one."""
    endpoint = {k: v for k, v in spec["api_floors"]["endpoint"].items()
                if k not in ("server", "port", "max_model_len")}
    spec["api_floors"]["endpoint"] = {**endpoint, "base_url": served[0], "model": served[1]}
    return spec


@pytest.fixture(scope="module")
def uninterrupted(api_inputs, served_target, tmp_path_factory):
    from floorgap.stages import api_floors
    from floorgap.stages._cli import run_stage

    out = tmp_path_factory.mktemp("api-uninterrupted")
    spec = _through(_spec(api_inputs, _free_port()), served_target)
    assert run_stage(api_floors.main, api_floors.build_parser(),
                     _args(api_inputs, out, spec)) == 0
    return out


@pytest.mark.slow
def test_api_bounds_contain_the_full_vocabulary_floors_on_the_same_paths(uninterrupted) -> None:
    """Top-5 reads from vLLM's server: every complete anchor-slot cell's full-vocabulary T^(0)
    and order-1 plug-in (the local target teacher-forced along the API's own paths) lie in the
    omitted-mass bounds, and the bounds are not vacuous."""
    floors = pd.read_parquet(uninterrupted / "floors.parquet")
    ok = floors[floors["complete"]]
    assert len(ok) == len(floors) and ok["anchor_id"].nunique() >= 2
    assert ok["t0_contained"].astype(bool).all() and ok["t1_plugin_contained"].astype(bool).all()
    assert (ok["t0_upper"] - ok["t0_lower"] < 1).all()
    # the API's values and the full vocabulary agree to the band, and slot 0 is 0 for both
    assert ((ok["t0"] - ok["full_t0"]).abs() <= ok["omitted"] + 1e-3).all()
    first = ok[ok["slot"] == 0]
    assert first["full_t0"].abs().max() < 1e-6 and first["t0"].abs().max() < 1e-6
    summary = pd.read_parquet(uninterrupted / "summary.parquet")
    assert set(summary["scope"]) == {"all", "gsm8k"}


@pytest.mark.slow
def test_a_killed_server_resumes_to_identical_records(api_inputs, uninterrupted,
                                                      tmp_path) -> None:
    """The server dies after the first anchor is journalled: the stage fails (after its
    retries), keeps the journal, and the rerun (a fresh server) reads only the missing anchors;
    its records equal those of the uninterrupted run."""
    port = _free_port()
    spec = _spec(api_inputs, port, max_retries=1, timeout_s=30, requests_per_minute=15)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "floorgap", "api_floors", *_args(api_inputs, tmp_path, spec)]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    journal = tmp_path / "journal.jsonl"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.exists() and len(journal.read_text().splitlines()) >= 2:
            break
        time.sleep(0.5)
    assert proc.poll() is None, "the stage ended before the server could be killed"
    killed = subprocess.run(["pkill", "-KILL", "-f", f"api_server.*--port {port}"], check=False)
    assert killed.returncode == 0
    assert proc.wait(timeout=600) != 0
    lines = journal.read_text().splitlines()
    assert 2 <= len(lines) <= 3 and not (tmp_path / "reads.parquet").exists()
    from floorgap.stages import api_floors
    from floorgap.stages._cli import run_stage

    rerun = _spec(api_inputs, _free_port(), max_retries=1, timeout_s=30)
    assert run_stage(api_floors.main, api_floors.build_parser(),
                     _args(api_inputs, tmp_path, rerun)) == 0
    assert "already journalled" in (tmp_path / "stage.log").read_text()
    # The anchors read again come from a fresh server, whose CPU batches round a log-probability
    # in its last digits differently (pandas compares floats to rtol 1e-5): the omitted mass
    # r = 1 - sum(p) then moves by ~1e-7 absolute, a large relative change where r is near 0,
    # and the bounds t -/+ E[r] with it. Read-for-read agreement is checked on the reads.
    for name, atol in (("reads", 0.0), ("floors", 1e-6), ("summary", 1e-6)):
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / f"{name}.parquet"),
                                      pd.read_parquet(uninterrupted / f"{name}.parquet"),
                                      atol=atol)


@pytest.mark.slow
def test_the_chat_route_continues_the_response_through_a_real_server(api_inputs, served_target,
                                                                     tmp_path):
    """The chat route (as for a frontier API): the prompt as a user message and the response so
    far as an assistant message the server continues (vLLM: continue_final_message)."""
    from floorgap.stages import api_floors
    from floorgap.stages._cli import run_stage

    spec = _through(_spec(api_inputs, _free_port(), route="chat",
                          extra_body={"continue_final_message": True,
                                      "add_generation_prompt": False, "ignore_eos": True}),
                    served_target)
    spec["api_floors"].update(anchors_per_domain=1, paths=4, matched=False)
    assert run_stage(api_floors.main, api_floors.build_parser(),
                     _args(api_inputs, tmp_path, spec)) == 0
    reads = pd.read_parquet(tmp_path / "reads.parquet")
    assert len(reads) == 4 and (reads["tokens"].map(len) == spec["gamma"]).all()
    assert all(len(t) >= 20 for row in reads["top_tokens"] for t in row)
    floors = pd.read_parquet(tmp_path / "floors.parquet")
    assert floors["complete"].all() and floors["t0"].between(0, 1).all()
    assert "full_t0" not in floors
