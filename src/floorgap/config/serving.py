"""The resolvers of the serving benchmark: the systems an engine serves, their folders and
ports, the rows, the replay of their rounds and the summary (paper Sec. 4, App. H.3)."""

from __future__ import annotations

from typing import Any

from floorgap.config.base import ConfigError, variant_kind
from floorgap.config.checks import CheckSpecs
from floorgap.config.kinds import ENGINE_KINDS


class ServingSpecs(CheckSpecs):
    """The specs of the serving_rows, serving, serving_replay and serving_summary stages."""

    def serving_system(self, name: str) -> dict[str, Any]:
        """A served system: ``ar`` (no drafter), ``target`` (the target drafting for itself) or
        a drafter variant with its kind and the export format the engine loads."""
        if name == "ar":
            return {"name": name, "kind": None, "format": None}
        if name == "target":
            return {"name": name, "kind": "target", "format": None}
        entry = self.variant_entry(name, self.primary)
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
            return str(self.variant_entry(name, target)["checkpoint"]["path"])
        return f"results/{target}/export/{name}/{fmt}"

    def serving_port(self, name: str) -> int:
        """System i of serving.systems, then of the checks' served drafters, listens on
        port + i (jobs may run side by side)."""
        return int(self.serving["port"]) + [*self.serving["systems"],
                                            *self.check_systems].index(name)

    def serving_rows_spec(self, target: str) -> dict[str, Any]:
        cfg = self.settings(target)
        return {"target": self.target(target), "tasks": self.serving["tasks"], "seed": cfg["seed"],
                "max_prompt_tokens": cfg["corpus"]["max_prompt_tokens"]}

    def serving_spec(self, target: str, system: str) -> dict[str, Any]:
        cfg = self.settings(target)
        serving = dict(self.serving)
        serving.update(port=self.serving_port(system),
                       max_model_len=int(serving["max_model_len"]))
        if system in self.check_systems and system not in serving["systems"]:
            # a check serves a few rows per task, one request in flight, in its own engine
            serving.update(rows_per_task=self.check_serve_rows(system), concurrency=[1],
                           **self.check_engine(system))
        return {"target": self.target(target), "system": self.serving_system(system),
                "serving": {k: v for k, v in serving.items()
                            if k not in ("systems", "tasks", "published")},
                "gamma": cfg["anchors"]["gamma"], "seed": cfg["seed"]}

    @property
    def replayed_systems(self) -> list[str]:
        """The served drafters (exported folders) whose rounds the serving_replay stage
        replays offline; `ar` and the target drafting for itself have no drafter to replay."""
        systems = self.serving["systems"]
        return [s for s in systems if self.serving_system(s)["format"] is not None]

    def serving_replay_spec(self, target: str, system: str) -> dict[str, Any]:
        spec = {"target": self.target(target), "system": self.serving_system(system),
                "gamma": self.settings(target)["anchors"]["gamma"]}
        if system in self.check_systems:
            # a checked folder's rounds are also replayed under each named fault (the check
            # names the one they fit); the benchmark's own drafters need only the faithful one
            spec["name_faults"] = True
        return spec

    def replay_reference(self, system: str) -> list[str]:
        """The weights a system's rounds are replayed with in place of its served folder: a
        checked drafter's reference, where its check names one."""
        ref = self.check_reference(system) if system in self.check_systems else None
        return [ref] if ref else []

    def serving_summary_spec(self, target: str) -> dict[str, Any]:
        cfg = self.settings(target)
        return {"target": self.target(target), "tasks": list(self.serving["tasks"]),
                "bootstrap": cfg["analysis"]["bootstrap"], "level": cfg["analysis"]["level"],
                "seed": cfg["seed"]}


def check_serving(spec: ServingSpecs) -> None:
    """Served systems are `ar`, `target` or drafter variants or component arms of an engine
    kind, with AR there (every speedup is against it); SGLang needs CUDA targets."""
    serving = spec.serving
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
        entry = spec.variant_entry(name, spec.primary)
        kind = variant_kind(entry, f"serving.systems {name}")
        extras = entry.get("short_conv") or entry.get("slot_embeddings")
        if kind not in ENGINE_KINDS or extras:
            raise ConfigError(f"serving.systems {name!r} is a {kind} drafter"
                              f"{' with short convolutions or slot embeddings' if extras else ''}"
                              ", which no engine has a module for; serve "
                              f"{' or '.join(ENGINE_KINDS)} drafters")
    if serving["engine"] == "sglang":
        cpu = [t for t in spec.targets if not spec.config["targets"][t]["device"].startswith("cuda")]
        if cpu:
            raise ConfigError(f"serving.engine sglang runs on CUDA only, but targets {cpu} are on "
                              "CPU; use serving.engine: vllm")
