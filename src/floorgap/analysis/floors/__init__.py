"""Floors analysis: per anchor x slot values and their Hajek/bootstrap summary.

Inputs are the rollouts records of one target (``paths-<shard>.parquet`` and
``floors-<shard>.parquet`` of every domain) and its anchors files. The probe already computed
the full-vocabulary floors at every anchor and slot (T^(0) in-sample and split-half, T^(1) by
split-half predecessor grouping with its covered mass and bounds, the in-sample plug-in and the
importance route); this stage adds what the stored top-K reads allow on the CPU:

* the top-K order-0 floor T~ of the renormalised reads with its band E[r] (paper Sec. C.6) and
  the full-minus-top-K difference;
* the oracle-routed K-median objective for every K, with the restart spread (paper Sec. D.2),
  on the renormalised top-K reads, dense over the union of their supports (K = 1 is T~);
* the effective support N_eff of the k-token block prefixes (paper Sec. B.6, D.1), recomputed
  from the path tokens with the current estimator (the probe's value is kept beside it).

The headline order-1 floor is the split-half grouping estimate with its covered mass and
bounds (paper App. B.3); the importance route is reported beside it as the independent second
estimate with its ESS (App. C.2). Shares of T^(0) removed compare both floors on one
population of paths (see :func:`floorgap.analysis.floors.summary._floor_block`).

:func:`summarise` then aggregates anchors with Hajek weights 1/pi and prompt-cluster bootstrap
intervals (paper Sec. B.2), one resample per scope ("all" or one domain) shared by every
statistic of that scope, so all of them are paired.

Record problems are counted, never dropped silently: a malformed, duplicated or missing floor
row makes that anchor x slot cell unusable for the probe's values; a malformed, duplicated or
missing path row makes the anchor's top-K, K-median and N_eff values unusable (they need all M
paths). Both are listed with their file. An anchor without any floor record or without any
path record, records of anchors that no anchors file lists, and record files that disagree on
the run are an error naming the files (:class:`RecordMismatch`).

The package: :mod:`.load` reads and checks the records, :mod:`.table` builds the anchor x slot
table, :mod:`.summary` aggregates it (with the statistics' notes in :mod:`.notes`).
"""

from floorgap.analysis.floors.load import FloorRecords, Issue, load_records
from floorgap.analysis.floors.summary import (SUMMARY_COLUMNS, check_reveal_undefined,
                                              log_record_problems, summarise)
from floorgap.analysis.floors.table import (ANCHOR_SLOT_COLUMNS, anchor_slot_table,
                                            check_anchor_slot_table)
from floorgap.errors import RecordMismatch

__all__ = [
    "ANCHOR_SLOT_COLUMNS",
    "SUMMARY_COLUMNS",
    "FloorRecords",
    "Issue",
    "RecordMismatch",
    "anchor_slot_table",
    "check_anchor_slot_table",
    "check_reveal_undefined",
    "load_records",
    "log_record_problems",
    "summarise",
]
