"""The page of ``floorgap compare`` (:mod:`floorgap.analysis.compare`): the outcome first, then
per stage and target how the records compare, the numbers that moved beyond their intervals,
the findings whose verdict differs and the timing fields set apart; as markdown and HTML."""

from __future__ import annotations

import html
import re
from pathlib import Path

import pandas as pd

from floorgap.analysis.compare import RunComparison
from floorgap.records import atomic_path

__all__ = ["tables", "to_markdown", "to_html", "write_compare"]

#: Rows shown of the numbers that moved (all of them are in numbers.csv).
SHOWN = 40


def tables(cmp: RunComparison) -> dict[str, pd.DataFrame]:
    """The page's tables: records by stage and target, moved numbers, differing verdicts."""
    files = pd.DataFrame([(f.path, f.stage, f.target, f.status, f.detail, f.max_diff)
                          for f in cmp.files],
                         columns=["path", "stage", "target", "status", "detail", "max_diff"])
    rows = []
    for (target, stage), g in files.groupby(["target", "stage"], sort=True):
        bad = g[g["status"] != "equal"]
        worst = g.loc[g["max_diff"].idxmax()] if len(g) else None
        rows.append({"target": target, "stage": stage, "files": len(g),
                     "equal": int((g["status"] == "equal").sum()),
                     "close": int((g["status"] == "close").sum()),
                     "different": int((g["status"] == "different").sum()),
                     "only in one run": int(g["status"].str.startswith("only").sum()),
                     "first difference": "" if bad.empty else
                     f"{bad.iloc[0]['path']}: {bad.iloc[0]['status']} {bad.iloc[0]['detail']}",
                     "largest |diff|": 0.0 if worst is None or bad.empty
                     else float(worst["max_diff"])})
    moved = pd.DataFrame([n.__dict__ for n in cmp.moved],
                         columns=["summary", "key", "a", "b", "moved"]).drop(columns="moved")
    claims = pd.DataFrame(cmp.claims, columns=["finding", "verdict on A", "verdict on B"])
    return {"records": pd.DataFrame(rows), "moved": moved, "claims": claims}


def _md(df: pd.DataFrame) -> str:
    if df.empty:
        return "none\n"
    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "---|" * len(df.columns)
    body = ["| " + " | ".join(str(v).replace("|", "/") for v in row) + " |"
            for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *body]) + "\n"


def _summary_lines(cmp: RunComparison) -> list[str]:
    # a field's name without where it sits (epochs[3].seconds -> seconds)
    timing = sorted({re.split(r"[.\]]", t)[-1] for f in cmp.files for t in f.timing})
    return [f"**{cmp.outcome}**: {len(cmp.files)} record files, "
            f"{sum(f.status == 'equal' for f in cmp.files)} equal bit for bit; "
            f"{len(cmp.moved)} of {len(cmp.numbers)} estimates moved beyond their intervals; "
            f"{len(cmp.claims)} findings changed verdict.",
            f"Timing fields set apart (not compared): {', '.join(timing) or 'none'}."]


def to_markdown(cmp: RunComparison) -> str:
    t = tables(cmp)
    parts = [f"# floorgap compare {cmp.a} {cmp.b}", "", *_summary_lines(cmp), "",
             "## Records by stage and target", "", _md(t["records"]),
             f"## Estimates beyond their intervals (first {SHOWN})", "",
             _md(t["moved"].head(SHOWN)), "## Findings whose verdict differs", "",
             _md(t["claims"])]
    return "\n".join(parts)


def to_html(cmp: RunComparison) -> str:
    t = tables(cmp)
    esc = html.escape
    body = [f"<h1>floorgap compare</h1><p>A: {esc(str(cmp.a))}<br>B: {esc(str(cmp.b))}</p>",
            *[f"<p>{esc(line.replace('**', ''))}</p>" for line in _summary_lines(cmp)],
            "<h2>Records by stage and target</h2>", t["records"].to_html(index=False),
            "<h2>Estimates beyond their intervals</h2>", t["moved"].to_html(index=False),
            "<h2>Findings whose verdict differs</h2>", t["claims"].to_html(index=False)]
    return ("<!doctype html><html><head><meta charset='utf-8'><title>floorgap compare</title>"
            "<style>body{font-family:sans-serif;max-width:72em}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}</style></head><body>"
            + "\n".join(body) + "</body></html>\n")


def write_compare(cmp: RunComparison, out: Path) -> None:
    """``out/compare.md``, ``out/compare.html`` and every compared estimate in
    ``out/numbers.csv``."""
    for name, text in (("compare.md", to_markdown(cmp)), ("compare.html", to_html(cmp))):
        with atomic_path(out / name) as tmp:
            tmp.write_text(text)
    with atomic_path(out / "numbers.csv") as tmp:
        pd.DataFrame([n.__dict__ for n in cmp.numbers]).to_csv(tmp, index=False)
