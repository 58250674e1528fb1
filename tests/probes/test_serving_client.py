"""The serving client against recorded engine responses: SGLang's streamed ``/generate``
chunks as its tokenizer manager writes them (the spec counts only on the final chunk, and only
when a verification round ran; sglang ``srt/managers/tokenizer_manager.py``, the fields of
``BatchStrOutput`` in ``srt/managers/io_struct.py``), served by a local HTTP server, and one tau
convention across engines."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from floorgap.errors import StageError
from floorgap.probes.engine_counts import EngineCounts, parse_vllm_counts, read_engine_counts
from floorgap.probes.serving import EngineSpec, ServingRow, serve_run, sglang_spec_counts


def _chunks(completion: list[int], meta: dict) -> list[dict]:
    """Streamed chunks of one SGLang response: cumulative output ids, meta_info on each, the
    speculative counts on the last one only."""
    out = []
    for n in range(1, len(completion) + 1):
        base = {"prompt_tokens": 5, "completion_tokens": n, "cached_tokens": 0,
                "finish_reason": None if n < len(completion) else {"type": "length",
                                                                   "length": n}}
        last = n == len(completion)
        out.append({"text": "", "output_ids": completion[:n],
                    "meta_info": {**base, **(meta if last else {})}})
    return out


class _Engine(BaseHTTPRequestHandler):
    responses: dict[int, list[dict]] = {}

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        chunks = self.responses[body["input_ids"][0]]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for c in chunks:
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def sglang_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()


def _serve(port: int, responses: dict[int, list[dict]]):
    _Engine.responses = responses
    spec = EngineSpec(engine="sglang", python="/py", target_dir="/t", dtype="bfloat16",
                      device="cuda", kind="dflash", drafter_dir="/d", gamma=7, port=port)
    rows = [ServingRow(task="t", row_id=f"r{k}", prompt_ids=(k, 1, 2)) for k in responses]
    return serve_run(spec, target="t", system="dflash", task="t", rows=rows, temperature=0.0,
                     concurrency=2, seeds=[0] * len(rows), max_tokens=64)


def test_sglang_counts_are_read_under_the_names_it_writes(sglang_server) -> None:
    # 9 tokens: 1 from prefill, then 3 rounds that accepted 2, 0 and 3 drafts (+1 each)
    meta = {"spec_verify_ct": 3, "spec_num_correct_drafts": 5, "spec_num_proposed_drafts": 18,
            "spec_accept_rate": 5 / 18, "spec_accept_length": 9 / 3,
            "spec_correct_drafts_histogram": [1, 0, 1, 1, 0, 0, 0]}
    requests, _ = _serve(sglang_server, {0: _chunks(list(range(9)), meta)})
    (q,) = requests
    assert (q.verify_steps, q.verified_tokens, q.completion_tokens) == (3, 8, 9)
    assert (q.accepted_drafts, q.draft_tokens) == (5, 18)


def test_a_one_token_response_is_zero_rounds_not_a_failure(sglang_server) -> None:
    requests, _ = _serve(sglang_server, {0: _chunks([7], {}), 1: _chunks(list(range(4)), {
        "spec_verify_ct": 1, "spec_num_correct_drafts": 2, "spec_num_proposed_drafts": 6})})
    assert [(q.verify_steps, q.verified_tokens) for q in requests] == [(0, 0), (1, 3)]


def test_counts_missing_from_a_longer_response_stop_the_job(sglang_server) -> None:
    with pytest.raises(StageError, match="no speculative-decoding counts"):
        _serve(sglang_server, {0: _chunks(list(range(5)), {})})


def test_older_alias_names_are_read() -> None:
    meta = {"spec_verify_ct": 2, "spec_accepted_drafts": 3, "spec_proposed_drafts": 12}
    assert sglang_spec_counts(meta, 6) == {"spec_steps": 2, "verified": 5, "accepted": 3,
                                           "drafted": 12, "steps": []}


def test_tau_has_one_convention_across_engines() -> None:
    """The same rounds, as vLLM's metrics and as SGLang's meta_info: the same verified tokens
    (rounds + accepted drafts, the prefill token in neither)."""
    vllm = {"num_spec_steps": 4, "num_accepted_draft_tokens": 6, "num_draft_tokens": 28}
    vllm_verified = vllm["num_spec_steps"] + vllm["num_accepted_draft_tokens"]
    sglang = sglang_spec_counts({"spec_verify_ct": 4, "spec_num_correct_drafts": 6,
                                 "spec_num_proposed_drafts": 24}, completion_tokens=11)
    assert sglang["verified"] == vllm_verified == 10
    assert sglang["verified"] / sglang["spec_steps"] == pytest.approx(2.5)


def test_the_engine_context_length_is_raised_to_the_longest_row(tmp_path) -> None:
    """An 8,192-token engine with 2,048 new tokens refuses any prompt over 6,144 tokens (HTTP
    400); the length is raised from the rows instead, up to the target's position limit."""
    from floorgap.probes.serving import engine_context_length

    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 40960}))
    assert engine_context_length(8192, 6000, 2048, tmp_path) == 8192
    assert engine_context_length(8192, 7000, 2048, tmp_path) == 9048
    with pytest.raises(StageError, match="max_position_embeddings"):
        engine_context_length(8192, 40000, 2048, tmp_path)
    # a multimodal target (Gemma-4) keeps its text model's limit under text_config
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {
        "max_position_embeddings": 4096}}))
    with pytest.raises(StageError, match=r"\(4096\)"):
        engine_context_length(1024, 4000, 512, tmp_path)


def test_a_killed_serving_job_resumes_from_its_journal(sglang_server, tmp_path, monkeypatch):
    """The serving stage journals each finished run; a job killed after its first run is
    finished by a rerun that serves only the rest, with the same requests as an uninterrupted
    job (wall times aside), and says how many runs it took over."""
    import argparse
    import contextlib
    import logging

    import floorgap.stages.serving as serving
    from floorgap.stages.serving import serve_runs

    monkeypatch.setattr(serving, "running_engine", lambda *a, **k: contextlib.nullcontext())
    meta = {"spec_verify_ct": 1, "spec_num_correct_drafts": 2, "spec_num_proposed_drafts": 6}
    _Engine.responses = {0: _chunks(list(range(4)), meta), 1: _chunks([5, 6, 7, 8], meta)}
    engine = EngineSpec(engine="sglang", python="/py", target_dir="/t", dtype="bfloat16",
                        device="cuda", kind="dflash", drafter_dir="/d", gamma=7,
                        port=sglang_server)
    rows = {"a": [ServingRow("a", "r0", (0, 1))], "b": [ServingRow("b", "r1", (1, 1))]}
    spec = {"target": {"name": "t"}, "system": {"name": "dflash"}, "seed": 3,
            "serving": {"temperatures": [0.0, 1.0], "concurrency": [1], "max_tokens": 8}}
    (tmp_path / "rows.parquet").write_bytes(b"rows")

    def job(folder):
        return argparse.Namespace(rows=tmp_path / "rows.parquet", journal=None,
                                  engine_log=tmp_path / folder / "engine.log",
                                  out_requests=tmp_path / folder / "requests.parquet")

    log = logging.getLogger("test")
    clean, clean_runs, resumed = serve_runs(engine, spec, rows, job("clean"), log)
    assert resumed == 0 and len(clean_runs) == 4
    real, calls = serving.serve_run, []

    def dies_on_the_second(*a, **k):
        if len(calls) == 1:
            raise KeyboardInterrupt("killed")
        calls.append(1)
        return real(*a, **k)

    monkeypatch.setattr(serving, "serve_run", dies_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        serve_runs(engine, spec, rows, job("killed"), log)
    monkeypatch.setattr(serving, "serve_run", real)
    again, runs, resumed = serve_runs(engine, spec, rows, job("killed"), log)
    assert resumed == 1 and len(runs) == 4

    def untimed(qs):
        return [{k: v for k, v in vars(q).items() if k not in ("latency_s", "ttft_s")}
                for q in qs]
    assert untimed(again) == untimed(clean)
    assert [(r.task, r.temperature) for r in runs] == [(r.task, r.temperature)
                                                       for r in clean_runs]


# vLLM 0.32's /metrics page for a DFlash server (prometheus_client's exposition of its spec-decode
# counters: a _total sample and a _created one each, engine and model labels; one series per
# position for the per-position counter)
VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="/t"} 12.0
# HELP vllm:spec_decode_num_drafts_created Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_created gauge
vllm:spec_decode_num_drafts_created{engine="0",model_name="/t"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="/t"} 36.0
# TYPE vllm:spec_decode_num_accepted_tokens_total counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="/t"} 9.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos_total counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/t",position="0"} 6.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/t",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="/t",position="2"} 1.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="/t"} 0.0
"""


def test_vllm_counters_are_read_from_its_metrics_page() -> None:
    counts = parse_vllm_counts(VLLM_METRICS, 3)
    assert counts == EngineCounts(drafts=12, draft_tokens=36, accepted=9,
                                  accepted_per_pos=(6, 2, 1))
    # a second engine's series add up; a reading's difference is what happened in between
    two = "\n".join(line + ("\n" + line.replace('engine="0"', 'engine="1"')
                            if 'engine="0"' in line else "")
                    for line in VLLM_METRICS.splitlines()) + "\n"
    assert parse_vllm_counts(two, 3).accepted_per_pos == (12, 4, 2)
    assert parse_vllm_counts(two, 3) - counts == counts


@pytest.mark.parametrize(("drop", "needle"), [
    ("per_pos", r"no vllm:spec_decode_num_accepted_tokens_per_pos_total\{position\}: this vLLM "
                r"build counts no acceptance per position; .*serving.engine_counters: false"),
    ("spec_decode", r"no vllm:spec_decode_num_drafts, .*--disable-log-stats"),
])
def test_missing_counters_are_named_with_how_to_turn_them_on(drop, needle) -> None:
    page = "\n".join(line for line in VLLM_METRICS.splitlines() if drop not in line)
    with pytest.raises(StageError, match=needle):
        parse_vllm_counts(page, 3)


def test_a_count_beyond_the_draft_length_is_refused() -> None:
    with pytest.raises(StageError, match="position 2, outside the 2 drafted slots"):
        parse_vllm_counts(VLLM_METRICS, 2)


def test_an_engine_without_a_metrics_endpoint_is_named(sglang_server) -> None:
    spec = EngineSpec(engine="vllm", python="/py", target_dir="/t", dtype="float32",
                      device="cpu", kind="dflash", drafter_dir="/d", gamma=3,
                      port=sglang_server)   # a server that answers no GET
    with pytest.raises(StageError, match=r"/metrics does not answer .* metrics endpoint is off"):
        read_engine_counts(spec, timeout=5)
    sglang = EngineSpec(engine="sglang", python="/py", target_dir="/t", dtype="float32",
                        device="cuda", kind="dflash", drafter_dir="/d", gamma=3)
    with pytest.raises(StageError, match="sglang keeps no speculative-decoding counters"):
        read_engine_counts(sglang)
