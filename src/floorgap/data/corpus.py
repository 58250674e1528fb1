"""The target-generated corpus: one response per selected prompt under the evaluation law.

Anchors (paper Sec. 2, App. B.2) lie on sequences the target itself generated, so the floors
are measured at contexts the target visits. For each selected prompt the target samples one
response under the evaluation law (temperature 1, no top-p / top-k truncation by default),
with the chat template applied and thinking off.

Randomness is keyed per prompt, never per batch: every prompt owns a CPU ``torch.Generator``
seeded with its prompt seed, and at each decoding step the row draws exactly one uniform from
it and takes the token at that quantile of the law (inverse CDF over the vocabulary, in float64).
Batching (left padding, KV cache) therefore changes a response only through floating-point
noise in the logits, and a sampled token flips only if a uniform falls within that noise of a
CDF boundary. Generation reuses transformers' ``generate`` (greedy mode) with a logits processor
that performs this draw and returns scores whose argmax is the drawn token.

Responses include the EOS token that ended them (``response_token_ids[-1]`` is EOS unless the
response is *censored*, i.e. hit ``max_new_tokens`` first); padding is never included.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import torch

from floorgap.data.domains import DomainPrompts, Prompt, Selection, load_domain, select_prompts
from floorgap.errors import StageError
from floorgap.models.sampled_decode import left_padded
from floorgap.models.targets import chat_prompt_ids, eos_token_ids, special_token_ids
from floorgap.progress import Timer, iter_batches, progress
from floorgap.records import TableRecord
from floorgap.sampling import SamplingLaw, keyed_draws
from floorgap.seeds import generator_for

log = logging.getLogger("floorgap.corpus")


# ---------------------------------------------------------------------------------------------
# The sampling law


class PerRowLawSampler:
    """A ``LogitsProcessor`` that samples each row from the law with the row's own generator.

    It returns scores equal to ``-inf`` except 0 at the drawn token, so greedy decoding takes
    the drawn token. The draws are kept (``self.draws``) to check that nothing else changed
    the choice.
    """

    def __init__(self, law: SamplingLaw, generators: Sequence[torch.Generator]) -> None:
        self.law = law
        self.generators = list(generators)
        self.draws: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if scores.shape[0] != len(self.generators):
            raise RuntimeError("batch size changed during generation")
        tokens = keyed_draws(self.law, scores, self.generators)
        self.draws.append(tokens.cpu())
        out = torch.full_like(scores, -math.inf)
        out.scatter_(1, tokens.unsqueeze(1).to(out.device), 0.0)
        return out


@contextlib.contextmanager
def _clean_generation_config(model: Any, eos_ids: list[int], pad_id: int) -> Iterator[Any]:
    """Swap in a generation config with no processors of its own (no repetition penalty, no
    suppressed tokens, no minimum length inherited from a checkpoint's defaults)."""
    from transformers import GenerationConfig

    saved = model.generation_config
    model.generation_config = GenerationConfig(eos_token_id=eos_ids, pad_token_id=pad_id,
                                               bos_token_id=saved.bos_token_id)
    try:
        yield model.generation_config
    finally:
        model.generation_config = saved


@dataclass
class Response:
    token_ids: list[int]
    censored: bool


def generate_batch(model: Any, prompt_ids: Sequence[Sequence[int]], seeds: Sequence[int], *,
                   law: SamplingLaw, max_new_tokens: int, eos_ids: Sequence[int],
                   pad_id: int) -> list[Response]:
    """Sample one response per prompt (left-padded batch, KV cache, per-row generators)."""
    device = next(model.parameters()).device
    ids, mask, _ = left_padded(prompt_ids, pad_id)
    width = ids.shape[1]
    sampler = PerRowLawSampler(law, [generator_for(s) for s in seeds])
    eos = [int(e) for e in eos_ids]
    from transformers import LogitsProcessorList

    with _clean_generation_config(model, eos, pad_id), torch.no_grad():
        out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                             do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                             use_cache=True, logits_processor=LogitsProcessorList([sampler]))
    new = out[:, width:].cpu()
    draws = torch.stack(sampler.draws, dim=1) if sampler.draws else new[:, :0]
    eos_set = set(eos)
    responses = []
    for i in range(len(prompt_ids)):
        row = new[i].tolist()
        end = next((j for j, tok in enumerate(row) if tok in eos_set), None)
        tokens = row if end is None else row[:end + 1]
        if tokens != draws[i, :len(tokens)].tolist():
            raise RuntimeError("generate changed a drawn token: a logits processor other than the "
                               "law's sampler is active")
        responses.append(Response(tokens, censored=end is None))
    return responses


# ---------------------------------------------------------------------------------------------
# The corpus stage


CORPUS_SCHEMA = pa.schema([
    ("prompt_id", pa.string()), ("domain", pa.string()), ("stand_in_for", pa.string()),
    ("selection_rank", pa.int32()), ("source_id", pa.string()), ("category", pa.string()),
    ("prompt_text", pa.string()), ("prompt_seed", pa.int64()),
    ("prompt_token_ids", pa.list_(pa.int32())), ("response_token_ids", pa.list_(pa.int32())),
    ("n_prompt_tokens", pa.int32()), ("n_response_tokens", pa.int32()),
    ("censored", pa.bool_()), ("response_text", pa.string()),
])


@dataclass
class _Selection:
    """The selected prompts of one domain and their chat-formatted token ids."""
    domain: Any
    selection: Any
    formatted: dict[str, list[int]]

    @property
    def prompts(self) -> list[Prompt]:
        return self.selection.selected


def select_formatted(domain: DomainPrompts, n: int, seed: int, tokenizer: Any, *,
                     chat_template: bool, enable_thinking: bool, **options: Any
                     ) -> tuple[Selection, dict[str, list[int]]]:
    """:func:`~floorgap.data.domains.select_prompts` (``options``: its keywords) filtering on
    the target-formatted length: each prompt examined is formatted on the way. Returns the
    selection and prompt id -> formatted token ids."""
    formatted: dict[str, list[int]] = {}

    def count_tokens(p: Prompt) -> int:
        formatted[p.prompt_id] = chat_prompt_ids(tokenizer, p.text, chat_template=chat_template,
                                                 enable_thinking=enable_thinking)
        return len(formatted[p.prompt_id])

    return select_prompts(domain.prompts, n, seed, count_tokens=count_tokens, **options), formatted


def _select_domain_prompts(spec: dict[str, Any], tokenizer: Any) -> _Selection:
    """Load the domain and select its prompts, formatting each one on the way (the selection
    filters on the formatted length)."""
    target, dom, cfg = spec["target"], spec["domain"], spec["corpus"]
    seed = int(spec["seed"])
    domain = load_domain(dom["name"], seed, source=dom.get("source"),
                         text_field=dom.get("text_field"))
    selection, formatted = select_formatted(
        domain, int(dom["prompts"]), seed, tokenizer, chat_template=bool(target["chat_template"]),
        enable_thinking=bool(target["enable_thinking"]),
        max_prompt_tokens=int(cfg["max_prompt_tokens"]))
    log.info("%s: selected %d of %d prompts (%d over %d tokens skipped)", domain.domain,
             len(selection.selected), len(domain.prompts), len(selection.filtered_long),
             cfg["max_prompt_tokens"])
    return _Selection(domain, selection, formatted)


def _generate_responses(model: Any, chosen: _Selection, *, law: SamplingLaw, max_new: int,
                        batch_size: int, eos_ids: list[int], pad_id: int) -> dict[int, Response]:
    """One response per selected prompt, keyed by selection rank."""
    prompts, formatted, name = chosen.prompts, chosen.formatted, chosen.domain.domain
    # Batch prompts of similar length together (less padding); results do not depend on it.
    order = sorted(range(len(prompts)), key=lambda i: (len(formatted[prompts[i].prompt_id]), i))
    responses: dict[int, Response] = {}
    batches = list(iter_batches(order, batch_size))
    timings = []
    with progress(total=len(prompts), desc=f"corpus {name}", unit="prompt") as bar:
        for b, idx in enumerate(batches):
            timer = Timer()
            batch_ids = [formatted[prompts[i].prompt_id] for i in idx]
            out = generate_batch(model, batch_ids, [prompts[i].seed for i in idx], law=law,
                                 max_new_tokens=max_new, eos_ids=eos_ids, pad_id=pad_id)
            responses.update(zip(idx, out))
            n_new = sum(len(r.token_ids) for r in out)
            timings.append(timer.seconds)
            log.info("batch %d/%d: %d prompts, prompt tokens <= %d, %d new tokens, %d censored, "
                     "%.1f s (%.1f tok/s)", b + 1, len(batches), len(idx),
                     max(len(x) for x in batch_ids), n_new, sum(r.censored for r in out),
                     timer.seconds, n_new / max(timer.seconds, 1e-9))
            bar.update(len(idx))
    log.info("%s: generation took %.1f s in %d batches", name, sum(timings), len(batches))
    return responses


def _censoring_counts(chosen: _Selection, responses: dict[int, Response],
                      cfg: dict[str, Any]) -> dict[str, Any]:
    """The selection and censoring counts; raises :class:`StageError` when the censored share
    exceeds ``censored_share_max``."""
    name, n_prompts, max_new = chosen.domain.domain, len(chosen.prompts), int(cfg["max_new_tokens"])
    n_censored = sum(r.censored for r in responses.values())
    share = n_censored / n_prompts
    counts = {**chosen.selection.summary(), "censored": n_censored, "censored_share": share,
              "response_tokens": sum(len(r.token_ids) for r in responses.values())}
    log.info("%s: %d of %d responses censored at %d tokens (share %.3f, gate %.3f)",
             name, n_censored, n_prompts, max_new, share, cfg["censored_share_max"])
    if share > float(cfg["censored_share_max"]):
        raise StageError(f"{name}: {n_censored} of {n_prompts} responses hit "
                         f"max_new_tokens={max_new} without EOS (share {share:.3f} > "
                         f"censored_share_max {cfg['censored_share_max']}); raise "
                         f"corpus.max_new_tokens or the gate")
    return counts


def _corpus_table(chosen: _Selection, responses: dict[int, Response], tokenizer: Any) -> pa.Table:
    """The corpus rows, in selection order."""
    rows = []
    for rank, p in enumerate(chosen.prompts):
        r, ids = responses[rank], chosen.formatted[p.prompt_id]
        rows.append({
            "prompt_id": p.prompt_id, "domain": p.domain, "stand_in_for": p.stand_in_for,
            "selection_rank": rank, "source_id": p.source_id, "category": p.category,
            "prompt_text": p.text, "prompt_seed": p.seed, "prompt_token_ids": ids,
            "response_token_ids": r.token_ids, "n_prompt_tokens": len(ids),
            "n_response_tokens": len(r.token_ids), "censored": r.censored,
            "response_text": tokenizer.decode(r.token_ids, skip_special_tokens=False)})
    return pa.Table.from_pylist(rows, schema=CORPUS_SCHEMA)


#: The facts of a materialised target (its model_info.json) a record's metadata repeats.
MODEL_INFO_KEYS = ("source_kind", "source", "architecture", "parameters", "vocab_size", "dtype")


def _corpus_metadata(spec: dict[str, Any], domain: Any, law: SamplingLaw, tokenizer: Any,
                     info: dict[str, Any], eos_ids: list[int], pad_id: int,
                     counts: dict[str, Any]) -> dict[str, Any]:
    """The corpus record's metadata (target, law, special tokens, counts)."""
    target = spec["target"]
    return {
        "stage": "corpus", "domain": domain.domain, "stand_in_for": domain.stand_in_for,
        "provenance": domain.provenance,
        "target": {"name": target.get("name"), "dtype": target.get("dtype"),
                   "device": target.get("device"),
                   "chat_template": bool(target["chat_template"]),
                   "enable_thinking": bool(target["enable_thinking"]),
                   "model": {k: info.get(k) for k in MODEL_INFO_KEYS}},
        "law": asdict(law), "corpus": dict(spec["corpus"]), "seed": int(spec["seed"]),
        "special_token_ids": special_token_ids(tokenizer),
        "all_special_ids": sorted(int(i) for i in tokenizer.all_special_ids),
        "eos_token_ids": eos_ids, "pad_token_id": pad_id, "eos_in_response": True,
        "counts": counts,
    }


def build_corpus(spec: dict[str, Any], model: Any, tokenizer: Any,
                 model_info: dict[str, Any] | None = None) -> TableRecord:
    """Select the domain's prompts and let the target answer each; no file is written here.

    ``spec`` is the corpus stage spec (``target``, ``domain``, ``corpus``, ``law``, ``seed``).
    Raises :class:`StageError` when the censored share exceeds ``censored_share_max``.
    """
    cfg = spec["corpus"]
    law = SamplingLaw.from_spec(spec["law"])
    chosen = _select_domain_prompts(spec, tokenizer)
    eos_ids = eos_token_ids(tokenizer, getattr(model, "generation_config", None))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_ids[0]
    responses = _generate_responses(model, chosen, law=law, max_new=int(cfg["max_new_tokens"]),
                                    batch_size=int(cfg["batch_size"]), eos_ids=eos_ids,
                                    pad_id=pad_id)
    counts = _censoring_counts(chosen, responses, cfg)
    table = _corpus_table(chosen, responses, tokenizer)
    metadata = _corpus_metadata(spec, chosen.domain, law, tokenizer, model_info or {}, eos_ids,
                                pad_id, counts)
    return TableRecord(table, metadata)
