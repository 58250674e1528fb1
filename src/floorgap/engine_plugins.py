"""vLLM general plugin (entry point group ``vllm.general_plugins``) loaded by the serving engine's
own environment, where ``envs/install.sh`` installs this package without its dependencies.

It mends one fault of vLLM 0.32's CPU build that breaks speculative decoding at temperature > 0.
Without Triton, the CPU platform replaces the rejection sampler's Triton kernels by fallbacks in
``vllm.utils.cpu_triton_utils``; the fallback of ``expand_kernel`` (which spreads each request's
temperature, top-k and top-p over its draft tokens) casts its output buffer to int64 and fills
the copy, so a float32 buffer is never written. The target's logits are then divided by
uninitialised temperatures before the acceptance test: measured on SmolLM2-135M at T = 1, the
target drafting for itself accepted no draft, and the returned tokens failed the lossless test
(z = -115; AR decoding on the same server: z = -0.1).

``register_vllm`` replaces that fallback with one that writes any dtype. The CPU platform
registers its fallbacks after the general plugins load, reading them from
``cpu_triton_utils`` at that moment, so the replacement is made in that module. Nothing here
imports vLLM unless the plugin runs inside it, and on any other platform it does nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["expand_to_tokens", "register_vllm"]


def expand_to_tokens(output: Any, input_val: Any, cu_num_tokens: Any, replace_from: Any,
                     replace_to: Any, MAX_NUM_TOKENS: Any = None) -> None:  # noqa: N803
    """The semantics of vLLM's ``expand_kernel``: request i's value (``replace_from`` replaced
    by ``replace_to``) written to its tokens ``output[cu[i-1]:cu[i]]``, in ``output``'s dtype.
    The argument names follow the kernel's launch (``MAX_NUM_TOKENS`` is Triton's tile)."""
    import torch

    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = torch.where(input_val == replace_from,
                         torch.as_tensor(replace_to, dtype=input_val.dtype), input_val)
    spread = torch.repeat_interleave(values, counts)
    output[:spread.numel()].copy_(spread.to(output.dtype))


def register_vllm() -> None:
    """vLLM general plugin: on the CPU platform, install :func:`expand_to_tokens` as the
    ``expand_kernel`` fallback (module docstring). Safe to call more than once."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils

    cpu_triton_utils._expand_kernel_impl = expand_to_tokens
