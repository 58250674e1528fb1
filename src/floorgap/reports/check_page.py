"""The page and the summary of a ``floorgap check`` (:mod:`floorgap.reports.check`): the verdicts
first, a figure per drafter (the risk by slot split into floor and model gap; the single-slot
best-response gain; served against replayed tau where the folder was served), the tables, for
several drafters their tau side by side, then the command and config files. The page holds its
figures as PNG data URIs, so it can be mailed as one file."""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from floorgap.records import atomic_path
from floorgap.reports.check import (FLOOR_SHARE, GREEDY_SHARE, ORDER_PARTS, SERVED_Z, CheckReport,
                                    Comparison, DrafterCheck)
from floorgap.reports.common import pyplot
from floorgap.reports.decomposition import (Decomposition, by_slot_cells, plain_interval,
                                            plain_number)

__all__ = ["comparison_figure", "drafter_figure", "served_figure", "to_html", "to_markdown",
           "write_check"]


# ------------------------------------------------------------------------------ figures


def _png(fig: Any) -> str:
    """A figure, laid out, as a data URI (the page holds its figures: it mails as one file)."""
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def drafter_figure(c: DrafterCheck) -> str:
    """Left: the risk by slot split into floor and model gap, the other order's floor and the
    lookup tables' risks beside it. Right: dtau_br by slot with its interval."""
    d = c.decomposition
    floor, gap, _, risk, risk_name = ORDER_PARTS[d.order]
    slots = np.arange(d.gamma)
    fig, (ax, bx) = pyplot().subplots(1, 2, figsize=(8.4, 2.9))
    t = np.array([d.value(floor, k) for k in slots])
    g = np.array([d.value(gap, k) for k in slots])
    ax.bar(slots, t, color="#4c72b0", label=f"floor {floor}")
    ax.bar(slots, g, bottom=t, color="#dd8452", label=f"model gap {gap}")
    other = "floors_T1" if d.order == 0 else "floors_T0"
    ax.plot(slots, [d.value(other, k) for k in slots], "k--", marker=".",
            label=f"other order's floor {other.removeprefix('floors_')}")
    for i, table in enumerate(d.lookups):
        ax.plot(slots, [d.value(f"{risk}@{table}", k) for k in slots], marker="x", lw=0.8,
                color=f"C{i + 2}", label=f"{risk_name} of {table} table")
    ax.set(xlabel="slot k", ylabel=risk_name, title=f"{d.drafter}: where {risk_name} comes from",
           xticks=slots)
    ax.legend(fontsize=6.5, loc="upper left")
    est, lo, hi = (c.gain[f].to_numpy(float) for f in ("estimate", "lower", "upper"))
    bx.bar(slots, est, color="#55a868")
    bx.errorbar(slots, est, yerr=[np.maximum(est - lo, 0), np.maximum(hi - est, 0)], fmt="none",
                ecolor="k", capsize=2, lw=0.8)
    bx.axhline(0, color="k", lw=0.5)
    bx.set(xlabel="slot k", ylabel="dtau_br (held out)", xticks=slots,
           title="single-slot best-response gain")
    return _png(fig)


def served_figure(c: DrafterCheck) -> str:
    """Served against replayed tau (task macro, with intervals) at each temperature."""
    assert c.served is not None
    temps = sorted(c.served.by_temperature)
    fig, ax = pyplot().subplots(figsize=(4.6, 2.6))
    for shift, key, label, color in ((-0.08, "tau_served", "served", "#4c72b0"),
                                     (0.08, "tau_offline", "replayed", "#dd8452")):
        for i, t in enumerate(temps):
            est, lo, hi = c.served.by_temperature[t][key]
            ax.errorbar([i + shift], [est], yerr=[[max(est - lo, 0)], [max(hi - est, 0)]],
                        fmt="o", color=color, capsize=3, label=label if i == 0 else None)
    ax.set_xticks(range(len(temps)), [f"T = {t:g}" for t in temps])
    ax.set(ylabel="tau", title=f"{c.name} in {c.served.engine}: served vs replayed")
    ax.legend(fontsize=7)
    return _png(fig)


def comparison_figure(report: CheckReport) -> str:
    """Each drafter's tau with its interval, and each pair's paired difference."""
    rows = [(c.name, *(c.decomposition.value("tau", -1, f) for f in ("estimate", "lower", "upper")))
            for c in report.drafters]
    rows += [(f"{c.a} - {c.b}", *c.diff_tau) for c in report.comparisons]
    fig, ax = pyplot().subplots(figsize=(6.0, 0.5 + 0.38 * len(rows)))
    for i, (label, est, lo, hi) in enumerate(rows):
        ax.errorbar([est], [i], xerr=[[max(est - lo, 0)], [max(hi - est, 0)]], fmt="o",
                    color="#4c72b0" if " - " not in label else "#c44e52", capsize=3)
    ax.set_yticks(range(len(rows)), [r[0] for r in rows])
    ax.invert_yaxis()
    ax.axvline(0, color="k", lw=0.4)
    ax.set(xlabel=f"tau, and paired differences ({report.level:.0%} CI)")
    return _png(fig)


# ------------------------------------------------------------------------------ pages


def _table_html(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    return pd.DataFrame(list(rows), columns=list(header)).to_html(index=False, border=0,
                                                                 classes="numbers")


def _comparison_rows(c: Comparison) -> tuple[list[str], list[list[str]]]:
    header = ["slot", f"{c.a} - {c.b}: {c.risk_statistic}", "CI"]
    return header, [[str(int(r.slot)), plain_number(r.estimate), plain_interval(r.lower, r.upper)]
                    for r in c.diff_risk.itertuples()]


def _drafter_table(c: DrafterCheck) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a drafter's by-slot table: its decomposition, then dtau_br."""
    header, rows = by_slot_cells(c.decomposition, latex=False)
    return ([*header, "dtau_br", "dtau_br CI"],
            [[*row, plain_number(g.estimate), plain_interval(g.lower, g.upper)]
             for row, g in zip(rows, c.gain.itertuples())])


def _served_table(c: DrafterCheck) -> tuple[list[str], list[list[str]]]:
    """(header, rows) of a served check: a row per temperature."""
    assert c.served is not None
    header = ["T", "rounds", "tau served", "CI", "tau replayed", "CI", "acceptance z",
              "lossless z", "greedy rounds reproduced"]
    rows = []
    for t, st in sorted(c.served.by_temperature.items()):
        (se, sl, su), (oe, ol, ou) = st["tau_served"], st["tau_offline"]
        agree = float(st.get("greedy_agreement", math.nan))
        rows.append([f"{t:g}", str(int(st["rounds"])), plain_number(se), _row_interval(sl, su),
                     plain_number(oe), _row_interval(ol, ou), plain_number(st["acceptance_z"], 2),
                     plain_number(st["lossless_z"], 2),
                     f"{agree:.0%}" if math.isfinite(agree) else "--"])
    return header, rows


def _row_interval(lower: float, upper: float) -> str:
    # the row bootstrap resamples rows within a task: with one row per task (the check's
    # default) it cannot vary, and no interval is shown
    return plain_interval(lower, upper) if upper > lower else "--"


def _tau_text(d: Decomposition, level: float) -> str:
    return (f"{plain_number(d.value('tau'))} ({level:.0%} CI "
            f"{plain_interval(d.value('tau', -1, 'lower'), d.value('tau', -1, 'upper'))})")


def to_markdown(report: CheckReport) -> str:
    """The summary the command prints: verdicts, then tau and the by-slot table per drafter."""
    lines = [f"# floorgap check {report.name} on {report.target} (gamma {report.gamma})", "",
             "## Verdicts", ""]
    lines += [f"- {'**' if v.flag else ''}{v.text}{'**' if v.flag else ''}"
              for v in report.verdicts]
    for c in report.drafters:
        d = c.decomposition
        header, rows = _drafter_table(c)
        lines += ["", f"## {d.drafter} ({d.kind or 'drafter'}, order {d.order})", "",
                  f"tau (offline accepted length) = {_tau_text(d, report.level)}",
                  "", *_markdown_table(header, rows)]
        if c.served is not None and c.served.by_temperature:
            lines += ["", f"Served in {c.served.engine}, every round replayed with "
                      f"{c.served.replayed_with}:", "", *_markdown_table(*_served_table(c))]
    return "\n".join(lines) + "\n"


def _markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *["| " + " | ".join(r) + " |" for r in rows]]


_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>floorgap check {{ r.name }}</title>
<style>
body { font: 14px/1.45 system-ui, sans-serif; max-width: 1100px; margin: 1.5em auto; padding: 0 1em; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; }
ul.verdicts li { margin: .25em 0; } li.flag { font-weight: 600; color: #8a2a0a; }
table.numbers { border-collapse: collapse; font-size: 12.5px; }
table.numbers th, table.numbers td { padding: 2px 8px; text-align: right; border-bottom: 1px solid #ddd; }
img { max-width: 100%; } pre { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: 12px; }
.muted { color: #666; }
</style></head><body>
<h1>floorgap check: {{ r.name }}</h1>
<p class="muted">target {{ r.target }}, block length gamma = {{ r.gamma }}, intervals at {{ pct(r.level) }}
(prompt-cluster bootstrap); every number below is computed on the same anchors and target paths.</p>
<h2>Verdicts</h2>
<ul class="verdicts" id="verdicts">
{% for v in r.verdicts %}<li class="{{ 'flag' if v.flag else '' }}" data-kind="{{ v.kind }}">{{ v.text }}</li>
{% endfor %}</ul>
<p class="muted">Thresholds: a drafter "loses to a lookup table" at a slot where its paired
risk difference from the table is not below zero; "within {{ pct(floor_share) }} of its floor" where
the model gap is at most {{ pct(floor_share) }} of its risk; a comparison is resolved when its
{{ pct(r.level) }} interval excludes zero; the engine serves what the weights predict when the
acceptance and lossless |z| are at most {{ served_z }} and at least {{ pct(greedy_share) }} of the
greedy rounds are reproduced.</p>
{% if compare_png %}<h2>Side by side</h2>
<figure><img src="{{ compare_png }}" alt="tau of each drafter and paired differences"></figure>
{% for table in comparison_tables %}{{ table | safe }}{% endfor %}
{% endif %}
{% for d in drafters %}
<h2 id="drafter-{{ d.name }}">{{ d.name }} ({{ d.kind }}, order {{ d.order }})</h2>
<p>tau (offline accepted length) = {{ d.tau }}</p>
<figure><img src="{{ d.png }}" alt="floor, model gap and best-response gain of {{ d.name }}"></figure>
{{ d.table | safe }}
{% if d.served_png %}<h3>Served in {{ d.engine }}</h3>
<p class="muted">every served round replayed offline with {{ d.replayed_with }}</p>
<figure><img src="{{ d.served_png }}" alt="served against replayed tau of {{ d.name }}"></figure>
{{ d.served_table | safe }}
{% endif %}
{% endfor %}
<h2>How this was made</h2>
<pre>{{ r.command or "(no command recorded)" }}</pre>
{% for path, text in r.configs.items() %}<p class="muted">{{ path }}</p><pre>{{ text }}</pre>
{% endfor %}
</body></html>
"""


def to_html(report: CheckReport) -> str:
    """The page: verdicts first, figures inline (PNG data URIs), tables, then the command and
    the config files that produced it."""
    import jinja2

    drafters = [{"name": c.name, "kind": c.decomposition.kind or "drafter",
                 "order": c.decomposition.order, "tau": _tau_text(c.decomposition, report.level),
                 "png": drafter_figure(c), "table": _table_html(*_drafter_table(c)),
                 **({"served_png": served_figure(c), "engine": c.served.engine,
                     "replayed_with": c.served.replayed_with,
                     "served_table": _table_html(*_served_table(c))}
                    if c.served is not None and c.served.by_temperature else {})}
                for c in report.drafters]
    env = jinja2.Environment(autoescape=True)
    page = env.from_string(_PAGE)
    return page.render(
        r=report, drafters=drafters, floor_share=FLOOR_SHARE, served_z=f"{SERVED_Z:g}",
        greedy_share=GREEDY_SHARE,
        pct=lambda x: f"{x:.0%}",
        compare_png=comparison_figure(report) if len(report.drafters) > 1 else "",
        comparison_tables=[_table_html(*_comparison_rows(c)) for c in report.comparisons
                           if len(c.diff_risk)])


def write_check(report: CheckReport, html_path: str | Path, md_path: str | Path) -> None:
    """Write the page and the summary, each atomically."""
    for path, text in ((html_path, to_html(report)), (md_path, to_markdown(report))):
        with atomic_path(path) as tmp:
            tmp.write_text(text, encoding="utf-8")
