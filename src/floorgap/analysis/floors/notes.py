"""What each statistic of the floors summary is (its ``note`` column)."""

from __future__ import annotations

NOTES = {
    "T0": "Hajek mean of the in-sample full-vocabulary order-0 floor",
    "T0_split": "Hajek mean of the split-half order-0 floor (fit on one half, score on the other)",
    "T0_split_minus_T0": "Hajek mean of split-half minus in-sample order-0 floor (fit check, C.3)",
    "T1_split_covered": "headline order-1 floor: covered split-half floor T_cov (grouping by "
                        "the realised predecessor, fit on one half, score on the other), "
                        "weighted by covered path mass: sum w c T_cov / sum w c",
    "T0_covered": "in-sample order-0 floor on the same covered paths: sum w c T0_cov / sum w c",
    "T1_covered_mass": "Hajek mean of the covered path mass c of the split-half order-1 floor",
    "T1_split_lower": "Hajek mean of the lower bound c*T_cov of the order-1 floor",
    "T1_split_upper": "Hajek mean of the upper bound c*T_cov + 1 - c of the order-1 floor",
    "T1_split_mid": "Hajek mean of the midpoint c*T_cov + (1 - c)/2 of the order-1 bounds",
    "T1_plugin": "Hajek mean of the in-sample order-1 plug-in (grouping, fit = score)",
    "T1_reweighted": "second estimate: Hajek mean of the importance-route order-1 floor (mean "
                     "over the revealed predecessors of each anchor with some weight)",
    "T1_reweighted_ess_mean": "Hajek mean of the per-anchor mean Kish ESS of the importance "
                              "weights",
    "T1_reweighted_ess_min": "smallest Kish ESS of the importance weights over anchors and "
                             "revealed predecessors (no interval)",
    "T1_reweighted_undefined": "count of revealed predecessors whose importance weights are "
                               "all zero; they are left out of their anchor's mean",
    "T1_reweighted_undefined_share": "share of the slot's revealed predecessors whose "
                                     "importance weights are all zero",
    "T1_reweighted_cells_undefined": "count of cells where every revealed predecessor is "
                                     "undefined; they are left out of T1_reweighted",
    "share_removed_reweighted": "1 - T1/T0 with T1 = importance route; ratio of Hajek sums",
    "share_removed_split_covered": "headline share removed: 1 - T_cov/T0_cov on the covered "
                                   "paths, ratio of covered-mass-weighted Hajek sums",
    "share_removed_split_mid": "1 - T1/T0 with T1 = midpoint of the split-half bounds "
                               "c*T_cov + (1 - c)/2; ratio of Hajek sums",
    "share_removed_split_min": "1 - T1/T0 with T1 = upper split-half bound (least share "
                               "removed the bounds allow)",
    "share_removed_split_max": "1 - T1/T0 with T1 = lower split-half bound (largest share "
                               "removed the bounds allow)",
    "T0_topk": "Hajek mean of the order-0 floor of the renormalised top-K reads",
    "T0_topk_band": "Hajek mean of the truncation band E[r] (mean residual mass), C.6",
    "T0_full_minus_topk": "Hajek mean of full-vocabulary minus top-K order-0 floor",
    "T0_full_minus_topk_abs": "Hajek mean of |full-vocabulary - top-K order-0 floor|",
    "topk_band_violations": "count of cells where |full - top-K| exceeds the band E[r] "
                            "(+1e-6); the band is a theorem, so this should be 0",
    "T0_top20": "Hajek mean of the order-0 floor of the first 20 entries of the top-K reads "
                "(the API read, App. C.6)",
    "T0_top20_band": "Hajek mean of the top-20 band E[r]",
    "T0_top20_minus_full": "Hajek mean of the paired difference top-20 - full vocabulary",
    "T0_top20_minus_full_abs": "Hajek mean of |top-20 - full vocabulary| order-0 floor",
    "top20_band_violations": "count of cells where |full - top-20| exceeds its band (+1e-6)",
    "T0_median": "Hajek-weighted median of the order-0 floor (averaged inverse CDF)",
    "T0_topdecile_share": "share of the slot's Hajek-weighted total floor carried by the top "
                          "decile of anchor mass",
    "T0_share_below_001": "Hajek share of anchors with order-0 floor < 0.01",
    "T0_below_001_share_of_total": "share of the slot's total floor from anchors with floor "
                                   "< 0.01",
    "neff_median": "Hajek median of N_eff of the k-token block prefixes (slot k); at the last "
                   "slot these are the (gamma-1)-token prefixes",
    "neff_p90": "Hajek 90th percentile of N_eff of the k-token block prefixes",
    "neff_mean": "Hajek mean of N_eff of the k-token block prefixes",
    "neff_min": "smallest N_eff over anchors (no interval)",
    "neff_max": "largest N_eff over anchors (no interval)",
    "neff_at_cap_share": "Hajek share of anchors where no two paths share a prefix (N_eff "
                         "recorded as M)",
    "neff_probe_mismatch": "count of cells where the probe's stored N_eff differs from the "
                           "current estimator on the same tokens (the analysis uses the latter)",
    "corr_log_neff_T0": "Hajek-weighted Pearson correlation of log N_eff (k-token prefixes) "
                        "with the order-0 floor at slot k",
    "corr_neff_T0": "Hajek-weighted Pearson correlation of N_eff (raw scale) with the order-0 "
                    "floor at slot k",
    "kmedian_objective": "Hajek mean of the best-restart K-median objective on the renormalised "
                         "top-K reads",
    "kmedian_share_removed": "1 - (K-median objective)/(K=1 objective = top-K T0) on the same "
                             "reads, best restart; ratio of Hajek sums",
    "kmedian_share_removed_worst": "as kmedian_share_removed, with the worst restart's "
                                   "objective (best + spread)",
    "kmedian_spread_mean": "Hajek mean of the restart spread (max - min objective)",
    "kmedian_spread_max": "largest restart spread over anchors (no interval)",
    "kmedian_spread_zero_share": "Hajek share of (anchor, slot >= 1, K >= 2) cell mass whose "
                                 "restart spread is zero (<= 1e-9)",
    "kmedian_spread_p90": "Hajek 90th percentile of the restart spread over (anchor, slot >= 1, "
                          "K >= 2) cells",
    "kmedian_spread_mean_max": "largest Hajek-mean restart spread over (K >= 2, slot) pairs",
    "n_anchors": "anchors in the scope",
    "n_prompts": "prompts (bootstrap clusters) in the scope",
    "paths_per_anchor": "M, target paths per anchor",
    "gamma": "block length",
    "store_top_k": "K of the stored top-K reads",
    "reveal_paths": "J, revealed predecessors per anchor of the importance route",
    "bootstrap_replicates": "B, prompt-bootstrap replicates",
    "records_corrupt": "count of corrupt or duplicated record rows (floor rows and path rows); "
                       "the affected cells are left out and listed in the log",
    "records_missing": "count of missing record rows (anchor x slot floor rows, paths); the "
                       "affected cells are left out and listed in the log",
    "cells_excluded": "anchor x slot cells left out of the probe's floor statistics",
    "cells_excluded_paths": "anchor x slot cells left out of the top-K, K-median and N_eff "
                            "statistics (incomplete path records)",
}
