"""The law's top-K without a full-vocabulary probability tensor (floorgap.sampling.law_topk)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.sampling import SamplingLaw, law_topk


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), temperature=st.sampled_from([0.5, 1.0, 1.7]),
       truncate=st.sampled_from([(1.0, 0), (0.8, 0), (1.0, 5)]), k=st.integers(1, 12))
def test_law_topk_equals_the_topk_of_the_laws_probabilities(seed, temperature, truncate, k):
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(seed)) * 3
    law = SamplingLaw(temperature, *truncate)
    vals, ids = law_topk(law, logits, k)
    ref_vals, ref_ids = law.probs(logits).topk(k, dim=-1)
    torch.testing.assert_close(vals.double(), ref_vals, atol=1e-6, rtol=1e-5)
    kept = ref_vals > 1e-6        # ties among zero-probability tokens may order differently
    assert torch.equal(ids[kept], ref_ids[kept])
    assert vals.dtype == torch.float32 and ids.dtype == torch.int64


def test_k_past_the_vocabulary_is_the_whole_law():
    logits = torch.randn(2, 7)
    vals, _ = law_topk(SamplingLaw(), logits, 100)
    assert vals.shape == (2, 7)
    assert torch.allclose(vals.sum(-1), torch.ones(2))
    with pytest.raises(ValueError):
        SamplingLaw(temperature=0)
