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

    def forward(self, features, committed, block_tokens, prefix_mask, feature_index):
        feats = features[feature_index]                                     # [N, T, F]
        w = prefix_mask.to(feats.dtype).unsqueeze(-1)
        pooled = (self.proj(feats) * w).sum(1) / w.sum(1).clamp_min(1.0)
        pred = torch.cat([committed[:, None], block_tokens[:, :-1]], dim=1)
        x = torch.tanh(pooled[:, None, :] + self.slot[None] + self.embed[pred])
        return self.out(self.drop(x * self.norm_scale))

    def loss(self, output, targets, block_tokens):
        """Cross-entropy against the renormalised top-K law (the trainer passes TopKTargets)."""
        p = torch.zeros_like(output, dtype=torch.float32).scatter_(-1, targets.ids,
                                                                   targets.vals.float())
        p = p / p.sum(-1, keepdim=True)
        logq = torch.log_softmax(output.float(), dim=-1)
        ce = -(p * logq).sum(-1)  # [B, gamma]
        k = torch.arange(ce.shape[1], dtype=ce.dtype)
        w = torch.exp(-k / 4)
        w = w / w.sum()
        per_slot = ce.mean(0)
        nll = -logq.gather(-1, block_tokens[..., None]).squeeze(-1).mean()
        loss = (per_slot * w).sum()
        return loss, {"ce_slot0": float(per_slot[0].detach()), "nll_tokens": float(nll.detach())}


class TinyExamples:
    """Stacked examples with the trainer's interface (``floorgap.models.training.Examples``):
    a keyed batch order and batches whose blocks each read their own feature row. Ragged
    prefixes are left-padded and masked out."""

    def __init__(self, n: int, seed: int = 0, *, ragged: bool = False, k: int = 4):
        g = torch.Generator().manual_seed(seed)
        self.features = torch.zeros(n, T, F)
        self.prefix_mask = torch.zeros(n, T, dtype=torch.bool)
        self.committed = torch.randint(V, (n,), generator=g)
        self.block_tokens = torch.zeros(n, GAMMA, dtype=torch.long)
        self.target_ids = torch.zeros(n, GAMMA, k, dtype=torch.long)
        self.target_vals = torch.zeros(n, GAMMA, k)
        for i in range(n):
            t = T - (i % 3) if ragged else T
            probs = torch.softmax(torch.randn(GAMMA, V, generator=g), -1)
            self.features[i, T - t:] = torch.randn(t, F, generator=g)
            self.prefix_mask[i, T - t:] = True
            self.block_tokens[i] = torch.multinomial(probs, 1, generator=g).squeeze(-1)
            self.target_vals[i], self.target_ids[i] = probs.topk(k, dim=-1)

    def __len__(self) -> int:
        return int(self.committed.shape[0])

    def epoch_batches(self, batch_size, seed, epoch, *, min_size=1):
        gen = torch.Generator().manual_seed(1000 * seed + epoch)
        batches = list(torch.split(torch.randperm(len(self), generator=gen), batch_size))
        return [b for b in batches if len(b) >= min_size]

    def gather(self, indices):
        return {"features": self.features[indices], "prefix_mask": self.prefix_mask[indices],
                "feature_index": torch.arange(len(indices)),
                "committed": self.committed[indices], "block_tokens": self.block_tokens[indices],
                "target_ids": self.target_ids[indices], "target_vals": self.target_vals[indices]}


def make_examples(n: int, seed: int = 0, *, ragged: bool = False) -> TinyExamples:
    return TinyExamples(n, seed, ragged=ragged)


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

