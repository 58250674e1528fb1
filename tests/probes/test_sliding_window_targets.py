"""A target with sliding-window attention layers (a tiny Gemma-4 text model, transformers'
own ``Gemma4ForCausalLM``): the probes that drop tokens from the cache again (the revealed
predecessors of the rollouts, the truncated prefixes of the MI probe) read exactly what a
fresh forward of the same sequence reads, once the context is longer than the window."""

from __future__ import annotations

import pytest
import torch

from floorgap.probes.mi import conditioned_logprobs, law_logprob
from floorgap.probes.rollouts import sample_block
from floorgap.sampling import SamplingLaw

transformers = pytest.importorskip("transformers")
if not hasattr(transformers, "Gemma4ForCausalLM"):
    pytest.skip("this transformers has no Gemma-4", allow_module_level=True)

WINDOW = 4
LAW = SamplingLaw()


@pytest.fixture(scope="module")
def gemma4():
    torch.manual_seed(0)
    cfg = transformers.Gemma4TextConfig(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention"], max_position_embeddings=128)
    return transformers.Gemma4ForCausalLM(cfg).eval().requires_grad_(False)


def _next_probs(model, ids: list[int]) -> torch.Tensor:
    logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
    return LAW.probs(logits.unsqueeze(0)).float()[0]


def test_revealed_predecessors_match_a_fresh_forward(gemma4) -> None:
    ctx = list(range(3, 3 + 3 * WINDOW))  # longer than the window
    block = sample_block(gemma4, ctx, n_paths=3, gamma=3, law=LAW, anchor_seed=7,
                         forward_batch=3, reveal_paths=2)
    for k in (1, 2):
        for j in range(2):
            for s in range(3):
                ids = ctx + block.tokens[s, :k - 1].tolist() + [int(block.tokens[j, k - 1])]
                torch.testing.assert_close(block.revealed[k, j, s], _next_probs(gemma4, ids),
                                           atol=1e-5, rtol=1e-4)
    # and the paths themselves continue from the cropped cache as from a fresh forward
    for s in range(3):
        ids = ctx + block.tokens[s, :2].tolist()
        torch.testing.assert_close(block.probs[2, s], _next_probs(gemma4, ids),
                                   atol=1e-5, rtol=1e-4)


def test_truncated_prefixes_match_a_fresh_forward(gemma4) -> None:
    ctx = list(range(5, 5 + 2 * WINDOW + 1))
    z_star = torch.tensor([11, 12, 13, 14])
    prefixes = torch.tensor([[20, 21, 22, 23], [30, 31, 32, 33]])
    starts = {1: 3, 2: 3}
    out = conditioned_logprobs(gemma4, ctx, prefixes, z_star, starts=starts, law=LAW,
                               forward_batch=2)
    for j, last in starts.items():
        for s in range(2):
            ids = ctx + prefixes[s, :j].tolist() + z_star[j:last].tolist()
            logits = gemma4(input_ids=torch.tensor([ids])).logits[:, -(last - j + 1):]
            want = law_logprob(LAW, logits, z_star[j:last + 1].view(1, -1, 1)).squeeze(-1)[0]
            torch.testing.assert_close(out[j][s], want.double(), atol=1e-5, rtol=1e-4)
