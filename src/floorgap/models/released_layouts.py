"""Tiny checkpoint folders in the layouts the released drafters are published in, written from
the key sets of those projects' own sources (never from floorgap's exporter):

* DeepSpec ``Qwen3DSparkModel`` (deepseek-ai/DeepSpec, ``deepspec/modeling/dspark/qwen3/
  config.py`` ``build_draft_config`` for the keys, ``modeling.py`` and ``markov_head.py`` for
  the tensors): a flat Qwen3 config with top-level ``block_size``, ``target_layer_ids``,
  ``mask_token_id``, ``num_anchors``, ``markov_rank`` (0 in the DFlash releases) and the
  confidence keys; the folder carries copies of the target's ``embed_tokens``/``lm_head``.
* z-lab ``DFlashDraftModel`` (z-lab/dflash, ``dflash/model.py``): ``block_size`` at the top,
  ``dflash_config: {mask_token_id, target_layer_ids}``, no ``target_hidden_size``, no
  embedding or head in the folder.
* speculators (vllm-project/speculators, ``src/speculators/models/dflash/config.py`` and
  ``models/dspark/config.py``): ``transformer_layer_config`` serialised with ``to_diff_dict``,
  ``aux_hidden_state_layer_ids`` (hidden-state indices, taps + 1), ``target_hidden_size`` null,
  and, for RedHatAI's DSpark, sliding-window layers (``layer_types`` sliding_attention, window
  2048, as speculators' training writes by default, ``scripts/train.py``).
* DeepSpec ``Gemma4DSparkModel`` (``deepspec/modeling/dspark/gemma4/config.py``), whose layers
  are gemma4_text layers.

Sizes follow the tiny target they are written for: its hidden width and vocabulary, two draft
layers. The tests read them, and ``floorgap rehearsal`` puts them where a paper config names a
released checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

# heads 32 wide: vLLM's CPU attention has no kernel for narrower ones (the rehearsal serves these)
HEADS, KV_HEADS, HEAD_DIM, INTER = 2, 1, 32, 96
LAYERS = 2


def _sizes(target, seed: int) -> tuple[int, int, torch.Generator]:
    """The target's hidden width and vocabulary, and the folder's seeded generator."""
    return (int(target.config.hidden_size), int(target.config.vocab_size),
            torch.Generator().manual_seed(seed))


def _target_tables(target) -> dict:
    """Copies of the target's embedding and head, as some releases carry them."""
    return {"embed_tokens.weight": target.get_input_embeddings().weight.detach().clone(),
            "lm_head.weight": target.get_output_embeddings().weight.detach().clone()}


def _markov_tensors(vocab: int, hidden: int, rank: int, gen: torch.Generator,
                    scale: float = 1.0) -> dict:
    """A vanilla Markov head (its two maps times ``scale``) and the confidence head."""
    return {"markov_head.markov_w1.weight": scale * torch.randn(vocab, rank, generator=gen),
            "markov_head.markov_w2.weight": scale * torch.randn(vocab, rank, generator=gen),
            "confidence_head.proj.weight": torch.randn(1, hidden + rank, generator=gen),
            "confidence_head.proj.bias": torch.randn(1, generator=gen)}


def _qwen3_layer_keys(hidden: int, vocab: int) -> dict:
    return {"model_type": "qwen3", "hidden_size": hidden, "intermediate_size": INTER,
            "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
            "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": vocab,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False,
            "max_position_embeddings": 40960,
            "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
            "tie_word_embeddings": False, "use_sliding_window": False, "sliding_window": None,
            "max_window_layers": LAYERS, "layer_types": ["full_attention"] * LAYERS,
            "bos_token_id": 151643, "eos_token_id": 151645}


def _backbone(hidden: int, taps: int, gen: torch.Generator) -> dict:
    def r(*shape):
        return 0.05 * torch.randn(*shape, generator=gen)
    t = {"fc.weight": r(hidden, taps * hidden), "hidden_norm.weight": 1 + r(hidden),
         "norm.weight": 1 + r(hidden)}
    for i in range(LAYERS):
        p = f"layers.{i}."
        t.update({p + "self_attn.q_proj.weight": r(HEADS * HEAD_DIM, hidden),
                  p + "self_attn.k_proj.weight": r(KV_HEADS * HEAD_DIM, hidden),
                  p + "self_attn.v_proj.weight": r(KV_HEADS * HEAD_DIM, hidden),
                  p + "self_attn.o_proj.weight": r(hidden, HEADS * HEAD_DIM),
                  p + "self_attn.q_norm.weight": 1 + r(HEAD_DIM),
                  p + "self_attn.k_norm.weight": 1 + r(HEAD_DIM),
                  p + "mlp.gate_proj.weight": r(INTER, hidden),
                  p + "mlp.up_proj.weight": r(INTER, hidden),
                  p + "mlp.down_proj.weight": r(hidden, INTER),
                  p + "input_layernorm.weight": 1 + r(hidden),
                  p + "post_attention_layernorm.weight": 1 + r(hidden)})
    return t


def _write(folder: Path, config: dict, tensors: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    return folder


def deepspec_folder(folder: Path, target, taps: list[int], *, block_size: int,
                    markov_rank: int, mask_token_id: int, seed: int = 0) -> Path:
    """A ``deepseek-ai/{dflash,dspark}_*_block<B>`` folder: markov_rank 0 is their DFlash
    (no Markov head, confidence off), above 0 their DSpark (vanilla head, confidence on)."""
    hidden, vocab, gen = _sizes(target, seed)
    confidence = markov_rank > 0
    config = {"architectures": ["Qwen3DSparkModel"], **_qwen3_layer_keys(hidden, vocab),
              "num_target_layers": int(target.config.num_hidden_layers),
              "block_size": block_size, "mask_token_id": mask_token_id,
              "target_layer_ids": list(taps), "num_anchors": 512,
              "enable_confidence_head": confidence, "markov_rank": markov_rank,
              "dtype": "float32", "transformers_version": "5.10.2"}
    if confidence:
        config["confidence_head_with_markov"] = True
    if markov_rank > 0:
        config["markov_head_type"] = "vanilla"
    # frozen copies of the target's tables (DeepSpec's base_trainer), which the engines may skip
    tensors = {**_backbone(hidden, len(taps), gen), **_target_tables(target)}
    if markov_rank > 0:
        tensors.update(_markov_tensors(vocab, hidden, markov_rank, gen, scale=0.5))
    return _write(folder, config, tensors)


def zlab_dflash_folder(folder: Path, target, taps: list[int], *, block_size: int,
                       mask_token_id: int, layer_types: list[str] | None = None,
                       seed: int = 1) -> Path:
    """A z-lab ``*-DFlash-b<B>`` folder."""
    hidden, vocab, gen = _sizes(target, seed)
    keys = _qwen3_layer_keys(hidden, vocab)
    del keys["rope_parameters"]
    keys["rope_theta"] = 1000000.0
    if layer_types is not None:
        keys.update(layer_types=layer_types, sliding_window=4096, use_sliding_window=True)
    config = {"architectures": ["DFlashDraftModel"],
              "auto_map": {"AutoModel": "dflash.DFlashDraftModel"}, **keys,
              "block_size": block_size, "num_target_layers": int(target.config.num_hidden_layers),
              "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(taps)}}
    return _write(folder, config, _backbone(hidden, len(taps), gen))


def speculators_folder(folder: Path, target, taps: list[int], *, kind: str, block_size: int,
                       mask_token_id: int, sliding: bool = False,
                       sample_from_anchor: bool | None = None, seed: int = 2) -> Path:
    """A speculators DFlash/DSpark folder (RedHatAI's ``*-speculator.dspark`` with
    ``sliding``); ``sample_from_anchor`` None leaves the key out, as exports before it existed."""
    hidden, vocab, gen = _sizes(target, seed)
    # to_diff_dict: the keys equal to the base config's defaults are not written
    layer = {"model_type": "qwen3", "vocab_size": vocab, "hidden_size": hidden,
             "intermediate_size": INTER, "num_hidden_layers": LAYERS,
             "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
             "head_dim": HEAD_DIM, "max_position_embeddings": 40960,
             "tie_word_embeddings": False,
             "layer_types": ["sliding_attention" if sliding else "full_attention"] * LAYERS,
             "use_sliding_window": sliding, "sliding_window": 2048 if sliding else None}
    config = {"architectures": ["DSparkDraftModel" if kind == "dspark" else "DFlashDraftModel"],
              "speculators_model_type": kind, "speculators_version": "0.7.0",
              "speculators_config": {"algorithm": kind, "proposal_methods": [
                  {"proposal_type": "greedy", "speculative_tokens": block_size,
                   "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                  "default_proposal_method": "greedy",
                  "verifier": {"name_or_path": "tiny", "architectures": ["LlamaForCausalLM"]}},
              "transformer_layer_config": layer, "draft_vocab_size": vocab,
              "block_size": block_size, "target_hidden_size": None,
              "aux_hidden_state_layer_ids": [t + 1 for t in taps],
              "mask_token_id": mask_token_id, "sliding_window_non_causal": False}
    if sample_from_anchor is not None:
        config["sample_from_anchor"] = sample_from_anchor
    tensors = {**_backbone(hidden, len(taps), gen), **_target_tables(target)}
    if kind == "dspark":
        config.update(markov_rank=8, markov_head_type="vanilla", enable_confidence_head=True,
                      confidence_head_with_markov=True)
        tensors.update(_markov_tensors(vocab, hidden, 8, gen))
    return _write(folder, config, tensors)


def gemma4_dspark_config(folder: Path) -> Path:
    """The config of ``deepseek-ai/dspark_gemma4_12b_block7`` (gemma4_text layers), shrunk."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Gemma4DSparkModel"], "model_type": "gemma4_text",
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "global_head_dim": 32, "num_global_key_value_heads": 1, "attention_k_eq_v": True,
        "intermediate_size": 96, "vocab_size": 96, "layer_types": ["full_attention"] * 2,
        "block_size": 7, "mask_token_id": 4, "target_layer_ids": [0, 1], "markov_rank": 8,
        "markov_head_type": "vanilla", "enable_confidence_head": True,
        "confidence_head_with_markov": True, "num_anchors": 512}))
    return folder
