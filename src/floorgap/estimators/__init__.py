"""Estimator core: pure tensor math (torch, CPU or GPU), no model code, no I/O.

Each function names the paper quantity it computes; the paper's symbol is in its docstring.
"""

# barycentre, floors, truncation, effective support, K-median
from .barycentre import (  # noqa: E402
    Barycentre,
    normalise_weights,
    tv_barycentre,
    tv_barycentre_lp,
    tv_distance,
)
from .floors import (  # noqa: E402
    ReweightedFloor,
    SplitFloor,
    alternating_split,
    floor_by_slot,
    floor_order0,
    floor_order0_split,
    floor_order1_by_slot,
    floor_order1_plugin,
    floor_order1_reweighted,
    floor_order1_split,
    floor_orderm_plugin,
    floor_orderm_split,
    group_ids,
    kish_ess,
    reveal_weights,
)
from .kmedian import KMedian, tv_kmedian, tv_kmedian_objective  # noqa: E402
from .support import (  # noqa: E402
    EffectiveSupport,
    effective_support,
    effective_support_by_depth,
)
from .truncation import (  # noqa: E402
    TopK,
    TruncatedFloor,
    renormalised_dense,
    topk_sparse,
    truncated_floor,
)

# aggregation, risks, serving reweighting, best response, MI recovery
from .aggregate import (  # noqa: E402
    BootstrapResult,
    ClusterResample,
    bootstrap_transform,
    cluster_resample,
    hajek_mean,
    paired_difference,
    percentile_interval,
    prompt_bootstrap,
    weighted_ratio,
)
from .best_response import (  # noqa: E402
    SingleSlotGain,
    SweepResult,
    WaterFill,
    coordinate_sweep,
    expected_length,
    single_slot_gain,
    tau_slot_decomposition,
    water_fill,
)
from .mi import (  # noqa: E402
    MICellLosses,
    RecoveryBootstrap,
    RecoveryEstimate,
    ess_gate_sensitivity,
    mi_cell_losses,
    recovery_bootstrap,
    recovery_fraction,
    recovery_terms,
    screen_anchors,
)
from .risk import (  # noqa: E402
    SelfRiskDecomposition,
    anchor_risk,
    decompose_self_risk,
    exposure,
    model_gap,
    oracle_risk,
    self_risk,
    warp_logits,
    warp_probs,
)
from .serving import (  # noqa: E402
    ServeRiskSums,
    ServingSummary,
    accept_factors,
    accepted_length,
    dependence_ratio,
    exact_chain_tau,
    independent_accepted_length,
    joint_survival,
    marginal_acceptance,
    reach,
    serving_risk_sums,
    serving_summary,
)
