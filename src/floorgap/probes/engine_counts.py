"""What a serving engine counts itself (paper App. H.3's served rounds, read a second way).

vLLM counts every verification round in its Prometheus counters at ``/metrics``
(``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
``..._num_accepted_tokens_total`` and ``..._num_accepted_tokens_per_pos_total{position="k"}``,
the rounds whose slot k was accepted); :func:`read_engine_counts` reads them, and the serving
stage reads them before and after each run, so a run's :class:`EngineCounts` are what the
engine counted while it ran. They are a second reading of the same rounds as the per-request
records (:mod:`floorgap.probes.serving`): the sums of the two must be equal, and a difference
is a fault of the reading. SGLang keeps no such counters; its per-request ``meta_info`` is all
it reports.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass

from floorgap.errors import StageError
from floorgap.probes.serving import EngineSpec

__all__ = ["VLLM_COUNTERS", "EngineCounts", "parse_vllm_counts", "read_engine_counts",
           "settled_engine_counts"]

# vLLM's speculative-decoding counters (Prometheus families; samples end in _total)
VLLM_COUNTERS = {"drafts": "vllm:spec_decode_num_drafts",
                 "draft_tokens": "vllm:spec_decode_num_draft_tokens",
                 "accepted": "vllm:spec_decode_num_accepted_tokens",
                 "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos"}


@dataclass(frozen=True)
class EngineCounts:
    """What an engine counted itself over some verification rounds: the rounds (``drafts``),
    the drafted and the accepted tokens, and per slot k the rounds whose slot k was accepted
    (``accepted_per_pos``; vLLM's ``position`` label, 0-based)."""

    drafts: int
    draft_tokens: int
    accepted: int
    accepted_per_pos: tuple[int, ...]

    def __sub__(self, before: EngineCounts) -> EngineCounts:
        if len(before.accepted_per_pos) != len(self.accepted_per_pos):
            raise StageError("the engine's per-position counters changed length between two "
                             "readings: the server restarted or serves another draft length")
        return EngineCounts(
            drafts=self.drafts - before.drafts, accepted=self.accepted - before.accepted,
            draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_per_pos=tuple(a - b for a, b in zip(self.accepted_per_pos,
                                                         before.accepted_per_pos)))


def parse_vllm_counts(text: str, gamma: int) -> EngineCounts:
    """The speculative-decoding counters of one vLLM ``/metrics`` page (Prometheus text),
    summed over every other label (engine index, model name). A page without them, or without
    the per-position counter, is a StageError naming the missing counter and how to turn it
    on."""
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float] = {}
    per_pos = [0.0] * int(gamma)
    seen: set[str] = set()
    names = {v: k for k, v in VLLM_COUNTERS.items()}
    for family in text_string_to_metric_families(text):
        key = names.get(family.name)
        if key is None:
            continue
        for sample in family.samples:
            if not sample.name.endswith("_total"):
                continue   # a counter's _created timestamp
            seen.add(key)
            if key == "accepted_per_pos":
                k = int(sample.labels["position"])
                if not 0 <= k < gamma:
                    raise StageError(f"the engine counts accepted drafts at position {k}, "
                                     f"outside the {gamma} drafted slots: it serves another "
                                     "draft length than the spec's gamma")
                per_pos[k] += sample.value
            else:
                totals[key] = totals.get(key, 0.0) + sample.value
    missing = [VLLM_COUNTERS[k] for k in ("drafts", "draft_tokens", "accepted") if k not in seen]
    if missing:
        raise StageError(f"the engine's /metrics page has no {', '.join(missing)}_total: vLLM "
                         "logs no statistics (started with --disable-log-stats; drop it) or "
                         "serves without a speculative config")
    if "accepted_per_pos" not in seen:
        raise StageError(f"the engine's /metrics page has no {VLLM_COUNTERS['accepted_per_pos']}"
                         "_total{position}: this vLLM build counts no acceptance per position; "
                         "serve with a vLLM build that exports it, or turn the engine's "
                         "counters off (serving.engine_counters: false)")
    return EngineCounts(drafts=int(totals["drafts"]), draft_tokens=int(totals["draft_tokens"]),
                        accepted=int(totals["accepted"]),
                        accepted_per_pos=tuple(int(v) for v in per_pos))


def read_engine_counts(spec: EngineSpec, timeout: float = 30.0) -> EngineCounts:
    """The running engine's own speculative-decoding counters (module docstring). vLLM only:
    SGLang keeps none (its per-request ``meta_info`` is its count). An endpoint that does not
    answer is a StageError saying how to turn it on."""
    if spec.engine != "vllm":
        raise StageError(f"{spec.engine} keeps no speculative-decoding counters of its own "
                         "(its per-request meta_info is its count): set "
                         "serving.engine_counters: false, or serve in vllm")
    url = f"{spec.base_url}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            text = resp.read().decode("utf-8")
    except (urllib.error.URLError, ConnectionError, TimeoutError, OSError) as exc:
        raise StageError(f"{url} does not answer ({exc}): the engine's metrics endpoint is off "
                         "(vLLM's OpenAI server serves it at its own port; a proxy in front of "
                         "it must pass /metrics through), or turn the engine's counters off "
                         "(serving.engine_counters: false)") from None
    return parse_vllm_counts(text, spec.gamma)


def settled_engine_counts(spec: EngineSpec, pause_s: float = 0.5, wait_s: float = 30.0
                          ) -> EngineCounts:
    """The engine's counters once two readings ``pause_s`` apart agree: vLLM records a step's
    statistics beside its outputs, so the last step of a finished response may be counted a
    moment after the client has its last token. Waits at most ``wait_s``."""
    last = read_engine_counts(spec)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(pause_s)
        now = read_engine_counts(spec)
        if now == last:
            return now
        last = now
    return last
