"""Serving a target with a drafter in a real engine, and the client that measures it (paper
Sec. 4, App. H.3-H.4).

The engine runs as its own process (its own Python environment when its pins clash with the
project's) behind its OpenAI-compatible HTTP server; this module starts it, waits until it is
healthy, sends the benchmark rows at a fixed concurrency and stops it. One client and one
accounting serve every engine:

* **vLLM** (CPU or CUDA): ``python -m vllm.entrypoints.openai.api_server`` with
  ``--speculative-config {"method": "dflash"|"dspark"|"draft_model", "model": DIR,
  "num_speculative_tokens": gamma}`` and per-request spec-decode metrics; each response's final
  usage chunk carries ``metrics.speculative_decoding`` (``num_spec_steps``,
  ``num_accepted_draft_tokens``, ``num_draft_tokens``, ``acceptance_histogram``).
* **SGLang** (CUDA only): ``python -m sglang.launch_server`` with ``--speculative-algorithm
  DFLASH|DSPARK`` and ``SGLANG_RAGGED_VERIFY_MODE=static`` (every drafted token verified, no
  confidence-based early stop); the per-request counts come from ``meta_info``
  (``spec_verify_ct``, ``spec_num_correct_drafts``, ``spec_num_proposed_drafts``) of its native
  ``/generate`` endpoint.

Prompts are sent as token ids (the target's chat template applied by the caller), so every
system sees exactly the same input. A request's ``verify_steps`` are its verification rounds and
``verified_tokens`` the tokens those rounds returned (accepted drafts plus one each), so
tau = verified_tokens / verify_steps is the engine's accepted length, with one convention for
both engines: rounds plus accepted drafts, the first token (from prefill) in neither. vLLM
reports those two counts; SGLang reports ``spec_verify_ct`` and ``spec_num_correct_drafts``
(its own accept length, ``completion_tokens / spec_verify_ct``, would count the prefill token).
For AR both are the completion tokens (tau = 1).

What an engine counts itself beside these per-request counts (vLLM's /metrics) is read by
:mod:`floorgap.probes.engine_counts`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from floorgap.errors import StageError
from floorgap.resources import DTYPE_BYTES

log = logging.getLogger("floorgap.serving")

ENGINES = ("vllm", "sglang")
# Thread counts Snakemake sets for a job's shell (its `threads`). The engine sizes its own pools;
# with these at the job's threads, vLLM's CPU worker ran ~25x slower here (64 tokens of SmolLM2
# in 88 s instead of 3.5 s), so the server starts without them.
JOB_THREAD_VARIABLES = ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                        "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
# speculative methods by the drafter folder's layout (its export format; the target drafting
# for itself: target), per engine (AR decoding has none). A dspark folder is served by the DSpark
# method whatever its kind: DeepSpec's DFlash is a Qwen3DSparkModel with markov_rank 0.
VLLM_METHODS = {"dflash": "dflash", "dspark": "dspark", "target": "draft_model"}
SGLANG_ALGORITHMS = {"dflash": "DFLASH", "dspark": "DSPARK"}


@dataclass(frozen=True)
class EngineSpec:
    """One engine process: the target folder, the drafter (``kind`` None for AR decoding) and
    how to run it. ``python`` is the interpreter of the engine's environment."""

    engine: str
    python: str
    target_dir: str
    dtype: str
    device: str
    gamma: int
    kind: str | None = None          # dflash | dspark | target (the target drafting itself)
    drafter_dir: str | None = None
    layout: str | None = None        # the drafter folder's format (default: the kind's)
    port: int = 8000
    max_model_len: int = 4096
    startup_timeout_s: float = 900.0
    draft_sampling: str = "probabilistic"   # vLLM's draft_sample_method (or greedy)
    extra_args: tuple[str, ...] = ()
    # CPU targets: the job's threads. vLLM's CPU build binds its compute threads to every CPU
    # the server may run on but one (kept for its scheduler and API), so the server is allowed
    # `threads + 1` of the job's CPUs (None: all of them).
    threads: int | None = None
    # requests in flight at once (the CPU engine's key/value cache is sized for them)
    max_concurrency: int = 1
    # read the engine's own counters before and after each run (serving.engine_counters)
    engine_counters: bool = False

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise StageError(f"unknown serving engine {self.engine!r}; use one of {ENGINES}")
        methods = VLLM_METHODS if self.engine == "vllm" else SGLANG_ALGORITHMS
        if self.kind is not None and self.method_key not in methods:
            raise StageError(f"{self.engine} cannot serve a {self.method_key!r} drafter folder; "
                             f"it serves {sorted(methods)}")
        if self.draft_sampling not in ("greedy", "probabilistic"):
            raise StageError(f"unknown draft sampling {self.draft_sampling!r}; use greedy or "
                             "probabilistic")
        if self.engine == "sglang" and not self.device.startswith("cuda"):
            raise StageError("SGLang runs DFLASH/DSPARK on CUDA only: set serving.engine: vllm "
                             "for a CPU target")

    @property
    def method_key(self) -> str:
        """The key of the speculative method: the folder's layout, else the kind."""
        return str(self.layout or self.kind)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def engine_context_length(configured: int, longest_prompt: int, new_tokens: int,
                          model_dir: str | os.PathLike[str]) -> int:
    """The ``max_model_len`` to start an engine with: the configured one, raised to the longest
    prompt plus the tokens each request may add, so no request is refused for length (an
    engine answers HTTP 400 to a prompt + ``max_tokens`` over its limit, which would stop the
    job). Refuses a length over the target's ``max_position_embeddings``, naming the fix."""
    need = int(longest_prompt) + int(new_tokens)
    config = json.loads((Path(model_dir) / "config.json").read_text())
    text = config.get("text_config") or config  # a multimodal target keeps it one level down
    limit = text.get("max_position_embeddings")
    if limit is not None and need > int(limit):
        raise StageError(f"the longest prompt ({longest_prompt} tokens) plus {new_tokens} new "
                         f"tokens exceeds the target's max_position_embeddings ({limit}): lower "
                         "corpus.max_prompt_tokens (it bounds the rows and anchors) or the "
                         "tokens per request")
    return max(int(configured), need)


#: The smallest key/value cache a CPU engine is given (a tiny model's need rounds up to it).
CPU_KV_CACHE_MIN_BYTES = 64 * 2 ** 20


def _kv_bytes_per_token(folder: str | os.PathLike[str] | None, dtype: str) -> int:
    """Key/value bytes per token of the decoder in ``folder`` (its ``config.json``), or 0."""
    config_file = Path(folder) / "config.json" if folder else None
    if config_file is None or not config_file.exists():
        return 0

    config = json.loads(config_file.read_text())
    text = config.get("text_config") or config
    layers, heads = int(text["num_hidden_layers"]), int(text["num_attention_heads"])
    kv_heads = int(text.get("num_key_value_heads") or heads)
    head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES.get(dtype, 4)


def cpu_kv_cache_bytes(spec: EngineSpec) -> int:
    """The key/value cache a CPU engine is started with: room for ``max_concurrency + 1``
    requests of ``max_model_len`` tokens in the target's and the drafter's layers, doubled for
    the engine's block rounding. vLLM's CPU build otherwise takes a share of the node's memory
    and spends ~8 s per GiB setting it up, most of a small model's start."""
    drafter = spec.target_dir if spec.kind == "target" else spec.drafter_dir
    per_token = _kv_bytes_per_token(spec.target_dir, spec.dtype) \
        + _kv_bytes_per_token(drafter, spec.dtype)
    need = 2 * per_token * spec.max_model_len * (max(1, int(spec.max_concurrency)) + 1)
    return max(CPU_KV_CACHE_MIN_BYTES, need)


def engine_command(spec: EngineSpec) -> tuple[list[str], dict[str, str]]:
    """The engine's server command line and the environment variables it needs."""
    env: dict[str, str] = {}
    if spec.engine == "vllm":
        cmd = [spec.python, "-m", "vllm.entrypoints.openai.api_server", "--model",
               spec.target_dir, "--dtype", spec.dtype, "--port", str(spec.port),
               "--host", "127.0.0.1", "--max-model-len", str(spec.max_model_len),
               "--seed", "0", "--enable-per-request-metrics"]
        if not spec.device.startswith("cuda"):
            # CPU: no compile warm-up (Triton-CPU is absent) and a share of node memory. No
            # chunked prefill: for a seeded request whose prefill is split, the 0.32 CPU build
            # rewinds its torch generator with set_offset, which CPU generators lack, and the
            # engine dies ("CPU Generator does not use offset"); whole prefills never rewind.
            cmd += ["--enforce-eager", "--kv-cache-memory-bytes", str(cpu_kv_cache_bytes(spec)),
                    "--no-enable-chunked-prefill", "--max-num-batched-tokens",
                    str(spec.max_model_len)]
        if spec.kind is not None:
            model = spec.target_dir if spec.kind == "target" else spec.drafter_dir
            # probabilistic samples from q and verifies with min(1, p/q), as the offline probe
            # scores q; greedy (vLLM's default) proposes argmax q as a one-hot proposal
            cfg = {"method": VLLM_METHODS[spec.method_key], "model": model,
                   "num_speculative_tokens": int(spec.gamma),
                   "draft_sample_method": spec.draft_sampling}
            cmd += ["--speculative-config", json.dumps(cfg),
                    "--per-request-spec-decode-metrics", "detailed"]
    else:
        cmd = [spec.python, "-m", "sglang.launch_server", "--model-path", spec.target_dir,
               "--dtype", spec.dtype, "--port", str(spec.port), "--host", "127.0.0.1",
               "--context-length", str(spec.max_model_len), "--random-seed", "0"]
        if spec.kind is not None:
            cmd += ["--speculative-algorithm", SGLANG_ALGORITHMS[spec.method_key],
                    "--speculative-draft-model-path", str(spec.drafter_dir)]
            if spec.method_key == "dspark":
                cmd += ["--speculative-dspark-block-size", str(spec.gamma)]
            else:
                cmd += ["--speculative-num-draft-tokens", str(spec.gamma + 1)]
            env["SGLANG_RAGGED_VERIFY_MODE"] = "static"
    return cmd + list(spec.extra_args), env


def engine_cpus(spec: EngineSpec, allowed: Iterable[int]) -> list[int] | None:
    """The CPUs the server may run on: ``threads + 1`` of ``allowed`` (in order) for a CPU
    target whose job names its threads, else None (no restriction)."""
    if spec.threads is None or spec.device.startswith("cuda"):
        return None
    cpus = sorted(allowed)
    return cpus[:max(1, int(spec.threads)) + 1]


def engine_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment the engine's server starts with: the caller's, less the job's thread
    counts (:data:`JOB_THREAD_VARIABLES`)."""
    return {k: v for k, v in environ.items() if k not in JOB_THREAD_VARIABLES}


def _get(url: str, timeout: float) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return int(resp.status)
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
        return 0


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a process on this machine already listens on ``host:port`` (a socket in
    TIME_WAIT does not count: servers rebind over it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


@contextlib.contextmanager
def running_engine(spec: EngineSpec, log_path: str | Path) -> Iterator[str]:
    """Start the engine's server (output to ``log_path``), wait for ``/health``, yield its base
    URL, and stop it (its whole process group) on exit, whatever happened. A server that exits
    or does not become healthy within ``startup_timeout_s`` is a StageError naming the log, and
    so is a port another process listens on (its server would answer for this job's engine)."""
    if port_taken(spec.port):
        raise StageError(f"port {spec.port} is taken: another process listens there, and its "
                         "server would answer this job's requests. Stop it, or give this stage "
                         "a free port (the config's serving.port, or api_floors.endpoint.port)")
    cmd, extra_env = engine_command(spec)
    env = {**engine_environment(os.environ), **extra_env}
    log.info("starting %s: %s", spec.engine, " ".join(cmd))
    # CPU affinity is Linux's: elsewhere the server runs unrestricted
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = engine_cpus(spec, affinity(0)) if affinity is not None else None
    if cpus is not None:
        log.info("the server runs on CPUs %s (%d job threads)", cpus, spec.threads)

    def before_exec() -> None:
        _die_with_parent()
        if cpus is not None:
            os.sched_setaffinity(0, cpus)

    with open(log_path, "ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=before_exec)
    try:
        start = time.monotonic()
        while _get(f"{spec.base_url}/health", 5.0) != 200:
            if proc.poll() is not None:
                raise StageError(f"the {spec.engine} server exited with status {proc.returncode}"
                                 f" before it was healthy; see {log_path}")
            if time.monotonic() - start > spec.startup_timeout_s:
                raise StageError(f"the {spec.engine} server was not healthy after "
                                 f"{spec.startup_timeout_s:.0f} s; see {log_path}")
            time.sleep(1.0)
        log.info("%s healthy after %.1f s", spec.engine, time.monotonic() - start)
        yield spec.base_url
    finally:
        _stop(proc)


def _die_with_parent() -> None:
    """In the server's process, before exec: ask Linux for SIGTERM when the stage that started
    it dies, so a killed job (kill -9 of a workflow) leaves no server holding its port."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def _stop(proc: subprocess.Popen) -> None:
    """Stop the server's whole process group: SIGTERM, then SIGKILL to what is left. The group
    is signalled even when its leader has already exited (killed, or crashed): the engine's
    core and worker processes outlive the API server and would hold their memory."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=60)
    deadline = time.monotonic() + 30
    while _group_alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def _group_alive(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (zombies waiting to be reaped do not
    count). Reads /proc where there is one, else asks the kernel with signal 0."""
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for stat in proc_dir.glob("[0-9]*/stat"):
        try:
            # pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its ")"
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


@dataclass(frozen=True)
class ServingRow:
    """One benchmark row: its task, prompt id and the prompt's token ids."""

    task: str
    row_id: str
    prompt_ids: tuple[int, ...]


@dataclass
class ServedRequest:
    """One request as the engine served it (record ``serving/requests``)."""

    target: str
    system: str                  # "ar" or the drafter's name
    engine: str
    task: str
    row_id: str
    temperature: float
    concurrency: int
    seed: int
    prompt_tokens: int
    completion_tokens: int
    verify_steps: int            # verification rounds (AR: one per token)
    verified_tokens: int         # tokens those rounds returned: accepted drafts + 1 per round
    accepted_drafts: int         # drafted tokens accepted (0 for AR)
    draft_tokens: int            # drafted tokens verified (0 for AR)
    latency_s: float             # send to last byte
    ttft_s: float                # send to first generated token
    finish_reason: str
    token_ids: list[int] = field(default_factory=list)
    # accepted drafts of each verification round in order (vLLM's detailed metrics; empty for
    # AR and for engines that report only totals): the offline replay's round boundaries
    step_accepted: list[int] = field(default_factory=list)


@dataclass
class ServedRun:
    """One client-side run: every row of a task at one temperature and concurrency."""

    target: str
    system: str
    engine: str
    task: str
    temperature: float
    concurrency: int
    requests: int
    completion_tokens: int
    wall_s: float
    # what the engine counted itself during the run (EngineCounts as a dict; None: not read)
    engine_counts: dict[str, Any] | None = None


def _sse_events(resp: Any) -> Iterator[dict[str, Any]]:
    for raw in resp:
        line = raw.decode("utf-8").strip()
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _post(url: str, body: Mapping[str, Any], timeout: float) -> Any:
    req = urllib.request.Request(url, data=json.dumps(body).encode("utf-8"),
                                 headers={"Content-Type": "application/json"})
    try:
        return urllib.request.urlopen(req, timeout=timeout)
    except urllib.error.HTTPError as e:
        detail = e.read().decode("utf-8", "replace")[:500]
        raise StageError(f"{url}: HTTP {e.code}: {detail}") from None


def _vllm_request(base_url: str, row: ServingRow, temperature: float, seed: int,
                  max_tokens: int, timeout: float) -> dict[str, Any]:
    """One streamed completion from vLLM's server: token ids, TTFT, latency, spec metrics."""
    body = {"model": None, "prompt": list(row.prompt_ids), "max_tokens": max_tokens,
            "temperature": temperature, "top_p": 1.0, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    t0 = time.perf_counter()
    ttft, tokens, usage, metrics, finish = None, [], None, None, ""
    with _post(f"{base_url}/v1/completions", body, timeout) as resp:
        for event in _sse_events(resp):
            for choice in event.get("choices") or []:
                ids = choice.get("token_ids") or []
                if ids and ttft is None:
                    ttft = time.perf_counter() - t0
                tokens += ids
                finish = choice.get("finish_reason") or finish
            usage = event.get("usage") or usage
            metrics = event.get("metrics") or metrics
    latency = time.perf_counter() - t0
    spec = (metrics or {}).get("speculative_decoding") or {}
    return {"tokens": tokens, "ttft": ttft if ttft is not None else latency,
            "latency": latency, "prompt_tokens": int((usage or {}).get("prompt_tokens", 0)),
            "completion_tokens": int((usage or {}).get("completion_tokens", len(tokens))),
            "spec_steps": spec.get("num_spec_steps"),
            "verified": (int(spec["num_spec_steps"]) + int(spec.get("num_accepted_draft_tokens", 0))
                         if spec.get("num_spec_steps") is not None else None),
            "accepted": int(spec.get("num_accepted_draft_tokens", 0)),
            "drafted": int(spec.get("num_draft_tokens", 0)),
            "steps": [int(a) for a in spec.get("per_step_accepted") or []], "finish": finish}


def _sglang_request(base_url: str, row: ServingRow, temperature: float, seed: int,
                    max_tokens: int, timeout: float) -> dict[str, Any]:
    """One streamed generation from SGLang's native endpoint (meta_info carries the counts)."""
    body = {"input_ids": list(row.prompt_ids), "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": temperature,
                                "top_p": 1.0, "sampling_seed": seed}}
    t0 = time.perf_counter()
    ttft, meta, tokens, finish = None, {}, [], ""
    with _post(f"{base_url}/generate", body, timeout) as resp:
        for event in _sse_events(resp):
            ids = event.get("output_ids") or []
            if ids and ttft is None:
                ttft = time.perf_counter() - t0
            tokens = list(ids) if ids else tokens
            meta = event.get("meta_info") or meta
    latency = time.perf_counter() - t0
    fr = meta.get("finish_reason")
    finish = fr.get("type", "") if isinstance(fr, dict) else str(fr or finish)
    completion = int(meta.get("completion_tokens", len(tokens)))
    return {"tokens": tokens, "ttft": ttft if ttft is not None else latency, "latency": latency,
            "prompt_tokens": int(meta.get("prompt_tokens", len(row.prompt_ids))),
            "completion_tokens": completion, **sglang_spec_counts(meta, completion),
            "finish": finish}


# SGLang's names for the accepted and proposed draft counts, newest first (older releases wrote
# the aliases); see the module docstring for what each counts.
SGLANG_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts")
SGLANG_PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts")


def _first_count(meta: Mapping[str, Any], names: Sequence[str]) -> int:
    return next((int(meta[name]) for name in names if meta.get(name) is not None), 0)


def sglang_spec_counts(meta: Mapping[str, Any], completion_tokens: int) -> dict[str, Any]:
    """Rounds and tokens of one SGLang response's ``meta_info``, in vLLM's convention.

    SGLang writes ``spec_verify_ct`` (verification rounds, prefill not counted) and
    ``spec_num_correct_drafts`` (accepted drafts, the bonus token not counted) only when at
    least one round ran, so a response of a single token (the prefill's) has neither: it is
    zero rounds, not a missing count. ``verified`` is rounds + accepted drafts (each round
    returns its accepted drafts and one token of its own), which leaves the prefill token out as
    vLLM does; SGLang's own ``completion_tokens / spec_verify_ct`` would count it.
    """
    verify = meta.get("spec_verify_ct")
    if verify is None and completion_tokens <= 1:
        verify = 0
    accepted = _first_count(meta, SGLANG_ACCEPTED)
    return {"spec_steps": verify,
            "verified": int(verify) + accepted if verify is not None else None,
            "accepted": accepted, "drafted": _first_count(meta, SGLANG_PROPOSED), "steps": []}


def serve_run(spec: EngineSpec, *, target: str, system: str, task: str,
              rows: Sequence[ServingRow], temperature: float, concurrency: int,
              seeds: Sequence[int], max_tokens: int, timeout_s: float = 3600.0
              ) -> tuple[list[ServedRequest], ServedRun]:
    """Send ``rows`` to a running engine with at most ``concurrency`` requests in flight and
    time the whole run (client side). Requests keep the rows' order in the result."""
    send = _vllm_request if spec.engine == "vllm" else _sglang_request

    def one(i: int) -> dict[str, Any]:
        return send(spec.base_url, rows[i], temperature, int(seeds[i]), max_tokens, timeout_s)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, int(concurrency))) as pool:
        results = list(pool.map(one, range(len(rows))))
    wall = time.perf_counter() - t0
    requests = []
    drafting = spec.kind is not None
    for i, (row, r) in enumerate(zip(rows, results)):
        steps = r["spec_steps"]
        if drafting and steps is None:
            raise StageError(f"{spec.engine} returned no speculative-decoding counts for "
                             f"{row.row_id}: start the server with per-request spec-decode "
                             "metrics (vLLM) or a speculative algorithm (SGLang); if it was, "
                             "the engine may have failed to run the drafter (its log says why, "
                             "e.g. vLLM's CPU attention has no kernel for the drafter's "
                             "head_dim)")
        requests.append(ServedRequest(
            target=target, system=system, engine=spec.engine, task=task, row_id=row.row_id,
            temperature=float(temperature), concurrency=int(concurrency), seed=int(seeds[i]),
            prompt_tokens=r["prompt_tokens"] or len(row.prompt_ids),
            completion_tokens=r["completion_tokens"],
            verify_steps=int(steps) if drafting else r["completion_tokens"],
            verified_tokens=int(r["verified"]) if drafting else r["completion_tokens"],
            accepted_drafts=r["accepted"], draft_tokens=r["drafted"], latency_s=r["latency"],
            ttft_s=r["ttft"], finish_reason=r["finish"], token_ids=list(r["tokens"]),
            step_accepted=list(r["steps"])))
    run = ServedRun(target=target, system=system, engine=spec.engine, task=task,
                    temperature=float(temperature), concurrency=int(concurrency),
                    requests=len(rows),
                    completion_tokens=sum(q.completion_tokens for q in requests), wall_s=wall)
    return requests, run
