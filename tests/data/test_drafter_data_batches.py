"""The response batches of the drafter_data stage: shortest prompts first, at most
``batch_size`` prompts and ``batch_tokens`` padded tokens a batch."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from floorgap.data.drafter_data import token_batches


@settings(max_examples=200, deadline=None)
@given(lens=st.lists(st.integers(1, 800), min_size=1, max_size=60), size=st.integers(1, 16),
       budget=st.none() | st.integers(1, 4000), max_new=st.integers(1, 64))
def test_batches_cover_the_order_within_both_limits(lens, size, budget, max_new) -> None:
    order = sorted(range(len(lens)), key=lambda i: (lens[i], i))
    batches = token_batches(order, lens, size, budget, max_new)
    assert [i for b in batches for i in b] == order            # consecutive, nothing lost
    for b in batches:
        width = max(lens[i] for i in b) + max_new
        assert 1 <= len(b) <= size
        # a lone prompt over the budget still gets a batch of its own
        assert budget is None or len(b) == 1 or len(b) * width <= budget
    # a batch is closed only when the next prompt does not fit
    for a, b in zip(batches, batches[1:]):
        width = lens[b[0]] + max_new
        assert len(a) == size or (budget is not None and (len(a) + 1) * width > budget)


def test_long_prompts_go_in_smaller_batches() -> None:
    lens = [50] * 8 + [400] * 4
    batches = token_batches(list(range(12)), lens, 8, 8 * 178, 128)
    assert [len(b) for b in batches] == [8, 2, 2]
