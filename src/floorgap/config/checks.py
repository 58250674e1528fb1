"""The resolvers of ``floorgap decompose`` and ``floorgap check``: a user's own drafters
(the ``decompose`` section), their decomposition tables, the checks' pages, the export
fidelity records and what the checks serve; the overlay the commands write."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from floorgap.config.base import NAME_PATTERN, ConfigError, variant_kind
from floorgap.config.drafters import DrafterSpecs
from floorgap.config.kinds import SERVED_FORMATS

#: The files the decomposition stage writes per drafter (results/<target>/decomposition/).
DECOMPOSITION_EXTS = ("csv", "tex", "md")
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


class CheckSpecs(DrafterSpecs):
    """The specs of the decomposition, export_fidelity and check_report stages."""

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
                "drafters": [{"name": d, "entry": self.variant_entry(d, self.check_target(name)),
                              "lookups": self.lookup_tables(d)}
                             for d in drafters],
                "pairs": pairs, "level": self.config["analysis"]["level"],
                "references": dict(entry.get("references") or {}),
                "served": self.check_served(name), "not_served": self.check_not_served(name),
                "engine": entry.get("engine") or self.serving["engine"],
                "tasks": list(self.serving["tasks"]),
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
                "folder": self.variant_entry(drafter, target)["checkpoint"]["path"],
                "reference": entry["references"][drafter],
                "law": self.settings(target)["evaluation_law"],
                "gamma": self.settings(target)["anchors"]["gamma"],
                "anchors_per_domain": int(entry["fidelity_anchors"])}

    def check_not_served(self, name: str) -> dict[str, str]:
        """Why a drafter of check ``name`` is not served, by drafter (the others are served):
        the check does not serve (``serve: false``), the folder is in a layout no engine
        loads, or the engine cannot run its method where the target runs."""
        entry = self.checks[name]
        if not entry["serve"]:
            return {d: "the check does not serve (--no-serve)" for d in entry["drafters"]}
        device = str(self.config["targets"][self.check_target(name)]["device"])
        why = {}
        for d in entry["drafters"]:
            ckpt = self.variant_entry(d, self.check_target(name))["checkpoint"]
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
        return max(int(e["serve_rows"]) for e in self.checks.values()
                   if drafter in e["drafters"])

    def check_engine(self, drafter: str) -> dict[str, str]:
        """The engine and interpreter a checked drafter is served with: its check's ``engine``
        (and ``python``), else the serving section's."""
        serving = self.serving
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

    def check_serving_files(self, name: str) -> list[str]:
        """The serving records (requests, then runs with the engine's own counts) of the
        folders check ``name`` serves, in its drafters' order."""
        target = self.check_target(name)
        return [f"results/{target}/serving/{d}/{kind}.parquet" for d in self.check_served(name)
                for kind in ("requests", "runs")]

    def check_files(self) -> list[str]:
        """The check_report stage's outputs of every check of the config."""
        return [path for name in self.checks for path in check_paths(name)]

    def decomposition_spec(self, target: str, name: str) -> dict[str, Any]:
        """What the decomposition stage reads: the drafter, its entry and the interval level."""
        return {"target": target, "drafter": name, "entry": self.variant_entry(name, target),
                "level": self.settings(target)["analysis"]["level"],
                "lookups": self.lookup_tables(name)}

    def decomposition_files(self, target: str) -> list[str]:
        """The decomposition stage's outputs of every drafter of the decompose section."""
        if self.scope(target) == "cross_target":
            return []
        return [path for name in self.decompose for path in decomposition_paths(target, name)]


def check_checks(spec: CheckSpecs) -> None:
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
