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
from dataclasses import asdict
from typing import Any

import torch

from floorgap.errors import StageError
from floorgap.progress import Timer, iter_batches, progress
from floorgap.sampling import SamplingLaw
from floorgap.seeds import derive_seed, generator_for

log = logging.getLogger("floorgap.training_data")

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


def build_training_data(spec: Mapping[str, Any], model: Any, tokenizer: Any,
                        excluded: Mapping[str, set[str]],
                        model_info: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The training record (module docstring) for the domains of ``spec``.

    ``spec`` holds ``target`` (config entry with ``name``), ``domains`` (list of domain entries
    with ``name``), ``training_data``, ``corpus`` (``max_prompt_tokens``, ``batch_size``),
    ``gamma`` and ``seed``. ``excluded`` maps each domain to its evaluation prompt ids.
    """
    from floorgap.data.corpus import generate_batch
    from floorgap.data.domains import load_domain, select_prompts
    from floorgap.models.targets import chat_prompt_ids, eos_token_ids

    target, cfg = spec["target"], spec["training_data"]
    seed, gamma = int(spec["seed"]), int(spec["gamma"])
    law = SamplingLaw.from_spec(cfg["law"])
    use_template = bool(target.get("chat_template", True))
    thinking = bool(target.get("enable_thinking", False))
    n_prompts, per_response = int(cfg["prompts_per_domain"]), int(cfg["blocks_per_response"])
    top_k, max_new = int(cfg["top_k_targets"]), int(cfg["max_new_tokens"])
    batch_size = int(spec["corpus"]["batch_size"])
    eos_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]

    tokens: list[int] = []
    offsets, prompt_lens, seq_pids, seq_domains = [0], [], [], []
    block_seq, ctx_len, committed, blocks, t_ids, t_vals = [], [], [], [], [], []
    counts: dict[str, Any] = {}
    formatted: dict[str, list[int]] = {}  # prompt id (domain-prefixed) -> formatted prompt ids

    def count_tokens(p: Any) -> int:
        formatted[p.prompt_id] = chat_prompt_ids(tokenizer, p.text, chat_template=use_template,
                                                 enable_thinking=thinking)
        return len(formatted[p.prompt_id])

    gen_seconds = fwd_seconds = 0.0
    for dom in spec["domains"]:
        name = dom["name"]
        if name not in excluded:
            raise StageError(f"no evaluation corpus given for domain {name}")
        domain = load_domain(name, seed, source=dom.get("source"),
                             text_field=dom.get("text_field"))
        sel = select_prompts(domain.prompts, n_prompts, seed, count_tokens=count_tokens,
                             max_prompt_tokens=int(spec["corpus"]["max_prompt_tokens"]),
                             exclude_ids=excluded[name])
        prompts = sel.selected
        overlap = {p.prompt_id for p in prompts} & set(excluded[name])
        if overlap:
            raise StageError(f"{name}: training prompts overlap the evaluation corpus: {overlap}")
        order = sorted(range(len(prompts)), key=lambda i: (len(formatted[prompts[i].prompt_id]), i))
        responses: dict[int, list[int]] = {}
        n_censored = 0
        with progress(total=len(prompts), desc=f"drafter data {name}", unit="prompt") as bar:
            for idx in iter_batches(order, batch_size):
                timer = Timer()
                out = generate_batch(model, [formatted[prompts[i].prompt_id] for i in idx],
                                     [response_seed(seed, prompts[i].prompt_id) for i in idx],
                                     law=law, max_new_tokens=max_new, eos_ids=eos_ids,
                                     pad_id=pad_id)
                gen_seconds += timer.seconds
                for i, r in zip(idx, out):
                    responses[i] = r.token_ids
                    n_censored += r.censored
                bar.update(len(idx))
        n_blocks = n_short = 0
        for i, p in enumerate(prompts):
            prompt_ids, resp = formatted[p.prompt_id], responses[i]
            starts = block_positions(len(resp), gamma, per_response, seed, p.prompt_id)
            if not starts:
                n_short += 1
                continue
            seq = prompt_ids + resp
            contexts = [len(prompt_ids) + t for t in starts]
            timer = Timer()
            ids, vals = block_targets(model, seq, contexts, gamma, law, top_k)
            fwd_seconds += timer.seconds
            s = len(prompt_lens)
            tokens += seq
            offsets.append(len(tokens))
            prompt_lens.append(len(prompt_ids))
            seq_pids.append(p.prompt_id)
            seq_domains.append(name)
            for c in contexts:
                block_seq.append(s)
                ctx_len.append(c)
                committed.append(seq[c - 1])
                blocks.append(seq[c:c + gamma])
            t_ids.append(ids)
            t_vals.append(vals)
            n_blocks += len(contexts)
        counts[name] = {**sel.summary(), "responses": len(prompts), "censored": n_censored,
                        "too_short": n_short, "blocks": n_blocks,
                        "response_tokens": sum(len(r) for r in responses.values())}
        log.info("%s: %d training prompts (%d evaluation ids excluded), %d blocks, %d responses "
                 "shorter than gamma, %d censored", name, len(prompts), sel.excluded, n_blocks,
                 n_short, n_censored)
    if not block_seq:
        raise StageError("no training blocks: every response is shorter than gamma; raise "
                         "drafters.training_data.max_new_tokens")
    info = dict(model_info or {})
    metadata = {
        "stage": "drafter_data", "format": FORMAT, "target": target.get("name"),
        "dtype": target.get("dtype"), "device": target.get("device"),
        "model": {k: info.get(k) for k in ("source_kind", "source", "architecture",
                                           "parameters", "vocab_size", "dtype")},
        "chat_template": use_template, "enable_thinking": thinking,
        "law": asdict(law), "training_data": dict(cfg), "gamma": gamma, "seed": seed,
        "domains": [d["name"] for d in spec["domains"]],
        "excluded_prompt_ids": {k: sorted(v) for k, v in excluded.items()},
        "eos_token_ids": eos_ids, "pad_token_id": pad_id, "counts": counts,
        "features": "not stored; recomputed from the target's taps at training time",
        "seconds": {"generate": gen_seconds, "targets": fwd_seconds},
    }
    return {
        "format": FORMAT,
        "tokens": torch.tensor(tokens, dtype=torch.int32),
        "seq_offsets": torch.tensor(offsets, dtype=torch.long),
        "seq_prompt_len": torch.tensor(prompt_lens, dtype=torch.long),
        "seq_prompt_ids": seq_pids,
        "seq_domains": seq_domains,
        "block_seq": torch.tensor(block_seq, dtype=torch.long),
        "context_len": torch.tensor(ctx_len, dtype=torch.long),
        "committed": torch.tensor(committed, dtype=torch.long),
        "block_tokens": torch.tensor(blocks, dtype=torch.long),
        "target_ids": torch.cat(t_ids),
        "target_vals": torch.cat(t_vals),
        "metadata": metadata,
    }


def sequence(data: Mapping[str, Any], i: int) -> torch.Tensor:
    """Token ids (int64) of sequence ``i`` of a training record."""
    a, b = int(data["seq_offsets"][i]), int(data["seq_offsets"][i + 1])
    return data["tokens"][a:b].long()


def load_training_data(path: Any) -> dict[str, Any]:
    """Load a training record written by the drafter_data stage."""
    data = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise StageError(f"{path}: not a drafter training record of format {FORMAT}")
    return data
