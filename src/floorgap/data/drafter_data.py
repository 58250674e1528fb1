"""Drafter training data: target responses under the training law, cut into blocks.

For every floor domain the stage selects ``prompts_per_domain`` training prompts in the seeded
selection order, skipping the prompts of that domain's evaluation corpus (the ids in
``results/<target>/corpus/<domain>.parquet``), so no training prompt is ever an evaluation
prompt. The target answers each prompt under the *training* law (paper App. H.2: temperature
0.7, top-p 0.8, top-k 20) with the corpus stage's per-prompt keyed sampler
(:func:`floorgap.data.corpus.generate_batch`); the response seed is
``derive_seed(seed, "drafter-data", prompt_id)``, distinct from the evaluation seed of the same
prompt.

Blocks. A block position t (0 <= t <= n_response - gamma) cuts a response the way an anchor
does: the context is ``prompt + response[:t]`` (its last token is the *committed* token c), the
block is ``response[t:t + gamma]``. ``blocks_per_response`` distinct positions are drawn per
response without replacement from a generator keyed by ``(seed, "drafter-data", "blocks",
prompt_id)``; responses shorter than gamma tokens give no block. For each block slot k the
stored target is the top-K of the target's next-token law at ``context + block[:k]`` under the
training law (teacher forcing along the realised block). All blocks of a response lie on one
sequence, so one causal forward over ``prompt + response`` gives every slot of every block.

Record (``torch.save``; loads with ``weights_only=True``)::

    tokens          int32 [S]          prompt + response of every sequence, concatenated
    seq_offsets     int64 [n_seq + 1]  sequence i is tokens[seq_offsets[i]:seq_offsets[i + 1]]
    seq_prompt_len  int64 [n_seq]      prompt tokens of sequence i
    seq_prompt_ids  list[str]          prompt ids; seq_domains list[str]
    block_seq       int64 [N]          sequence of block n
    context_len     int64 [N]          context of block n = sequence[:context_len]
    committed       int64 [N]          the context's last token
    block_tokens    int64 [N, G]       sequence[context_len:context_len + G]
    target_ids      int32 [N, G, K]    top-K token ids of the training-law distribution
    target_vals     float32 [N, G, K]  their probabilities (the kept mass may be < 1)
    metadata        dict               provenance, config, seed, counts, excluded ids

Only token ids are stored, not the target's tap features: the features of every context are
prefixes of one causal forward over the sequence, so training recomputes them online (once per
sequence) and the file stays small (features would be n_taps * hidden floats per token).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from floorgap.errors import StageError
from floorgap.progress import Timer, iter_batches, progress
from floorgap.sampling import SamplingLaw
from floorgap.seeds import derive_seed, generator_for

log = logging.getLogger("floorgap.drafter_data")

FORMAT = 1
TENSOR_KEYS = ("tokens", "seq_offsets", "seq_prompt_len", "block_seq", "context_len",
               "committed", "block_tokens", "target_ids", "target_vals")


def response_seed(seed: int, prompt_id: str) -> int:
    """Seed of the training response to ``prompt_id`` (distinct from its evaluation seed)."""
    return derive_seed(seed, "drafter-data", prompt_id)


def block_positions(n_response: int, gamma: int, count: int, seed: int, prompt_id: str
                    ) -> list[int]:
    """Up to ``count`` distinct block starts in ``[0, n_response - gamma]``, ascending."""
    n_pos = n_response - gamma + 1
    if n_pos <= 0:
        return []
    gen = generator_for(derive_seed(seed, "drafter-data", "blocks", prompt_id))
    perm = torch.randperm(n_pos, generator=gen)[:count]
    return sorted(int(t) for t in perm)


@torch.no_grad()
def block_targets(model: Any, sequence: Sequence[int], starts: Sequence[int], gamma: int,
                  law: SamplingLaw, top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-K of the law's next-token distribution at every slot of every block of one sequence.

    ``starts`` are context lengths (in sequence tokens); slot k of a block starting at c is
    predicted by the logits at position ``c + k - 1``. Returns ids int32 [n, G, K] and
    probabilities float32 [n, G, K] (descending).
    """
    device = next(model.parameters()).device
    ids = torch.tensor([list(sequence)], dtype=torch.long, device=device)
    logits = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits[0]
    pos = torch.tensor([[c + k - 1 for k in range(gamma)] for c in starts], dtype=torch.long,
                       device=device)
    probs = law.probs(logits[pos.reshape(-1)])                          # float64 [n*G, V]
    vals, idx = probs.topk(min(top_k, probs.shape[-1]), dim=-1)
    n = len(starts)
    return (idx.view(n, gamma, -1).to("cpu", torch.int32),
            vals.view(n, gamma, -1).to("cpu", torch.float32))


@dataclass(frozen=True)
class _Settings:
    """The settings of one build, read once from the spec, the tokenizer and the model."""

    seed: int
    gamma: int
    law: SamplingLaw
    use_template: bool
    thinking: bool
    n_prompts: int
    per_response: int
    top_k: int
    max_new: int
    batch_size: int
    max_prompt_tokens: int
    eos_ids: list[int]
    pad_id: int

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any], model: Any, tokenizer: Any) -> _Settings:
        from floorgap.models.targets import eos_token_ids

        target, cfg = spec["target"], spec["training_data"]
        eos_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
        return cls(seed=int(spec["seed"]), gamma=int(spec["gamma"]),
                   law=SamplingLaw.from_spec(cfg["law"]),
                   use_template=bool(target.get("chat_template", True)),
                   thinking=bool(target.get("enable_thinking", False)),
                   n_prompts=int(cfg["prompts_per_domain"]),
                   per_response=int(cfg["blocks_per_response"]),
                   top_k=int(cfg["top_k_targets"]), max_new=int(cfg["max_new_tokens"]),
                   batch_size=int(spec["corpus"]["batch_size"]),
                   max_prompt_tokens=int(spec["corpus"]["max_prompt_tokens"]), eos_ids=eos_ids,
                   pad_id=(tokenizer.pad_token_id if tokenizer.pad_token_id is not None
                           else eos_ids[0]))


@dataclass
class _Record:
    """The record being built, sequence by sequence: the token stream with its offsets and
    per-sequence prompt lengths, ids and domains, and per block its sequence, context length,
    committed token, block tokens and top-K targets; plus the seconds spent generating
    responses and computing targets."""

    tokens: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=lambda: [0])
    prompt_lens: list[int] = field(default_factory=list)
    prompt_ids: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    block_seq: list[int] = field(default_factory=list)
    context_len: list[int] = field(default_factory=list)
    committed: list[int] = field(default_factory=list)
    block_tokens: list[list[int]] = field(default_factory=list)
    target_ids: list[torch.Tensor] = field(default_factory=list)
    target_vals: list[torch.Tensor] = field(default_factory=list)
    gen_seconds: float = 0.0
    fwd_seconds: float = 0.0

    def add_sequence(self, prompt: list[int], response: list[int], prompt_id: str, domain: str,
                     contexts: list[int], gamma: int, ids: torch.Tensor, vals: torch.Tensor
                     ) -> None:
        """Append sequence ``prompt + response`` and its blocks at context lengths
        ``contexts`` with their targets ``ids``/``vals`` [n, G, K]."""
        seq = prompt + response
        s = len(self.prompt_lens)
        self.tokens += seq
        self.offsets.append(len(self.tokens))
        self.prompt_lens.append(len(prompt))
        self.prompt_ids.append(prompt_id)
        self.domains.append(domain)
        for c in contexts:
            self.block_seq.append(s)
            self.context_len.append(c)
            self.committed.append(seq[c - 1])
            self.block_tokens.append(seq[c:c + gamma])
        self.target_ids.append(ids)
        self.target_vals.append(vals)

    def tensors(self) -> dict[str, Any]:
        """The record's data entries (module docstring), in the order they are saved."""
        return {
            "tokens": torch.tensor(self.tokens, dtype=torch.int32),
            "seq_offsets": torch.tensor(self.offsets, dtype=torch.long),
            "seq_prompt_len": torch.tensor(self.prompt_lens, dtype=torch.long),
            "seq_prompt_ids": self.prompt_ids,
            "seq_domains": self.domains,
            "block_seq": torch.tensor(self.block_seq, dtype=torch.long),
            "context_len": torch.tensor(self.context_len, dtype=torch.long),
            "committed": torch.tensor(self.committed, dtype=torch.long),
            "block_tokens": torch.tensor(self.block_tokens, dtype=torch.long),
            "target_ids": torch.cat(self.target_ids),
            "target_vals": torch.cat(self.target_vals),
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
               st: _Settings, name: str, record: _Record) -> tuple[dict[int, list[int]], int]:
    """The target's response to each prompt under the training law (batched shortest first),
    by prompt index, and the number cut at ``max_new_tokens``."""
    from floorgap.data.corpus import generate_batch

    order = sorted(range(len(prompts)), key=lambda i: (len(formatted[prompts[i].prompt_id]), i))
    responses: dict[int, list[int]] = {}
    n_censored = 0
    with progress(total=len(prompts), desc=f"drafter data {name}", unit="prompt") as bar:
        for idx in iter_batches(order, st.batch_size):
            timer = Timer()
            out = generate_batch(model, [formatted[prompts[i].prompt_id] for i in idx],
                                 [response_seed(st.seed, prompts[i].prompt_id) for i in idx],
                                 law=st.law, max_new_tokens=st.max_new, eos_ids=st.eos_ids,
                                 pad_id=st.pad_id)
            record.gen_seconds += timer.seconds
            for i, r in zip(idx, out):
                responses[i] = r.token_ids
                n_censored += r.censored
            bar.update(len(idx))
    return responses, n_censored


def _cut_blocks(model: Any, prompts: list[Any], formatted: Mapping[str, list[int]],
                responses: Mapping[int, list[int]], st: _Settings, name: str, record: _Record
                ) -> tuple[int, int]:
    """Cut each response into blocks and add them with their top-K targets to ``record``.
    Returns (blocks, responses shorter than gamma)."""
    n_blocks = n_short = 0
    for i, p in enumerate(prompts):
        prompt_ids, resp = formatted[p.prompt_id], responses[i]
        starts = block_positions(len(resp), st.gamma, st.per_response, st.seed, p.prompt_id)
        if not starts:
            n_short += 1
            continue
        contexts = [len(prompt_ids) + t for t in starts]
        timer = Timer()
        ids, vals = block_targets(model, prompt_ids + resp, contexts, st.gamma, st.law, st.top_k)
        record.fwd_seconds += timer.seconds
        record.add_sequence(prompt_ids, resp, p.prompt_id, name, contexts, st.gamma, ids, vals)
        n_blocks += len(contexts)
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
        "law": asdict(st.law), "training_data": dict(spec["training_data"]), "gamma": st.gamma,
        "seed": st.seed, "domains": [d["name"] for d in spec["domains"]],
        "excluded_prompt_ids": {k: sorted(v) for k, v in excluded.items()},
        "eos_token_ids": st.eos_ids, "pad_token_id": st.pad_id, "counts": counts,
        "features": "not stored; recomputed from the target's taps at training time",
        "seconds": {"generate": record.gen_seconds, "targets": record.fwd_seconds},
    }


def build_drafter_data(spec: Mapping[str, Any], model: Any, tokenizer: Any,
                        excluded: Mapping[str, set[str]],
                        model_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The training record (module docstring) for the domains of ``spec``.

    ``spec`` holds ``target`` (config entry with ``name``), ``domains`` (list of domain entries
    with ``name``), ``training_data``, ``corpus`` (``max_prompt_tokens``, ``batch_size``),
    ``gamma`` and ``seed``. ``excluded`` maps each domain to its evaluation prompt ids.
    """
    st = _Settings.from_spec(spec, model, tokenizer)
    record = _Record()
    counts: dict[str, Any] = {}
    formatted: dict[str, list[int]] = {}  # prompt id (domain-prefixed) -> formatted prompt ids
    for dom in spec["domains"]:
        name = dom["name"]
        prompts, sel = _training_prompts(dom, st, excluded, tokenizer, formatted)
        responses, n_censored = _responses(model, prompts, formatted, st, name, record)
        n_blocks, n_short = _cut_blocks(model, prompts, formatted, responses, st, name, record)
        counts[name] = {**sel.summary(), "responses": len(prompts), "censored": n_censored,
                        "too_short": n_short, "blocks": n_blocks,
                        "response_tokens": sum(len(r) for r in responses.values())}
        log.info("%s: %d training prompts (%d evaluation ids excluded), %d blocks, %d responses "
                 "shorter than gamma, %d censored", name, len(prompts), sel.excluded, n_blocks,
                 n_short, n_censored)
    if not record.block_seq:
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
