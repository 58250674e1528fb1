"""Deterministic seed derivation.

Every random draw in floorgap is keyed by *what* it is for (a prompt, an anchor, a path),
never by the order in which work happens to be batched, chunked or sharded. A seed is the
first 63 bits of SHA-256 over the base seed and the key parts, so it is stable across
machines, Python versions and processes.
"""

from __future__ import annotations

import hashlib

import torch

BASE_SEED = 20260818


def derive_seed(base_seed: int, *parts: object) -> int:
    """Return a 63-bit seed determined by ``base_seed`` and the ordered key ``parts``."""
    text = "\x1f".join([str(int(base_seed)), *(str(p) for p in parts)])
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") & ((1 << 63) - 1)


def generator_for(seed: int, device: str | torch.device = "cpu") -> torch.Generator:
    """A torch generator seeded with ``seed`` on ``device``."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed))
    return gen
