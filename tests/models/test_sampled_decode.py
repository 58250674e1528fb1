"""Sampled decoding with the target's law read at every step, against independent methods:
the tokens against transformers' ``generate`` with the per-row sampler, the targets and
features against a teacher-forced forward over the finished sequence; on a full-attention
family and a sliding-window one whose window the prompts exceed."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig

from floorgap.data.corpus import generate_batch
from floorgap.models.from_target import target_features
from floorgap.models import sampled_decode
from floorgap.models.sampled_decode import decode_with_targets, row_groups
from floorgap.sampling import SamplingLaw

SMALL = dict(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
             num_attention_heads=4, num_key_value_heads=2)
FAMILIES = {
    "llama": lambda: LlamaConfig(**SMALL),
    # window 6 < every prompt: the sliding layers' cache is cut while rows decode
    "gemma3": lambda: Gemma3TextConfig(**SMALL, head_dim=8, sliding_window=6,
                                       layer_types=["sliding_attention", "full_attention",
                                                    "sliding_attention"]),
}
LAW = SamplingLaw.from_spec({"temperature": 1.0, "top_p": 1.0, "top_k": 0})
TARGET_LAW = SamplingLaw.from_spec({"temperature": 0.7, "top_p": 1.0, "top_k": 0})
PROMPTS = [[5, 17, 3, 44, 9, 81, 2], [60, 33, 7, 12, 70, 71, 72, 73, 74, 75, 76],
           [8, 1, 90, 14, 15, 16, 30, 31], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49]]
SEEDS = [11, 12, 13, 14]
TAPS = [0, 2]
PAD, EOS = 0, 3


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def model(request):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(FAMILIES[request.param]()).eval()


def _decode(model, prompts=PROMPTS, seeds=SEEDS, max_new=12, eos=(EOS,), taps=TAPS,
            prefill_rows=16):
    return decode_with_targets(model, prompts, seeds, law=LAW, target_law=TARGET_LAW, top_k=5,
                               max_new_tokens=max_new, eos_ids=list(eos), pad_id=PAD, taps=taps,
                               prefill_rows=prefill_rows)


# prefill groups of 1 and 3 rows joined (full attention) against one padded prefill; with no
# cost to a further attention call every row of a joined cache reads its keys in a group of its own
@pytest.mark.parametrize(("prefill_rows", "overhead"), [(1, None), (3, None), (16, None), (16, 0)])
def test_the_tokens_are_generates_and_the_targets_a_teacher_forced_forwards(
        model, prefill_rows, overhead, monkeypatch) -> None:
    if overhead is not None:
        monkeypatch.setattr(sampled_decode, "ROW_GROUP_OVERHEAD", overhead)
    # a frequent end token, so rows end at different steps and leave the batch
    rows = _decode(model, eos=(EOS, 50, 51, 52, 53, 54, 55, 56, 57), prefill_rows=prefill_rows)
    reference = generate_batch(model, PROMPTS, SEEDS, law=LAW, max_new_tokens=12,
                               eos_ids=[EOS, 50, 51, 52, 53, 54, 55, 56, 57], pad_id=PAD)
    assert [r.token_ids for r in rows] == [r.token_ids for r in reference]
    assert [r.censored for r in rows] == [r.censored for r in reference]
    assert len({len(r.token_ids) for r in rows}) > 1        # rows really left at different steps
    for prompt, row in zip(PROMPTS, rows):
        ids = torch.tensor([prompt + row.token_ids])
        with torch.inference_mode():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1:-1]
            feats = target_features(model, ids, torch.ones_like(ids), TAPS)[0]
        vals, top = TARGET_LAW.probs(logits).topk(5, dim=-1)
        assert row.target_ids.dtype == torch.int32 and row.target_vals.dtype == torch.float32
        torch.testing.assert_close(row.target_vals, vals.float(), atol=1e-5, rtol=1e-4)
        assert torch.equal(row.target_ids.long()[vals > 1e-3], top[vals > 1e-3])
        assert row.features.shape == (len(prompt) + len(row.token_ids), len(TAPS) * 32)
        torch.testing.assert_close(row.features, feats, atol=1e-5, rtol=1e-4)


def test_a_response_depends_on_its_seed_not_on_its_batch(model) -> None:
    together = _decode(model, taps=None)
    alone = [_decode(model, [p], [s], taps=None)[0] for p, s in zip(PROMPTS, SEEDS)]
    reordered = _decode(model, PROMPTS[::-1], SEEDS[::-1], taps=None)[::-1]
    for a, b, c in zip(together, alone, reordered):
        assert a.token_ids == b.token_ids == c.token_ids and a.features is None
        torch.testing.assert_close(a.target_vals, b.target_vals, atol=1e-5, rtol=1e-4)
    assert all(r.censored and len(r.token_ids) == 12 for r in together if EOS not in r.token_ids)
    other = _decode(model, seeds=[s + 100 for s in SEEDS], taps=None)
    assert [r.token_ids for r in other] != [r.token_ids for r in together]


def test_prompts_and_seeds_must_pair(model) -> None:
    with pytest.raises(ValueError, match="3 prompts but 4 seeds"):
        _decode(model, PROMPTS[:3], SEEDS)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_agreement_check_passes_rounding_and_refuses_a_misread_position(model, dtype) -> None:
    """The drafter_data stage's check on these rows: rounding passes (float32 by the largest
    difference, half precision by the mean TV), targets read one position late are refused."""
    from dataclasses import replace
    from types import SimpleNamespace

    from floorgap.data.drafter_data import teacher_forced_agreement
    from floorgap.errors import StageError

    cast = model.to(getattr(torch, dtype))
    try:
        # a cold target law: a random model's distributions differ little between positions
        cold = SamplingLaw.from_spec({"temperature": 0.05, "top_p": 1.0, "top_k": 0})
        rows = decode_with_targets(cast, PROMPTS, SEEDS, law=LAW, target_law=cold, top_k=5,
                                   max_new_tokens=16, eos_ids=[EOS], pad_id=PAD)
        prompts = [SimpleNamespace(prompt_id=str(i)) for i in range(len(PROMPTS))]
        formatted = {str(i): p for i, p in enumerate(PROMPTS)}
        st = SimpleNamespace(target_law=cold, top_k=5, features=None)
        # every sequence compared, as the stage compares every 16th
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("floorgap.data.drafter_data.AGREEMENT_EVERY", 1)
            assert teacher_forced_agreement(cast, prompts, formatted, rows, st)["dtype"] == dtype
            late = [replace(r, target_ids=r.target_ids.roll(1, 0),
                            target_vals=r.target_vals.roll(1, 0)) for r in rows]
            statistic = "max_abs_dp" if dtype == "float32" else "mean_tv"
            with pytest.raises(StageError, match=f"{statistic} .* in {dtype}"):
                teacher_forced_agreement(cast, prompts, formatted, late, st)
    finally:
        model.to(torch.float32)


def _reads(groups, starts, overhead):
    top = max(starts)
    return sum((b - a) * (top - first) + overhead for a, b, first in groups)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 60), min_size=1, max_size=7), st.integers(0, 80))
def test_row_groups_are_the_cheapest_split_of_the_rows(starts, overhead) -> None:
    groups = row_groups(starts, overhead)
    # contiguous ranges covering every row once, each reading from its earliest row's start
    assert [a for a, _, _ in groups] == [0] + [b for _, b, _ in groups[:-1]]
    assert groups[-1][1] == len(starts)
    assert all(first == min(starts[a:b]) for a, b, first in groups)
    # no other split into contiguous ranges reads fewer keys (every split, enumerated)
    n = len(starts)
    for cuts in itertools.product([False, True], repeat=n - 1):
        bounds = [0] + [i + 1 for i, c in enumerate(cuts) if c] + [n]
        other = [(a, b, min(starts[a:b])) for a, b in zip(bounds, bounds[1:])]
        assert _reads(groups, starts, overhead) <= _reads(other, starts, overhead)
