"""The proposal kinds: what the workflow decides by a drafter's or a lookup table's kind, in
one table. A kind's class (``models/drafters.DRAFTER_CLASSES``, ``models/lookup``), its schema
enum and its engine layouts (``models/engine_formats``) are checked against it
(``tests/test_structure.py``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProposalKind:
    """One kind of proposal q_k.

    ``order``: its conditioning order (0 reads X only; 1 also the predecessor z_{k-1}).
    ``lookup``: a lookup table fitted on the training blocks (else a trained drafter).
    ``formats``: the checkpoint layouts it is exported in beside floorgap's own, its engine's
    layout first; none where no engine has a module for it."""

    order: int
    lookup: bool = False
    formats: tuple[str, ...] = ()


KINDS: dict[str, ProposalKind] = {
    "dflash": ProposalKind(0, formats=("dflash", "speculators")),
    "dspark": ProposalKind(1, formats=("dspark", "speculators")),
    "prefix_attention": ProposalKind(1),
    "unigram": ProposalKind(0, lookup=True),
    "bigram_committed": ProposalKind(0, lookup=True),
    "bigram": ProposalKind(1, lookup=True),
}
#: The conditioning order of every kind.
KIND_ORDER = {name: kind.order for name, kind in KINDS.items()}
#: The trained drafters' kinds and the lookup tables'.
DRAFTER_KINDS = tuple(name for name, kind in KINDS.items() if not kind.lookup)
LOOKUP_KINDS = tuple(name for name, kind in KINDS.items() if kind.lookup)
#: The drafter kind each engine layout holds unless the entry names another; these layouts
#: are the ones the engines serve (vLLM's and SGLang's dflash and dspark methods).
FORMAT_KINDS = {kind.formats[0]: name for name, kind in KINDS.items() if kind.formats}
SERVED_FORMATS = tuple(FORMAT_KINDS)
#: The kinds an engine serves.
ENGINE_KINDS = tuple(FORMAT_KINDS.values())
#: The other kinds a layout can hold: a dspark folder (``Qwen3DSparkModel``) with markov_rank
#: 0 is DeepSpec's DFlash (``kind: dflash``); speculators folders hold either (the entry must
#: name it).
FORMAT_ALSO_HOLDS = {"dspark": ("dflash",), "speculators": ENGINE_KINDS}
