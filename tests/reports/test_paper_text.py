"""The generated paper tells the truth under every config: its text states directions only
through the claims' macros, names no other config, and every claim's words follow its verdict.

``FLOORGAP_PAPER_RUNS=<run>[:<run>...]`` checks the expanded paper of finished runs as well (CI
sets it to the rehearsal of the qwen3-4b config; the integration tests check the smoke run)."""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from conftest import DEFAULT_CONFIG, SHIPPED_CONFIGS
from floorgap.reports.claims import (CLAIMS, HOLDS, UNRESOLVED, Check, Evidence, direction,
                                     judge)
from floorgap.reports.paper_text import (body, config_literals, expand, foreign_literals,
                                         load_values, paper_problems, sentences)

REPO = Path(__file__).resolve().parents[2]
MAIN = REPO / "paper" / "main.tex"
CONFIGS = [DEFAULT_CONFIG, *SHIPPED_CONFIGS]

#: Words that state a direction of a finding.
DIRECTION = re.compile(r"\b(rises?|rising|falls?|grows?|growth|shrinks?|widens?|increases?|"
                       r"decreases?|higher|lower|above|below|exceeds?|larger|smaller|more|less|"
                       r"fewer)\b", re.I)
#: Sentences that use such a word for a definition or a method, not for a finding of the run.
METHOD_SENTENCES = (
    "The \\emph{information floor}",   # the floor's definition
    "The screen (final-slot missing information above",   # the MI screen's threshold
    "The top decile of anchors carries",   # "below 0.01" is the statistic's definition
    "The solutions are feasible, so these shares are lower bounds",   # a bound's direction
    "The risk $R_k$ is a total variation distance",   # why the drafters train on KL
    "Parts (a) and (b) together say",   # how to read the study, conditionally
    "Path $r$ of an anchor draws",   # nesting of paths; "more paths" is the design
)


def _finding_sentences(tex: str) -> list[str]:
    return [s for s in sentences(body(tex)) if not s.startswith("\\begin{")]


def test_every_direction_in_the_text_comes_from_a_claim_or_the_paper():
    loose = [s[:120] for s in _finding_sentences(MAIN.read_text())
             if DIRECTION.search(s) and "\\fgClaim" not in s and "the paper" not in s.lower()
             and not s.startswith(METHOD_SENTENCES)]
    assert loose == [], "these sentences state a direction no claim's verdict sets"


def test_the_text_types_no_number_of_a_run_or_of_the_paper():
    """Numbers come from the values: the text types none with a decimal point or a percent
    sign (the 1% level of the lossless test and the 0.01 of the share-below statistic are
    definitions; widths are layout)."""
    text = body(MAIN.read_text()).replace("1\\% level", "").replace("below $0.01$", "")
    text = re.sub(r"[\d.]+\\linewidth", "", text)
    assert re.findall(r"\d\.\d|\d\\%", text) == []


def test_the_text_names_no_config():
    text = body(MAIN.read_text())
    literals = set().union(*(config_literals(yaml.safe_load(p.read_text())) for p in CONFIGS))
    assert [lit for lit in literals if lit in text] == []
    assert [p for p in ("135M", "laptop", "SmolLM", "HumanEval", "top-128", "two-layer") if
            p in text] == []


def test_every_macro_of_the_claims_the_text_cites_exists():
    cited = set(re.findall(r"\\fgClaim([A-Z][A-Za-z]*?)(Verdict|Says|Run|Paper|Direction|Count|"
                           r"Check)\b", MAIN.read_text()))
    keys = {"".join(w.capitalize() for w in c.key.split("_")) for c in CLAIMS}
    assert cited and {stem for stem, _ in cited} <= keys


@given(st.lists(st.floats(-1, 1), min_size=1, max_size=6), st.floats(0, 0.4),
       st.sampled_from(["above", "below", "rises", "falls"]), st.booleans())
def test_the_words_of_a_claim_never_contradict_its_verdict(est, width, kind, words):
    """What the text says the run shows (the direction word or count) agrees with the verdict:
    a claim that holds reads in its own direction, one that does not hold never does, and one
    the intervals leave open says so."""
    est = np.array(est)
    ev = Evidence.of([f"k={i}" for i in range(len(est))], est, est - width, est + width)
    check = Check(kind, 0.0)
    claim = next(c for c in CLAIMS if c.check.kind == kind)
    claim = dataclasses.replace(claim, check=check,
                                words=("shrinks", "widens") if words else None)
    word, verdict = direction(claim, ev), judge(check, ev)
    on_side, n = check.points(ev)
    trend = kind in ("rises", "falls")
    if trend or (words and n == 1):
        up, down = claim.words or ("rises", "falls")
        claimed = down if kind == "falls" else up
        assert (word == claimed) == (verdict == HOLDS)
        assert ("within its interval" in word) == (verdict == UNRESOLVED)
    else:
        assert word == f"{on_side} of {n}"
        if verdict == HOLDS:
            assert on_side == n


def test_expand_replaces_nested_macros_and_names_an_undefined_one():
    values = {"\\fgA": "x \\fgB", "\\fgB": "y"}
    assert expand("a \\fgA{} b", values) == "a x y b"
    with pytest.raises(KeyError, match="fgC"):
        expand("\\fgC", values)


def test_foreign_literals_find_another_configs_target_but_not_the_own(tmp_path):
    own = {"targets": {"mine": {"source": {"kind": "hub", "id": "org/Mine"}}}}
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({"targets": {"theirs": {"source": {"kind": "hub",
                                                                        "id": "org/Theirs"}}}}))
    assert foreign_literals("on org/Mine", own, [other]) == []
    assert foreign_literals("on org/Theirs with a laptop", own, [other]) == ["org/Theirs",
                                                                             "laptop"]


def check_finished_run(run: Path, config_path: Path) -> None:
    """A finished run's expanded paper: every macro defined, no other config's literal, and
    every claim checked."""
    assert paper_problems(run, MAIN, config_path, CONFIGS) == []
    assert load_values(run / "paper" / "values.tex")["\\fgClaimsTotal"] == str(len(CLAIMS))


def _runs() -> list[tuple[Path, Path]]:
    """``FLOORGAP_PAPER_RUNS``: ``run[=config]`` entries joined by ``:`` (the config defaults
    to the run's config.yaml)."""
    runs = []
    for entry in filter(None, os.environ.get("FLOORGAP_PAPER_RUNS", "").split(":")):
        run, _, config = entry.partition("=")
        runs.append((Path(run), Path(config) if config else Path(run) / "config.yaml"))
    return runs


@pytest.mark.parametrize("run, config", _runs())
def test_a_finished_runs_paper_is_true_to_its_own_config(run, config):
    check_finished_run(run, config)


def test_the_paper_stage_reads_overfull_boxes_from_the_latex_log():
    from floorgap.stages.paper import overfull_boxes

    log = ("Overfull \\hbox (3.1pt too wide) in paragraph at lines 10--12\n"
           "Underfull \\hbox (badness 10000) in paragraph\n"
           "Overfull \\hbox (21.62646pt too wide) in alignment at lines 1--406\n")
    assert overfull_boxes(log) == [(21.62646, "in alignment at lines 1--406"),
                                   (3.1, "in paragraph at lines 10--12")]
