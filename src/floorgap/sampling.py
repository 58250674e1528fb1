"""The sampling law of a target or drafter, and inverse-CDF draws keyed by a caller's uniform.

One law (temperature, then top-k, then top-p) serves the corpus, the rollouts and the drafter
training data; the warp itself is :func:`floorgap.estimators.risk.warp_logits`, the same warp
that puts a proposal under the target's law when risks are measured (paper Sec. C.7).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from floorgap.estimators.risk import warp_logits


@dataclass(frozen=True)
class SamplingLaw:
    """Temperature, nucleus (top-p) and top-k truncation; ``top_p=1`` and ``top_k=0`` disable."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0")

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> SamplingLaw:
        """The law of a config's ``evaluation_law`` (or similar) mapping."""
        return cls(float(spec["temperature"]), float(spec["top_p"]),
                   int(spec["top_k"]))

    @property
    def is_plain(self) -> bool:
        """True when nothing is truncated (only the temperature acts)."""
        return self.top_p >= 1.0 and self.top_k == 0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Next-token probabilities under the law, in float64, along the last dimension.

        Top-k keeps every token tying the k-th largest; top-p keeps the smallest prefix of the
        descending order whose mass reaches ``top_p`` (the crossing token is kept).
        """
        return warp_logits(logits.to(torch.float64), self.temperature, self.top_p,
                           self.top_k or None)


def law_topk(law: SamplingLaw, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most likely tokens under ``law`` and their probabilities (descending) along
    the last dimension: (probabilities float32, ids int64). For a plain law (temperature only)
    no full-vocabulary probability tensor is built: the top-k of the logits are the top-k of
    the law, and their probabilities follow from one float32 log-normaliser; a truncating law
    goes through :meth:`SamplingLaw.probs`."""
    k = min(int(k), logits.shape[-1])
    if not law.is_plain:
        vals, ids = law.probs(logits).topk(k, dim=-1)
        return vals.float(), ids
    scaled = logits.float()
    if law.temperature != 1.0:   # x / 1 == x: skip the pass over the vocabulary
        scaled = scaled / law.temperature
    top, ids = scaled.topk(k, dim=-1)
    return (top - torch.logsumexp(scaled, dim=-1, keepdim=True)).exp(), ids


def keyed_draws(law: SamplingLaw, logits: torch.Tensor,
                generators: list[torch.Generator] | tuple[torch.Generator, ...]) -> torch.Tensor:
    """One token per row of ``logits`` [B, V] under ``law``: row i takes the next uniform of
    ``generators[i]`` and the token at that quantile (:func:`inverse_cdf_sample`), so a row's
    draws depend on its generator only, never on the rows beside it."""
    u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
    return inverse_cdf_sample(law.probs(logits), u)


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Token at quantile ``uniforms`` (``[B]``, in [0, 1)) of each row of ``probs`` (``[B, V]``):
    the first index whose cumulative mass exceeds ``u * total``. Zero-probability tokens are
    never returned (their cumulative mass does not increase)."""
    cdf = torch.cumsum(probs.to(torch.float64), dim=-1)
    target = (uniforms.to(cdf.device, torch.float64) * cdf[:, -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)
