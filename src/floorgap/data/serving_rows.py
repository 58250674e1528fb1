"""The serving benchmark's rows (paper Sec. 4, App. H.3): for each of the configured tasks, the
first ``rows`` prompts of its seeded selection order that pass the prompt-length filter and are
disjoint from every prompt used elsewhere.

Disjointness is by prompt text (the hash part of a prompt id), not by id: tasks that share a
shipped source (mbpp, humaneval and livecodebench read HumanEval; math-500 and aime25 read
CHAMP) give the same text different ids. A row is skipped when its text is an evaluation
prompt of the floors (the corpus stage), a drafter training prompt (drafter_data), or a row of
an earlier task in the configured order.

Each row keeps the target-formatted prompt token ids (the chat template unless the target has
none), so every system is served exactly the same input.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from floorgap.data.corpus import select_formatted
from floorgap.data.domains import load_domain
from floorgap.errors import StageError

log = logging.getLogger("floorgap.serving_rows")


def text_key(prompt_id: str) -> str:
    """The text part of a prompt id (``<domain>:<hash>`` -> ``<hash>``)."""
    return prompt_id.split(":", 1)[-1]


def select_serving_rows(tasks: Mapping[str, Mapping[str, Any]], tokenizer: Any, *, seed: int,
                        max_prompt_tokens: int, chat_template: bool, enable_thinking: bool,
                        used_prompt_ids: Iterable[str]) -> tuple[list[dict[str, Any]],
                                                                 dict[str, Any]]:
    """Rows of every task (``{task: {"rows": n, "source"?: ..., "text_field"?: ...}}``, in
    order): dicts with task, row_id, text, prompt_ids, prompt_tokens, stand_in_for, category and
    the per-row seed. Returns the rows and per-task selection facts."""
    taken = {text_key(p) for p in used_prompt_ids}
    rows: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}
    for task, entry in tasks.items():
        domain = load_domain(task, seed, source=entry.get("source"),
                             text_field=entry.get("text_field"))
        excluded = [p.prompt_id for p in domain.prompts if text_key(p.prompt_id) in taken]
        sel, formatted = select_formatted(
            domain, int(entry["rows"]), seed, tokenizer, chat_template=chat_template,
            enable_thinking=enable_thinking, max_prompt_tokens=max_prompt_tokens,
            exclude_ids=excluded, allow_fewer=True)
        if len(sel.selected) < int(entry["rows"]):
            raise StageError(f"serving task {task}: only {len(sel.selected)} of {entry['rows']} "
                             f"rows are left after excluding prompts used elsewhere and prompts "
                             f"over {max_prompt_tokens} tokens; lower serving.tasks.{task}")
        for p in sel.selected:
            taken.add(text_key(p.prompt_id))
            ids = formatted[p.prompt_id]
            rows.append({"task": task, "row_id": p.prompt_id, "text": p.text,
                         "prompt_ids": list(ids), "prompt_tokens": len(ids),
                         "stand_in_for": domain.stand_in_for, "category": p.category,
                         "seed": int(p.seed)})
        facts[task] = {**sel.summary(), "stand_in_for": domain.stand_in_for,
                       "source": domain.provenance.get("source")}
        log.info("%s: %d rows (%d prompts used elsewhere skipped)%s", task, len(sel.selected),
                 len(excluded), f", standing in for {domain.stand_in_for}"
                 if domain.stand_in_for else "")
    return rows, facts
