"""Lookup-table verdicts: where a drafter fails to beat a lookup table of its order, read from
a gaps summary (the paired differences the gaps stage writes). Pure pandas, so the report items
that print verdicts load without the estimators' tensor stack."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

#: The risk a drafter and a lookup table of its order are compared on, per slot: R for order 0,
#: R^oracle (on the covered paths) for order 1.
LOOKUP_DIFF = {0: "diff_R", 1: "diff_R_oracle"}


@dataclass(frozen=True)
class LookupVerdict:
    """Where drafter ``drafter`` fails to beat lookup table ``table`` (paper terms: its risk
    minus the table's, paired within anchors, by slot): ``loses`` the slots whose estimate is
    >= 0, ``not_clearly_better`` those whose interval does not lie below zero."""

    drafter: str
    table: str
    statistic: str
    loses: list[int]
    not_clearly_better: list[int]

    def sentence(self) -> str:
        """The plain verdict (the log, the decomposition and the paper text use it)."""
        if self.loses:
            return (f"{self.drafter} loses to a lookup table ({self.table}) at slots "
                    + ", ".join(map(str, self.loses)))
        return f"{self.drafter} beats the {self.table} table at every slot"


def lookup_verdicts(summary: pd.DataFrame, pairs: Sequence[Sequence[str]],
                    domain: str = "all") -> list[LookupVerdict]:
    """A :class:`LookupVerdict` for each [drafter, table] pair whose paired difference is in
    the summary (the gaps stage's contrasts)."""
    out = []
    for drafter, table in pairs:
        name = f"{drafter}-{table}"
        rows = summary[(summary["variant"] == name) & (summary["domain"] == domain)
                       & summary["statistic"].isin(set(LOOKUP_DIFF.values()))
                       & (summary["slot"] >= 0)]
        if rows.empty:
            continue
        stat = str(rows["statistic"].iloc[0])
        rows = rows[rows["statistic"] == stat].sort_values("slot")
        loses = [int(k) for k, e in zip(rows["slot"], rows["estimate"]) if not e < 0]
        unclear = [int(k) for k, u in zip(rows["slot"], rows["upper"]) if not u < 0]
        out.append(LookupVerdict(drafter, table, stat, loses, unclear))
    return out
