"""The generated paper as text: ``paper/main.tex`` with every ``\\fg`` macro replaced by its value
from ``paper/values.tex``, split into sentences, and the literals of other configs it must not
contain.

The paper's text is shared by every config, so a sentence that names one config's target,
device or sizes is false under the others: :func:`foreign_literals` finds, in a run's
expanded text, the identifying strings of every other shipped config (target names, hub ids,
model files) and the phrases that only the default config made true.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["load_values", "expand", "sentences", "config_literals", "foreign_literals",
           "paper_problems", "DEFAULT_ONLY_PHRASES"]

_NEWCOMMAND = re.compile(r"\\newcommand\{(\\fg[A-Za-z]+)\}\{(.*)\}$")
_MACRO = re.compile(r"\\fg[A-Za-z]+(\{\})?")

#: Phrases the text once typed that only the embedded default made true (its model's size, its
#: machine, its sample, its drafters): none may appear in any run's paper. (Its taps and top-K
#: are config values another config may share: the text cites them through macros.)
DEFAULT_ONLY_PHRASES = ("135M", "laptop", "few dozen anchors", "two-layer", "for minutes",
                        "this CPU", "MBPP is not shipped", "this model's continuations")


def load_values(path: str | Path) -> dict[str, str]:
    """``{"\\fgName": value}`` of a values file (one ``\\newcommand`` per line)."""
    values = {}
    for line in Path(path).read_text().splitlines():
        if m := _NEWCOMMAND.match(line):
            values[m.group(1)] = m.group(2)
    return values


def expand(tex: str, values: Mapping[str, str]) -> str:
    """``tex`` with every defined ``\\fg`` macro replaced by its value (values may cite other
    macros); an undefined one is an error naming it."""
    def one(m: re.Match[str]) -> str:
        name = m.group(0).removesuffix("{}")
        if name not in values:
            raise KeyError(f"{name} is used by the paper but no report item defines it")
        return values[name]

    for _ in range(5):
        tex, n = _MACRO.subn(one, tex)
        if n == 0:
            return tex
    raise ValueError("macros still nested after five expansions")


def body(tex: str) -> str:
    """The document between ``\\begin{document}`` and ``\\end{document}``, comments dropped."""
    start, end = tex.find("\\begin{document}"), tex.find("\\end{document}")
    text = tex[start:end] if start >= 0 else tex
    return "\n".join(re.sub(r"(?<!\\)%.*", "", line) for line in text.splitlines())


def sentences(text: str) -> list[str]:
    """The text's sentences, whitespace joined (a split after ``.``, ``;`` or ``:`` followed by
    a space and a capital or a LaTeX command)."""
    flat = " ".join(text.split())
    return [s for s in re.split(r"(?<=[.;:])\s+(?=[A-Z\\])", flat) if s]


def config_literals(config: Mapping[str, Any]) -> set[str]:
    """The strings that identify a config's targets: their names, hub ids, model files and
    packages (its drafters' hub ids too)."""
    found: set[str] = set()
    for name, target in (config.get("targets") or {}).items():
        found.add(name)
        source = target.get("source") or {}
        found.update(str(source[k]) for k in ("id", "file", "package") if source.get(k))
    variants = ((config.get("drafters") or {}).get("variants") or {}).values()
    found.update(str(v["checkpoint"]["hub"]) for v in variants
                 if isinstance(v.get("checkpoint"), Mapping) and v["checkpoint"].get("hub"))
    return found


def foreign_literals(text: str, own: Mapping[str, Any], others: Iterable[Path]) -> list[str]:
    """The literals of other configs (``others``: config files) and of the default alone
    (:data:`DEFAULT_ONLY_PHRASES`) that occur in ``text``, a run's expanded paper under config
    ``own``. The run's own literals are allowed."""
    mine = config_literals(own)
    theirs: set[str] = set()
    for path in others:
        theirs |= config_literals(yaml.safe_load(Path(path).read_text()) or {})
    flat = " ".join(text.split())
    hits = [lit for lit in sorted(theirs - mine) if re.search(
        rf"(?<![\w-]){re.escape(lit)}(?![\w-])", flat)]
    return hits + [p for p in DEFAULT_ONLY_PHRASES if p in flat]


def paper_problems(run: Path, main_tex: Path, config: Path, configs: Iterable[Path]
                   ) -> list[str]:
    """What is wrong with a finished run's paper as text: a macro the text cites that no item
    defined, or a literal of another config (``configs``) or of the default alone."""
    values = load_values(run / "paper" / "values.tex")
    try:
        text = expand(body(main_tex.read_text()), values)
    except KeyError as exc:
        return [str(exc)]
    own = yaml.safe_load(config.read_text()) or {}
    return [f"names {lit!r}, a literal of another config"
            for lit in foreign_literals(text, own, configs)]
