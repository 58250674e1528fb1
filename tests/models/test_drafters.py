"""Drafter architectures (DFlash, DSpark, prefix-attention head) over a tiny random Llama."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from floorgap.models.drafters import DrafterConfig, DrafterOutput, build_drafter, proposal_probs
from floorgap.models.from_target import concat_taps, target_features, target_features_and_logits

transformers = pytest.importorskip("transformers")
from _tiny import tiny_llama  # noqa: E402

V, H, G, T, B = 96, 32, 4, 6, 2
KINDS = ("dflash", "dspark", "prefix_attention")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def target():
    return tiny_llama(V, H, 64)


def config(kind: str, **kw) -> DrafterConfig:
    base = {"kind": kind, "gamma": G, "hidden_size": H, "n_layers": 1, "n_heads": 4,
            "intermediate_size": 64, "taps": [0, 1], "mask_token_id": V - 1, "markov_rank": 8,
            "head_width": 16, "head_heads": 2, "head_mlp": 32, "nominate_k": 5}
    if kind == "prefix_attention":
        base.update(short_conv=True, slot_embeddings=True)
    base.update(kw)
    return DrafterConfig(**base)


def make(kind: str, target, seed: int = 1, **kw):
    torch.manual_seed(seed)
    return build_drafter(config(kind, **kw), target)


@pytest.fixture(scope="module")
def batch(target):
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, V - 1, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, :2] = 0                                     # right-aligned second prefix
    feats = target_features(target, ids, mask, [0, 1])
    committed = torch.randint(0, V - 1, (B,), generator=g)
    block = torch.randint(0, V - 1, (B, G), generator=g)
    probs = torch.softmax(3 * torch.randn(B, G, V, generator=g), -1)
    return feats, mask.bool(), committed, block, probs


def test_target_features_shape_and_padding(target, batch):
    feats = batch[0]
    assert feats.shape == (B, T, 2 * H)
    # a left-padded prefix gives the same features as the unpadded one at real positions
    ids = torch.randint(0, V - 1, (1, 4))
    plain = target_features(target, ids, torch.ones(1, 4, dtype=torch.long), [1])
    padded_ids = torch.cat([torch.zeros(1, 2, dtype=torch.long), ids], 1)
    padded = target_features(target, padded_ids, torch.tensor([[0, 0, 1, 1, 1, 1]]), [1])
    torch.testing.assert_close(padded[:, 2:], plain, atol=1e-5, rtol=1e-4)


class _LaterLayersAtKeptPositions(torch.nn.Module):
    """A target that, like Gemma 4's KV-shared layers, returns its hidden states after layer 0
    only at the positions whose logits are kept."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, logits_to_keep=0, **kw):
        out = self.inner(input_ids=input_ids, logits_to_keep=logits_to_keep, **kw)
        if logits_to_keep:
            out.hidden_states = out.hidden_states[:2] + tuple(
                h[:, -logits_to_keep:] for h in out.hidden_states[2:])
        return out


@pytest.mark.parametrize("wrapped", [False, True])
def test_one_forward_gives_the_features_and_the_kept_logits(target, wrapped):
    ids = torch.randint(0, V - 1, (1, T), generator=torch.Generator().manual_seed(5))
    model = _LaterLayersAtKeptPositions(target) if wrapped else target
    feats, logits = target_features_and_logits(model, ids, [0, 1], 3)
    torch.testing.assert_close(feats, target_features(target, ids, torch.ones_like(ids), [0, 1]),
                               atol=1e-5, rtol=1e-4)
    assert logits.shape == (1, 3, V)
    torch.testing.assert_close(logits, target(input_ids=ids).logits[:, -3:], atol=1e-5,
                               rtol=1e-4)


@pytest.mark.parametrize("kind", KINDS)
def test_shapes(kind, target, batch):
    feats, mask, committed, block, _ = batch
    model = make(kind, target)
    out = model(feats, committed, block, prefix_mask=mask)
    assert isinstance(out, DrafterOutput)
    assert out.logits.shape == out.base_logits.shape == (B, G, V)
    assert torch.isfinite(out.logits).all()
    if kind == "dflash":
        assert out.confidence is None and out.nomination_logits is None
    else:
        assert out.confidence.shape == (B, G)
        assert ((out.confidence > 0) & (out.confidence < 1)).all()
    assert (out.nomination_logits is not None) == (kind == "prefix_attention")
    d = model.draft(feats, committed, prefix_mask=mask, temperature=1.0,
                    generator=torch.Generator().manual_seed(0))
    assert d.tokens.shape == (B, G) and d.logits.shape == (B, G, V)
    assert model.propose(feats, committed, block, prefix_mask=mask).shape == (B, G, V)


def test_trainable_parameters_exclude_shared(target):
    model = make("prefix_attention", target)
    names = [n for n, _ in model.named_parameters()]
    assert names and not any("embed" in n or "lm_head" in n for n in names)
    shared = {id(p) for p in target.parameters()}
    assert not any(id(p) in shared for p in model.parameters())


def test_dflash_independent_of_block_tokens(target, batch):
    feats, mask, committed, block, _ = batch
    model = make("dflash", target)
    a = model(feats, committed, block, prefix_mask=mask).logits
    b = model(feats, committed, torch.randint(0, V, (B, G)), prefix_mask=mask).logits
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(model.propose(feats, committed, block, prefix_mask=mask), a)


def test_dspark_zero_markov_head_is_predecessor_free(target, batch):
    feats, mask, committed, block, _ = batch
    model = make("dspark", target)
    assert torch.count_nonzero(model.markov_head.markov_w2.weight) == 0
    other = torch.randint(0, V - 1, (B, G))
    a = model.propose(feats, committed, block, prefix_mask=mask)
    b = model.propose(feats, committed, other, prefix_mask=mask)
    torch.testing.assert_close(a, b)                    # R^self = R^oracle: zero exposure
    d = model.draft(feats, committed, prefix_mask=mask, temperature=1.0,
                    generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(d.logits, a)
    with torch.no_grad():
        model.markov_head.markov_w2.weight.normal_()
    c = model.propose(feats, committed, other, prefix_mask=mask)
    assert not torch.allclose(model.propose(feats, committed, block, prefix_mask=mask), c)
    # forward (teacher forcing) agrees with propose for the same predecessors
    torch.testing.assert_close(model(feats, committed, other, prefix_mask=mask).logits, c)


def test_dspark_draft_is_reproducible(target, batch):
    feats, mask, committed, *_ = batch
    model = make("dspark", target)
    with torch.no_grad():
        model.markov_head.markov_w2.weight.normal_()
    d1 = model.draft(feats, committed, mask, 1.0, torch.Generator().manual_seed(5))
    d2 = model.draft(feats, committed, mask, 1.0, torch.Generator().manual_seed(5))
    assert torch.equal(d1.tokens, d2.tokens)
    # self mode: slot k's logits are the oracle-mode logits given the drafted predecessors
    torch.testing.assert_close(d1.logits, model.propose(feats, committed, d1.tokens, mask))
    g = model.draft(feats, committed, mask, temperature=0.0)
    assert torch.equal(g.tokens, g.logits.argmax(-1))


def test_prefix_head_init_and_proposal(target, batch):
    feats, mask, committed, block, _ = batch
    model = make("prefix_attention", target)
    assert torch.allclose(model.head.out_norm.weight, torch.full((16,), 0.35))
    u = model(feats, committed, block, prefix_mask=mask).base_logits
    nominated = torch.zeros(B, G, V, dtype=torch.bool).scatter(-1, u.topk(5, -1).indices, True)
    for logits in (model.propose(feats, committed, block, prefix_mask=mask),
                   model.draft(feats, committed, mask, 1.0,
                               torch.Generator().manual_seed(0)).logits):
        q = torch.softmax(logits, -1)
        torch.testing.assert_close(q.sum(-1), torch.ones(B, G))
        assert (q[~nominated] == 0).all()
        assert (q[nominated] > 0).all()
    d = model.draft(feats, committed, mask, temperature=0.0)
    assert torch.equal(proposal_probs(d.logits, 0.0).argmax(-1), d.tokens)
    assert nominated.gather(-1, d.tokens[..., None]).all()
    # the lattice walk's row for slot k equals the oracle proposal given its own chain
    torch.testing.assert_close(d.logits, model.propose(feats, committed, d.tokens, mask))
    # the head depends on the predecessor
    other = (block + 1) % (V - 1)
    assert not torch.allclose(model(feats, committed, block, prefix_mask=mask).logits,
                              model(feats, committed, other, prefix_mask=mask).logits)


@pytest.mark.parametrize("kind", KINDS)
def test_the_proposal_read_from_a_forward_is_the_one_propose_deploys(kind, target, batch):
    """The held-out score reads q from the teacher-forced forward (proposal_logits); it must
    be the proposal the evaluation and the engines use, the prefix-attention head's kept on
    its nominations (its forward logits cover every token)."""
    feats, mask, committed, block, _ = batch
    model = make(kind, target)
    out = model(feats, committed, block, prefix_mask=mask)
    torch.testing.assert_close(model.full_vocab(model.proposal_logits(out)),
                               model.propose(feats, committed, block, mask))
    if kind == "prefix_attention":
        assert torch.isfinite(out.logits).all()


@pytest.mark.parametrize("kind", KINDS)
def test_loss_decreases_and_shared_frozen(kind, target, batch):
    feats, mask, committed, block, probs = batch
    model = make(kind, target)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    first = None
    for _ in range(20):
        out = model(feats, committed, block, prefix_mask=mask)
        loss, parts = model.loss(out, probs, block)
        assert torch.isfinite(loss) and all(math.isfinite(x) for x in parts.values())
        first = parts["loss"] if first is None else first
        opt.zero_grad()
        loss.backward()
        opt.step()
    last = model.loss(model(feats, committed, block, prefix_mask=mask), probs, block)[1]
    assert last["loss"] < first
    expected = {"dflash": {"ce"}, "dspark": {"ce", "tv", "conf"},
                "prefix_attention": {"ce", "tv", "conf", "nom"}}[kind]
    assert expected | {"loss"} == set(parts)
    assert target.get_input_embeddings().weight.grad is None
    assert target.get_output_embeddings().weight.grad is None


def test_config_rejects_bad_input(target):
    with pytest.raises(ValueError):
        DrafterConfig(kind="medusa")
    with pytest.raises(ValueError):
        build_drafter(config("dflash", taps=[0, 5]), target)
    with pytest.raises(ValueError):
        build_drafter(dataclasses.replace(config("dflash"), hidden_size=H * 2), target)


def test_bf16_target_with_fp32_drafter():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=V, hidden_size=H, intermediate_size=64,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2)
    tgt = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    model = make("prefix_attention", tgt)
    ids = torch.randint(0, V - 1, (B, T))
    feats = target_features(tgt, ids, torch.ones(B, T, dtype=torch.long), [0, 1])
    assert feats.dtype == torch.bfloat16
    probs = torch.softmax(torch.randn(B, G, V), -1)
    out = model(feats, ids[:, -1], ids[:, :G])
    assert out.logits.dtype == torch.float32
    loss, _ = model.loss(out, probs, ids[:, :G])
    loss.backward()
    assert all(p.grad is not None for p in model.head.parameters())
    assert tgt.get_input_embeddings().weight.grad is None


@pytest.mark.parametrize("kind", KINDS)
def test_propose_paths_equals_propose_on_expanded_context(kind, target, batch):
    """One context, M predecessor rows: the shared block pass and the per-slot head give the
    proposals of the batched pass, at every slot and at any subset of slots."""
    feats, mask, committed, _, _ = batch
    model = make(kind, target).eval()
    if kind == "dspark":
        with torch.no_grad():
            model.markov_head.markov_w2.weight.normal_(std=0.5)   # a live predecessor correction
    m = 6
    g = torch.Generator().manual_seed(9)
    preds = torch.randint(0, V - 1, (m, G), generator=g)
    f1, c1, m1 = feats[:1], committed[:1], mask[:1]
    full = model.propose(f1.expand(m, -1, -1), c1.expand(m), preds, m1.expand(m, -1))
    torch.testing.assert_close(model.propose_paths(f1, c1, preds, m1), full,
                               atol=1e-5, rtol=1e-5)
    for ks in ([0], [G - 1], [1, 3]):
        torch.testing.assert_close(model.propose_paths(f1, c1, preds, m1, slots=ks),
                                   full[:, ks], atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="one context"):
        model.propose_paths(feats, committed, preds, mask)


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_sharing_a_context_equal_blocks_alone(kind, target):
    """feature_index packing (training batches of one sequence) changes nothing: each block of
    a left-aligned shared context gives the logits it gives with its own prefix only."""
    d = make(kind, target)
    if d.kind == "dspark":
        with torch.no_grad():
            d.markov_head.markov_w2.weight.normal_(std=0.5)
    torch.manual_seed(3)
    seq = torch.randint(0, V - 1, (1, 12))
    feats = target_features(target, seq, torch.ones_like(seq), d.cfg.taps)      # [1, 12, F]
    starts = torch.tensor([3, 5, 4])            # context lengths c: prefix seq[:c - 1]
    t = int(starts.max()) - 1
    mask = torch.arange(t)[None, :] < (starts[:, None] - 1)
    committed = seq[0, starts - 1]
    blocks = torch.stack([seq[0, c:c + G] for c in starts.tolist()])
    with torch.no_grad():
        packed = d(feats[:, :t], committed, blocks, mask, torch.zeros(3, dtype=torch.long))
        for i, c in enumerate(starts.tolist()):
            alone = d(feats[:, :c - 1], committed[i:i + 1], blocks[i:i + 1])
            torch.testing.assert_close(packed.logits[i], alone.logits[0], atol=1e-5, rtol=1e-5)


def test_dflash_reads_slot_k_from_row_k_plus_one(target):
    """DFlash (as engines run it) has gamma + 1 block rows, DSpark-style kinds gamma."""
    assert config("dflash").block_rows == G + 1 and not config("dflash").sample_from_anchor
    assert config("dspark").block_rows == G and config("dspark").sample_from_anchor
    d = make("dflash", target, slot_embeddings=True)
    assert d.backbone.slot_emb.shape[0] == G + 1
    feats = torch.randn(1, 5, 2 * H)
    assert d.propose(feats, torch.tensor([3])).shape == (1, G, V)


def test_init_from_target_copies_the_last_layers(target):
    from floorgap.models.from_target import init_from_target

    d = make("dspark", target, n_layers=1, n_kv_heads=2, head_dim=H // 4)
    picked = init_from_target(d, target)
    assert picked == [1]
    src = target.model.layers[1]
    mine = d.backbone.layers[0]
    for name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.down_proj", "input_layernorm"):
        assert torch.equal(mine.get_submodule(name).weight, src.get_submodule(name).weight)
    assert torch.equal(d.backbone.norm.weight, target.model.norm.weight)
    with pytest.raises(ValueError, match="drafter shape"):
        init_from_target(make("dflash", target, n_kv_heads=4), target)


def test_the_fused_start_gives_the_first_copied_layer_the_targets_own_context(target):
    """init: target_scaled's fusion: fc passes the last tap (the stream entering the first
    copied layer) and hidden_norm is that layer's input norm, so the context the copied layer
    reads is what the target's layer normalises there, at every position."""
    from floorgap.models.from_target import init_from_target, init_fusion_from_target

    d = make("dflash", target, n_layers=1, n_kv_heads=2, head_dim=H // 4)
    init_from_target(d, target)
    assert init_fusion_from_target(d, target) == 0
    ids = torch.randint(0, V - 1, (2, T), generator=torch.Generator().manual_seed(4))
    hs = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    with torch.no_grad():
        ctx = d.backbone.hidden_norm(d.backbone.fc(concat_taps(hs, d.cfg.taps)))
        torch.testing.assert_close(ctx, target.model.layers[1].input_layernorm(hs[1]))
    with pytest.raises(ValueError, match="no tap 0"):
        init_fusion_from_target(make("dflash", target, n_layers=1, n_kv_heads=2,
                                     head_dim=H // 4, taps=[1]), target)


def test_residual_scale_is_the_streams_norm_entering_the_first_copied_layer(target):
    """Against hooks on the target's own modules: the input of layer L - n and the embedding
    output, their mean norms over every position."""
    from floorgap.models.from_target import residual_scale

    g = torch.Generator().manual_seed(5)
    seqs = [torch.randint(0, V - 1, (n,), generator=g) for n in (5, 9)]
    seen = {"in": [], "emb": []}

    def layer_input(module, args, kwargs):
        seen["in"].append(kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])

    hooks = [target.model.layers[1].register_forward_pre_hook(layer_input, with_kwargs=True),
             target.model.embed_tokens.register_forward_hook(
                 lambda m, args, out: seen["emb"].append(out))]
    try:
        scale = residual_scale(target, seqs, n_layers=1)
    finally:
        for h in hooks:
            h.remove()
    inner = sum(float(x.norm(dim=-1).mean()) for x in seen["in"])
    embeds = sum(float(x.norm(dim=-1).mean()) for x in seen["emb"])
    assert len(seen["in"]) == len(seen["emb"]) == 2
    assert scale == pytest.approx(inner / embeds, rel=1e-5) and scale != pytest.approx(1.0)
    with pytest.raises(ValueError, match="only 2"):
        residual_scale(target, seqs, n_layers=3)


def test_a_scaled_drafter_feeds_its_layers_the_rows_times_the_scale(target):
    plain, scaled = make("dflash", target), make("dflash", target, input_scale=2.5)
    feats = torch.randn(2, 5, 2 * H)
    rows = torch.randn(2, G + 1, H)
    mask = torch.ones(2, 5, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(scaled.backbone(feats, rows, mask)[0],
                                   plain.backbone(feats, rows * 2.5, mask)[0])
        assert not torch.allclose(scaled.backbone(feats, rows, mask)[0],
                                  plain.backbone(feats, rows, mask)[0])


@pytest.mark.parametrize("own_keys", [True, False])
def test_one_context_attention_equals_attention_on_copied_keys(own_keys):
    """The shared-context fast path is attention over [context; own keys], each row's context
    copied: the same numbers as scaled_dot_product_attention, masks included."""
    from floorgap.models.drafters import one_context_attention

    g = torch.Generator().manual_seed(0)
    n, h, length, t, hd = 4, 3, 5, 7, 8
    q = torch.randn(n, h, length, hd, generator=g)
    kc, vc = torch.randn(h, t, hd, generator=g), torch.randn(h, t, hd, generator=g)
    prefix = torch.arange(t)[None, :] < torch.tensor([2, 7, 4, 5])[:, None]      # [N, T]
    k, v = kc.expand(n, -1, -1, -1), vc.expand(n, -1, -1, -1)
    keep = prefix[:, None, None, :].expand(n, 1, length, t)
    kb = vb = None
    if own_keys:
        kb, vb = torch.randn(n, h, length, hd, generator=g), torch.randn(n, h, length, hd,
                                                                         generator=g)
        k, v = torch.cat([k, kb], 2), torch.cat([v, vb], 2)
        keep = torch.cat([keep, torch.ones(n, 1, length, length, dtype=torch.bool)], -1)
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=keep)
    got = one_context_attention(q, kc, vc, keep, kb, vb)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
