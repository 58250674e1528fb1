"""Serving in a real engine (floorgap.probes.serving): the server command lines, a failed start,
and, with the engine's environment (.venv-serving from envs/install.sh), vLLM on CPU serving the
smoke target: speculative output equal to AR at temperature 0, the target drafting for itself
accepting every draft (tau = gamma + 1), a random drafter accepting next to nothing."""

from __future__ import annotations

import json
import os
import socket
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

from floorgap.errors import StageError
from floorgap.probes.engine_counts import settled_engine_counts
from floorgap.probes.serving import (
    EngineSpec,
    ServingRow,
    engine_command,
    engine_cpus,
    engine_environment,
    port_taken,
    running_engine,
    serve_run,
)

from conftest import SERVING_PYTHON


def _spec(**kw) -> EngineSpec:
    base = dict(engine="vllm", python="/py", target_dir="/t", dtype="float32", device="cpu",
                gamma=7)
    return EngineSpec(**{**base, **kw})


def test_vllm_command_serves_a_dflash_folder_with_per_request_counts() -> None:
    cmd, env = engine_command(_spec(kind="dflash", drafter_dir="/d", port=8123))
    assert cmd[:3] == ["/py", "-m", "vllm.entrypoints.openai.api_server"] and env == {}
    spec = json.loads(cmd[cmd.index("--speculative-config") + 1])
    assert spec == {"method": "dflash", "model": "/d", "num_speculative_tokens": 7,
                    "draft_sample_method": "probabilistic"}
    assert "--per-request-spec-decode-metrics" in cmd and "--enforce-eager" in cmd
    # seeded requests must never have their prefill split on the CPU build (it dies)
    assert "--no-enable-chunked-prefill" in cmd
    assert cmd[cmd.index("--port") + 1] == "8123"
    ar, _ = engine_command(_spec())
    assert "--speculative-config" not in ar
    target, _ = engine_command(_spec(kind="target"))
    assert json.loads(target[target.index("--speculative-config") + 1])["model"] == "/t"
    greedy, _ = engine_command(_spec(kind="dflash", drafter_dir="/d", draft_sampling="greedy"))
    spec = json.loads(greedy[greedy.index("--speculative-config") + 1])
    assert spec["draft_sample_method"] == "greedy"


def test_a_cpu_engine_gets_the_key_value_cache_its_requests_need(tmp_path) -> None:
    """Sized from the target's and the drafter's layers, the context length and the requests
    in flight (not a share of the node's memory, which vLLM's CPU build is slow to set up)."""
    target, drafter = tmp_path / "t", tmp_path / "d"
    for folder, layers in ((target, 30), (drafter, 2)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(
            {"num_hidden_layers": layers, "num_attention_heads": 9, "num_key_value_heads": 3,
             "hidden_size": 576}))

    def kv(**kw) -> int:
        cmd, _ = engine_command(_spec(target_dir=str(target), max_model_len=2048, **kw))
        return int(cmd[cmd.index("--kv-cache-memory-bytes") + 1])

    per_token = 2 * 30 * 3 * 64 * 4                      # K and V, 30 layers, 3 heads of 64
    assert kv() == 2 * per_token * 2048 * 2               # one request in flight, one spare
    assert kv(max_concurrency=4) == 2 * per_token * 2048 * 5
    with_drafter = kv(kind="dflash", drafter_dir=str(drafter))
    assert with_drafter == 2 * per_token * 2048 * 2 * 32 // 30
    assert kv(kind="target") == 2 * kv()                   # the target drafts for itself
    assert kv(dtype="bfloat16") == kv() // 2
    tiny, _ = engine_command(_spec(target_dir=str(tmp_path / "absent")))
    assert int(tiny[tiny.index("--kv-cache-memory-bytes") + 1]) == 64 * 2 ** 20
    gpu, _ = engine_command(_spec(device="cuda", target_dir=str(target)))
    assert "--kv-cache-memory-bytes" not in gpu


def test_sglang_command_is_static_verification_on_cuda() -> None:
    cmd, env = engine_command(_spec(engine="sglang", device="cuda", kind="dspark",
                                    drafter_dir="/d"))
    assert cmd[:3] == ["/py", "-m", "sglang.launch_server"]
    assert env == {"SGLANG_RAGGED_VERIFY_MODE": "static"}
    assert cmd[cmd.index("--speculative-algorithm") + 1] == "DSPARK"
    assert cmd[cmd.index("--speculative-dspark-block-size") + 1] == "7"
    cmd, _ = engine_command(_spec(engine="sglang", device="cuda", kind="dflash",
                                  drafter_dir="/d"))
    assert cmd[cmd.index("--speculative-num-draft-tokens") + 1] == "8"
    with pytest.raises(StageError, match="CUDA only"):
        _spec(engine="sglang", device="cpu")
    with pytest.raises(StageError, match="cannot serve"):
        _spec(engine="sglang", device="cuda", kind="target")


def test_the_server_starts_without_the_jobs_thread_counts() -> None:
    """Snakemake sets the BLAS/OpenMP thread counts to the job's threads; the engine sizes its
    own pools (with them vLLM's CPU worker crawled)."""
    env = engine_environment({"PATH": "/bin", "MKL_NUM_THREADS": "2", "OMP_NUM_THREADS": "2",
                              "OPENBLAS_NUM_THREADS": "2", "HOME": "/root"})
    assert env == {"PATH": "/bin", "HOME": "/root"}


def test_a_cpu_server_runs_on_the_jobs_threads_plus_one_cpu(tmp_path: Path) -> None:
    """vLLM's CPU build computes on every CPU it may use but one: a job of T threads lets its
    server use T + 1 CPUs; GPU servers and jobs without a thread count are not restricted."""
    assert engine_cpus(_spec(threads=1), {5, 2, 9}) == [2, 5]
    assert engine_cpus(_spec(threads=8), {0, 1}) == [0, 1]
    assert engine_cpus(_spec(), {0, 1, 2}) is None
    assert engine_cpus(_spec(device="cuda", threads=1), {0, 1, 2}) is None
    # a stand-in server (answers /health, writes the CPUs it may run on) started for real
    seen = tmp_path / "cpus.json"
    fake = tmp_path / "python"
    fake.write_text(
        "#!/usr/bin/env python3\n"
        "import http.server, json, os, sys\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        f"open({str(seen)!r}, 'w').write(json.dumps(sorted(os.sched_getaffinity(0))))\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a):\n"
        "        pass\n"
        "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n")
    fake.chmod(0o755)
    allowed = sorted(os.sched_getaffinity(0))
    with running_engine(_spec(python=str(fake), port=_free_port(), threads=1,
                              startup_timeout_s=60), tmp_path / "engine.log"):
        assert json.loads(seen.read_text()) == allowed[:2]


def test_a_server_that_exits_is_a_one_line_error_naming_its_log(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    spec = _spec(python="/bin/false", port=_free_port(), startup_timeout_s=30)
    with pytest.raises(StageError, match=r"exited with status 1 before it was healthy; see"):
        with running_engine(spec, log):
            pass
    assert log.exists()


def test_a_port_another_process_listens_on_is_refused_before_any_start(tmp_path) -> None:
    """A server already on the port would answer /health and every request for this job's
    engine (two workflows side by side on one machine, or a server left from elsewhere)."""
    log = tmp_path / "engine.log"
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = int(other.getsockname()[1])
        assert port_taken(port)
        with pytest.raises(StageError, match=rf"port {port} is taken.*serving.port"):
            with running_engine(_spec(python="/bin/false", port=port), log):
                pass
    assert not log.exists()                       # nothing was started
    assert not port_taken(port)                   # free again once the listener closed


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def engine_inputs(smoke_target, tmp_path_factory):
    """The smoke target's folder, a random DFlash drafter for it in vLLM's layout, and rows."""
    from floorgap.models.drafter_training import drafter_config
    from floorgap.models.drafters import build_drafter
    from floorgap.models.engine_formats import export_drafter
    from floorgap.models.targets import chat_prompt_ids, load_target

    if not SERVING_PYTHON.exists():
        pytest.fail(f"{SERVING_PYTHON} is missing: `bash envs/install.sh` builds the engine's "
                    "environment")
    cfg, target, model_dir, _ = smoke_target
    model, tok = load_target(model_dir)
    torch.manual_seed(0)
    dc = drafter_config({"kind": "dflash", "layers": 1}, cfg["drafters"]["taps"],
                        cfg["anchors"]["gamma"], model.config)
    folder = export_drafter(build_drafter(dc, model), tmp_path_factory.mktemp("dflash"), "dflash")
    rows = [ServingRow("t", f"t:{i}", tuple(chat_prompt_ids(tok, text)))
            for i, text in enumerate(["Name three colours.", "What is 2 + 2?",
                                      "Write a haiku about rain.", "Explain gravity briefly."])]
    return model_dir, folder, rows, cfg["anchors"]["gamma"]


def _serve(model_dir, rows, gamma, kind=None, drafter=None, temperatures=(0.0,), tmp=None):
    """Serve ``rows`` at each temperature from one engine start: {temperature: (requests, run)}.
    Five full rounds of gamma + 1 tokens after the prefill token, so a self-drafting target's
    tau is exactly gamma + 1."""
    max_tokens = 1 + 5 * (gamma + 1)
    spec = EngineSpec(engine="vllm", python=str(SERVING_PYTHON), target_dir=str(model_dir),
                      dtype="float32", device="cpu", gamma=gamma, kind=kind,
                      drafter_dir=str(drafter) if drafter else None, port=_free_port(),
                      max_model_len=1024)
    out = {}
    with running_engine(spec, tmp / f"{kind}.log"):
        for temperature in temperatures:
            # the engine's own counters around the run, as the serving stage reads them
            before = settled_engine_counts(spec) if kind else None
            out[temperature] = serve_run(
                spec, target="t", system=str(kind), task="t", rows=rows,
                temperature=temperature, concurrency=2, seeds=list(range(1, len(rows) + 1)),
                max_tokens=max_tokens)
            if before is not None:
                out[temperature][1].engine_counts = asdict(settled_engine_counts(spec) - before)
    return out


@pytest.fixture(scope="module")
def served_dflash(engine_inputs, tmp_path_factory):
    """The random DFlash drafter served at temperatures 0 and 1 (one engine start)."""
    model_dir, folder, rows, gamma = engine_inputs
    return _serve(model_dir, rows, gamma, kind="dflash", drafter=folder,
                  temperatures=(0.0, 1.0), tmp=tmp_path_factory.mktemp("served"))


@pytest.mark.slow
def test_vllm_speculation_is_exact_and_counts_verify_rounds(engine_inputs, served_dflash,
                                                             tmp_path) -> None:
    """Temperature 0: DFlash and self-drafting outputs equal AR token for token; the target
    drafting for itself accepts every draft (tau = gamma + 1 exactly); a random DFlash drafter
    accepts almost nothing (tau near 1)."""
    model_dir, folder, rows, gamma = engine_inputs
    ar, ar_run = _serve(model_dir, rows, gamma, tmp=tmp_path)[0.0]
    assert ar_run.requests == len(rows) and ar_run.wall_s > 0
    assert all(r.verify_steps == r.completion_tokens == r.verified_tokens for r in ar)
    own_runs = _serve(model_dir, rows, gamma, kind="target", temperatures=(0.0, 1.0),
                      tmp=tmp_path)
    own, _ = own_runs[0.0]
    flash, _ = served_dflash[0.0]
    for a, o, f in zip(ar, own, flash):
        assert a.token_ids and a.token_ids == o.token_ids == f.token_ids
    tau_own = sum(r.verified_tokens for r in own) / sum(r.verify_steps for r in own)
    assert tau_own == gamma + 1
    # temperature 1: q = p, so every sampled draft is accepted, and the text is the target's
    # (this needs the project's vLLM plugin: without it the CPU build's sampler divides the
    # target's logits by uninitialised temperatures)
    sampled, _ = own_runs[1.0]
    assert sum(r.verified_tokens for r in sampled) / sum(r.verify_steps for r in sampled) \
        == gamma + 1
    assert abs(_lossless_z(model_dir, rows, sampled)) < 4
    tau_flash = sum(r.verified_tokens for r in flash) / sum(r.verify_steps for r in flash)
    assert 1.0 <= tau_flash < 1.5
    assert all(r.draft_tokens == gamma * r.verify_steps for r in flash)


@pytest.mark.slow
def test_the_engines_own_counters_equal_its_per_request_records(engine_inputs,
                                                                served_dflash) -> None:
    """vLLM's /metrics counters over a run (read before and after it) count the same rounds as
    its per-request metrics: rounds, drafted and accepted tokens, and per slot the rounds whose
    slot was accepted."""
    import pandas as pd

    from floorgap.analysis.serving import record_counts

    gamma = engine_inputs[3]
    for temperature, (requests, run) in served_dflash.items():
        records = record_counts(pd.DataFrame([asdict(q) for q in requests]), gamma)
        counted = {**run.engine_counts,
                   "accepted_per_pos": list(run.engine_counts["accepted_per_pos"])}
        assert counted == records, temperature
        assert counted["drafts"] > 0 and counted["draft_tokens"] == gamma * counted["drafts"]


def _lossless_z(model_dir, rows, requests) -> float:
    from floorgap.estimators.served import lossless_z
    from floorgap.models.targets import load_target
    from floorgap.probes.serving_replay import request_lossless_terms

    model, _ = load_target(model_dir)
    prompts = {r.row_id: r.prompt_ids for r in rows}
    terms = [request_lossless_terms(model, prompts[q.row_id], q.token_ids, q.temperature)
             for q in requests]
    return lossless_z(torch.tensor([t[0] for t in terms]), torch.tensor([t[1] for t in terms]))


@pytest.mark.slow   # imports vLLM in its own environment (tens of seconds)
def test_the_plugin_mends_the_cpu_builds_token_expansion() -> None:
    """In the engine's environment the project's vLLM plugin is installed (entry point
    vllm.general_plugins) and, once vLLM loads its plugins, the CPU fallback that spreads each
    request's temperature over its draft tokens writes a float32 buffer."""
    import subprocess

    if not SERVING_PYTHON.exists():
        pytest.fail(f"{SERVING_PYTHON} is missing: `bash envs/install.sh` builds it")
    code = ("import torch, vllm._C\n"
            "from vllm.plugins import load_general_plugins\n"
            "load_general_plugins()\n"
            "from vllm.utils import cpu_triton_utils as c\n"
            "out = torch.full((5,), -7.0)\n"
            "c._expand_kernel_impl(out, torch.tensor([0.0, 0.7]),"
            " torch.tensor([3, 5], dtype=torch.int32), 0, 1)\n"
            "print(out.tolist())\n")
    res = subprocess.run([str(SERVING_PYTHON), "-c", code], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    values = json.loads(res.stdout.strip().splitlines()[-1])
    assert values == pytest.approx([1.0, 1.0, 1.0, 0.7, 0.7])


def _check_rounds_replay(model_dir, folder, rows, gamma, served) -> None:
    """The served rounds against their offline replay on the project's import of ``folder``
    (see :func:`test_served_rounds_match_their_offline_replay`)."""
    from floorgap.estimators.served import acceptance_test, lossless_z
    from floorgap.models.targets import load_target
    from floorgap.probes.drafter_eval import load_trained_drafter
    from floorgap.probes.serving_replay import replay_request

    model, _ = load_target(model_dir)
    drafter = load_trained_drafter(folder, model, gamma)
    prompts = {r.row_id: r.prompt_ids for r in rows}
    replayed = {}
    for temperature, (requests, _) in served.items():
        rounds = []
        for q in requests:
            assert len(q.step_accepted) == q.verify_steps
            rounds += replay_request(model, drafter, prompts[q.row_id], q.token_ids,
                                     q.step_accepted, temperature=temperature,
                                     labels={"target": "t", "system": "dflash", "task": "t",
                                             "row_id": q.row_id, "temperature": temperature,
                                             "concurrency": 2},
                                     draft_sampling="probabilistic")
        replayed[temperature] = [r for r in rounds if r.complete]
        if temperature > 0:
            z = lossless_z(torch.tensor([r.lossless_score for r in rounds]),
                           torch.tensor([r.lossless_var for r in rounds]))
            assert abs(z) < 4, z
    greedy = replayed[0.0]
    assert len(greedy) >= 10
    for r in greedy:
        matches = [tv == 0.0 for tv in r.tv] + [False]
        assert r.accepted == matches.index(False), (r.round, r.accepted, r.tv)
    sampled = replayed[1.0]
    test = acceptance_test(torch.tensor([r.accepted for r in sampled]),
                           torch.tensor([r.tv for r in sampled], dtype=torch.float64))
    assert test.trials >= 30
    assert abs(test.z) < 4, test


@pytest.mark.slow
def test_served_rounds_match_their_offline_replay(engine_inputs, served_dflash) -> None:
    """The exported drafter's acceptance in the engine against the offline replay of the same
    rounds (floorgap.probes.serving_replay) on the project's import of the same folder: at
    temperature 0 every complete round accepts exactly the drafts whose argmax matches the
    target's (greedy verification is deterministic); at temperature 1 (drafts sampled from q)
    the accepted drafts agree with the exact trial probabilities 1 - TV(p_j, q_j) within
    sampling error (|z| < 4), and the returned tokens are draws from the target's law
    (lossless test, |z| < 4)."""
    model_dir, folder, rows, gamma = engine_inputs
    _check_rounds_replay(model_dir, folder, rows, gamma, served_dflash)


def test_a_server_dies_with_the_stage_that_started_it() -> None:
    """kill -9 of the process that started a server (a killed workflow job) ends the server too
    (PR_SET_PDEATHSIG), so no server is left holding its port."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = ("import subprocess, sys, time\n"
            "from floorgap.probes.serving import _die_with_parent\n"
            "p = subprocess.Popen(['sleep', '300'], start_new_session=True,"
            " preexec_fn=_die_with_parent)\n"
            "print(p.pid, flush=True)\n"
            "time.sleep(300)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{child}/status").read().split("State:")[1].split()[0]
        except FileNotFoundError:
            return
        if state == "Z":  # exited, waiting to be reaped by its new parent
            return
        time.sleep(0.1)
    os.kill(child, signal.SIGKILL)
    raise AssertionError("the child outlived its parent")


def test_stopping_a_server_whose_leader_died_ends_its_whole_group() -> None:
    """An engine's core and workers outlive a killed API server; stopping the server ends every
    process of its group, so none is left holding memory."""
    import os
    import signal
    import subprocess

    from floorgap.probes.serving import _group_alive, _stop

    leader = subprocess.Popen(["bash", "-c", "sleep 300 & echo $!; wait"],
                              start_new_session=True, stdout=subprocess.PIPE, text=True)
    int(leader.stdout.readline())
    os.kill(leader.pid, signal.SIGKILL)
    leader.wait()
    assert _group_alive(leader.pid)
    _stop(leader)
    assert not _group_alive(leader.pid)
