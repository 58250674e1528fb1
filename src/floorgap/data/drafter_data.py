"""Drafter training data: target responses, with the target's distribution at every
response position.

For every floor domain the stage selects ``prompts_per_domain`` training prompts in the seeded
selection order, skipping the prompts of that domain's evaluation corpus (the ids in
``results/<target>/corpus/<domain>.parquet``), so no training prompt is ever an evaluation
prompt. The target answers each prompt under the training data's ``law`` (by default the
evaluation law, so that training contexts are distributed like the floor paths) with the corpus
stage's per-prompt keyed sampler (:func:`floorgap.data.corpus.generate_batch`), ``batch_size``
prompts at a time, the batches filled across domains; the response seed is
``derive_seed(seed, "drafter-data", prompt_id)``, distinct from the evaluation seed of the same
prompt.

Targets. One teacher-forced forward over ``prompt + response`` gives, at every response
position, the target's next-token distribution under the *evaluation* law (the law the risks
R_k are measured against); its top-K ids and probabilities are stored (the mass outside them is
1 - sum of the values).

Blocks. Every response position is a block start: a block with context length c
(``prompt_len <= c <= len - gamma``) has the context ``sequence[:c]`` (its last token is the
*committed* token), the block ``sequence[c:c + gamma]`` and at slot k the target at position
``c + k - 1`` (teacher forcing along the realised block). Blocks overlap, so the record stores
one target row per position, not per block (:func:`block_index` lists the blocks).

Record (``torch.save``; loads with ``weights_only=True``)::

    tokens          int32 [S]          prompt + response of every sequence, concatenated
    seq_offsets     int64 [n_seq + 1]  sequence i is tokens[seq_offsets[i]:seq_offsets[i + 1]]
    seq_prompt_len  int64 [n_seq]      prompt tokens of sequence i
    seq_prompt_ids  list[str]          prompt ids; seq_domains list[str]
    pos_offsets     int64 [n_seq + 1]  rows of sequence i's response positions
    target_ids      int32 [P, K]       row pos_offsets[i] + j: top-K ids of the evaluation-law
    target_vals     float32 [P, K]     distribution predicting response token j of sequence i
    features        [S, n_taps * H]    optional (``store_features``): the target's tap features
                                       of every token, in the training precision
    metadata        dict               provenance, config, seed, counts, excluded ids;
                                       ``features`` says whether and at which taps they are stored

Features. The features of every context are prefixes of one causal forward over its sequence.
With ``store_features`` they come from the forward that gives the targets (so they cost nothing
here and no drafter job recomputes them: ~2 min of the target per trained drafter on the default
target); without it only token ids are stored and training recomputes them once per sequence,
which keeps the record small for paper-scale targets (n_taps * hidden values per token).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from floorgap.errors import StageError
from floorgap.models.targets import mixed_precision
from floorgap.progress import Timer, iter_batches, progress
from floorgap.sampling import SamplingLaw, law_topk
from floorgap.seeds import derive_seed

log = logging.getLogger("floorgap.drafter_data")

FORMAT = 2
TENSOR_KEYS = ("tokens", "seq_offsets", "seq_prompt_len", "pos_offsets", "target_ids",
               "target_vals")


def response_seed(seed: int, prompt_id: str) -> int:
    """Seed of the training response to ``prompt_id`` (distinct from its evaluation seed)."""
    return derive_seed(seed, "drafter-data", prompt_id)


@dataclass(frozen=True)
class FeatureSpec:
    """Which tap features a record stores (decoder layers ``taps``, 0-based) and in what dtype."""

    taps: tuple[int, ...]
    dtype: str = "float32"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> FeatureSpec | None:
        if not spec:
            return None
        return cls(taps=tuple(int(t) for t in spec["taps"]), dtype=str(spec.get("dtype", "float32")))


@torch.no_grad()
def position_targets(model: Any, sequence: Sequence[int], prompt_len: int, law: SamplingLaw,
                     top_k: int, features: FeatureSpec | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Top-K of the law's next-token distribution predicting every response token of one
    sequence: rows j = 0..len - prompt_len - 1 read the logits at position prompt_len + j - 1.
    Returns ids int32 [n, K], probabilities float32 [n, K] (descending) and, with ``features``,
    the concatenated hidden states at its taps for every token [len, n_taps * H] (tap t is the
    output of decoder layer t, as :func:`floorgap.models.drafters.target_features` reads it)."""
    from floorgap.models.drafters import target_features_and_logits

    device = next(model.parameters()).device
    ids = torch.tensor([list(sequence)], dtype=torch.long, device=device)
    # the output head runs on the rows read: positions prompt_len - 1 .. len - 1 (the last unused)
    keep = len(sequence) - prompt_len + 1
    feats = None
    if features is None:
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=keep).logits
    else:
        feats, logits = target_features_and_logits(model, ids, list(features.taps), keep)
        feats = feats[0].to("cpu", getattr(torch, features.dtype))
    vals, idx = law_topk(law, logits[0, :-1], top_k)                      # [n, K] each
    return idx.to("cpu", torch.int32), vals.to("cpu", torch.float32), feats


def block_index(data: Mapping[str, Any], gamma: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every block of a record: (sequence [N], context length c [N]), c running over
    ``prompt_len .. len - gamma`` of each sequence in order."""
    seqs, ctxs = [], []
    offsets, plen = data["seq_offsets"], data["seq_prompt_len"]
    for i in range(int(plen.shape[0])):
        n, lp = int(offsets[i + 1] - offsets[i]), int(plen[i])
        c = torch.arange(lp, n - gamma + 1, dtype=torch.long)
        seqs.append(torch.full_like(c, i))
        ctxs.append(c)
    return torch.cat(seqs), torch.cat(ctxs)


@dataclass(frozen=True)
class _Settings:
    """The settings of one build, read once from the spec, the tokenizer and the model."""

    seed: int
    gamma: int
    law: SamplingLaw
    target_law: SamplingLaw
    use_template: bool
    thinking: bool
    n_prompts: int
    top_k: int
    max_new: int
    batch_size: int
    max_prompt_tokens: int
    eos_ids: list[int]
    pad_id: int
    autocast: str | None = None
    features: FeatureSpec | None = None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], model: Any, tokenizer: Any) -> _Settings:
        from floorgap.models.targets import eos_token_ids

        target, cfg = spec["target"], spec["training_data"]
        eos_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        return cls(seed=int(spec["seed"]), gamma=int(spec["gamma"]),
                   law=SamplingLaw.from_spec(cfg.get("law") or spec["evaluation_law"]),
                   target_law=SamplingLaw.from_spec(spec["evaluation_law"]),
                   use_template=bool(target.get("chat_template", True)),
                   thinking=bool(target.get("enable_thinking", False)),
                   n_prompts=int(cfg["prompts_per_domain"]),
                   top_k=int(cfg["top_k_targets"]), max_new=int(cfg["max_new_tokens"]),
                   batch_size=int(cfg.get("batch_size", spec["corpus"]["batch_size"])),
                   max_prompt_tokens=int(spec["corpus"]["max_prompt_tokens"]), eos_ids=eos_ids,
                   autocast=cfg.get("autocast"),
                   features=FeatureSpec.from_spec(spec.get("features")),
                   pad_id=(tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                           else eos_ids[0]))


@dataclass
class _Record:
    """The record being built, sequence by sequence: the token stream with its offsets and
    per-sequence prompt lengths, ids and domains, the per-position top-K targets; plus the
    seconds spent generating responses and computing targets."""

    tokens: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=lambda: [0])
    prompt_lens: list[int] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    pos_offsets: list[int] = field(default_factory=lambda: [0])
    target_ids: list[torch.Tensor] = field(default_factory=list)
    target_vals: list[torch.Tensor] = field(default_factory=list)
    features: list[torch.Tensor] = field(default_factory=list)
    gen_seconds: float = 0.0
    fwd_seconds: float = 0.0

    def add_sequence(self, prompt: list[int], response: list[int], prompt_id: str, domain: str,
                     ids: torch.Tensor, vals: torch.Tensor,
                     features: torch.Tensor | None = None) -> None:
        """Append sequence ``prompt + response`` with its per-position targets [n_resp, K]
        (and the tap features of its tokens)."""
        self.tokens += prompt + response
        self.offsets.append(len(self.tokens))
        self.prompt_lens.append(len(prompt))
        self.prompt_ids.append(prompt_id)
        self.domains.append(domain)
        self.pos_offsets.append(self.pos_offsets[-1] + len(response))
        self.target_ids.append(ids)
        self.target_vals.append(vals)
        if features is not None:
            self.features.append(features)

    def tensors(self) -> dict[str, Any]:
        """The record's data entries (module docstring), in the order they are saved."""
        feats = {"features": torch.cat(self.features)} if self.features else {}
        return {
            "tokens": torch.tensor(self.tokens, dtype=torch.int32),
            "seq_offsets": torch.tensor(self.offsets, dtype=torch.long),
            "seq_prompt_len": torch.tensor(self.prompt_lens, dtype=torch.long),
            "seq_prompt_ids": self.prompt_ids,
            "seq_domains": self.domains,
            "pos_offsets": torch.tensor(self.pos_offsets, dtype=torch.long),
            "target_ids": torch.cat(self.target_ids),
            "target_vals": torch.cat(self.target_vals),
            **feats,
        }


def _training_prompts(dom: Mapping[str, Any], st: _Settings, excluded: Mapping[str, set[str]],
                      tokenizer: Any, formatted: dict[str, list[int]]) -> tuple[list[Any], Any]:
    """The domain's training prompts (seeded selection order, evaluation ids skipped) and the
    selection; fills ``formatted`` (prompt id -> formatted prompt ids) along the way."""
    from floorgap.data.domains import load_domain, select_prompts
    from floorgap.models.targets import chat_prompt_ids

    name = dom["name"]
    if name not in excluded:
        raise StageError(f"no evaluation corpus given for domain {name}")

    def count_tokens(p: Any) -> int:
        formatted[p.prompt_id] = chat_prompt_ids(tokenizer, p.text, chat_template=st.use_template,
                                                 enable_thinking=st.thinking)
        return len(formatted[p.prompt_id])

    domain = load_domain(name, st.seed, source=dom.get("source"), text_field=dom.get("text_field"))
    sel = select_prompts(domain.prompts, st.n_prompts, st.seed, count_tokens=count_tokens,
                         max_prompt_tokens=st.max_prompt_tokens, exclude_ids=excluded[name])
    prompts = sel.selected
    overlap = {p.prompt_id for p in prompts} & set(excluded[name])
    if overlap:
        raise StageError(f"{name}: training prompts overlap the evaluation corpus: {overlap}")
    return prompts, sel


def _responses(model: Any, prompts: list[Any], formatted: Mapping[str, list[int]],
               st: _Settings, record: _Record) -> list[Any]:
    """The target's response to each prompt under the training data's law (batched, shortest
    first), in the prompts' order (:class:`floorgap.data.corpus.Response`: tokens, and whether
    ``max_new_tokens`` cut it)."""
    from floorgap.data.corpus import generate_batch

    order = sorted(range(len(prompts)), key=lambda i: (len(formatted[prompts[i].prompt_id]), i))
    responses: list[Any] = [None] * len(prompts)
    with progress(total=len(prompts), desc="drafter data responses", unit="prompt") as bar:
        for idx in iter_batches(order, st.batch_size):
            timer = Timer()
            # only the contexts are drawn in mixed precision: the stored targets come from a
            # forward in the target's own dtype (the evaluation law's distributions)
            with mixed_precision(next(model.parameters()).device.type, st.autocast):
                out = generate_batch(model, [formatted[prompts[i].prompt_id] for i in idx],
                                     [response_seed(st.seed, prompts[i].prompt_id) for i in idx],
                                     law=st.law, max_new_tokens=st.max_new,
                                     eos_ids=st.eos_ids, pad_id=st.pad_id)
            record.gen_seconds += timer.seconds
            for i, r in zip(idx, out):
                responses[i] = r
            bar.update(len(idx))
    return responses


def _add_targets(model: Any, prompts: list[Any], formatted: Mapping[str, list[int]],
                 responses: Sequence[list[int]], st: _Settings, name: str, record: _Record
                 ) -> tuple[int, int]:
    """Add each response with its per-position top-K targets to ``record``. Returns (blocks,
    responses shorter than gamma, which give none and are left out)."""
    n_blocks = n_short = 0
    for i, p in enumerate(prompts):
        prompt_ids, resp = formatted[p.prompt_id], responses[i]
        if len(resp) < st.gamma:
            n_short += 1
            continue
        timer = Timer()
        ids, vals, feats = position_targets(model, prompt_ids + resp, len(prompt_ids),
                                            st.target_law, st.top_k, st.features)
        record.fwd_seconds += timer.seconds
        record.add_sequence(prompt_ids, resp, p.prompt_id, name, ids, vals, feats)
        n_blocks += len(resp) - st.gamma + 1
    return n_blocks, n_short


def _metadata(spec: Mapping[str, Any], st: _Settings, excluded: Mapping[str, set[str]],
              counts: dict[str, Any], model_info: Mapping[str, Any] | None, record: _Record
              ) -> dict[str, Any]:
    """The record's provenance: target and model, settings, seed, counts, excluded ids."""
    target = spec["target"]
    info = dict(model_info or {})
    return {
        "stage": "drafter_data", "format": FORMAT, "target": target.get("name"),
        "dtype": target.get("dtype"), "device": target.get("device"),
        "model": {k: info.get(k) for k in ("source_kind", "source", "architecture",
                                           "parameters", "vocab_size", "dtype")},
        "chat_template": st.use_template, "enable_thinking": st.thinking,
        "law": asdict(st.law), "target_law": asdict(st.target_law), "training_data": dict(spec["training_data"]), "gamma": st.gamma,
        "seed": st.seed, "domains": [d["name"] for d in spec["domains"]],
        "excluded_prompt_ids": {k: sorted(v) for k, v in excluded.items()},
        "eos_token_ids": st.eos_ids, "pad_token_id": st.pad_id, "counts": counts,
        "features": ({"taps": list(st.features.taps), "dtype": st.features.dtype}
                     if st.features else None),
        "seconds": {"generate": record.gen_seconds, "targets": record.fwd_seconds},
    }


def build_drafter_data(spec: Mapping[str, Any], model: Any, tokenizer: Any,
                        excluded: Mapping[str, set[str]],
                        model_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The training record (module docstring) for the domains of ``spec``.

    ``spec`` holds ``target`` (config entry with ``name``), ``domains`` (list of domain entries
    with ``name``), ``training_data``, ``evaluation_law``, ``corpus`` (``max_prompt_tokens``,
    ``batch_size``),
    ``gamma`` and ``seed``. ``excluded`` maps each domain to its evaluation prompt ids.
    """
    st = _Settings.from_spec(spec, model, tokenizer)
    record = _Record()
    counts: dict[str, Any] = {}
    formatted: dict[str, list[int]] = {}  # prompt id (domain-prefixed) -> formatted prompt ids
    chosen = [(dom["name"], *_training_prompts(dom, st, excluded, tokenizer, formatted))
              for dom in spec["domains"]]
    # one generation over every domain's prompts, so batches fill across domains (a response's
    # draws are keyed by its prompt id: the batching changes it only through float noise)
    everything = [p for _, prompts, _ in chosen for p in prompts]
    generated = _responses(model, everything, formatted, st, record)
    first = 0
    for name, prompts, sel in chosen:
        mine, first = generated[first:first + len(prompts)], first + len(prompts)
        responses = [r.token_ids for r in mine]
        n_censored = sum(r.censored for r in mine)
        n_blocks, n_short = _add_targets(model, prompts, formatted, responses, st, name, record)
        counts[name] = {**sel.summary(), "responses": len(prompts), "censored": n_censored,
                        "too_short": n_short, "blocks": n_blocks,
                        "response_tokens": sum(len(r) for r in responses)}
        log.info("%s: %d training prompts (%d evaluation ids excluded), %d blocks, %d responses "
                 "shorter than gamma, %d censored", name, len(prompts), sel.excluded, n_blocks,
                 n_short, n_censored)
    if not record.prompt_ids:
        raise StageError("no training blocks: every response is shorter than gamma; raise "
                         "drafters.training_data.max_new_tokens")
    return {"format": FORMAT, **record.tensors(),
            "metadata": _metadata(spec, st, excluded, counts, model_info, record)}


def sequence(data: Mapping[str, Any], i: int) -> torch.Tensor:
    """Token ids (int64) of sequence ``i`` of a training record."""
    a, b = int(data["seq_offsets"][i]), int(data["seq_offsets"][i + 1])
    return data["tokens"][a:b].long()


def load_drafter_data(path: Any) -> dict[str, Any]:
    """Load a training record written by the drafter_data stage."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StageError(f"{path}: not a drafter training record of format {FORMAT}")
    return data
