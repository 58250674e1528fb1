"""The config's shared vocabulary and the core of the resolved config: the constants, the
entry helpers, :class:`Evaluation` and :class:`SpecCore` (names, targets, their merged
settings and the evaluation groups), which each stage family's resolver extends."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from floorgap.config.kinds import FORMAT_ALSO_HOLDS, FORMAT_KINDS, KIND_ORDER

#: The evaluation groups of drafter_eval and the summaries of gaps (paper Tables 5-8, 10, 13;
#: ``decompose`` the user's checkpoint drafters of the ``decompose`` section).
SUMMARIES = ("summary", "trajectory", "components", "budget", "decompose")
#: The drafter roles every gap-half item is built from (paper Secs. 3.3, 4).
ROLES = ("order0", "order1", "ours")
#: The seed key every component arm shares, so that the arms start from the same draws.
COMPONENTS_SEED_KEY = "components"
#: The keys a checkpoint entry may carry: the architecture and weights come from the folder.
CHECKPOINT_KEYS = frozenset({"name", "kind", "layers", "checkpoint"})
#: Names of drafters (config keys, results folders): the schema's pattern.
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
#: What a target runs: ``full``, every per-target stage; ``cross_target``, only what the
#: comparison across targets reads (Fig. 5: corpus, anchors, rollouts, floors, the order-0 and
#: order-1 baselines, their evaluation and the gaps summary).
TARGET_SCOPES = ("full", "cross_target")
#: The evaluation job of a cross_target target: the two baselines of Fig. 5.
ROLES_JOB = "roles"
#: Keys of a target entry that configure the workflow rather than the model (left out of the
#: target spec every stage receives, so changing them reruns only what they change).
TARGET_WORKFLOW_KEYS = ("scope", "settings", "placement")


#: The config's JSON schema: every knob with its default and description.
SCHEMA = Path(__file__).resolve().parents[3] / "workflow" / "schemas" / "config.schema.yaml"


def validate_config(config: Mapping[str, Any]) -> None:
    """Validate ``config`` against :data:`SCHEMA`, filling in the schema's defaults in place:
    the one home of a knob's default (the code reads ``config[key]``)."""
    from snakemake.utils import validate  # the resolver alone needs Snakemake's validator

    validate(config, schema=str(SCHEMA))


def merge_settings(base: Mapping[str, Any], settings: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with a target's ``settings`` merged over it key by key; a drafter entry
    (``drafters.variants.<name>``) is replaced whole, so a checkpoint entry can stand in for a
    trained one."""
    def merge(a: Mapping[str, Any], b: Mapping[str, Any], path: tuple[str, ...]) -> dict:
        out = dict(a)
        for key, value in b.items():
            whole = path == ("drafters", "variants")
            if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) and not whole:
                out[key] = merge(out[key], value, path + (key,))
            else:
                out[key] = value
        return out

    return merge(base, settings, ())


class ConfigError(ValueError):
    """Config sections that validate one by one but contradict each other."""


def is_checkpoint(entry: Mapping[str, Any]) -> bool:
    """Whether a drafter entry names a checkpoint to import rather than a drafter to train."""
    return bool(entry.get("checkpoint"))


def variant_kind(entry: Mapping[str, Any], where: str = "drafter entry") -> str:
    """The drafter kind of a config entry: its ``kind``, or for a checkpoint entry the kind its
    format holds (dflash, dspark); a speculators checkpoint must name its ``kind``. Raises
    :class:`ConfigError` when a given ``kind`` contradicts the format."""
    if not is_checkpoint(entry):
        if "kind" not in entry:
            raise ConfigError(f"{where} has neither 'kind' nor 'checkpoint'; give the kind of "
                              "drafter to train or a checkpoint to import")
        return str(entry["kind"])
    fmt = str(entry["checkpoint"].get("format"))
    kind = entry.get("kind")
    implied = FORMAT_KINDS.get(fmt)
    if implied is None and kind is None:
        raise ConfigError(f"{where}: a {fmt} checkpoint can hold a dflash or a dspark drafter; "
                          "add kind: dflash or kind: dspark")
    if implied is None and kind not in FORMAT_KINDS.values():
        raise ConfigError(f"{where}: a {fmt} checkpoint holds a dflash or a dspark drafter, not "
                          f"{kind}; fix kind")
    if kind is not None and kind in FORMAT_ALSO_HOLDS.get(fmt, ()):
        return str(kind)
    if implied is not None and kind is not None and kind != implied:
        raise ConfigError(f"{where}: kind {kind} contradicts checkpoint.format {fmt} (a {fmt} "
                          f"folder holds a {implied} drafter); drop kind or fix the format")
    return str(kind if kind is not None else implied)


def drafter_epochs(entry: Mapping[str, Any], train: Mapping[str, Any]) -> int:
    """The epochs a drafter trains: its entry's ``epochs``, else ``drafters.train.epochs`` (the
    one rule: the trainer writes that many epoch files and the evaluation groups read them)."""
    return int(entry.get("epochs", train["epochs"]))


def with_kind(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with the kind a checkpoint entry leaves to its format filled in."""
    if is_checkpoint(entry) and "kind" not in entry:
        entry["kind"] = variant_kind(entry, f"drafter {entry.get('name')}")
    return entry


def check_checkpoint_entry(entry: Mapping[str, Any], where: str) -> None:
    """A checkpoint entry carries no training or architecture settings (the folder decides)."""
    extra = sorted(set(entry) - CHECKPOINT_KEYS)
    if extra:
        raise ConfigError(f"{where} imports a checkpoint but also sets {extra}; a checkpoint "
                          "is not trained and its folder's config.json gives the architecture: "
                          "keep only kind, layers and checkpoint")
    variant_kind(entry, where)


def as_json(obj: Any) -> str:
    """A spec as compact, key-sorted JSON (stable across runs, so params compare equal)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))



@dataclass(frozen=True)
class Evaluation:
    """One drafter's weights evaluated on the rollout paths by one drafter_eval job:
    ``weights`` is ``final`` or ``epoch-<e>`` (an earlier epoch of the training trajectory).
    Records are kept per job, since two jobs may evaluate the same lookup table."""

    variant: str
    weights: str
    job: str = "study"

    @property
    def label(self) -> str:
        """The name its records carry: the variant for final weights, else variant@epoch-e."""
        return self.variant if self.weights == "final" else f"{self.variant}@{self.weights}"


@dataclass
class SpecCore:
    """The resolved config's names, targets and evaluation groups; the stage families'
    resolvers (:mod:`floorgap.config`) add the specs. :meth:`validate` runs the
    cross-section checks before the groups are built."""

    config: Mapping[str, Any]
    targets: list[str] = field(init=False)
    domains: list[str] = field(init=False)
    primary: str = field(init=False)
    variants: list[str] = field(init=False)
    arms: list[str] = field(init=False)
    trajectory: list[str] = field(init=False)
    budget_arms: list[str] = field(init=False)
    budget_variants: list[str] = field(init=False)
    roles: dict[str, str] = field(init=False)
    lookups: list[str] = field(init=False)
    budget_lookups: list[str] = field(init=False)
    decompose: list[str] = field(init=False)
    checks: dict[str, dict[str, Any]] = field(init=False)
    eval_groups: dict[str, list[Evaluation]] = field(init=False)
    eval_jobs: dict[str, list[Evaluation]] = field(init=False)

    def __post_init__(self) -> None:
        cfg = self.config
        drafters = cfg["drafters"]
        self.targets = list(cfg["targets"])
        self.domains = list(cfg["domains"])
        self.primary = cfg.get("primary_target", self.targets[0])
        self.variants = list(drafters["variants"])
        self.arms = list(drafters["components"]["arms"])
        self.trajectory = list(drafters["trajectory"])
        budget = drafters.get("budget", {})
        self.budget_arms = list(budget.get("arms", {}))
        self.budget_variants = list(budget.get("variants", []))
        self.roles = dict(drafters["roles"])
        self.lookups = list(drafters.get("lookups") or {})
        self.decompose = list(cfg.get("decompose") or {})
        self.checks = {name: dict(entry) for name, entry in (cfg.get("check") or {}).items()}
        self._settings = {t: merge_settings(cfg, cfg["targets"][t].get("settings") or {})
                          for t in self.targets}
        for t in self.targets:  # a target's merged config is a config too (without its
            if cfg["targets"][t].get("settings"):  # own settings, it is the one just validated)
                validate_config(self._settings[t])
        # a table fitted on a subset of the training blocks (``blocks``) belongs to the budget
        # study, beside the study's drafters trained on the same subset
        self.budget_lookups = [t for t in self.lookups
                               if drafters["lookups"][t].get("blocks") is not None]
        self.validate()
        self.eval_groups = {
            # the lookup tables beside the drafters, on the same anchors and paths
            "summary": [Evaluation(v, "final") for v in self.variants + self.reference_lookups],
            # every epoch (the final weights are the best held-out epoch, one of them)
            "trajectory": [Evaluation(v, f"epoch-{e}") for v in self.trajectory
                           for e in range(1, self.variant_epochs(v, self.primary) + 1)],
            "components": [Evaluation(arm, "final") for arm in self.arms],
            # the budget study: every epoch of the variants it includes (epochs at fixed data;
            # their final weights are evaluated with the summary group), the kept weights of
            # its arms (data at fixed steps, one change at a time, the data curve) and the
            # tables fitted on the arms' subsets
            "budget": [Evaluation(v, f"epoch-{e}") for v in self.budget_variants
                       for e in range(1, self.variant_epochs(v, self.primary) + 1)]
                      + [Evaluation(d, "final") for d in self.budget_arms + self.budget_lookups],
            # a user's own drafters (floorgap decompose): final weights only, beside the
            # lookup tables (their paired differences say whether the drafter beats them)
            "decompose": [Evaluation(name, "final", "decompose") for name in self.decompose]
                         + [Evaluation(t, "final", "decompose") for t in dict.fromkeys(
                             t for _, t in self.lookup_contrasts(self.decompose))],
        }
        # The drafter_eval jobs (one per shard each). The study's groups share one: the
        # target's p along the paths, most of an evaluation's cost, is then computed once for
        # all of them. A user's own drafters keep theirs, so evaluating them trains nothing.
        self.eval_jobs = {
            "study": [e for group in ("summary", "trajectory", "components", "budget")
                      for e in self.eval_groups[group]],
            "decompose": self.eval_groups["decompose"],
            # a cross_target target evaluates only the two baselines Fig. 5 reads
            ROLES_JOB: [Evaluation(v, "final", ROLES_JOB) for v in self.cross_target_drafters],
        }

    def validate(self) -> None:
        """Cross-section checks (the full spec's own)."""

    # ---------------------------------------------------------------- names and settings

    @property
    def drafter_names(self) -> list[str]:
        """Every drafter: the variants, the component arms, the budget-study arms, the
        lookup tables and the decompose section's drafters (one namespace)."""
        return self.variants + self.arms + self.budget_arms + self.lookups + self.decompose

    @property
    def reference_lookups(self) -> list[str]:
        """The lookup tables fitted on all the training data: the ones every drafter is set
        beside (the budget study's tables are set beside its arms of the same subset)."""
        return [t for t in self.lookups if t not in self.budget_lookups]

    @property
    def cross_target_drafters(self) -> list[str]:
        """The drafters a cross_target target trains or imports: the order-0 and order-1
        baselines (Fig. 5)."""
        return list(dict.fromkeys([self.roles["order0"], self.roles["order1"]]))

    def scope(self, target: str) -> str:
        """What ``target`` runs (one of TARGET_SCOPES); the primary target is always
        ``full``."""
        scope = str(self.config["targets"][target]["scope"])
        if scope not in TARGET_SCOPES:
            raise ConfigError(f"targets.{target}.scope {scope!r} is none of {TARGET_SCOPES}")
        return scope

    def settings(self, target: str) -> dict[str, Any]:
        """The config as ``target`` sees it: its ``settings`` merged over the shared sections."""
        return self._settings[target]

    def target_drafters(self, target: str) -> list[str]:
        """The drafters trained or imported for ``target``."""
        if self.scope(target) == "cross_target":
            return self.cross_target_drafters
        return self.drafter_names

    def eval_job_names(self, target: str) -> list[str]:
        """The drafter_eval jobs of ``target`` that evaluate something."""
        names = [ROLES_JOB] if self.scope(target) == "cross_target" else ["study", "decompose"]
        return [job for job in names if self.eval_jobs[job]]

    def eval_job_targets(self, job: str) -> list[str]:
        """The targets that run drafter_eval job ``job``."""
        return [t for t in self.targets if job in self.eval_job_names(t)]

    def summaries(self, target: str) -> list[str]:
        """The gaps summaries of ``target`` (an empty group, e.g. no decompose section, has
        none; a cross_target target has only ``summary``, of its two baselines)."""
        if self.scope(target) == "cross_target":
            return ["summary"]
        return [name for name in self.eval_groups if self.summary_evaluations(name, target)]

    def shards(self) -> range:
        return range(self.config["rollouts"]["shards"])

    def gpus(self, target: str) -> int:
        """GPUs a model-running job of this target requests (0 on CPU targets): placed by
        ``placement`` where a rehearsal runs a cuda target's jobs on CPU stand-ins."""
        entry = self.config["targets"][target]
        return 1 if entry.get("placement", entry["device"]).startswith("cuda") else 0

    def partition(self, target: str) -> str:
        """The SLURM partition of a model-running job of this target (section ``cluster``)."""
        cluster = self.config["cluster"]
        return cluster["gpu_partition"] if self.gpus(target) else cluster["cpu_partition"]

    def host_mem_mb(self, target: str, rule: str, model_dir: str, ceiling_mb: int) -> int:
        """``mem_mb`` of a probe job, sized from the target's parameters once the model is
        materialised (:func:`floorgap.resources.host_mem_mb`); ``ceiling_mb`` before."""
        from floorgap.resources import host_mem_mb

        return host_mem_mb(self.settings(target), target, rule, model_dir, ceiling_mb)

    def gpu_model(self, target: str) -> str:
        """The GPU type a model-running job of this target asks for (``cluster.gpu_model``,
        sbatch ``--gpus=<model>:<n>``); empty on CPU targets or when the cluster names none."""
        return str(self.config["cluster"].get("gpu_model", "")) if self.gpus(target) else ""

    def drafter_gpus(self, target: str) -> int:
        return self.gpus(target) * int(self.settings(target)["drafters"]["train"]
                                       ["processes"])

    def target(self, name: str) -> dict[str, Any]:
        """The model entry of target ``name`` (without its workflow keys: scope, settings)."""
        entry = self.config["targets"][name]
        return {"name": name, **{k: v for k, v in entry.items()
                                 if k not in TARGET_WORKFLOW_KEYS}}

    def taps(self, target: str) -> list[int]:
        """The target layers the drafters read: the target's own ``taps`` (targets differ in
        depth) or ``drafters.taps``."""
        return list(self.config["targets"][target].get("taps") or self.config["drafters"]["taps"])

    def domain(self, name: str, target: str) -> dict[str, Any]:
        """Domain ``name`` as ``target`` sees it."""
        return {"name": name, **self.settings(target)["domains"][name]}

    def variant_entry(self, name: str, target: str) -> dict[str, Any]:
        """A drafter's config entry with its name, as ``target`` sees it (its own entry where
        its settings replace it; the stages that run on the primary target only, serving and
        the reports, pass the primary); component arms train for components.epochs and share
        one seed key (the same initial draws); a checkpoint entry carries its resolved
        ``kind``."""
        drafters = self.settings(target)["drafters"]
        if name in drafters["variants"]:
            return with_kind({"name": name, **drafters["variants"][name]})
        if name in self.budget_arms:
            return {"name": name, **drafters["budget"]["arms"][name]}
        if name in self.lookups:
            return {"name": name, **drafters["lookups"][name]}
        if name in self.decompose:
            return with_kind({"name": name, **self.config["decompose"][name]})
        components = drafters["components"]
        return {"name": name, "epochs": components["epochs"], "seed_key": COMPONENTS_SEED_KEY,
                **components["arms"][name]}

    def is_imported(self, name: str, target: str) -> bool:
        """Whether drafter ``name`` (of ``target``) is imported from a checkpoint (not trained)."""
        return is_checkpoint(self.variant_entry(name, target))

    def variant_epochs(self, name: str, target: str) -> int:
        return drafter_epochs(self.variant_entry(name, target),
                              self.settings(target)["drafters"]["train"])

    def drafter_priority(self, name: str, target: str) -> int:
        """The scheduling priority of drafter ``name``'s training job: the gap half's chain
        first, longest first. A variant trained on all the data (the roles, the trajectory)
        gets its epochs; a table fitted on all of it 1 (short, but the drafters' evaluation
        waits on it); a subset arm, a component arm and an import get 0 and fill the cores."""
        if name in self.reference_lookups:
            return 1
        entry = self.variant_entry(name, target)
        variants = self.settings(target)["drafters"]["variants"]
        if is_checkpoint(entry) or name not in variants or "blocks" in entry:
            return 0
        return self.variant_epochs(name, target)

    # ------------------------------------------------- what more than one stage family reads

    @property
    def serving(self) -> dict[str, Any]:
        """The serving section (the engine, its python, the systems and the tasks)."""
        return self.config["serving"]

    def analysis_spec(self, **extra: Any) -> dict[str, Any]:
        """Estimation settings; the config seed keys the bootstrap and K-median draws."""
        return {**self.config["analysis"], "seed": self.config["seed"], **extra}

    def lookup_contrasts(self, drafters: Sequence[str]) -> list[list[str]]:
        """[drafter, table] for each of ``drafters`` and each lookup table of its order fitted
        on all the training data: the paired differences that say whether a drafter beats a
        lookup table."""
        return [[d, t] for d in drafters for t in self.reference_lookups
                if self.drafter_order(d) == self.drafter_order(t)]

    def drafter_order(self, name: str) -> int:
        """The information order of a drafter or lookup table (0 reads X only, 1 also its
        predecessor), from the primary target's entry: a target replaces an entry's values, and
        the order-0 role is checked on every target (check_targets)."""
        return KIND_ORDER[str(self.variant_entry(name, self.primary)["kind"])]

    def check_contrasts(self) -> list[list[str]]:
        """[a, b] for every pair of drafters one check compares, in its order: their paired
        differences on the same anchors and paths (tau always; the risk by slot where the two
        are of one order)."""
        pairs = [(a, b) for entry in self.checks.values()
                 for i, a in enumerate(entry["drafters"]) for b in entry["drafters"][i + 1:]]
        return [list(p) for p in dict.fromkeys(pairs)]

    def summary_evaluations(self, summary: str, target: str) -> list[Evaluation]:
        """The evaluations a gaps summary of ``target`` reads: its evaluation group; a
        cross_target target's ``summary`` reads its two baselines."""
        if self.scope(target) == "cross_target":
            return self.eval_jobs[ROLES_JOB] if summary == "summary" else []
        return self.eval_groups[summary]


def check_targets(spec: SpecCore) -> None:
    """Scopes and per-target settings: the primary target runs everything; settings change the
    values of existing domains and drafters, never the names (one namespace, one DAG shape)."""
    if spec.scope(spec.primary) != "full":
        raise ConfigError(f"the primary target {spec.primary!r} has scope "
                          f"{spec.scope(spec.primary)}; the primary target runs every stage: "
                          "drop its scope or make another target primary_target")
    for target in spec.targets:
        settings = spec.config["targets"][target].get("settings") or {}
        where = f"targets.{target}.settings"
        unknown = sorted(set(settings.get("domains") or {}) - set(spec.domains))
        if unknown:
            raise ConfigError(f"{where}.domains names {unknown}, which are not domains "
                              f"({', '.join(spec.domains)}); a target changes a domain's "
                              "settings, it cannot add one")
        variants = (settings.get("drafters") or {}).get("variants") or {}
        unknown = sorted(set(variants) - set(spec.variants))
        if unknown:
            raise ConfigError(f"{where}.drafters.variants names {unknown}, which are not "
                              f"drafters.variants ({', '.join(spec.variants)}); a target replaces "
                              "the entry of an existing drafter name")
        for name, entry in variants.items():
            if is_checkpoint(entry):
                check_checkpoint_entry(entry, f"{where}.drafters.variants.{name}")
        order0 = variant_kind(spec.variant_entry(spec.roles["order0"], target),
                              f"{where}.drafters.variants.{spec.roles['order0']}")
        if order0 != "dflash":
            raise ConfigError(f"drafters.roles.order0 {spec.roles['order0']!r} is a {order0} "
                              f"drafter on target {target}; the order-0 baseline must be of "
                              "kind dflash (q_k depends on X only)")


def check_names(spec: SpecCore) -> None:
    """Variants, component arms, budget arms, lookup tables and decompose drafters share one
    namespace: each section's names are new to the sections before it."""
    sections = (("drafters.components.arms", spec.arms, "the variant name(s)",
                 "give the component arms their own names"),
                ("drafters.budget.arms", spec.budget_arms, "the drafter name(s)",
                 "give the budget arms their own names"),
                ("drafters.lookups", spec.lookups, "the drafter name(s)",
                 "give the lookup tables their own names"),
                ("decompose", spec.decompose, "the drafter name(s)",
                 "give the drafters to decompose their own names (one namespace, one results "
                 "folder each)"))
    before = list(spec.variants)
    for section, names, what, fix in sections:
        clash = sorted(set(names) & set(before))
        if clash:
            raise ConfigError(f"{section} reuses {what} {clash}; {fix}")
        before += names
