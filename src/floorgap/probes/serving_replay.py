"""Served requests replayed offline: the offline prediction of every verification round the
engine ran (paper App. H.3; the check that the offline tau predicts the served one).

A drafter's served request holds its completion y (token ids) and the accepted drafts J_r of
each verification round r (vLLM's detailed per-request metrics). The first completion token
comes from prefill; round r then drafts gamma slots after the committed prefix y[:n_r]
(n_0 = 1) and returns J_r + 1 tokens, so n_{r+1} = n_r + J_r + 1. Replayed on the same target
and the same exported drafter folder the engine loaded, each round gets, per slot j along the
served continuation y[n_r + j]:

* ``p_tok``, ``q_tok``: the target's and the proposal's probability of that token (the accept
  factor's inputs), under the request's law (temperature T; top-p 1);
* ``tv``: TV(p_j, q_j), with p_j the target's law after y[:n_r + j]: slot j's exact acceptance
  probability once the slots before it were accepted.

The proposal is the one the engine verified. With probabilistic drafting it is q itself; with
greedy drafting (vLLM's default) it is the one-hot proposal at argmax q, so q_tok is 1 when the
served token is that argmax and 0 otherwise, and tv = 1 - p_j(argmax q_j). At temperature 0 the
engine also verifies greedily: the records then hold the limits of the same quantities
(p_tok = 1 on the greedy continuation, tv = 0 when the two argmaxes agree), so the same
estimators apply.

Each round also carries a lossless test of the tokens it returned, y[n_r .. n_r + J_r]: under
exact speculative sampling each is a draw from the target's p_i, so log p_i(y_i) + H(p_i) has
mean 0 and variance Var_{p_i}[log p_i]; ``lossless_score`` and ``lossless_var`` are their sums
over the round (NaN at temperature 0).

Named faults. An engine that reads a folder otherwise than floorgap does runs another function
of the same weights. The two faults users meet most are each one change of the drafter's
config (:func:`fault_hypotheses`): the block rows in the other layout ("block layout shifted
by one": 1+N weights run anchor-first propose at slot k what they predict for slot k - 1, and
the reverse k + 1) and the taps one decoder layer off ("target-layer index offset by one": the
features of layer L + 1 fed for L). Every round is replayed under each of them as well
(``hypotheses_tv``, JSON: fault name -> tv by slot), so the check can say which of them the
served rounds fit where the faithful reading does not.

The proposal at slot j is read with the served tokens as predecessors (order-1 drafters draft
slot j from slot j - 1's token, which is y[n_r + j - 1] whenever slot j is reached). Rounds
whose gamma slots run past the completion (the last rounds, cut by the token limit or a stop)
are kept with ``complete`` false and NaN beyond the end: the estimators use complete rounds.
Whether a round is complete depends on n_r only, not on its outcome, so dropping the others
biases nothing.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from floorgap.config import ENGINE_KINDS
from floorgap.errors import StageError
from floorgap.estimators.barycentre import tv_distance
from floorgap.models.drafters import build_drafter
from floorgap.models.from_target import target_features_and_logits
from floorgap.models.targets import text_config
from floorgap.sampling import SamplingLaw

__all__ = ["LAYOUT_SHIFT", "TAP_OFFSET", "ReplayRound", "fault_hypotheses",
           "hypothesis_drafters", "replay_request", "replay_requests", "request_lossless_terms",
           "round_starts"]


@dataclass
class ReplayRound:
    """One verification round of a served request, replayed (module docstring)."""

    target: str
    system: str
    task: str
    row_id: str
    temperature: float
    concurrency: int
    round: int
    start: int                  # n_r: completion tokens committed before the round's drafts
    accepted: int               # J_r, as the engine reported it
    complete: bool              # all gamma slots lie inside the completion
    p_tok: list[float]
    q_tok: list[float]
    tv: list[float]
    lossless_score: float = math.nan
    lossless_var: float = math.nan
    # tv by slot of the same round replayed under each named fault (JSON; module docstring)
    hypotheses_tv: str = "{}"


def round_starts(step_accepted: Sequence[int], completion_tokens: int, gamma: int) -> list[int]:
    """n_r of every round from the engine's accepted counts; checks that the rounds account for
    the completion (the last round may be cut by the token limit or a stop)."""
    starts, n = [], 1
    for r, a in enumerate(step_accepted):
        if not 0 <= int(a) <= gamma:
            raise StageError(f"round {r} accepted {a} drafts, outside [0, {gamma}]")
        if n >= completion_tokens:
            raise StageError(f"round {r} starts after the completion's {completion_tokens} "
                             "tokens: the per-round counts do not belong to this completion")
        starts.append(n)
        n += int(a) + 1
    if n < completion_tokens:
        raise StageError(f"the rounds return {n} tokens, the completion has {completion_tokens}: "
                         "the per-round counts are incomplete (serve with vLLM's detailed "
                         "per-request spec-decode metrics)")
    return starts


@torch.inference_mode()
def replay_request(target: Any, drafter: Any, prompt_ids: Sequence[int],
                   completion_ids: Sequence[int], step_accepted: Sequence[int], *,
                   temperature: float, labels: dict[str, Any],
                   draft_sampling: str = "probabilistic") -> list[ReplayRound]:
    """The rounds of one served request (module docstring). ``labels``: target, system, task,
    row_id, temperature, concurrency of the request; ``draft_sampling``: how the engine drafted
    at temperature > 0 (``greedy``: the one-hot proposal at argmax q)."""
    if drafter.cfg.kind not in ENGINE_KINDS:
        raise StageError(f"a {drafter.cfg.kind} drafter has no engine module to have been "
                         f"served by; only {' and '.join(ENGINE_KINDS)} rounds are replayed")
    gamma = int(drafter.gamma)
    y = [int(t) for t in completion_ids]
    starts = round_starts(step_accepted, len(y), gamma)
    if not starts:
        return []
    device = next(target.parameters()).device
    seq = torch.tensor([list(prompt_ids) + y], dtype=torch.long, device=device)
    n_prompt = len(prompt_ids)
    # one forward; logits row i is the target's law after prompt + y[:i] (rows for the
    # prompt's own positions are never read, so the output head skips them)
    feats, logits = target_features_and_logits(target, seq, list(drafter.cfg.taps), len(y) + 1)
    feats, logits = feats[:, :-1], logits[0].double()           # [1, P + N - 1, F], [N + 1, V]
    greedy = temperature <= 0
    law = None if greedy else SamplingLaw(temperature=float(temperature))
    q_logits = _round_proposals(drafter, feats, y, starts, n_prompt, gamma)  # [R, G, V]
    rounds = []
    for r, (n, a) in enumerate(zip(starts, step_accepted)):
        avail = min(gamma, len(y) - n)          # slots whose token lies inside the completion
        p_rows = logits[n:n + avail]            # p_j predicts y[n + j]
        toks = torch.tensor(y[n:n + avail], device=device)
        q_arg = q_logits[r, :avail].argmax(-1)
        score = var = math.nan
        if greedy:
            p_arg = p_rows.argmax(-1)
            p_tok = (p_arg == toks).double()
            q_tok = (q_arg == toks).double()
            tv = 1.0 - (p_arg == q_arg).double()
        else:
            # one warp for the slots' rows and the rows of the tokens the round returned
            p_all = law.probs(logits[n:n + max(avail, a + 1)])
            p = p_all[:avail]
            p_tok = p.gather(-1, toks[:, None])[:, 0]
            if draft_sampling == "greedy":
                q_tok = (q_arg == toks).double()
                tv = 1.0 - p.gather(-1, q_arg[:, None])[:, 0]
            else:
                q = law.probs(q_logits[r, :avail])
                q_tok = q.gather(-1, toks[:, None])[:, 0]
                tv = tv_distance(p, q, dim=-1)
            score, var = _lossless_terms(p_all[:a + 1], y[n:n + a + 1])
        pad = [math.nan] * (gamma - avail)
        rounds.append(ReplayRound(
            **labels, round=r, start=n, accepted=int(a), complete=avail == gamma,
            p_tok=p_tok.cpu().tolist() + pad, q_tok=q_tok.cpu().tolist() + pad,
            tv=tv.cpu().tolist() + pad, lossless_score=score, lossless_var=var))
    return rounds


#: The named faults, each the change of the replayed drafter's config that reproduces it.
LAYOUT_SHIFT = "block layout shifted by one"
TAP_OFFSET = "target-layer index offset by {step:+d}"


def fault_hypotheses(cfg: Any, depth: int) -> dict[str, dict[str, Any]]:
    """The named faults (module docstring) a drafter of config ``cfg`` on a target of ``depth``
    decoder layers can be read with: name -> the config fields that change. A tap offset that
    would leave the target's layers is not among them."""
    out: dict[str, dict[str, Any]] = {LAYOUT_SHIFT: {"anchor_rows": not cfg.sample_from_anchor}}
    for step in (1, -1):
        taps = [int(t) + step for t in cfg.taps]
        if all(0 <= t < depth for t in taps):
            out[TAP_OFFSET.format(step=step)] = {"taps": taps}
    return out


def hypothesis_drafters(target: Any, drafter: Any) -> dict[str, Any]:
    """The drafter read under each named fault: the same weights in a drafter of the changed
    config (:func:`fault_hypotheses`)."""
    depth = int(text_config(target.config).num_hidden_layers)
    out = {}
    for name, change in fault_hypotheses(drafter.cfg, depth).items():
        other = build_drafter(replace(drafter.cfg, **change), target)
        other.load_state_dict(drafter.state_dict())
        out[name] = other.eval().requires_grad_(False)
    return out


def replay_requests(target: Any, drafter: Any, requests: Iterable[Any],
                    prompts: Mapping[str, Sequence[int]], *, target_name: str, system: str,
                    draft_sampling: str = "probabilistic",
                    on_request: Callable[[int], Any] | None = None,
                    name_faults: bool = False) -> tuple[list[ReplayRound], int]:
    """The rounds of every served request (rows with ``task``, ``row_id``, ``temperature``,
    ``concurrency``, ``token_ids``, ``step_accepted``; ``prompts`` maps a row id to its prompt
    ids) and how many distinct requests were replayed. A request served again with the same
    completion and rounds (a greedy row at each concurrency) replays to the same numbers, so it
    is replayed once and its rounds relabelled. ``name_faults``: each round also replayed
    under every named fault (``hypotheses_tv``; module docstring)."""
    rounds: list[ReplayRound] = []
    replayed: dict[tuple[Any, ...], list[ReplayRound]] = {}
    others = hypothesis_drafters(target, drafter) if name_faults else {}
    for r in requests:
        row_id = str(r.row_id)
        if row_id not in prompts:
            raise StageError(f"served row {row_id} is not among the serving rows: the requests "
                             "were served for other rows; rerun the serving stage")
        labels = {"target": target_name, "system": system, "task": r.task, "row_id": row_id,
                  "temperature": float(r.temperature), "concurrency": int(r.concurrency)}
        key = (row_id, float(r.temperature), tuple(int(t) for t in r.token_ids),
               tuple(int(a) for a in r.step_accepted))
        if key in replayed:
            rounds += [dataclasses.replace(x, **labels) for x in replayed[key]]
        else:
            def replay(d: Any) -> list[ReplayRound]:
                return replay_request(target, d, prompts[row_id], list(r.token_ids),
                                      list(r.step_accepted), temperature=float(r.temperature),
                                      labels=labels, draft_sampling=draft_sampling)

            replayed[key] = replay(drafter)
            alternatives = {name: replay(d) for name, d in others.items()}
            for i, x in enumerate(replayed[key]):
                x.hypotheses_tv = json.dumps({n: alt[i].tv for n, alt in alternatives.items()})
            rounds += replayed[key]
        if on_request is not None:
            on_request(1)
    return rounds, len(replayed)


def _round_proposals(drafter: Any, feats: Any, y: list[int], starts: list[int], n_prompt: int,
                     gamma: int, chunk: int = 32) -> Any:
    """Proposal logits [rounds, gamma, V] of every round: block r's context is the prefix
    y[:n_r - 1] after the prompt (a left-aligned slice of the one feature pass), its committed
    token y[n_r - 1], and the served tokens are the predecessors (order-1 drafters)."""
    device = feats.device
    out = []
    for lo in range(0, len(starts), chunk):
        part = starts[lo:lo + chunk]
        length = torch.tensor([n_prompt + n - 1 for n in part], device=device)
        mask = torch.arange(feats.shape[1], device=device)[None, :] < length[:, None]
        committed = torch.tensor([y[n - 1] for n in part], device=device)
        paths = torch.tensor([[y[min(n + j, len(y) - 1)] for j in range(gamma)] for n in part],
                             device=device)
        index = torch.zeros(len(part), dtype=torch.long, device=device)
        logits = drafter(feats, committed, paths, prefix_mask=mask, feature_index=index).logits
        out.append(drafter.full_vocab(logits).double())   # a trimmed head: -inf outside it
    return torch.cat(out)


def _lossless_terms(p: Any, tokens: list[int]) -> tuple[float, float]:
    """sum_i log p_i(y_i) + H(p_i) and sum_i Var_{p_i}[log p_i] over the returned tokens (the
    rows of ``p`` beyond the completion are dropped)."""
    p = p[:len(tokens)]
    logp = torch.log(p.clamp_min(1e-300))
    h = -(p * logp).sum(-1)
    second = (p * logp * logp).sum(-1)
    tok = torch.tensor(tokens, device=p.device)
    score = logp.gather(-1, tok[:, None])[:, 0] + h
    return float(score.sum()), float((second - h * h).sum())


@torch.inference_mode()
def request_lossless_terms(target: Any, prompt_ids: Sequence[int],
                           completion_ids: Sequence[int], temperature: float
                           ) -> tuple[float, float]:
    """The lossless test's sums over every token of a served completion (module docstring),
    for a request whose rounds are not replayed (AR decoding, the target drafting for itself).
    Temperature > 0."""
    device = next(target.parameters()).device
    y = [int(t) for t in completion_ids]
    seq = torch.tensor([list(prompt_ids) + y], dtype=torch.long, device=device)
    # the rows after the prompt only: row i is the law after prompt + y[:i]
    logits = target(input_ids=seq, logits_to_keep=len(y) + 1).logits[0].double()
    law = SamplingLaw(temperature=float(temperature))
    return _lossless_terms(law.probs(logits[:len(y)]), y)
