"""The resolvers of the floor half's probes: corpus, anchors, rollouts, MI, the floors'
robustness variants and the floors through an API (paper Sec. 3, App. C-D)."""

from __future__ import annotations

from typing import Any

from floorgap.config.base import ConfigError, SpecCore


class ProbeSpecs(SpecCore):
    """The specs of the probes that run the target on the floor paths."""

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

    # ------------------------------------------------ robustness of the floors (App. C.3-C.7)

    #: the variants of the floor_variants section, each a report item's run
    FLOOR_VARIANTS = ("finite_m", "block16", "sampling_law")

    def floor_variants_spec(self, target: str, variant: str) -> dict[str, Any]:
        cfg = self.settings(target)
        section = cfg["floor_variants"]
        return {"target": self.target(target), "variant": {"name": variant, **section[variant]},
                "anchors_per_domain": section["anchors_per_domain"],
                "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
                "paths": cfg["rollouts"]["paths"],
                "forward_batch": cfg["rollouts"]["forward_batch"]}

    # ------------------------------------------------------- floors through an API (Sec. 3.4)

    @property
    def api_floors(self) -> dict[str, Any]:
        """The api_floors section (the endpoint the floors are read through)."""
        return self.config["api_floors"]

    #: the reads of the api_floors stage: ``api`` (the frontier emulation: top-20, checked on
    #: the same paths) and ``replication`` (App. C.2: a second engine's top-256 reads)
    API_READS = ("api", "replication")

    def api_floors_spec(self, target: str, read: str = "api") -> dict[str, Any]:
        """The api_floors section for one read; ``replication`` takes its anchors, paths and
        top_k from the ``replication`` section, on the same endpoint (one port up) without the
        matched check."""
        cfg = self.settings(target)
        section = dict(self.api_floors)
        if read == "replication":
            rep = cfg["replication"]
            endpoint = dict(section["endpoint"])
            endpoint["port"] = int(endpoint["port"]) + 1
            section.update(anchors_per_domain=rep["anchors_per_domain"], paths=rep["paths"],
                           top_k=rep["top_k"], matched=False, endpoint=endpoint)
        elif read != "api":
            raise ConfigError(f"unknown api_floors read {read!r}; use one of {self.API_READS}")
        return {"target": self.target(target), "api_floors": section, "read": read,
                "law": cfg["evaluation_law"], "gamma": cfg["anchors"]["gamma"],
                "seed": cfg["seed"],
                "serving_python": self.serving["python"]}
