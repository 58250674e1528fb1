"""A tiny drafter implementing the training interface, tiny data, and data-parallel workers.

Kept in its own module so spawned processes can import the workers by name.
"""

from __future__ import annotations

import torch
from torch import nn

V, F, D, GAMMA, T = 11, 6, 8, 3, 5


class TinyDrafter(nn.Module):
    """Pools the prefix features, adds a slot embedding and the (frozen) predecessor embedding."""

    def __init__(self, vocab: int = V, feat: int = F, width: int = D, gamma: int = GAMMA,
                 dropout: float = 0.0):
        super().__init__()
        self.vocab_size = vocab
        # The shared target table: fixed by the target, not by the drafter's initialisation seed.
        table = torch.randn(vocab, width, generator=torch.Generator().manual_seed(1234))
        self.embed = nn.Parameter(table, requires_grad=False)
        self.proj = nn.Linear(feat, width)
        self.slot = nn.Parameter(0.1 * torch.randn(gamma, width))
        self.norm_scale = nn.Parameter(torch.ones(width))
        self.drop = nn.Dropout(dropout)
        self.out = nn.Linear(width, vocab)

    def forward(self, features, committed, block_tokens, prefix_mask=None):
        if prefix_mask is None:
            prefix_mask = torch.ones(features.shape[:2], dtype=torch.bool, device=features.device)
        w = prefix_mask.to(features.dtype).unsqueeze(-1)
        pooled = (self.proj(features) * w).sum(1) / w.sum(1).clamp_min(1.0)
        pred = torch.cat([committed[:, None], block_tokens[:, :-1]], dim=1)
        x = torch.tanh(pooled[:, None, :] + self.slot[None] + self.embed[pred])
        return self.out(self.drop(x * self.norm_scale))

    def loss(self, output, target_probs, block_tokens):
        logq = torch.log_softmax(output.float(), dim=-1)
        ce = -(target_probs * logq).sum(-1)  # [B, gamma]
        k = torch.arange(ce.shape[1], dtype=ce.dtype)
        w = torch.exp(-k / 4)
        w = w / w.sum()
        per_slot = ce.mean(0)
        nll = -logq.gather(-1, block_tokens[..., None]).squeeze(-1).mean()
        loss = (per_slot * w).sum()
        return loss, {"ce_slot0": float(per_slot[0].detach()), "nll_tokens": float(nll.detach())}


def make_examples(n: int, seed: int = 0, *, sparse: bool = False, ragged: bool = False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        t = T - (i % 3) if ragged else T
        logits = torch.randn(GAMMA, V, generator=g)
        probs = torch.softmax(logits, -1)
        ex = {
            "features": torch.randn(t, F, generator=g),
            "prefix_mask": torch.ones(t, dtype=torch.bool),
            "committed": torch.randint(V, (), generator=g),
            "block_tokens": torch.multinomial(probs, 1, generator=g).squeeze(-1),
        }
        if sparse:
            vals, ids = probs.topk(4, dim=-1)
            ex["target_ids"], ex["target_vals"] = ids, vals
        else:
            ex["target_probs"] = probs
        out.append(ex)
    return out


def new_model(seed: int = 1, dropout: float = 0.0) -> TinyDrafter:
    torch.manual_seed(seed)
    return TinyDrafter(dropout=dropout)


def grads_and_step_worker(n_examples: int, config_dict: dict):
    """One optimiser step in a process group; returns (grads before the step, params after)."""
    from floorgap.models.training import TrainConfig, train

    torch.set_num_threads(1)
    model = new_model()
    grads = {}

    def hook(info):
        for name, p in info["model"].named_parameters():
            if p.requires_grad:
                grads[name] = p.grad.detach().clone()

    train(model, make_examples(n_examples), TrainConfig.from_dict(config_dict),
          progress=False, before_step=hook)
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    return grads, params

