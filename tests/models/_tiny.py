"""A tiny random Llama target shared by the drafter tests."""

from __future__ import annotations

import torch


def tiny_llama(vocab: int, hidden: int, intermediate: int):
    """A frozen two-layer Llama (4 heads, 2 key/value heads, untied head), seeded."""
    import transformers

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=vocab, hidden_size=hidden,
                                   intermediate_size=intermediate, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model
