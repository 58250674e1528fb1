"""The paper's notation (Table 2, App. A.1) in one place: each symbol, what it means, and where the
code computes it. ``table2_notation`` prints this list; the test of this module checks that
every named home exists and that its docstring spells the symbol as :attr:`Symbol.ascii` does,
so the table, the paper and the docstrings cannot drift apart.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Symbol", "NOTATION"]


@dataclass(frozen=True)
class Symbol:
    """One row of Table 2: the LaTeX ``symbol``, its ``meaning``, the plain-text spelling the
    docstrings use (``ascii``) and the ``homes`` ("module:attribute") that compute it."""

    symbol: str
    meaning: str
    ascii: str
    homes: tuple[str, ...] = ()


NOTATION: tuple[Symbol, ...] = (
    Symbol(r"$X$, $Z$, $\gamma$", r"context; target block; block length ($\gamma=7$ unless "
           "stated otherwise)", "gamma",
           ("floorgap.probes.rollouts:sample_block",)),
    Symbol(r"$p_k$, $q_k$", "target and proposal distributions evaluated on a target path",
           "p_k", ("floorgap.probes.rollouts:SampledBlock",)),
    Symbol(r"$\alpha(p,q)$, $R_k$", r"pairwise acceptance; free-rollout risk "
           r"$\mathbb{E}_\mu[\mathrm{TV}(p_k,q_k)]$", "alpha(p, q)",
           ("floorgap.estimators.risk:acceptance",)),
    Symbol(r"$a_i$, $W_{k-1}$", r"target-path weight $\min(1,q_i(Z_i)/p_i(Z_i))$; reach "
           r"$\prod_{i<k} a_i$", "W_{k-1}",
           ("floorgap.estimators.serving:reach",)),
    Symbol(r"$J$, $\tau$", r"accepted draft-prefix length; expected returned length "
           r"$1+\mathbb{E}[J]$", "tau",
           ("floorgap.estimators.serving:accepted_length",
            "floorgap.estimators.served:round_accepted_length")),
    Symbol(r"$T_k^{(m)}$", "information floor: the least risk any order-$m$ proposal can "
           "achieve", "T_k^(m)",
           ("floorgap.estimators.floors:floor_orderm_split",)),
    Symbol(r"$G_k^{(m)}$", r"model gap $R_k - T_k^{(m)}$: risk not forced by the information "
           "restriction", "G_k^(m)",
           ("floorgap.estimators.risk:model_gap",)),
    Symbol(r"$R_k^{\mathrm{oracle}}$, $R_k^{\mathrm{self}}$",
           "target-predecessor risk; own-sampled-predecessor risk", "R_k^",
           ("floorgap.estimators.risk:oracle_risk", "floorgap.estimators.risk:self_risk")),
    Symbol(r"$E_k^{\mathrm{expo}}$", r"exposure difference $R_k^{\mathrm{self}} - "
           r"R_k^{\mathrm{oracle}}$", "E_k^expo",
           ("floorgap.estimators.risk:exposure",)),
    Symbol(r"$r$, $\widetilde T$", "mass outside a top-$K$ read; the floor of the "
           r"renormalised reads, $|T-\widetilde T| \le \mathbb{E}[r]$", "E[r]",
           ("floorgap.estimators.truncation:truncated_slot_floors",)),
    Symbol(r"$M$", "rollouts per anchor, specified for each probe", "M",
           ("floorgap.estimators.floors:floor_order0",)),
)
