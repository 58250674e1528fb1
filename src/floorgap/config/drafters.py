"""The resolvers of the gap half: training data, drafters, their evaluation on the floor
paths, the gaps summaries, the lookup tables beside them and the exports (paper
Secs. 3.3, 4; App. E)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from floorgap.config.base import (
    ROLES,
    ConfigError,
    SpecCore,
    check_checkpoint_entry,
    is_checkpoint,
    variant_kind,
)
from floorgap.config.kinds import KINDS


class DrafterSpecs(SpecCore):
    """The specs of the stages that train, import, evaluate and export drafters."""

    def drafter_data_spec(self, target: str) -> dict[str, Any]:
        """What the drafter_data stage reads; the taps and the training precision only when the
        record stores features (otherwise changing them reruns nothing there)."""
        cfg = self.settings(target)
        drafters = cfg["drafters"]
        spec = {"target": self.target(target),
                "domains": [self.domain(d, target) for d in self.domains],
                "training_data": drafters["training_data"], "corpus": cfg["corpus"],
                "evaluation_law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
                "seed": cfg["seed"]}
        if drafters["training_data"]["store_features"]:
            spec["features"] = {"taps": self.taps(target),
                                "dtype": drafters["train"].get("autocast") or "float32"}
        return spec

    def drafters_spec(self, target: str, variant: str) -> dict[str, Any]:
        """What the drafters stage reads. An imported checkpoint reads no training settings, so
        changing them reruns no import."""
        cfg = self.settings(target)
        entry = self.variant_entry(variant, target)
        if is_checkpoint(entry):
            return {"target": self.target(target), "variant": entry,
                    "gamma": cfg["anchors"]["gamma"]}
        return {"target": self.target(target), "variant": entry,
                "export_epochs": variant in self.trajectory + self.budget_variants,
                "taps": self.taps(target),
                "train": cfg["drafters"]["train"], "gamma": cfg["anchors"]["gamma"],
                "seed": cfg["seed"]}

    def drafter_eval_spec(self, target: str, shard: int, job: str) -> dict[str, Any]:
        cfg = self.settings(target)
        return {"target": self.target(target), "rollouts": cfg["rollouts"],
                "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
                "shard": int(shard), "variants": [e.label for e in self.eval_jobs[job]]}

    def gaps_spec(self, summary: str, target: str) -> dict[str, Any]:
        """The analysis settings of one gaps summary: its contrasts (ours against the order-1
        baseline; each component arm against the baseline arm), labels and sweeps; a
        cross_target target's summary has its two baselines and no contrast."""
        if self.scope(target) == "cross_target":
            return self.analysis_spec(contrasts=[])
        if summary == "trajectory":
            return self.analysis_spec(contrasts=[], sweeps=False)
        if summary == "budget":
            return self.analysis_spec(contrasts=self.budget_contrasts(), sweeps=False,
                                      lookups=self.budget_lookups)
        if summary == "decompose":
            return self.analysis_spec(contrasts=self.lookup_contrasts(self.decompose)
                                      + self.check_contrasts(),
                                      sweeps=False, lookups=self.reference_lookups)
        if summary == "components":
            base = self.config["drafters"]["components"]["baseline"]
            return self.analysis_spec(contrasts=[[arm, base] for arm in self.arms if arm != base],
                                      sweeps=False)
        roles = list(dict.fromkeys(self.roles[r] for r in ROLES))
        return self.analysis_spec(contrasts=[[self.roles["ours"], self.roles["order1"]],
                                             *self.lookup_contrasts(roles)],
                                  lookups=self.reference_lookups)

    def budget_contrasts(self) -> list[list[str]]:
        """[arm, table] for each budget arm and each budget table of its order fitted on as
        many blocks: whether the arm beats the table that saw the same data."""
        def blocks(name: str) -> Any:
            return self.variant_entry(name, self.primary).get("blocks")
        return [[a, t] for a in self.budget_arms for t in self.budget_lookups
                if self.drafter_order(a) == self.drafter_order(t) and blocks(a) == blocks(t)]

    def lookup_tables(self, drafter: str) -> list[str]:
        """The lookup tables of ``drafter``'s order, which its decomposition and check set
        beside it."""
        return [t for [_, t] in self.lookup_contrasts([drafter])]

    def export_formats(self, variant: str | Mapping[str, Any]) -> list[str]:
        """The checkpoint formats drafter ``variant`` (a name or an entry) is exported in: its
        kind's formats (``config.kinds.KINDS``: its engine's layout and speculators); only
        floorgap's own layout for a kind no engine has a module for and for short_conv or
        slot_embeddings (floorgap.models.engine_formats refuses them in the engine formats)."""
        entry = self.variant_entry(variant, self.primary) if isinstance(variant, str) \
            else variant
        kind = variant_kind(entry, f"drafter {entry.get('name')}")
        extras = entry.get("short_conv") or entry.get("slot_embeddings")
        if not KINDS[kind].formats or extras:
            return ["floorgap"]
        if is_checkpoint(entry) and entry["checkpoint"]["format"] == "dspark" \
                and kind == "dflash":
            return ["dspark"]  # DeepSpec's DFlash: anchor rows, served as a markov_rank-0 DSpark
        return list(KINDS[kind].formats)

    def export_targets(self) -> list[str]:
        """The export folders ``all`` builds: every drafter of ``drafters.variants`` of the
        primary target, in each of its formats."""
        return [f"results/{self.primary}/export/{name}/{fmt}" for name in self.variants
                for fmt in self.export_formats(name)]


def check_drafters(spec: DrafterSpecs) -> None:
    """The drafters section against itself: the component baseline is an arm, the studied
    variants and the roles name variants, every domain has a training-prompt count, and
    checkpoint entries are where they may be."""
    cfg = spec.config
    baseline = cfg["drafters"]["components"]["baseline"]
    if baseline not in spec.arms:
        raise ConfigError(f"drafters.components.baseline {baseline!r} is not one of the arms "
                          f"({', '.join(spec.arms)})")
    for section, names in (("budget.variants", spec.budget_variants),
                           ("trajectory", spec.trajectory)):
        unknown = sorted(set(names) - set(spec.variants))
        if unknown:
            raise ConfigError(f"drafters.{section} names {unknown}, which are not "
                              "drafters.variants; list variant names")
    check_checkpoints(spec)
    for target in spec.targets:
        settings = spec.settings(target)
        counts = settings["drafters"]["training_data"]["prompts_per_domain"]
        if isinstance(counts, Mapping) and set(counts) != set(settings["domains"]):
            raise ConfigError(f"drafters.training_data.prompts_per_domain ({target}) names "
                              f"{sorted(counts)}, the domains are {sorted(settings['domains'])}: "
                              "give a count for every domain, or one integer")
    for role in ROLES:
        name = spec.roles.get(role)
        if name not in spec.variants:
            raise ConfigError(f"drafters.roles.{role} is {name!r}, which is not one of "
                              f"drafters.variants ({', '.join(spec.variants)}); name the variant "
                              "that plays this role")
    # the order-0 baseline's kind is checked on every target (config.base.check_targets)


def check_checkpoints(spec: DrafterSpecs) -> None:
    """Checkpoint entries are well formed, and only where final weights are all that is read:
    they have no training epochs (trajectory, budget study) and no shared training seed
    (component arms)."""
    drafters = spec.config["drafters"]
    for name, entry in drafters["variants"].items():
        if is_checkpoint(entry):
            check_checkpoint_entry(entry, f"drafters.variants.{name}")
    for name in spec.decompose:
        entry = spec.config["decompose"][name]
        if not is_checkpoint(entry):
            raise ConfigError(f"decompose.{name} has no checkpoint; the decompose section "
                              "evaluates existing drafters: give checkpoint: {format, path}")
        check_checkpoint_entry(entry, f"decompose.{name}")
    studied = sorted(set(spec.trajectory + spec.budget_variants))
    if drafters["train"].get("patience") is not None and studied:
        raise ConfigError(f"drafters.train.patience may stop training before the last epoch, "
                          f"but {studied} (trajectory, budget.variants) have every epoch "
                          "evaluated; drop patience or empty those lists")
    for target in spec.targets:
        if spec.scope(target) != "full":
            continue  # a cross_target target trains no trajectory and no budget study
        variants = spec.settings(target)["drafters"]["variants"]
        imported = sorted(v for v in variants if is_checkpoint(variants[v]))
        for section, names in (("drafters.trajectory", spec.trajectory),
                               ("drafters.budget.variants", spec.budget_variants)):
            bad = sorted(set(names) & set(imported))
            if bad:
                raise ConfigError(f"{section} names {bad}, which import a checkpoint (target "
                                  f"{target}) and have no training epochs to evaluate; remove "
                                  f"them from {section} (or train them: give kind and layers "
                                  "instead of checkpoint)")
    arms = {"drafters.components.arms": drafters["components"]["arms"],
            "drafters.budget.arms": drafters.get("budget", {}).get("arms", {})}
    for section, entries in arms.items():
        bad = sorted(a for a, e in entries.items() if is_checkpoint(e))
        if bad:
            raise ConfigError(f"{section} {bad} name a checkpoint; these arms are trained in the "
                              "workflow (give kind and layers); evaluate a checkpoint as a "
                              "drafters.variants or decompose entry")
