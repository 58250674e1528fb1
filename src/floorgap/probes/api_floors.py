"""Floors read through an OpenAI-compatible endpoint (paper Sec. 3.4, App. C.6).

A frontier target exposes its probabilities only through an API capped at the top K tokens of
each position. At an anchor the probe asks the endpoint for M continuations of gamma tokens
under the sampling law, with the top-K log-probabilities of every position (``n = M`` in one
request, seeded per anchor: the engine keys each of the M paths from that seed). The floors
then come from the renormalised top-K rows with their omitted-mass band
(:func:`floorgap.estimators.truncation.truncated_slot_floors`).

Two routes: ``completions`` sends the anchor's context as token ids (exactly the context the
other probes use; vLLM and SGLang servers accept it) and ``chat`` sends the prompt as a user
message and the response so far as a final assistant message to be continued (the provider's
continuation switch goes in ``extra_body`` or ``assistant_fields``, e.g. vLLM's
``continue_final_message``). Tokens are keyed by the strings the endpoint returns; a vLLM
server with ``return_tokens_as_token_ids`` returns ``token_id:<id>``, which the matched-path
check needs to teacher-force the same paths through the local model.

Robustness. The client (the ``openai`` package) retries connection errors, 408/409/429 and 5xx
answers with exponential backoff; requests are spaced by ``requests_per_minute``. Every
complete anchor is appended to a journal (one JSON line, flushed and fsynced), so a run killed
mid-way resumes from the last complete anchor; a response without log-probabilities is a
:class:`~floorgap.errors.StageError` naming the fix. The API key is read from the environment
variable the config names and is never written anywhere.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from floorgap.errors import StageError
from floorgap.probes.drafter_eval import target_path_probs
from floorgap.probes.rollouts import SampledBlock, anchor_records
from floorgap.records import Journal
from floorgap.sampling import SamplingLaw

log = logging.getLogger("floorgap.api_floors")

ROUTES = ("completions", "chat")
TOKEN_ID_PREFIX = "token_id:"


@dataclass(frozen=True)
class Endpoint:
    """An OpenAI-compatible endpoint and how to ask it (the ``api_floors.endpoint`` section)."""

    base_url: str
    model: str
    route: str = "completions"
    top_k: int = 20
    api_key_env: str | None = None
    extra_body: Mapping[str, Any] = field(default_factory=dict)
    assistant_fields: Mapping[str, Any] = field(default_factory=dict)
    max_retries: int = 6
    timeout_s: float = 600.0
    requests_per_minute: float | None = None

    def __post_init__(self) -> None:
        if self.route not in ROUTES:
            raise StageError(f"unknown API route {self.route!r}; use one of {ROUTES}")

    def api_key(self) -> str:
        """The key from ``api_key_env`` (a local server needs none)."""
        if not self.api_key_env:
            return "EMPTY"
        key = os.environ.get(self.api_key_env)
        if not key:
            raise StageError(f"the API key variable {self.api_key_env} is not set: export it "
                             "before the run (keys never go in the config or the records)")
        return key

    def client(self) -> Any:
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=self.api_key(),
                             max_retries=self.max_retries, timeout=self.timeout_s)


@dataclass(frozen=True)
class PathRead:
    """One continuation at an anchor: the sampled tokens' keys and log-probabilities, and the
    top-K read of every position (the endpoint may append the sampled token as a K+1-th)."""

    path: int
    tokens: list[str]
    logp: list[float]
    top_tokens: list[list[str]]
    top_logp: list[list[float]]
    finish_reason: str | None = None


class RateLimiter:
    """Spaces request starts by 60 / ``requests_per_minute`` seconds (None: no limit)."""

    def __init__(self, requests_per_minute: float | None) -> None:
        self.interval = 60.0 / requests_per_minute if requests_per_minute else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            now = time.monotonic()
            delay = self._next - now
            self._next = max(now, self._next) + self.interval
        if delay > 0:
            time.sleep(delay)


def _no_logprobs(where: str) -> StageError:
    return StageError(f"the endpoint returned no log-probabilities ({where}): it must support "
                      "logprobs with top_logprobs (OpenAI chat: logprobs=true, top_logprobs=K; "
                      "completions: logprobs=K; a vLLM server needs --max-logprobs >= K)")


def parse_choice(choice: Mapping[str, Any], route: str, index: int) -> PathRead:
    """A :class:`PathRead` from one choice of a completions or chat response (plain dicts)."""
    lp = choice.get("logprobs")
    if not lp:
        raise _no_logprobs(f"choice {index}")
    if route == "completions":
        tokens, logp, tops = lp.get("tokens"), lp.get("token_logprobs"), lp.get("top_logprobs")
        if not tokens or logp is None or tops is None or any(t is None for t in tops):
            raise _no_logprobs(f"choice {index} lacks tokens or top_logprobs")
        top_tokens = [list(t.keys()) for t in tops]
        top_logp = [[float(v) for v in t.values()] for t in tops]
    else:
        content = lp.get("content")
        if not content or any(not c.get("top_logprobs") for c in content):
            raise _no_logprobs(f"choice {index} lacks content top_logprobs")
        tokens = [c["token"] for c in content]
        logp = [c["logprob"] for c in content]
        top_tokens = [[t["token"] for t in c["top_logprobs"]] for c in content]
        top_logp = [[float(t["logprob"]) for t in c["top_logprobs"]] for c in content]
    return PathRead(path=int(choice.get("index", index)), tokens=[str(t) for t in tokens],
                    logp=[float(v) for v in logp], top_tokens=top_tokens, top_logp=top_logp,
                    finish_reason=choice.get("finish_reason"))


def anchor_prompt(route: str, context_ids: Sequence[int], prompt_text: str | None = None,
                  response_text: str | None = None,
                  assistant_fields: Mapping[str, Any] | None = None) -> Any:
    """What one request sends: the context's token ids (completions) or the chat messages."""
    if route == "completions":
        return [int(i) for i in context_ids]
    if prompt_text is None:
        raise StageError("the chat route needs the anchor's prompt text")
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt_text}]
    if response_text:
        messages.append({"role": "assistant", "content": response_text,
                         **dict(assistant_fields or {})})
    return messages


def read_anchor(client: Any, endpoint: Endpoint, prompt: Any, *, n_paths: int, gamma: int,
                law: SamplingLaw, seed: int, limiter: RateLimiter | None = None
                ) -> list[PathRead]:
    """M continuations of ``gamma`` tokens at one anchor with top-K reads, in path order."""
    body: dict[str, Any] = dict(model=endpoint.model, n=int(n_paths), max_tokens=int(gamma),
                                temperature=float(law.temperature), top_p=float(law.top_p),
                                seed=int(seed))
    extra = dict(endpoint.extra_body)
    if law.top_k:
        extra.setdefault("top_k", int(law.top_k))
    if limiter is not None:
        limiter.wait()
    if endpoint.route == "completions":
        resp = client.completions.create(prompt=prompt, logprobs=int(endpoint.top_k),
                                         extra_body=extra or None, **body)
    else:
        resp = client.chat.completions.create(messages=prompt, logprobs=True,
                                              top_logprobs=int(endpoint.top_k),
                                              extra_body=extra or None, **body)
    data = resp.model_dump() if hasattr(resp, "model_dump") else dict(resp)
    choices = data.get("choices") or []
    if len(choices) != n_paths:
        raise StageError(f"the endpoint returned {len(choices)} choices for n={n_paths}: it must "
                         "honour n (or set api_floors.paths to what it allows)")
    return sorted((parse_choice(c, endpoint.route, i) for i, c in enumerate(choices)),
                  key=lambda r: r.path)


# ----------------------------------------------------------------------------------- journal


class AnchorJournal(Journal):
    """The journal of complete anchors: anchor id -> its path reads (:class:`Journal`)."""

    def load(self) -> dict[str, list[PathRead]]:
        return {k: [PathRead(**p) for p in v] for k, v in self.load_entries().items()}

    def append(self, anchor_id: str, reads: Sequence[PathRead]) -> None:
        self.append_entry(anchor_id, [asdict(r) for r in reads])


# ------------------------------------------------------------------------ matched-path check


def token_ids(keys: Sequence[str]) -> list[int]:
    """Token ids of ``token_id:<id>`` keys; other keys are a StageError naming the switch."""
    out = []
    for key in keys:
        if not key.startswith(TOKEN_ID_PREFIX):
            raise StageError(f"token {key!r} is not a token id: the matched-path check needs the "
                             "endpoint to return ids (vLLM: extra_body return_tokens_as_token_ids"
                             ": true)")
        out.append(int(key[len(TOKEN_ID_PREFIX):]))
    return out


def full_vocab_floors(model: Any, context_ids: list[int], tokens: torch.Tensor, *,
                      law: SamplingLaw, forward_batch: int) -> list[Any]:
    """Teacher-force the paths ``tokens`` ([M, gamma] ids) through the local target and compute
    the full-vocabulary floors of every slot on exactly those paths: the rollout probe's
    :class:`~floorgap.probes.record_types.SlotFloorRecord` of each slot."""
    P = target_path_probs(model, context_ids, tokens, law=law, forward_batch=forward_batch)
    block = SampledBlock(tokens=tokens, probs=P, revealed=None, seconds=0.0)
    return anchor_records("matched", block, store_top_k=1)[1]
