"""Estimator core: pure tensor math (torch, CPU or GPU), no model code, no I/O.

Each function names the paper quantity it computes; the paper's symbol is in its docstring.
"""

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
