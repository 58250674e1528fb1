"""The workflow's decisions, resolved once from a validated config.

The Snakemake rules only name files, resources and the command; everything they would otherwise
decide lives here, where unit tests reach it: which drafters exist and in which role (the
order-0 baseline, the order-1 baseline, ours), which (variant, weights) pairs each evaluation
group and each gaps summary reads, the seed keys and epochs of the component arms, the
consistency checks between config sections, and the spec (a plain dict) each stage command
receives. :func:`resolve` turns the config into a :class:`WorkflowSpec`; :func:`as_json` makes a
spec the stable string a rule passes as ``params``, so a rule reruns exactly when the part of
the config it reads changes.

Checkpoint variants. A drafter entry with ``checkpoint`` (a released or exported drafter in an
engine layout, :mod:`floorgap.models.engine_formats`) is imported by the drafters stage instead
of trained; its ``kind`` may be left out when the format names it (:func:`variant_kind`). The
``decompose`` section lists such drafters of a user's own: they form the evaluation group and
gaps summary ``decompose`` and get a decomposition table each (``floorgap decompose``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from floorgap.config.base import (
    COMPONENTS_SEED_KEY, NAME_PATTERN, ROLES, ROLES_JOB, SUMMARIES, TARGET_SCOPES, ConfigError,
    Evaluation, as_json, check_names, check_targets, drafter_epochs, is_checkpoint,
    merge_settings, validate_config, variant_kind,
)
from floorgap.config.checks import (
    CHECK_FILES, check_checks, check_paths, decompose_overlay, decomposition_paths, write_overlay,
)
from floorgap.config.drafters import check_drafters
from floorgap.config.kinds import (
    DRAFTER_KINDS, ENGINE_KINDS, KIND_ORDER, KINDS, LOOKUP_KINDS, SERVED_FORMATS, ProposalKind,
)
from floorgap.config.probes import ProbeSpecs
from floorgap.config.reports import REPORT_SUMMARIES, ReportSpecs, ReportSummary
from floorgap.config.serving import ServingSpecs, check_serving

__all__ = [
    "CHECK_FILES", "COMPONENTS_SEED_KEY", "DRAFTER_KINDS", "ENGINE_KINDS", "KINDS", "KIND_ORDER",
    "LOOKUP_KINDS", "ProposalKind", "NAME_PATTERN", "REPORT_SUMMARIES",
    "ROLES", "ROLES_JOB", "SERVED_FORMATS", "SUMMARIES", "TARGET_SCOPES", "ConfigError",
    "Evaluation", "ReportSummary", "WorkflowSpec", "as_json", "check_consistency",
    "check_paths", "decompose_overlay", "decomposition_paths", "drafter_epochs", "is_checkpoint",
    "merge_settings", "resolve", "validate_config", "variant_kind", "write_overlay",
]


class WorkflowSpec(ServingSpecs, ProbeSpecs, ReportSpecs):
    """The resolved config: names, roles, evaluation groups and every stage's spec."""

    def validate(self) -> None:
        check_consistency(self)


def check_consistency(spec: WorkflowSpec) -> None:
    """Cross-section checks the JSON schema cannot express, each beside the part it checks;
    each error names the fix."""
    if spec.primary not in spec.targets:
        raise ConfigError(f"primary_target {spec.primary!r} is not a key of targets "
                          f"({', '.join(spec.targets)}); name one of them or drop primary_target "
                          "to use the first")
    check_names(spec)
    check_drafters(spec)
    check_checks(spec)
    check_serving(spec)
    check_targets(spec)


def resolve(config: Mapping[str, Any]) -> WorkflowSpec:
    """The resolved :class:`WorkflowSpec` of ``config``, validated against the schema first
    (its defaults filled in place; each target's merged settings too)."""
    validate_config(config)
    return WorkflowSpec(config)
