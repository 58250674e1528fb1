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

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: The evaluation groups of drafter_eval and the summaries of gaps (paper Tables 5-8, 10, 13;
#: ``decompose`` the user's checkpoint drafters of the ``decompose`` section).
SUMMARIES = ("summary", "trajectory", "components", "budget", "decompose")
#: The drafter roles every gap-half item is built from (paper Secs. 3.3, 4).
ROLES = ("order0", "order1", "ours")
#: The seed key every component arm shares, so that the arms start from the same draws.
COMPONENTS_SEED_KEY = "components"
#: The drafter kind each engine format holds unless the entry names another: a dspark folder
#: (``Qwen3DSparkModel``) with markov_rank 0 is DeepSpec's DFlash (``kind: dflash``), and
#: speculators folders hold either kind (the entry must name it).
FORMAT_KINDS = {"dflash": "dflash", "dspark": "dspark"}
FORMAT_ALSO_HOLDS = {"dspark": ("dflash",), "speculators": ("dflash", "dspark")}
# The conditioning order of every proposal kind (drafters and lookup tables): 0 reads X only,
# 1 also the predecessor z_{k-1}
KIND_ORDER = {"dflash": 0, "dspark": 1, "prefix_attention": 1,
              "unigram": 0, "bigram_committed": 0, "bigram": 1}
#: The keys a checkpoint entry may carry: the architecture and weights come from the folder.
CHECKPOINT_KEYS = frozenset({"name", "kind", "layers", "checkpoint"})
#: Names of drafters (config keys, results folders): the schema's pattern.
NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9_-]*$")
#: The files the decomposition stage writes per drafter (results/<target>/decomposition/).
DECOMPOSITION_EXTS = ("csv", "tex", "md")
#: The folder layouts the engines serve (vLLM's and SGLang's dflash and dspark methods).
SERVED_FORMATS = ("dflash", "dspark")
#: Each engine's environment as envs/install.sh builds it (a check's engine other than the
#: serving section's runs from here unless the check names its python).
ENGINE_PYTHONS = {"vllm": ".venv-serving/bin/python", "sglang": ".venv-sglang/bin/python"}
#: The files of one check (``floorgap check``): the page a person reads and its summary.
CHECK_FILES = ("index.html", "summary.md")


def decomposition_paths(target: str, name: str) -> list[str]:
    """The decomposition stage's files of drafter ``name`` on ``target`` (csv, tex, md)."""
    return [f"results/{target}/decomposition/{name}.{ext}" for ext in DECOMPOSITION_EXTS]


def check_paths(name: str) -> list[str]:
    """The check_report stage's files of check ``name`` (the page, then its summary)."""
    return [f"results/check/{name}/{f}" for f in CHECK_FILES]
#: What a target runs: ``full``, every per-target stage; ``cross_target``, only what the
#: comparison across targets reads (Fig. 5: corpus, anchors, rollouts, floors, the order-0 and
#: order-1 baselines, their evaluation and the gaps summary).
TARGET_SCOPES = ("full", "cross_target")
#: The evaluation job of a cross_target target: the two baselines of Fig. 5.
ROLES_JOB = "roles"
#: Keys of a target entry that configure the workflow rather than the model (left out of the
#: target spec every stage receives, so changing them reruns only what they change).
TARGET_WORKFLOW_KEYS = ("scope", "settings", "placement")


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


def _with_kind(entry: dict[str, Any]) -> dict[str, Any]:
    """``entry`` with the kind a checkpoint entry leaves to its format filled in."""
    if is_checkpoint(entry) and "kind" not in entry:
        entry["kind"] = variant_kind(entry, f"drafter {entry.get('name')}")
    return entry


def _check_checkpoint_entry(entry: Mapping[str, Any], where: str) -> None:
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
class WorkflowSpec:
    """The resolved config: names, roles, evaluation groups and the per-stage specs."""

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
        check_consistency(self)
        self.eval_groups = {
            # the lookup tables beside the drafters, on the same anchors and paths
            "summary": [Evaluation(v, "final") for v in self.variants + self.lookups],
            # every epoch (the final weights are the best held-out epoch, one of them)
            "trajectory": [Evaluation(v, f"epoch-{e}") for v in self.trajectory
                           for e in range(1, self.variant_epochs(v) + 1)],
            "components": [Evaluation(arm, "final") for arm in self.arms],
            # the budget study: every epoch of the variants it includes (epochs at fixed data;
            # their final weights are evaluated with the summary group) and the kept weights
            # of its arms (data at fixed steps, one change at a time)
            "budget": [Evaluation(v, f"epoch-{e}") for v in self.budget_variants
                       for e in range(1, self.variant_epochs(v) + 1)]
                      + [Evaluation(arm, "final") for arm in self.budget_arms],
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

    # ---------------------------------------------------------------- names and settings

    @property
    def drafter_names(self) -> list[str]:
        """Every drafter: the variants, the component arms, the budget-study arms, the
        lookup tables and the decompose section's drafters (one namespace)."""
        return self.variants + self.arms + self.budget_arms + self.lookups + self.decompose

    @property
    def cross_target_drafters(self) -> list[str]:
        """The drafters a cross_target target trains or imports: the order-0 and order-1
        baselines (Fig. 5)."""
        return list(dict.fromkeys([self.roles["order0"], self.roles["order1"]]))

    def scope(self, target: str) -> str:
        """What ``target`` runs (one of TARGET_SCOPES); the primary target is always
        ``full``."""
        scope = str(self.config["targets"][target].get("scope", "full"))
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
        return [name for name in self.eval_groups if self.summary_evaluations(name)]

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
                                       .get("processes", 1))

    def target(self, name: str) -> dict[str, Any]:
        """The model entry of target ``name`` (without its workflow keys: scope, settings)."""
        entry = self.config["targets"][name]
        return {"name": name, **{k: v for k, v in entry.items()
                                 if k not in TARGET_WORKFLOW_KEYS}}

    def domain(self, name: str, target: str | None = None) -> dict[str, Any]:
        cfg = self.config if target is None else self.settings(target)
        return {"name": name, **cfg["domains"][name]}

    def variant_entry(self, name: str, target: str | None = None) -> dict[str, Any]:
        """A drafter's config entry with its name (``target``'s own entry where its settings
        replace it); component arms train for components.epochs and share one seed key (the
        same initial draws); a checkpoint entry carries its resolved ``kind``."""
        cfg = self.config if target is None else self.settings(target)
        drafters = cfg["drafters"]
        if name in drafters["variants"]:
            return _with_kind({"name": name, **drafters["variants"][name]})
        if name in self.budget_arms:
            return {"name": name, **drafters["budget"]["arms"][name]}
        if name in self.lookups:
            return {"name": name, **drafters["lookups"][name]}
        if name in self.decompose:
            return _with_kind({"name": name, **self.config["decompose"][name]})
        components = drafters["components"]
        return {"name": name, "epochs": components["epochs"], "seed_key": COMPONENTS_SEED_KEY,
                **components["arms"][name]}

    def is_imported(self, name: str, target: str | None = None) -> bool:
        """Whether drafter ``name`` (of ``target``) is imported from a checkpoint (not trained)."""
        return is_checkpoint(self.variant_entry(name, target))

    def variant_epochs(self, name: str, target: str | None = None) -> int:
        entry = self.variant_entry(name, target)
        cfg = self.config if target is None else self.settings(target)
        return int(entry.get("epochs", cfg["drafters"]["train"]["epochs"]))

    def summary_evaluations(self, summary: str, target: str | None = None) -> list[Evaluation]:
        """The evaluations a gaps summary reads: its evaluation group; a cross_target target's
        ``summary`` reads its two baselines."""
        if target is not None and self.scope(target) == "cross_target":
            return self.eval_jobs[ROLES_JOB] if summary == "summary" else []
        return self.eval_groups[summary]

    # ---------------------------------------------------------------- stage specs

    def models_spec(self, target: str) -> dict[str, Any]:
        return self.target(target)

    def corpus_spec(self, target: str, domain: str) -> dict[str, Any]:
        cfg = self.settings(target)
        return {"target": self.target(target), "domain": self.domain(domain, target),
                "corpus": cfg["corpus"], "law": cfg["evaluation_law"], "seed": cfg["seed"]}

    def anchors_spec(self, target: str, domain: str) -> dict[str, Any]:
        cfg = self.settings(target)
        return {"domain": domain, "anchors": cfg["anchors"], "seed": cfg["seed"]}

    def rollouts_spec(self, target: str, shard: int) -> dict[str, Any]:
        cfg = self.settings(target)
        return {"target": self.target(target), "rollouts": cfg["rollouts"],
                "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
                "shard": int(shard)}

    def mi_spec(self, target: str) -> dict[str, Any]:
        """What the MI probe reads; the ESS gates only enter the report, so they are left out."""
        cfg = self.settings(target)
        return {"target": self.target(target),
                "mi": {k: v for k, v in cfg["mi"].items() if k != "ess_gates"},
                "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
                "forward_batch": cfg["rollouts"]["forward_batch"]}

    def analysis_spec(self, **extra: Any) -> dict[str, Any]:
        """Estimation settings; the config seed keys the bootstrap and K-median draws."""
        return {**self.config["analysis"], "seed": self.config["seed"], **extra}

    def taps(self, target: str) -> list[int]:
        """The target layers the drafters read: the target's own ``taps`` (targets differ in
        depth) or ``drafters.taps``."""
        return list(self.config["targets"][target].get("taps") or self.config["drafters"]["taps"])

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
        if drafters["training_data"].get("store_features", False):
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

    def gaps_spec(self, summary: str, target: str | None = None) -> dict[str, Any]:
        """The analysis settings of one gaps summary: its contrasts (ours against the order-1
        baseline; each component arm against the baseline arm), labels and sweeps; a
        cross_target target's summary has its two baselines and no contrast."""
        if target is not None and self.scope(target) == "cross_target":
            return self.analysis_spec(contrasts=[])
        if summary in ("trajectory", "budget"):
            return self.analysis_spec(contrasts=[], sweeps=False)
        if summary == "decompose":
            return self.analysis_spec(contrasts=self.lookup_contrasts(self.decompose)
                                      + self.check_contrasts(),
                                      sweeps=False, lookups=self.lookups)
        if summary == "components":
            base = self.config["drafters"]["components"]["baseline"]
            return self.analysis_spec(contrasts=[[arm, base] for arm in self.arms if arm != base],
                                      sweeps=False)
        roles = list(dict.fromkeys(self.roles[r] for r in ROLES))
        return self.analysis_spec(contrasts=[[self.roles["ours"], self.roles["order1"]],
                                             *self.lookup_contrasts(roles)],
                                  lookups=self.lookups)

    def lookup_contrasts(self, drafters: Sequence[str]) -> list[list[str]]:
        """[drafter, table] for each of ``drafters`` and each lookup table of its order: the
        paired differences that say whether a drafter beats a lookup table."""
        return [[d, t] for d in drafters for t in self.lookups
                if self.drafter_order(d) == self.drafter_order(t)]

    def lookup_tables(self, drafter: str) -> list[str]:
        """The lookup tables of ``drafter``'s order, which its decomposition and check set
        beside it."""
        return [t for [_, t] in self.lookup_contrasts([drafter])]

    def drafter_order(self, name: str) -> int:
        """The information order of a drafter or lookup table (0 reads X only, 1 also its
        predecessor)."""
        return KIND_ORDER[str(self.variant_entry(name)["kind"])]

    def check_contrasts(self) -> list[list[str]]:
        """[a, b] for every pair of drafters one check compares, in its order: their paired
        differences on the same anchors and paths (tau always; the risk by slot where the two
        are of one order)."""
        pairs = [(a, b) for entry in self.checks.values()
                 for i, a in enumerate(entry["drafters"]) for b in entry["drafters"][i + 1:]]
        return [list(p) for p in dict.fromkeys(pairs)]

    def check_target(self, name: str) -> str:
        """The target check ``name`` runs on (its ``target``, else the primary one)."""
        return str(self.checks[name].get("target") or self.primary)

    def check_spec(self, name: str) -> dict[str, Any]:
        """What the check_report stage reads: each drafter with its entry and the lookup tables
        of its order, the pairs it compares, the interval level, and the command and config
        files that asked for it."""
        entry = self.checks[name]
        drafters = list(entry["drafters"])
        pairs = [[a, b] for i, a in enumerate(drafters) for b in drafters[i + 1:]]
        return {"name": name, "target": self.check_target(name),
                "drafters": [{"name": d, "entry": self.variant_entry(d),
                              "lookups": self.lookup_tables(d)}
                             for d in drafters],
                "pairs": pairs, "level": self.config["analysis"]["level"],
                "references": dict(entry.get("references") or {}),
                "served": self.check_served(name), "not_served": self.check_not_served(name),
                "engine": (self.serving or {}).get("engine"),
                "tasks": list((self.serving or {}).get("tasks", [])),
                "bootstrap": self.config["analysis"]["bootstrap"], "seed": self.config["seed"],
                "command": entry.get("command", ""),
                "configfiles": list(entry.get("configfiles", []))}

    def fidelity_files(self, name: str) -> list[str]:
        """The export fidelity records check ``name`` reads: one per drafter with a reference."""
        refs = self.checks[name].get("references") or {}
        return [f"results/check/{name}/fidelity/{d}.json" for d in self.checks[name]["drafters"]
                if d in refs]

    def fidelity_spec(self, name: str, drafter: str) -> dict[str, Any]:
        """What the export_fidelity stage reads: the target, the folder and its reference, the
        evaluation law, gamma and how many anchors per domain."""
        target = self.check_target(name)
        entry = self.checks[name]
        return {"target": self.target(target), "drafter": drafter,
                "folder": self.variant_entry(drafter)["checkpoint"]["path"],
                "reference": entry["references"][drafter],
                "law": self.config["evaluation_law"], "gamma": self.config["anchors"]["gamma"],
                "anchors_per_domain": int(entry.get("fidelity_anchors", 4))}

    def check_not_served(self, name: str) -> dict[str, str]:
        """Why a drafter of check ``name`` is not served, by drafter (the others are served):
        the check does not serve (``serve: false``, or no serving section), the folder is in a
        layout no engine loads, or the engine cannot run its method where the target runs."""
        entry = self.checks[name]
        if self.serving is None:
            return {d: "the config has no serving section (the engine, its python and the "
                       "tasks)" for d in entry["drafters"]}
        if not entry.get("serve", True):
            return {d: "the check does not serve (--no-serve)" for d in entry["drafters"]}
        device = str(self.config["targets"][self.check_target(name)]["device"])
        why = {}
        for d in entry["drafters"]:
            ckpt = self.variant_entry(d)["checkpoint"]
            if ckpt["format"] not in SERVED_FORMATS:
                why[d] = (f"its folder is in the {ckpt['format']} layout; the engines load "
                          f"{' and '.join(SERVED_FORMATS)} folders")
            elif "path" not in ckpt:
                why[d] = "its checkpoint is a hub id; the check serves local folders"
            elif ckpt["format"] == "dspark" and self.check_engine(d)["engine"] == "vllm" \
                    and not device.startswith("cuda"):
                why[d] = ("vLLM's CPU build has no DSpark runner (its V1 model runner does "
                          "not support dspark, the V2 one needs Triton); serve on a CUDA target")
        return why

    def check_served(self, name: str) -> list[str]:
        """The drafters of check ``name`` it serves (see :meth:`check_not_served`)."""
        why = self.check_not_served(name)
        return [d for d in self.checks[name]["drafters"] if d not in why]

    @property
    def check_systems(self) -> list[str]:
        """Every served drafter of every check, each a serving system of its check's target
        (after serving.systems, on the ports that follow theirs)."""
        return list(dict.fromkeys(d for name in self.checks for d in self.check_served(name)))

    def check_serve_rows(self, drafter: str) -> int:
        """Rows per task a checked drafter is served on (the most any of its checks asks)."""
        return max(int(e.get("serve_rows", 1)) for e in self.checks.values()
                   if drafter in e["drafters"])

    def check_engine(self, drafter: str) -> dict[str, str]:
        """The engine and interpreter a checked drafter is served with: its check's ``engine``
        (and ``python``), else the serving section's."""
        serving = self.serving or {}
        entry = next(e for e in self.checks.values() if drafter in e["drafters"])
        engine = str(entry.get("engine") or serving["engine"])
        default = serving["python"] if engine == serving["engine"] else ENGINE_PYTHONS[engine]
        return {"engine": engine, "python": str(entry.get("python") or default)}

    def check_reference(self, drafter: str) -> str | None:
        """The weights a checked drafter's folder was exported from, where a check names them:
        its served rounds are replayed with those (else with floorgap's import of the folder)."""
        refs = [e["references"][drafter] for e in self.checks.values()
                if drafter in (e.get("references") or {})]
        return refs[0] if refs else None

    def check_replay_files(self, name: str) -> list[str]:
        """The replayed rounds of the folders check ``name`` serves, in its drafters' order."""
        target = self.check_target(name)
        return [f"results/{target}/serving_replay/{d}/rounds.parquet"
                for d in self.check_served(name)]

    def check_files(self) -> list[str]:
        """The check_report stage's outputs of every check of the config."""
        return [path for name in self.checks for path in check_paths(name)]

    def decomposition_spec(self, target: str, name: str) -> dict[str, Any]:
        """What the decomposition stage reads: the drafter, its entry and the interval level."""
        return {"target": target, "drafter": name, "entry": self.variant_entry(name),
                "level": self.config["analysis"]["level"],
                "lookups": self.lookup_tables(name)}

    # ---------------------------------------------------------------- serving (Sec. 4, H.3)

    @property
    def serving(self) -> dict[str, Any] | None:
        """The serving section, or None when the config has none (no serving stages)."""
        return self.config.get("serving")

    def serving_system(self, name: str) -> dict[str, Any]:
        """A served system: ``ar`` (no drafter), ``target`` (the target drafting for itself) or
        a drafter variant with its kind and the export format the engine loads."""
        if name == "ar":
            return {"name": name, "kind": None, "format": None}
        if name == "target":
            return {"name": name, "kind": "target", "format": None}
        entry = self.variant_entry(name)
        kind = variant_kind(entry, f"serving.systems {name}")
        if name in self.check_systems:
            # a checked folder is served as it is, in its own layout
            return {"name": name, "kind": kind, "format": entry["checkpoint"]["format"]}
        return {"name": name, "kind": kind, "format": self.export_formats(entry)[0]}

    def served_folder(self, target: str, name: str) -> str | None:
        """The drafter folder the engine loads for system ``name``: a checked folder itself,
        a variant's export in the system's format, none for ``ar`` and ``target``."""
        fmt = self.serving_system(name)["format"]
        if fmt is None:
            return None
        if name in self.check_systems:
            return str(self.variant_entry(name)["checkpoint"]["path"])
        return f"results/{target}/export/{name}/{fmt}"

    def serving_port(self, name: str) -> int:
        """System i of serving.systems, then of the checks' served drafters, listens on
        port + i (jobs may run side by side)."""
        serving = self.serving or {}
        return int(serving.get("port", 8011)) + [*serving["systems"],
                                                 *self.check_systems].index(name)

    def serving_rows_spec(self, target: str) -> dict[str, Any]:
        serving = self.serving or {}
        return {"target": self.target(target), "tasks": serving["tasks"], "seed":
                self.config["seed"], "max_prompt_tokens": self.config["corpus"]["max_prompt_tokens"]}

    def serving_spec(self, target: str, system: str) -> dict[str, Any]:
        serving = dict(self.serving or {})
        serving.update(port=self.serving_port(system),
                       max_model_len=int(serving.get("max_model_len", 4096)))
        if system in self.check_systems and system not in serving["systems"]:
            # a check serves a few rows per task, one request in flight, in its own engine
            serving.update(rows_per_task=self.check_serve_rows(system), concurrency=[1],
                           **self.check_engine(system))
        return {"target": self.target(target), "system": self.serving_system(system),
                "serving": {k: v for k, v in serving.items()
                            if k not in ("systems", "tasks", "published")},
                "gamma": self.config["anchors"]["gamma"], "seed": self.config["seed"]}

    @property
    def replayed_systems(self) -> list[str]:
        """The served drafters (exported folders) whose rounds the serving_replay stage
        replays offline; `ar` and the target drafting for itself have no drafter to replay."""
        systems = (self.serving or {}).get("systems", [])
        return [s for s in systems if self.serving_system(s)["format"] is not None]

    def serving_replay_spec(self, target: str, system: str) -> dict[str, Any]:
        return {"target": self.target(target), "system": self.serving_system(system),
                "gamma": self.config["anchors"]["gamma"]}

    def replay_reference(self, system: str) -> list[str]:
        """The weights a system's rounds are replayed with in place of its served folder: a
        checked drafter's reference, where its check names one."""
        ref = self.check_reference(system) if system in self.check_systems else None
        return [ref] if ref else []

    def serving_summary_spec(self, target: str) -> dict[str, Any]:
        return {"target": self.target(target), "tasks": list((self.serving or {})["tasks"]),
                "bootstrap": self.config["analysis"]["bootstrap"],
                "level": self.config["analysis"]["level"], "seed": self.config["seed"]}

    # ------------------------------------------------ robustness of the floors (App. C.3-C.7)

    #: the variants of the floor_variants section, each a report item's run
    FLOOR_VARIANTS = ("finite_m", "block16", "sampling_law")

    def floor_variants_spec(self, target: str, variant: str) -> dict[str, Any]:
        cfg = self.config
        section = cfg["floor_variants"]
        return {"target": self.target(target), "variant": {"name": variant, **section[variant]},
                "anchors_per_domain": section["anchors_per_domain"],
                "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
                "paths": cfg["rollouts"]["paths"],
                "forward_batch": cfg["rollouts"]["forward_batch"]}

    # ------------------------------------------------------- floors through an API (Sec. 3.4)

    @property
    def api_floors(self) -> dict[str, Any] | None:
        """The api_floors section, or None when the config has none (no api_floors stage)."""
        return self.config.get("api_floors")

    #: the reads of the api_floors stage: ``api`` (the frontier emulation: top-20, checked on
    #: the same paths) and ``replication`` (App. C.2: a second engine's top-256 reads)
    API_READS = ("api", "replication")

    def api_floors_spec(self, target: str, read: str = "api") -> dict[str, Any]:
        """The api_floors section for one read; ``replication`` takes its anchors, paths and
        top_k from the ``replication`` section, on the same endpoint (one port up) without the
        matched check."""
        cfg = self.config
        section = dict(self.api_floors or {})
        if read == "replication":
            rep = cfg["replication"]
            endpoint = dict(section["endpoint"])
            endpoint["port"] = int(endpoint.get("port", 8031)) + 1
            section.update(anchors_per_domain=rep["anchors_per_domain"], paths=rep["paths"],
                           top_k=rep["top_k"], matched=False, endpoint=endpoint)
        elif read != "api":
            raise ConfigError(f"unknown api_floors read {read!r}; use one of {self.API_READS}")
        return {"target": self.target(target), "api_floors": section, "read": read,
                "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
                "seed": cfg["seed"],
                "serving_python": (self.serving or {}).get("python", ".venv-serving/bin/python")}

    def decomposition_files(self, target: str) -> list[str]:
        """The decomposition stage's outputs of every drafter of the decompose section."""
        if self.scope(target) == "cross_target":
            return []
        return [path for name in self.decompose for path in decomposition_paths(target, name)]

    def export_formats(self, variant: str | Mapping[str, Any]) -> list[str]:
        """The checkpoint formats drafter ``variant`` (a name or an entry) is exported in: its
        engine format and speculators for dflash and dspark; only floorgap's own layout for
        the prefix-attention kind and for short_conv or slot_embeddings, which no engine has
        a module for (floorgap.models.engine_formats refuses them in the engine formats)."""
        entry = self.variant_entry(variant) if isinstance(variant, str) else variant
        kind = variant_kind(entry, f"drafter {entry.get('name')}")
        extras = entry.get("short_conv") or entry.get("slot_embeddings")
        if kind not in ("dflash", "dspark") or extras:
            return ["floorgap"]
        if is_checkpoint(entry) and entry["checkpoint"]["format"] == "dspark" \
                and kind == "dflash":
            return ["dspark"]  # DeepSpec's DFlash: anchor rows, served as a markov_rank-0 DSpark
        return [kind, "speculators"]

    def export_targets(self) -> list[str]:
        """The export folders ``all`` builds: every drafter of ``drafters.variants`` of the
        primary target, in each of its formats."""
        return [f"results/{self.primary}/export/{name}/{fmt}" for name in self.variants
                for fmt in self.export_formats(name)]

    def report_inputs(self, reads: str) -> dict[str, str]:
        """The files a report item of ``reads`` (a key of :data:`REPORT_SUMMARIES`) reads, as
        KEY -> path (the item function's ``inputs``)."""
        return REPORT_SUMMARIES[reads].inputs(self)

    def report_spec(self, reads: str, kind: str) -> dict[str, Any]:
        """The options one report item receives: the plotting options (figures only, so a
        plotting change reruns nothing upstream) and those of what it reads
        (:data:`REPORT_SUMMARIES`)."""
        spec: dict[str, Any] = dict(self.config["figures"]) if kind == "figure" else {}
        return {**spec, **REPORT_SUMMARIES[reads].options(self)}


# --------------------------------------------------------------------- what report items read


@dataclass(frozen=True)
class ReportSummary:
    """What one kind of report item reads: its files, KEY -> path (``inputs``), and the options
    beyond the plotting ones (``options``), both from the resolved config. A new kind of item is
    a new entry of :data:`REPORT_SUMMARIES`; the report rules and their specs follow from it."""

    inputs: Callable[[WorkflowSpec], dict[str, str]]
    options: Callable[[WorkflowSpec], dict[str, Any]] = lambda w: {}


def _primary(path: str) -> Callable[[WorkflowSpec], dict[str, str]]:
    """One summary of the primary target, read as ``summary``."""
    return lambda w: {"summary": f"results/{w.primary}/{path}"}


def _roles(w: WorkflowSpec) -> dict[str, Any]:
    """The drafter roles and the lookup tables' kinds (the gap half's items)."""
    return {"roles": w.roles,
            "lookups": {name: str(w.variant_entry(name)["kind"]) for name in w.lookups}}


def _served_beside(path: str) -> Callable[[WorkflowSpec], dict[str, str]]:
    # tables 10 and 13 also show the served tau of the variants the serving benchmark served
    return lambda w: {"summary": f"results/{w.primary}/{path}",
                      "served": f"results/{w.primary}/serving_summary/summary.parquet"}


def _budget_inputs(w: WorkflowSpec) -> dict[str, str]:
    # the budget study also reads each study drafter's training log (blocks per epoch)
    return {"summary": f"results/{w.primary}/gaps/budget.parquet",
            **{f"log_{v}": f"results/{w.primary}/drafters/{v}/train_log.jsonl"
               for v in w.budget_variants + w.budget_arms}}


def _budget_options(w: WorkflowSpec) -> dict[str, Any]:
    studied = w.budget_variants + w.budget_arms
    return {**_roles(w), "budget": {v: w.variant_entry(v) for v in studied},
            "train_epochs": {v: w.variant_epochs(v) for v in studied}}


#: Each kind of report item (a registry row's ``reads``): the files it reads and its options.
REPORT_SUMMARIES: dict[str, ReportSummary] = {
    "floors": ReportSummary(_primary("floors/summary.parquet")),
    "gaps": ReportSummary(_primary("gaps/summary.parquet"), _roles),
    "gaps_trajectory": ReportSummary(_served_beside("gaps/trajectory.parquet"), _roles),
    "gaps_components": ReportSummary(
        _served_beside("gaps/components.parquet"),
        lambda w: {**_roles(w), "baseline": w.config["drafters"]["components"]["baseline"],
                   "arms": w.arms}),
    "gaps_budget": ReportSummary(_budget_inputs, _budget_options),
    "mi": ReportSummary(
        lambda w: {d: f"results/{w.primary}/mi/{d}.parquet" for d in w.domains},
        lambda w: {"analysis": {"bootstrap": w.config["analysis"]["bootstrap"],
                                "level": w.config["analysis"]["level"],
                                "seed": w.config["seed"]},
                   "ess_gates": w.config["mi"]["ess_gates"]}),
    # App. F.3: published accepted lengths to bound, beside the project's own
    "serving": ReportSummary(
        _primary("serving_summary/summary.parquet"),
        lambda w: {**_roles(w), "published": list((w.serving or {}).get("published", [])),
                   "gamma": w.config["anchors"]["gamma"]}),
    "api_floors": ReportSummary(_primary("api_floors/api/summary.parquet")),
    # App. C.2: the second engine's reads beside the rollouts' full-vocabulary floors
    "replication": ReportSummary(lambda w: {
        "replication": f"results/{w.primary}/api_floors/replication/floors.parquet",
        "anchor_slot": f"results/{w.primary}/floors/anchor_slot.parquet"}),
    "floor_variants": ReportSummary(lambda w: {
        v: f"results/{w.primary}/floor_variants/{v}_summary.parquet" for v in w.FLOOR_VARIANTS}),
    # Fig. 5 compares the targets: every target's gaps summary
    "cross_target": ReportSummary(
        lambda w: {f"gaps_{t}": f"results/{t}/gaps/summary.parquet" for t in w.targets}, _roles),
    # the notation table reads the notation module, no file
    "notation": ReportSummary(lambda w: {}),
}


def check_consistency(spec: WorkflowSpec) -> None:
    """Cross-section checks the JSON schema cannot express; each error names the fix."""
    cfg = spec.config
    if spec.primary not in spec.targets:
        raise ConfigError(f"primary_target {spec.primary!r} is not a key of targets "
                          f"({', '.join(spec.targets)}); name one of them or drop primary_target "
                          "to use the first")
    _check_names(spec)
    baseline = cfg["drafters"]["components"]["baseline"]
    if baseline not in spec.arms:
        raise ConfigError(f"drafters.components.baseline {baseline!r} is not one of the arms "
                          f"({', '.join(spec.arms)})")
    unknown = sorted(set(spec.budget_variants) - set(spec.variants))
    if unknown:
        raise ConfigError(f"drafters.budget.variants names {unknown}, which are not "
                          "drafters.variants; list variant names")
    unknown = sorted(set(spec.trajectory) - set(spec.variants))
    if unknown:
        raise ConfigError(f"drafters.trajectory names {unknown}, which are not "
                          "drafters.variants; list variant names")
    _check_checkpoints(spec)
    _check_checks(spec)
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
    _check_serving(spec)
    order0 = variant_kind(cfg["drafters"]["variants"][spec.roles["order0"]],
                          f"drafters.variants.{spec.roles['order0']}")
    if order0 != "dflash":
        raise ConfigError(f"drafters.roles.order0 {spec.roles['order0']!r} is a {order0} drafter; "
                          "the order-0 baseline must be of kind dflash (q_k depends on X only)")
    _check_targets(spec)


def _check_targets(spec: WorkflowSpec) -> None:
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
                _check_checkpoint_entry(entry, f"{where}.drafters.variants.{name}")
        order0 = variant_kind(spec.variant_entry(spec.roles["order0"], target),
                              f"{where}.drafters.variants.{spec.roles['order0']}")
        if order0 != "dflash":
            raise ConfigError(f"drafters.roles.order0 {spec.roles['order0']!r} is a {order0} "
                              f"drafter on target {target}; the order-0 baseline must be of "
                              "kind dflash (q_k depends on X only)")


def _check_serving(spec: WorkflowSpec) -> None:
    """Served systems are `ar`, `target` or drafter variants or component arms of an engine
    kind, with AR there (every speedup is against it); SGLang needs CUDA targets."""
    serving = spec.config.get("serving")
    if not serving:
        return
    systems = list(serving["systems"])
    if "ar" not in systems:
        raise ConfigError("serving.systems has no `ar`: every speedup is against AR decoding "
                          "on the same engine; add `ar`")
    for name in systems:
        if name in ("ar", "target"):
            continue
        if name not in spec.variants and name not in spec.arms:
            raise ConfigError(f"serving.systems names {name!r}, which is neither `ar`, `target` "
                              f"nor one of drafters.variants ({', '.join(spec.variants)}) or "
                              "drafters.components.arms")
        entry = spec.variant_entry(name)
        kind = variant_kind(entry, f"serving.systems {name}")
        if kind not in ("dflash", "dspark") or entry.get("short_conv") or \
                entry.get("slot_embeddings"):
            raise ConfigError(f"serving.systems {name!r} is a {kind} drafter"
                              f"{' with short convolutions or slot embeddings' if kind in ('dflash', 'dspark') else ''}"
                              ", which no engine has a module for; serve dflash or dspark drafters")
    if serving["engine"] == "sglang":
        cpu = [t for t in spec.targets if not spec.config["targets"][t]["device"].startswith("cuda")]
        if cpu:
            raise ConfigError(f"serving.engine sglang runs on CUDA only, but targets {cpu} are on "
                              "CPU; use serving.engine: vllm")


def _check_names(spec: WorkflowSpec) -> None:
    """Variants, component arms, budget arms and decompose drafters share one namespace."""
    clash = sorted(set(spec.variants) & set(spec.arms))
    if clash:
        raise ConfigError(f"drafters.components.arms reuses the variant name(s) {clash}; "
                          "give the component arms their own names")
    clash = sorted(set(spec.budget_arms) & set(spec.variants + spec.arms))
    if clash:
        raise ConfigError(f"drafters.budget.arms reuses the drafter name(s) {clash}; give the "
                          "budget arms their own names")
    clash = sorted(set(spec.lookups) & set(spec.variants + spec.arms + spec.budget_arms))
    if clash:
        raise ConfigError(f"drafters.lookups reuses the drafter name(s) {clash}; give the "
                          "lookup tables their own names")
    clash = sorted(set(spec.decompose) & set(spec.variants + spec.arms + spec.budget_arms
                                             + spec.lookups))
    if clash:
        raise ConfigError(f"decompose reuses the drafter name(s) {clash} of the drafters "
                          "section (one namespace, one results folder each); give the drafters "
                          "to decompose their own names")


def _check_checks(spec: WorkflowSpec) -> None:
    """Each check names drafters of the decompose section and a target that runs them."""
    for name, entry in spec.checks.items():
        unknown = [d for d in entry["drafters"] if d not in spec.decompose]
        if unknown:
            raise ConfigError(f"check.{name} names {unknown}, which are not in the decompose "
                              f"section ({', '.join(spec.decompose) or 'empty'}); add their "
                              "checkpoint entries there (floorgap check writes both)")
        stray = sorted(set(entry.get("references") or {}) - set(entry["drafters"]))
        if stray:
            raise ConfigError(f"check.{name}.references names {stray}, which the check does not "
                              f"list in drafters ({', '.join(entry['drafters'])})")
        target = spec.check_target(name)
        if target not in spec.targets or spec.scope(target) != "full":
            raise ConfigError(f"check.{name}.target {target!r} is not a target of scope full "
                              f"({', '.join(t for t in spec.targets if spec.scope(t) == 'full')})"
                              "; name one of them")
        if entry.get("serve") and spec.serving is None:
            raise ConfigError(f"check.{name}.serve is on, but the config has no serving section "
                              "(the engine, its python and the tasks); add one or drop serve")
        for d in spec.check_served(name):
            engines = {str(e.get("engine") or spec.serving["engine"])
                       for e in spec.checks.values() if d in e["drafters"]}
            if len(engines) > 1:
                raise ConfigError(f"the checks name {d} with the engines {sorted(engines)}; a "
                                  "folder is served in one engine (its serving records are "
                                  "shared): check it in one engine, or give it two names")
        served = spec.check_served(name)
        device = str(spec.config["targets"][target]["device"])
        if served and spec.check_engine(served[0])["engine"] == "sglang" \
                and not device.startswith("cuda"):
            raise ConfigError(f"check.{name} serves in sglang, which runs on CUDA only, but its "
                              f"target {target} is on {device}; serve in vllm (--engine vllm) "
                              "or check on a CUDA target")


def _check_checkpoints(spec: WorkflowSpec) -> None:
    """Checkpoint entries are well formed, and only where final weights are all that is read:
    they have no training epochs (trajectory, budget study) and no shared training seed
    (component arms)."""
    drafters = spec.config["drafters"]
    for name, entry in drafters["variants"].items():
        if is_checkpoint(entry):
            _check_checkpoint_entry(entry, f"drafters.variants.{name}")
    for name in spec.decompose:
        entry = spec.config["decompose"][name]
        if not is_checkpoint(entry):
            raise ConfigError(f"decompose.{name} has no checkpoint; the decompose section "
                              "evaluates existing drafters: give checkpoint: {format, path}")
        _check_checkpoint_entry(entry, f"decompose.{name}")
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


def resolve(config: Mapping[str, Any]) -> WorkflowSpec:
    """The resolved :class:`WorkflowSpec` of a schema-validated config."""
    return WorkflowSpec(config)


# -------------------------------------------------------------------- floorgap decompose


def decompose_overlay(name: str, folder: str | os.PathLike[str], fmt: str,
                      kind: str | None = None) -> dict[str, Any]:
    """The config overlay of ``floorgap decompose``: one ``decompose`` drafter ``name`` that
    imports the checkpoint folder ``folder`` (made absolute) of format ``fmt``; ``kind`` is
    required for a speculators folder (its config names it). Snakemake merges it over the base
    config (later ``--configfile`` files win)."""
    if not NAME_PATTERN.match(name):
        raise ConfigError(f"drafter name {name!r} must match {NAME_PATTERN.pattern} (lower-case "
                          "letters, digits, - and _): pass another --name")
    entry: dict[str, Any] = {"checkpoint": {"format": fmt,
                                            "path": str(Path(folder).expanduser().resolve())}}
    if kind is not None:
        entry["kind"] = kind
    variant_kind(entry, f"decompose.{name}")
    return {"decompose": {name: entry}}


def write_overlay(path: str | os.PathLike[str], overlay: Mapping[str, Any]) -> Path:
    """Write a config overlay as YAML, atomically; returns its path."""
    import yaml

    from floorgap.records import atomic_path

    with atomic_path(path) as tmp:
        tmp.write_text("# written by `floorgap decompose`; merged over the base config\n"
                       + yaml.safe_dump(dict(overlay), sort_keys=False))
    return Path(path)
