"""Block drafters over a frozen Hugging Face target: DFlash (order 0), DSpark (order 1) and the
prefix-attention head (order 1, paper Sec. 4 and App. H.1/H.2).

Every drafter proposes a block of ``gamma`` tokens Z_0..Z_{gamma-1} that follow the committed
token c (the last token the target has accepted or sampled). Its context X is the committed
prefix, seen through the target's hidden states at a few *tap* layers
(:func:`floorgap.models.from_target.target_features`).
The token embedding E and the output head of the target are shared with the drafter: they are
passed in, frozen, and never copied or registered as drafter parameters, so ``parameters()`` and
``state_dict()`` hold only the drafter's own weights (the shared modules follow the target's
device and dtype; the drafter casts at the boundary).

Shapes: B batch, T prefix length (right-aligned; ``prefix_mask`` marks real positions),
G = gamma, D drafter width (= target hidden size, because the head is shared), F = n_taps * H,
V vocabulary, N draft vocabulary (V unless ``draft_vocab`` trims it), K = nominate_k, W head
width, P predecessor hypotheses per slot.

Trimmed vocabulary. With ``draft_vocab`` (target ids, ascending) the head is the target's
output head at those N rows; the teacher-forced ``forward`` and the loss work over the N draft
indices, while ``propose``/``propose_paths``/``draft`` return target-vocabulary logits (-inf
outside the draft vocabulary) and target token ids, so every consumer sees the target's
vocabulary. ``mask_embedding`` replaces E(mask) on the mask rows by a trained vector.

Engine layout. Module names follow the checkpoints DFlash/DSpark serving engines load
(``fc``, ``hidden_norm``, ``layers.{i}.self_attn.{q,k,v,o}_proj``, ``q_norm``/``k_norm``,
``mlp.{gate,up,down}_proj``, ``norm``, ``markov_head.markov_w1/w2``, ``confidence_head.proj``;
floorgap.models.engine_formats writes and reads them). A DFlash block has gamma + 1 rows
[E(c), E(mask) x gamma] and row k + 1 proposes slot k; the DSpark-style kinds have gamma rows
and row k proposes slot k (``DrafterConfig.sample_from_anchor``).

Attention. The drafter's own layers are full attention over [context; block]: every block row
sees every real prefix position and the whole block, whatever windows the target's layers use.
A target with sliding-window layers (Gemma-3) still hands the drafter the whole prefix through
its taps, and a drafter block is short, so nothing is gained by windowing, and DFlash/DSpark
engines run their draft layers as full attention. The layers take the shapes (heads, key/value
heads, head width, MLP width) and rotary base of the target's full-attention layers
(``floorgap.models.drafter_training.drafter_config``); a target whose layers differ in shape
(Gemma-4) has no one layer shape to take and is refused there.

Kinds (one subclass of :class:`Drafter` each, :data:`DRAFTER_CLASSES`)
-----------------------------------------------------------------------
``dflash``  Parallel backbone; q_k = softmax(u_k), a function of X only.
``dspark``  Same backbone + low-rank Markov correction  l_k = u_k + B(A[z_{k-1}]) + confidence.
``prefix_attention``  Same backbone (optionally with short convolutions and slot embeddings)
            + the head  l_k(X, a) = u_k(X) + B f_head(x_{k,a}, H_X)  + confidence; at inference
            the proposal lives on the top-K nominations of u_k (``propose``/``draft``).

Common API (used by training and evaluation)
--------------------------------------------
``forward(features, committed, block_tokens, prefix_mask) -> DrafterOutput``  teacher forcing:
    the predecessor of slot k is block_tokens[:, k-1], of slot 0 the committed token.
``loss(output, targets, block_tokens) -> (loss, parts)``  :func:`block_objective` plus the kind's
    auxiliary terms.
``propose(features, committed, predecessors, prefix_mask) -> logits [B, G, V]``  the proposal
    for given predecessors (oracle mode); q_k = softmax(logits_k / temperature).
``draft(features, committed, prefix_mask, temperature, generator) -> Draft``  self mode: the
    drafter's own left-to-right chain and the proposals it was drawn from.

Size: about a thousand lines, one drafter family: the config, the layers the kinds share, the
base class with the passes every consumer calls, the block objective and the three kinds. A
kind is its layers plus its passes, and the passes differ only in the head, so they read best
side by side; what the drafter takes from its target lives in
:mod:`floorgap.models.from_target`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from floorgap.config import KIND_ORDER
from floorgap.estimators.topk import logsumexp_gather, topk_divergences
from floorgap.models.targets import text_config

OBJECTIVES = ("ce", "kl", "tv")


@dataclass
class DrafterConfig:
    kind: str = "dflash"
    gamma: int = 7
    hidden_size: int = 2560          # drafter width D; must equal the target's hidden size
    n_layers: int = 5
    n_heads: int = 32
    n_kv_heads: int | None = None    # grouped-query attention; default n_heads
    head_dim: int | None = None      # default hidden_size // n_heads
    intermediate_size: int = 9728    # backbone SwiGLU width
    taps: list[int] = field(default_factory=lambda: [1, 9, 17, 25, 33])
    target_hidden: int | None = None  # width of one tap feature (filled by build_drafter)
    vocab_size: int | None = None     # filled by build_drafter
    mask_token_id: int | None = None  # default: vocab_size - 1
    # a trimmed draft vocabulary (EAGLE-3 / FR-Spec style): the target ids the drafter can
    # propose, ascending; q is exactly zero elsewhere. None: the target's whole vocabulary
    draft_vocab: list[int] | None = None
    # a trained embedding for the mask rows in place of the frozen E(mask_token_id)
    mask_embedding: bool = False
    # the block rows' input times this before the layers: layers copied from the target
    # (init: target_scaled) then see a residual stream at the scale of the target's own there
    # (engine layouts fold it into the weights: engine_formats.fold_input_scale)
    input_scale: float = 1.0
    # block rows (see sample_from_anchor); None: the kind's own convention. A released DFlash
    # drafter of DeepSpec (Qwen3DSparkModel, markov_rank 0) reads slot k from row k = True
    anchor_rows: bool | None = None
    markov_rank: int = 256
    head_width: int = 512
    head_heads: int = 4
    head_mlp: int = 2048
    head_out_scale: float = 0.35
    short_conv: bool = False
    slot_embeddings: bool = False
    nominate_k: int = 16
    rms_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    init_std: float = 0.02
    # objective: "ce" (sampled tokens), "kl" (KL(p || q)) or "tv" (TV(p, q)), the last two on
    # the stored top-K of p plus one residual bucket
    objective: str = "ce"
    slot_decay: float = 4.0          # slot weights exp(-k / slot_decay)
    conf_weight: float = 0.1
    nom_weight: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown drafter kind {self.kind!r}; expected one of {KINDS}")
        if self.gamma < 1:
            raise ValueError("gamma must be >= 1")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"unknown objective {self.objective!r}; expected one of {OBJECTIVES}")
        self.taps = [int(t) for t in self.taps]
        if self.draft_vocab is not None:
            self.draft_vocab = [int(t) for t in self.draft_vocab]
            if not self.draft_vocab or any(b <= a for a, b in
                                           zip(self.draft_vocab, self.draft_vocab[1:])):
                raise ValueError("draft_vocab must be non-empty, ascending target ids")

    @property
    def draft_vocab_size(self) -> int | None:
        """N, the size of the vocabulary the drafter's head scores (V unless trimmed)."""
        return len(self.draft_vocab) if self.draft_vocab is not None else self.vocab_size

    @property
    def order(self) -> int:
        return KIND_ORDER[self.kind]

    @property
    def sample_from_anchor(self) -> bool:
        """Whether block row 0 (the committed token) proposes slot 0, as DSpark's engines do;
        DFlash's engines instead read slot k from row k + 1, a mask row at the position of the
        token it proposes, so its block has gamma + 1 rows. ``anchor_rows`` overrides the
        kind's convention (released checkpoints of either kind exist in both)."""
        return self.anchor_rows if self.anchor_rows is not None else self.kind != "dflash"

    @property
    def block_rows(self) -> int:
        return self.gamma + (0 if self.sample_from_anchor else 1)


@dataclass
class DrafterOutput:
    logits: Tensor                     # [B, G, N]; order-1 kinds: conditioned on block tokens
    base_logits: Tensor                # [B, G, N]; u_k(X)
    confidence: Tensor | None = None   # [B, G] in (0, 1)
    nomination_logits: Tensor | None = None  # [B, G, N]; logits nominating candidates (= u_k)


@dataclass
class Draft:
    tokens: Tensor   # [B, G] the drafted chain
    logits: Tensor   # [B, G, V] proposal logits of slot k given tokens[:, k-1] (slot 0: committed)


# --------------------------------------------------------------------------- building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6, init: float = 1.0) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.full((dim,), float(init)))

    def forward(self, x: Tensor) -> Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


class SwiGLU(nn.Module):
    """down_proj(silu(gate_proj(x)) * up_proj(x)), the names of the engines' Qwen3/Llama MLP."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class ShortConv(nn.Module):
    """Two-tap data-dependent convolution along the block (App. H.2):
    Conv(x)_j = (b0 + c0(x_j)) * x_j + (b1 + c1(x_j)) * x_{j-1},  x_{-1} = 0.

    c0, c1 are linear maps (one fused ``D -> 2D`` layer) initialised to zero, b0 = 1, b1 = 0,
    so a fresh module is the identity.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.gates = nn.Linear(dim, 2 * dim, bias=False)
        nn.init.zeros_(self.gates.weight)
        self.b0 = nn.Parameter(torch.ones(dim))
        self.b1 = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor) -> Tensor:          # x [B, G, D]
        c0, c1 = self.gates(x).chunk(2, dim=-1)       # [B, G, D] each
        prev = F.pad(x, (0, 0, 1, 0))[:, :-1]         # x_{j-1}, zero at j = 0
        return (self.b0 + c0) * x + (self.b1 + c1) * prev


def rotate(x: Tensor, pos: Tensor, theta: float) -> Tensor:
    """Rotary position embedding. x [B, h, L, d], pos [B, L] (integer positions)."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.float()[:, None, :, None] * inv            # [B, 1, L, d/2]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x.float()[..., : d // 2], x.float()[..., d // 2:]
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


def one_context_attention(q: Tensor, kc: Tensor, vc: Tensor, mask: Tensor,
                          kb: Tensor | None = None, vb: Tensor | None = None) -> Tensor:
    """Attention of N query rows that share one context (the blocks of a training batch come
    from one sequence) without copying the context's keys and values N times: all N x L queries
    meet the context keys in one product, each row's own keys (``kb``/``vb``, optional) apart,
    and one softmax spans both. q [N, h, L, hd]; kc, vc [h, T, hd]; kb, vb [N, h, L2, hd];
    mask [N, 1, L, T + L2] (True: attend). Equals scaled_dot_product_attention on the
    concatenated keys up to float rounding."""
    n, h, length, hd = q.shape
    t = kc.shape[1]
    rows = q.transpose(0, 1).reshape(h, n * length, hd)
    scores = (rows @ kc.transpose(1, 2)).view(h, n, length, t).transpose(0, 1)  # [N, h, L, T]
    if kb is not None:
        scores = torch.cat([scores, q @ kb.transpose(2, 3)], -1)
    scores = scores.float() * hd ** -0.5
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).to(vc.dtype)
    pc = p[..., :t].transpose(0, 1).reshape(h, n * length, t)
    out = (pc @ vc).view(h, n, length, hd).transpose(0, 1)                        # [N, h, L, hd]
    return out if vb is None else out + p[..., t:] @ vb


class BlockAttention(nn.Module):
    """Qwen3-style attention of the block over [context; block]: grouped-query heads, per-head
    ``q_norm``/``k_norm``, rotary at absolute positions, no biases (the layout DFlash/DSpark
    engines load). Context keys/values come from the fused prefix features without an input
    norm, block keys/values from the normalised block states."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        d, nh = cfg.hidden_size, cfg.n_heads
        nkv = cfg.n_kv_heads or nh
        if nh % nkv:
            raise ValueError(f"n_heads {nh} must be a multiple of n_kv_heads {nkv}")
        hd = cfg.head_dim or d // nh
        self.nh, self.nkv, self.hd, self.theta = nh, nkv, hd, cfg.rope_theta
        self.q_proj = nn.Linear(d, nh * hd, bias=False)
        self.k_proj = nn.Linear(d, nkv * hd, bias=False)
        self.v_proj = nn.Linear(d, nkv * hd, bias=False)
        self.o_proj = nn.Linear(nh * hd, d, bias=False)
        self.q_norm = RMSNorm(hd, cfg.rms_eps)
        self.k_norm = RMSNorm(hd, cfg.rms_eps)

    def _kv(self, x: Tensor, pos: Tensor) -> tuple[Tensor, Tensor]:
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.nkv, self.hd).transpose(1, 2)
        return rotate(k, pos, self.theta), v                                  # [b, kv, n, hd]

    def forward(self, x: Tensor, ctx: Tensor, ctx_pos: Tensor, blk_pos: Tensor, mask: Tensor,
                feature_index: Tensor | None) -> Tensor:
        # x [N, G, D] normalised block; ctx [S, T, D]; ctx_pos [S, T]; blk_pos [N, G];
        # mask [N, 1, G, T+G]; feature_index [N] -> row of ctx (None: S == N, row i)
        b, g, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, g, self.nh, self.hd)).transpose(1, 2)
        q = rotate(q, blk_pos, self.theta)
        kc, vc = self._kv(ctx, ctx_pos)
        kb, vb = self._kv(x, blk_pos)
        if feature_index is not None and ctx.shape[0] == 1:
            rep = self.nh // self.nkv
            a = one_context_attention(q, kc[0].repeat_interleave(rep, 0),
                                      vc[0].repeat_interleave(rep, 0), mask,
                                      kb.repeat_interleave(rep, 1), vb.repeat_interleave(rep, 1))
            return self.o_proj(a.transpose(1, 2).reshape(b, g, -1))
        if feature_index is not None:
            kc, vc = kc.index_select(0, feature_index), vc.index_select(0, feature_index)
        k, v = torch.cat([kc, kb], dim=2), torch.cat([vc, vb], dim=2)       # [N, kv, T+G, hd]
        if self.nkv != self.nh:
            k = k.repeat_interleave(self.nh // self.nkv, dim=1)
            v = v.repeat_interleave(self.nh // self.nkv, dim=1)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)         # [N, h, G, hd]
        return self.o_proj(a.transpose(1, 2).reshape(b, g, -1))


class BlockLayer(nn.Module):
    """One decoder layer over the block (engine names: ``input_layernorm``, ``self_attn``,
    ``post_attention_layernorm``, ``mlp``). Keys/values of the fused prefix features are
    prepended in every layer; each block position sees every real prefix position and the whole
    block (bidirectional). Optional short convolutions wrap the attention sublayer: one on its
    normalised input (pre) and one on its output before the residual add (post)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.input_layernorm = RMSNorm(d, cfg.rms_eps)
        self.self_attn = BlockAttention(cfg)
        self.post_attention_layernorm = RMSNorm(d, cfg.rms_eps)
        self.mlp = SwiGLU(d, cfg.intermediate_size)
        self.conv_pre = ShortConv(d) if cfg.short_conv else None
        self.conv_post = ShortConv(d) if cfg.short_conv else None

    def forward(self, h: Tensor, ctx: Tensor, ctx_pos: Tensor, blk_pos: Tensor, mask: Tensor,
                feature_index: Tensor | None = None) -> Tensor:
        x = self.input_layernorm(h)
        if self.conv_pre is not None:
            x = self.conv_pre(x)
        a = self.self_attn(x, ctx, ctx_pos, blk_pos, mask, feature_index)
        if self.conv_post is not None:
            a = self.conv_post(a)
        h = h + a
        return h + self.mlp(self.post_attention_layernorm(h))


class Backbone(nn.Module):
    """Feature fusion (``fc`` then ``hidden_norm``) + block decoder + final ``norm``. Returns the
    normalised block states h [N, R, D] (R block rows) and the fused prefix features [S, T, D].

    Blocks may share a context: with ``feature_index`` [N], block i reads context row
    ``feature_index[i]`` of ``features`` [S, T, F] (the training batches of one sequence, whose
    blocks differ only in where their prefix ends). Such contexts must be left-aligned (real
    positions 0..T-1 in order; ``prefix_mask`` [N, T] marks each block's prefix). Without it,
    ``features`` has one row per block and may be right-aligned (left padding).
    """

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        assert cfg.target_hidden is not None
        d = cfg.hidden_size
        self.cfg = cfg
        self.fc = nn.Linear(len(cfg.taps) * cfg.target_hidden, d, bias=False)
        self.hidden_norm = RMSNorm(d, cfg.rms_eps)
        self.layers = nn.ModuleList(BlockLayer(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(d, cfg.rms_eps)
        self.slot_emb = (nn.Parameter(torch.zeros(cfg.block_rows, d)) if cfg.slot_embeddings
                         else None)

    def forward(self, features: Tensor, block_in: Tensor, prefix_mask: Tensor,
                feature_index: Tensor | None = None) -> tuple[Tensor, Tensor]:
        # features [S, T, F]; block_in [N, R, D] (E(c), E(mask), ...); prefix_mask [N, T] bool
        n, g = block_in.shape[:2]
        t = features.shape[1]
        ctx = self.hidden_norm(self.fc(features.to(self.fc.weight.dtype)))   # [S, T, D]
        h = block_in if self.cfg.input_scale == 1.0 else block_in * self.cfg.input_scale
        if self.slot_emb is not None:
            h = h + self.slot_emb[:g]
        # positions: prefix 0..L-1 at its real slots, the committed token at L, row j at L + j
        if feature_index is None:
            ctx_pos = (prefix_mask.long().cumsum(-1) - 1).clamp(min=0)        # [N, T]
        else:
            ctx_pos = torch.arange(t, device=features.device).expand(features.shape[0], t)
        length = prefix_mask.long().sum(-1, keepdim=True)                     # [N, 1]
        blk_pos = length + torch.arange(g, device=features.device)            # [N, R]
        keep = torch.cat([prefix_mask.bool(), prefix_mask.new_ones(n, g, dtype=torch.bool)], 1)
        mask = keep[:, None, None, :].expand(n, 1, g, t + g)                  # [N, 1, R, T+R]
        for layer in self.layers:
            h = layer(h, ctx, ctx_pos, blk_pos, mask, feature_index)
        return self.norm(h), ctx


class PrefixHead(nn.Module):
    """f_head(x_{k,a}, H_X): x = W_in [N_e(E(a)); N_h(h_k)]; one attention read of the
    committed prefix (keys/values from the fused features, shared across hypotheses); SwiGLU;
    output RMS scale (init ``head_out_scale``). The output map B (V x W) is ``self.out``."""

    def __init__(self, cfg: DrafterConfig, embed_dim: int) -> None:
        super().__init__()
        d, w, nh = cfg.hidden_size, cfg.head_width, cfg.head_heads
        if w % nh:
            raise ValueError("head_width must be divisible by head_heads")
        self.nh, self.hd = nh, w // nh
        self.norm_e = RMSNorm(embed_dim, cfg.rms_eps)
        self.norm_h = RMSNorm(d, cfg.rms_eps)
        self.norm_c = RMSNorm(d, cfg.rms_eps)
        self.w_in = nn.Linear(embed_dim + d, w, bias=False)
        self.attn_norm = RMSNorm(w, cfg.rms_eps)
        self.q = nn.Linear(w, w, bias=False)
        self.k = nn.Linear(d, w, bias=False)
        self.v = nn.Linear(d, w, bias=False)
        self.o = nn.Linear(w, w, bias=False)
        self.mlp_norm = RMSNorm(w, cfg.rms_eps)
        self.mlp = SwiGLU(w, cfg.head_mlp)
        self.out_norm = RMSNorm(w, cfg.rms_eps, init=cfg.head_out_scale)
        self.out = nn.Linear(w, cfg.draft_vocab_size, bias=False)             # B: [N, W]

    def forward(self, e: Tensor, h: Tensor, ctx: Tensor, prefix_mask: Tensor,
                feature_index: Tensor | None = None) -> Tensor:
        # e [B, G, P, E] predecessor embeddings; h [B, G, D]; ctx [S, T, D] (S = B unless
        # feature_index [B] maps blocks to context rows) -> [B, G, P, W]
        b, g, p, _ = e.shape
        hn = self.norm_h(h)[:, :, None, :].expand(b, g, p, h.shape[-1])
        x = self.w_in(torch.cat([self.norm_e(e), hn], dim=-1))                 # [B, G, P, W]
        c = self.norm_c(ctx)
        k = self.k(c).view(c.shape[0], -1, self.nh, self.hd).transpose(1, 2)  # [S, h, T, hd]
        v = self.v(c).view(c.shape[0], -1, self.nh, self.hd).transpose(1, 2)
        q = self.q(self.attn_norm(x)).view(b, g * p, self.nh, self.hd).transpose(1, 2)
        mask = prefix_mask.bool()[:, None, None, :]                           # [B, 1, 1, T]
        if feature_index is not None and c.shape[0] == 1:
            a = one_context_attention(q, k[0], v[0], mask)                    # [B, h, G*P, hd]
        else:
            if feature_index is not None:
                k, v = k.index_select(0, feature_index), v.index_select(0, feature_index)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)      # [B, h, G*P, hd]
        x = x + self.o(a.transpose(1, 2).reshape(b, g, p, -1))
        x = x + self.mlp(self.mlp_norm(x))
        return self.out_norm(x)


# --------------------------------------------------------------------------- the drafter


def proposal_probs(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """q = softmax(logits / temperature) over the last axis; temperature 0 gives the one-hot
    argmax (the greedy proposal). -inf logits (outside a nominated set) get probability 0."""
    if temperature <= 0:
        return F.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float32)
    return torch.softmax(logits.float() / temperature, dim=-1)


def _pick(logits: Tensor, temperature: float, generator: torch.Generator | None) -> Tensor:
    """Greedy (temperature 0) or sampled index from logits [B, N] -> [B]."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = proposal_probs(logits, temperature)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class MarkovHead(nn.Module):
    """DSpark's vanilla low-rank transition bias B(A[a]): ``markov_w1`` (A, an embedding
    [V, r]) then ``markov_w2`` (B, a map r -> V with weight [V, r]), the engines' names."""

    def __init__(self, vocab_size: int, rank: int, out_size: int | None = None) -> None:
        super().__init__()
        self.markov_w1 = nn.Embedding(vocab_size, rank)              # any predecessor
        self.markov_w2 = nn.Linear(rank, out_size or vocab_size, bias=False)  # draft vocab

    def forward(self, prev: Tensor) -> tuple[Tensor, Tensor]:
        """Bias over the vocabulary and the rank-r embedding of the predecessors ``prev``."""
        a = self.markov_w1(prev)
        return self.markov_w2(a), a


class ConfidenceHead(nn.Module):
    """sigmoid(proj([h; a])): the predicted acceptance of a slot's proposal (``proj`` [1, in])."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.proj = nn.Linear(width, 1)

    def forward(self, h: Tensor, a: Tensor) -> Tensor:
        return torch.sigmoid(self.proj(torch.cat([h, a.to(h.dtype)], -1)).squeeze(-1))


class SlotProposal:
    """The proposal interface's shape, read from ``cfg``: ``gamma`` slots and the conditioning
    ``order`` (shared by the drafters and the lookup tables, :mod:`floorgap.models.lookup`)."""

    cfg: Any

    @property
    def gamma(self) -> int:
        return self.cfg.gamma

    @property
    def order(self) -> int:
        return self.cfg.order


class Drafter(SlotProposal, nn.Module):
    """What every kind shares: the backbone, the borrowed target tables, the trimmed draft
    vocabulary, the mask rows and the objective. A kind is a subclass (:data:`DRAFTER_CLASSES`)
    that adds its heads, its passes (``forward``, ``draft``, and the heads' part of ``propose``
    and ``propose_paths``: ``_slot_logits``, ``_path_logits``) and any auxiliary loss terms
    (``_aux_losses``)."""

    kind: str = ""

    def __init__(self, cfg: DrafterConfig, embed: nn.Module, head: nn.Module) -> None:
        super().__init__()
        if cfg.vocab_size is None or cfg.target_hidden is None or cfg.mask_token_id is None:
            raise ValueError("vocab_size, target_hidden and mask_token_id must be set "
                             "(build_drafter fills them from the target)")
        if cfg.kind != self.kind:
            raise ValueError(f"a {type(self).__name__} drafts kind {self.kind!r}, not "
                             f"{cfg.kind!r} (build_drafter picks the class)")
        self.cfg = cfg
        # the target's tables, held without registering them as submodules
        self._shared = SimpleNamespace(embed=embed, head=head)
        self._head_cast: tuple[Any, Tensor] | None = None
        for p in list(embed.parameters()) + list(head.parameters()):
            p.requires_grad_(False)
        embed_dim = embed.weight.shape[1]
        self.backbone = Backbone(cfg)
        self._add_heads(embed_dim)
        self.apply(self._init)
        self._reset_heads()
        ids = t2d = None
        if cfg.draft_vocab is not None:
            ids = torch.tensor(cfg.draft_vocab, dtype=torch.long)
            if max(cfg.draft_vocab) >= cfg.vocab_size:
                raise ValueError(f"draft_vocab holds ids past the target's {cfg.vocab_size}")
            t2d = torch.full((cfg.vocab_size,), -1, dtype=torch.long)
            t2d[ids] = torch.arange(len(ids))
        # not persistent: rebuilt from the config, so files carry them only where an engine
        # needs them (the export writes d2t)
        self.draft_ids: Tensor | None
        self.target_to_draft: Tensor | None
        self.register_buffer("draft_ids", ids, persistent=False)
        self.register_buffer("target_to_draft", t2d, persistent=False)
        self.mask_embed: nn.Parameter | None = None
        if cfg.mask_embedding:
            # random at the scale of the target's own token embeddings
            scale = embed.weight.detach().float().std()     # a tensor: no host read
            self.mask_embed = nn.Parameter(torch.randn(embed_dim) * scale)

    def _add_heads(self, embed_dim: int) -> None:
        """Register the kind's own heads (before the shared initialisation)."""

    def _reset_heads(self) -> None:
        """Adjust the kind's heads after the shared initialisation."""

    def _init(self, m: nn.Module) -> None:
        # Module.apply visits children first, so a ShortConv re-zeroes its gates afterwards.
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=self.cfg.init_std)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.zeros_(m.bias)
        if isinstance(m, ShortConv):
            nn.init.zeros_(m.gates.weight)

    @property
    def trimmed(self) -> bool:
        return self.draft_ids is not None

    def to_target_ids(self, idx: Tensor) -> Tensor:
        """Target token ids of draft-vocabulary indices (the identity on a full vocabulary)."""
        return idx if self.draft_ids is None else self.draft_ids[idx]

    def full_vocab(self, logits: Tensor) -> Tensor:
        """Draft-vocabulary logits [..., N] -> target-vocabulary logits [..., V], -inf outside
        the draft vocabulary (q is zero there)."""
        if self.draft_ids is None:
            return logits
        out = logits.new_full((*logits.shape[:-1], self.cfg.vocab_size), float("-inf"))
        return out.index_copy(-1, self.draft_ids, logits)

    def draft_targets(self, top: TopKTargets) -> tuple[TopKTargets, Tensor | None]:
        """The stored top-K of p in draft-vocabulary indices and which of them lie inside the
        draft vocabulary (None on a full vocabulary)."""
        if self.target_to_draft is None:
            return top, None
        idx = self.target_to_draft[top.ids]
        valid = idx >= 0
        return TopKTargets(ids=idx.clamp_min(0), vals=top.vals), valid

    # ---- shared target pieces
    def embed(self, ids: Tensor) -> Tensor:
        return self._shared.embed(ids).to(self.backbone.fc.weight.dtype)

    def head_weight(self) -> Tensor:
        """The rows of the target's output head the drafter scores: [N, D] (all V rows unless
        the draft vocabulary is trimmed)."""
        w = self._shared.head.weight
        return w if self.draft_ids is None else w.index_select(0, self.draft_ids.to(w.device))

    def lm_head(self, h: Tensor) -> Tensor:
        """The target's output head (its draft-vocabulary rows) on h: float32 logits [..., N],
        or under autocast logits in the autocast precision (the loss reads them in float32)."""
        head = self._shared.head
        bias = head.bias
        if bias is not None and self.draft_ids is not None:
            bias = bias[self.draft_ids]
        kind = h.device.type
        key = (torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else
               head.weight.dtype, head.weight.data_ptr(), head.weight._version)
        if self.draft_ids is None and not torch.is_autocast_enabled(kind):
            return head(h.to(head.weight.dtype)).float()
        # autocast recasts a frozen weight at every call (it caches only trainable leaves), and
        # a trimmed head is a gather: the N x D rows are cast or gathered once (the weight's
        # version guards against edits)
        if self._head_cast is None or self._head_cast[0] != key:
            self._head_cast = (key, self.head_weight().detach().to(key[0]))
        out = F.linear(h.to(key[0]), self._head_cast[1], bias)
        return out if torch.is_autocast_enabled(kind) else out.float()

    # ---- passes
    def _block(self, features: Tensor, committed: Tensor, prefix_mask: Tensor | None,
               feature_index: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Backbone pass: (h [B,G,D], ctx [S,T,D], base logits u [B,G,V], prefix_mask [B,T]).

        The block rows are [E(c), E(mask), ...]; with ``sample_from_anchor`` row k proposes
        slot k, otherwise (DFlash) there is one more row and row k + 1 proposes slot k.
        """
        b = committed.numel()
        if prefix_mask is None:
            if feature_index is not None:
                raise ValueError("blocks that share a context need their prefix_mask")
            prefix_mask = torch.ones(b, features.shape[1], dtype=torch.bool, device=features.device)
        rows = self.cfg.block_rows
        if self.mask_embed is None:
            ids = torch.full((b, rows), self.cfg.mask_token_id, dtype=torch.long,
                             device=features.device)
            ids[:, 0] = committed.view(b)
            block_in = self.embed(ids)
        else:
            first = self.embed(committed.view(b, 1))
            mask = self.mask_embed.to(first.dtype).expand(b, rows - 1, -1)
            block_in = torch.cat([first, mask], dim=1)
        h, ctx = self.backbone(features, block_in, prefix_mask, feature_index)
        if not self.cfg.sample_from_anchor:
            h = h[:, 1:]
        return h, ctx, self.lm_head(h), prefix_mask

    @staticmethod
    def _shift(committed: Tensor, tokens: Tensor, g: int) -> Tensor:
        """Predecessors of slots 0..G-1: [committed, tokens[:, 0], ..., tokens[:, G-2]]."""
        return torch.cat([committed.view(-1, 1), tokens[:, : g - 1]], dim=1)

    # ---- the kind's passes (the API in the module docstring)
    def forward(self, features: Tensor, committed: Tensor, block_tokens: Tensor | None = None,
                prefix_mask: Tensor | None = None, feature_index: Tensor | None = None
                ) -> DrafterOutput:
        """Teacher-forced pass. features [S, T, F]; committed [B]; block_tokens [B, G];
        feature_index [B] (blocks sharing left-aligned contexts, see :class:`Backbone`)."""
        raise NotImplementedError

    def proposal_logits(self, output: DrafterOutput) -> Tensor:
        """The draft-vocabulary logits [B, G, N] of the proposal :meth:`propose` makes, from a
        teacher-forced :meth:`forward` (what a held-out score must measure): the forward's own
        logits unless the kind restricts its proposal."""
        return output.logits

    @torch.no_grad()
    def propose(self, features: Tensor, committed: Tensor, predecessors: Tensor | None = None,
                prefix_mask: Tensor | None = None) -> Tensor:
        """Proposal logits [B, G, V] for given predecessors (oracle mode).

        ``predecessors[:, j]`` is the predecessor of slot j + 1 (the target's realised Z_j);
        slot 0's predecessor is ``committed`` (order 0 ignores them). A [B, G] block may be
        passed as is (its last column is unused). The proposal is q_k = softmax(logits_k /
        temperature).
        """
        h, ctx, u, pm = self._block(features, committed, prefix_mask)
        pred = None
        if self.order:
            if predecessors is None:
                raise ValueError(f"{self.kind} needs predecessors")
            pred = self._shift(committed, predecessors, self.cfg.gamma)
        return self._slot_logits(h, ctx, u, pm, pred)

    @torch.no_grad()
    def propose_paths(self, features: Tensor, committed: Tensor, predecessors: Tensor,
                      prefix_mask: Tensor | None = None, slots: Sequence[int] | None = None
                      ) -> Tensor:
        """:meth:`propose` for M predecessor rows that share one context, on ``slots`` only.

        ``features`` [1, T, F], ``committed`` [1], ``predecessors`` [M, G] as in
        :meth:`propose`. Equals ``propose(features.expand(M, ...), committed.expand(M),
        predecessors, prefix_mask.expand(M, -1))[:, slots]`` up to float rounding, but runs the
        block pass (backbone and base logits u, which do not see the predecessors) once and
        reads the output head only at ``slots``: the evaluation probe's self chain asks for one
        slot at a time. Returns [M, S, V] (S = len(slots), all slots by default).
        """
        if features.shape[0] != 1:
            raise ValueError("propose_paths takes one context (features of batch size 1)")
        ks = list(range(self.cfg.gamma)) if slots is None else [int(k) for k in slots]
        h, ctx, u, pm = self._block(features, committed, prefix_mask)
        m = predecessors.shape[0]
        pred = self._shift(committed.view(1).expand(m), predecessors, self.cfg.gamma)[:, ks] \
            if self.order else None  # order 0 reads no predecessor
        return self._path_logits(ks, h, ctx, u[:, ks], pm, pred, m)

    def _slot_logits(self, h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor,
                     pred: Tensor | None) -> Tensor:
        """:meth:`propose`'s logits [B, G, V] from the block pass, one predecessor per slot
        (pred [B, G]; None for order 0)."""
        raise NotImplementedError

    def _path_logits(self, ks: list[int], h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor,
                     pred: Tensor | None, m: int) -> Tensor:
        """:meth:`propose_paths`'s logits [M, S, V] at slots ``ks`` (u [1, S, N] there) for
        the M predecessor rows ``pred`` [M, S] of one context (None for order 0):
        :meth:`_slot_logits`, for the kinds whose slot logits broadcast over the rows."""
        return self._slot_logits(h[:, ks], ctx, u, pm, pred).expand(m, -1, -1)

    def draft(self, features: Tensor, committed: Tensor, prefix_mask: Tensor | None = None,
              temperature: float = 1.0, generator: torch.Generator | None = None) -> Draft:
        """Self mode: draw the chain left to right from the drafter's own proposals (greedy at
        temperature 0: the per-slot argmax given the chosen predecessor, not a global Viterbi
        path; otherwise softmax(logits / temperature) sampled with ``generator``). Returns the
        tokens and, per slot, the logits of the proposal that drew them."""
        raise NotImplementedError

    def _chain(self, u: Tensor, committed: Tensor, temperature: float,
               generator: torch.Generator | None, bias: Any = None) -> Draft:
        """:meth:`draft` slot by slot from u_k plus ``bias(z_{k-1})`` (slot 0: the committed
        token), when a slot reads nothing else of its predecessor."""
        tokens, rows, prev = [], [], committed.view(u.shape[0])
        for k in range(u.shape[1]):
            row = u[:, k] if bias is None else u[:, k] + bias(prev)
            prev = self.to_target_ids(_pick(row, temperature, generator))
            tokens.append(prev)
            rows.append(row)
        return Draft(tokens=torch.stack(tokens, 1), logits=self.full_vocab(torch.stack(rows, 1)))

    # ---- objective
    def loss(self, output: DrafterOutput, targets: Tensor | TopKTargets | None,
             block_tokens: Tensor) -> tuple[Tensor, dict[str, float]]:
        """:func:`block_objective` on the draft vocabulary plus the kind's auxiliary terms
        (``_aux_losses``: name -> (weight, slot-weighted batch mean)). ``targets`` is p_k, dense
        [B, G, V] or its stored top-K (:class:`TopKTargets`)."""
        objective = self.cfg.objective
        needs_p = objective != "ce" or self.order > 0
        if needs_p and targets is None:
            raise ValueError(f"the {objective} objective of a {self.kind} drafter needs "
                             "the target's distributions")
        top = valid = None
        if targets is not None:
            top, valid = self.draft_targets(TopKTargets.of(targets))
        tokens = block_tokens if self.target_to_draft is None else \
            self.target_to_draft[block_tokens]
        w = slot_weights(output.logits.shape[1], self.cfg.slot_decay, output.logits.device)
        total, parts, tv = block_objective(output.logits, top, valid, tokens, objective,
                                           w / w.sum(), needs_p)
        for name, (weight, value) in self._aux_losses(output, top, valid, tv, w / w.sum()).items():
            total = total + weight * value
            parts[name] = float(value.detach())
        parts["loss"] = float(total.detach())
        return total, parts

    def _aux_losses(self, output: DrafterOutput, top: TopKTargets | None, valid: Tensor | None,
                    tv: Tensor | None, weights: Tensor) -> dict[str, tuple[float, Tensor]]:
        return {}


def slot_weights(g: int, decay: float, device: Any = None) -> Tensor:
    """The loss's slot weights exp(-k / decay), k = 0..g-1 (unnormalised)."""
    k = torch.arange(g, device=device, dtype=torch.float32)
    return torch.exp(-k / decay)


def _weighted(x: Tensor, weights: Tensor) -> Tensor:
    """[B, G] -> the slot-weighted batch mean (weights sum to 1)."""
    return (x * weights).sum(-1).mean()


def block_objective(logits: Tensor, top: TopKTargets | None, valid: Tensor | None,
                    tokens: Tensor, objective: str, weights: Tensor, needs_p: bool
                    ) -> tuple[Tensor, dict[str, float], Tensor | None]:
    """The main term of a drafter's loss over draft-vocabulary logits [B, G, N], slot-weighted
    (``weights`` [G], summing to 1) and averaged over the batch. Returns (loss, parts, the TV
    against the whole p [B, G] or None).

    ``ce``: the cross-entropy of the realised tokens (draft indices, -1 outside the draft
    vocabulary are skipped); ``kl``: KL(p_k || q_k); ``tv``: TV(p_k, q_k), both on the top-K of
    p plus one residual bucket (:func:`topk_divergences`). CE on a sampled Z_k ~ p_k and
    KL(p_k || .) have the same minimiser; KL replaces the one-hot sample by p_k itself. With a
    trimmed vocabulary (``valid``) the objective fits p restricted to the draft vocabulary (the
    best q it can hold) while the TV reported stays against the whole p, charging the mass
    outside.
    """
    b, g, v = logits.shape  # logits kept in their precision: topk_divergences reads float32
    honest = topk_divergences(logits, top.ids, top.vals, valid) if needs_p else {}
    div = honest
    if valid is not None and needs_p:
        inside = torch.where(valid, top.vals.float(), torch.zeros_like(top.vals.float()))
        kept = (1 - (top.vals.float() - inside).sum(-1, keepdim=True)).clamp_min(1e-12)
        div = topk_divergences(logits, top.ids, inside / kept, valid)
    if objective == "ce":
        ce = F.cross_entropy(logits.float().reshape(-1, v), tokens.reshape(-1),
                             reduction="none", ignore_index=-1).view(b, g)
        total = _weighted(ce, weights)
    else:
        total = _weighted(div[objective], weights)
    parts = {objective: float(total.detach())}
    if "tv" in honest and (objective != "tv" or honest is not div):
        parts["tv"] = float(_weighted(honest["tv"], weights).detach())
    return total, parts, honest.get("tv")


class DFlashDrafter(Drafter):
    """DFlash (order 0): q_k = softmax(u_k), a function of the context X only; the block has
    gamma + 1 rows and row k + 1 proposes slot k."""

    kind = "dflash"

    def forward(self, features: Tensor, committed: Tensor, block_tokens: Tensor | None = None,
                prefix_mask: Tensor | None = None, feature_index: Tensor | None = None
                ) -> DrafterOutput:
        u = self._block(features, committed, prefix_mask, feature_index)[2]
        return DrafterOutput(logits=u, base_logits=u)

    def _slot_logits(self, h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor,
                     pred: Tensor | None) -> Tensor:
        return self.full_vocab(u)

    @torch.no_grad()
    def draft(self, features: Tensor, committed: Tensor, prefix_mask: Tensor | None = None,
              temperature: float = 1.0, generator: torch.Generator | None = None) -> Draft:
        """The slots are drawn independently from one parallel pass."""
        u = self._block(features, committed, prefix_mask)[2]
        return self._chain(u, committed, temperature, generator)


class _Order1Drafter(Drafter):
    """An order-1 kind: slot k's proposal also reads its predecessor z_{k-1} (slot 0 the
    committed token), and a confidence head predicts each slot's acceptance, trained with
    conf_weight * BCE(confidence, 1 - TV) (TV detached)."""

    def _order1(self, h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor, pred: Tensor,
                feature_index: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Draft-vocabulary logits [B, G, N] for one predecessor per slot (pred [B, G]) and the
        confidence [B, G]."""
        raise NotImplementedError

    def _nomination_logits(self, u: Tensor) -> Tensor | None:
        return None

    def forward(self, features: Tensor, committed: Tensor, block_tokens: Tensor | None = None,
                prefix_mask: Tensor | None = None, feature_index: Tensor | None = None
                ) -> DrafterOutput:
        h, ctx, u, pm = self._block(features, committed, prefix_mask, feature_index)
        if block_tokens is None:
            raise ValueError(f"{self.kind} needs block_tokens (predecessors) in forward")
        pred = self._shift(committed, block_tokens, self.cfg.gamma)
        logits, conf = self._order1(h, ctx, u, pm, pred, feature_index)
        return DrafterOutput(logits=logits, base_logits=u, confidence=conf,
                             nomination_logits=self._nomination_logits(u))

    def _aux_losses(self, output: DrafterOutput, top: TopKTargets | None, valid: Tensor | None,
                    tv: Tensor | None, weights: Tensor) -> dict[str, tuple[float, Tensor]]:
        conf = output.confidence.float().clamp(1e-6, 1 - 1e-6)
        accept = (1 - tv).detach().clamp(0.0, 1.0)
        bce = F.binary_cross_entropy(conf, accept, reduction="none")
        return {"conf": (self.cfg.conf_weight, _weighted(bce, weights))}


class DSparkDrafter(_Order1Drafter):
    """DSpark (order 1): the backbone's u_k plus the low-rank Markov correction B(A[z_{k-1}])
    of the predecessor, l_k = u_k + B(A[z_{k-1}]), and the confidence head."""

    kind = "dspark"

    def _add_heads(self, embed_dim: int) -> None:
        cfg = self.cfg
        self.markov_head = MarkovHead(cfg.vocab_size, cfg.markov_rank, cfg.draft_vocab_size)
        self.confidence_head = ConfidenceHead(cfg.hidden_size + cfg.markov_rank)

    def _reset_heads(self) -> None:
        nn.init.zeros_(self.markov_head.markov_w2.weight)  # untrained Markov head == backbone

    def _order1(self, h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor, pred: Tensor,
                feature_index: Tensor | None = None) -> tuple[Tensor, Tensor]:
        bias, a = self.markov_head(pred)                                      # [B,G,N], [B,G,r]
        return u + bias.float(), self.confidence_head(h, a)

    def _slot_logits(self, h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor,
                     pred: Tensor | None) -> Tensor:
        return self.full_vocab(u + self.markov_head(pred)[0].float())

    @torch.no_grad()
    def draft(self, features: Tensor, committed: Tensor, prefix_mask: Tensor | None = None,
              temperature: float = 1.0, generator: torch.Generator | None = None) -> Draft:
        """Each slot adds B(A[z_{k-1}]) for the drafter's own previous token."""
        u = self._block(features, committed, prefix_mask)[2]
        return self._chain(u, committed, temperature, generator,
                           lambda prev: self.markov_head(prev)[0].float())


class PrefixAttentionDrafter(_Order1Drafter):
    """The prefix-attention head (order 1, paper Sec. 4): l_k(X, a) = u_k(X) + B f_head(x_{k,a},
    H_X) and the confidence head; at inference the proposal lives on the top-K nominations of
    u_k, trained by nom_weight * L_nom (the cross-entropy of u_k's renormalised distribution on
    S_k, the target's top-``nominate_k`` tokens, against p's renormalised mass there)."""

    kind = "prefix_attention"

    def _add_heads(self, embed_dim: int) -> None:
        self.head = PrefixHead(self.cfg, embed_dim)
        self.confidence_head = ConfidenceHead(self.cfg.hidden_size + self.cfg.head_width)

    def _order1(self, h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor, pred: Tensor,
                feature_index: Tensor | None = None) -> tuple[Tensor, Tensor]:
        f = self.head(self.embed(pred)[:, :, None], h, ctx, pm, feature_index)[:, :, 0]
        return u + self.head.out(f).float(), self.confidence_head(h, f)

    def _nomination_logits(self, u: Tensor) -> Tensor | None:
        return u

    def proposal_logits(self, output: DrafterOutput) -> Tensor:
        """The forward's logits kept on the top-K nominations of u_k, -inf elsewhere: q_k as
        :meth:`propose` deploys it (the training loss reads every logit)."""
        succ = output.base_logits.topk(self.cfg.nominate_k, dim=-1).indices
        kept = torch.full_like(output.logits, float("-inf"))
        return kept.scatter(-1, succ, output.logits.gather(-1, succ))

    def _pair_scores(self, h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor, pred: Tensor,
                     succ: Tensor) -> Tensor:
        """Scores l_k(X, a)_v for predecessor hypotheses pred [B, G, P] and nominated successors
        succ [B, G, K]: u_k[v] + B_v . f_head(x_{k,a}) -> [B, G, P, K]."""
        f = self.head(self.embed(pred), h, ctx, pm)                          # [B, G, P, W]
        bw = self.head.out.weight[succ]                                       # [B, G, K, W]
        corr = torch.einsum("bgpw,bgkw->bgpk", f, bw.to(f.dtype)).float()
        return u.gather(-1, succ)[:, :, None, :] + corr

    def _scatter(self, scores: Tensor, succ: Tensor) -> Tensor:
        """Scores over nominated successors [B, G, K] (draft-vocabulary indices) -> logits
        [B, G, V] over the target's vocabulary, -inf elsewhere."""
        out = torch.full((*succ.shape[:2], self.cfg.vocab_size), float("-inf"),
                         device=scores.device, dtype=scores.dtype)
        return out.scatter(-1, self.to_target_ids(succ), scores)

    def _slot_logits(self, h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor,
                     pred: Tensor | None) -> Tensor:
        """-inf outside the top-K nominations of u_k, so q_k is normalised over the nominated
        successors and zero elsewhere."""
        succ = u.topk(self.cfg.nominate_k, dim=-1).indices                    # [B, G, K]
        scores = self._pair_scores(h, ctx, u, pm, pred[:, :, None], succ)[:, :, 0]
        return self._scatter(scores, succ)

    def _path_logits(self, ks: list[int], h: Tensor, ctx: Tensor, u: Tensor, pm: Tensor,
                     pred: Tensor | None, m: int) -> Tensor:
        succ = u.topk(self.cfg.nominate_k, dim=-1).indices                    # [1, S, K]
        # the M predecessors are M hypotheses of one context: [1, S, M] -> scores [1, S, M, K]
        scores = self._pair_scores(h[:, ks], ctx, u, pm, pred.T[None], succ)[0]
        return self._scatter(scores.transpose(0, 1), succ.expand(m, -1, -1))

    @torch.no_grad()
    def draft(self, features: Tensor, committed: Tensor, prefix_mask: Tensor | None = None,
              temperature: float = 1.0, generator: torch.Generator | None = None) -> Draft:
        """Nominate the top-K of u_k per slot, score every (slot k-1 candidate, slot k
        candidate) pair in one head pass (slot 0 against the committed token) and walk the
        lattice: the chosen token of slot k-1 selects the row of scores used at slot k."""
        h, ctx, u, pm = self._block(features, committed, prefix_mask)
        b, g = u.shape[:2]
        kk = self.cfg.nominate_k
        succ = u.topk(kk, dim=-1).indices                                     # [B, G, K]
        # predecessor hypotheses: slot 0 -> committed (repeated), slot k -> slot k-1's nominees
        pred = torch.cat([committed.view(b, 1, 1).expand(b, 1, kk),
                          self.to_target_ids(succ[:, :-1])], dim=1)
        scores = self._pair_scores(h, ctx, u, pm, pred, succ)                 # [B, G, K, K]
        ar = torch.arange(b, device=u.device)
        row_idx = torch.zeros(b, dtype=torch.long, device=u.device)
        tokens, rows = [], []
        for k in range(g):
            row = scores[ar, k, row_idx]                                      # [B, K]
            j = _pick(row, temperature, generator)
            tokens.append(self.to_target_ids(succ[ar, k, j]))
            rows.append(row)
            row_idx = j
        logits = self._scatter(torch.stack(rows, 1), succ)
        return Draft(tokens=torch.stack(tokens, 1), logits=logits)

    def _aux_losses(self, output: DrafterOutput, top: TopKTargets | None, valid: Tensor | None,
                    tv: Tensor | None, weights: Tensor) -> dict[str, tuple[float, Tensor]]:
        terms = super()._aux_losses(output, top, valid, tv, weights)
        k = min(self.cfg.nominate_k, top.ids.shape[-1])
        p_nom = top.vals[..., :k].float()
        if valid is not None:  # nominations live in the draft vocabulary
            p_nom = torch.where(valid[..., :k], p_nom, torch.zeros_like(p_nom))
        p_nom = p_nom / p_nom.sum(-1, keepdim=True).clamp_min(1e-12)
        lse, picked = logsumexp_gather(output.base_logits, top.ids[..., :k])
        l_nom = _weighted(-(p_nom * (picked - lse.unsqueeze(-1))).sum(-1), weights)
        return {**terms, "nom": (self.cfg.nom_weight, l_nom)}


# one class per kind: adding a kind is a subclass here and its row in floorgap.config.kinds.KINDS
DRAFTER_CLASSES: dict[str, type[Drafter]] = {
    c.kind: c for c in (DFlashDrafter, DSparkDrafter, PrefixAttentionDrafter)}
KINDS = tuple(DRAFTER_CLASSES)


@dataclass
class TopKTargets:
    """The target's p_k at every slot as its top-K: ids [B, G, K] (distinct, by descending
    probability) and probabilities vals [B, G, K]; 1 - sum(vals) is the mass outside."""

    ids: Tensor
    vals: Tensor

    @classmethod
    def of(cls, targets: Tensor | TopKTargets) -> TopKTargets:
        """Dense p [B, G, V] becomes its sorted full support (no residual mass)."""
        if isinstance(targets, TopKTargets):
            return targets
        vals, ids = targets.float().sort(-1, descending=True)
        return cls(ids=ids, vals=vals)


# --------------------------------------------------------------------------- builders


def build_drafter(config: DrafterConfig, target_model: nn.Module) -> Drafter:
    """A drafter sharing ``target_model``'s input embedding and output head (frozen)."""
    embed = target_model.get_input_embeddings()
    head = target_model.get_output_embeddings()
    tcfg = text_config(target_model.config)
    n_layers = int(tcfg.num_hidden_layers)
    bad = [t for t in config.taps if not 0 <= t < n_layers]
    if bad:
        raise ValueError(f"tap layers {bad} outside the target's {n_layers} layers")
    vocab = int(head.weight.shape[0])
    hidden = int(tcfg.hidden_size)
    if config.hidden_size != hidden:
        raise ValueError(f"drafter hidden_size {config.hidden_size} must equal the target's "
                         f"hidden size {hidden} (the output head is shared)")
    cfg = replace(config, target_hidden=config.target_hidden or hidden, vocab_size=vocab,
                  mask_token_id=config.mask_token_id if config.mask_token_id is not None
                  else vocab - 1)
    model = DRAFTER_CLASSES[cfg.kind](cfg, embed, head)
    # built on the CPU (the same initial draws on every device), then moved where the shared
    # modules live; nothing to move on a CPU target (nor under a fake-tensor shape check)
    device = embed.weight.device
    if all(t.device == device for t in (*model.parameters(), *model.buffers())):
        return model
    return model.to(device=device)
