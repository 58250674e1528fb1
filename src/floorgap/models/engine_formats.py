"""Block drafters as serving-engine checkpoint folders: export and import.

A folder holds ``config.json`` and the drafter's own weights in ``model.safetensors`` (or shards
listed by ``model.safetensors.index.json``). The target's embedding and output head, which the
drafter borrows, are never written: an engine loads them from the target. File tensor names are
the drafter's ``state_dict`` names without the ``backbone.`` prefix (``fc.weight``,
``layers.{i}.self_attn.q_proj.weight``, ``norm.weight``, ``markov_head.markov_w1.weight``, ...).

Formats (:data:`FORMATS`)
-------------------------
``dflash``       SGLang/vLLM ``DFlashDraftModel``: a Qwen3 config plus ``block_size``,
                 ``target_hidden_size`` and ``dflash_config`` (``target_layer_ids`` are the
                 0-based target decoder layers, i.e. ``DrafterConfig.taps``).
``dspark``       ``Qwen3DSparkModel``, the layout of DeepSpec's releases
                 (``deepseek-ai/{dflash,dspark}_qwen3_*_block7``; written by
                 ``deepspec/modeling/dspark/qwen3/config.py``) and the architecture vLLM's and
                 SGLang's DSpark load for a Qwen3 target: a flat Qwen3 config plus top-level
                 ``block_size``, ``target_layer_ids``, ``mask_token_id``, ``markov_rank`` and the
                 confidence keys, no ``target_hidden_size``; anchor-row blocks. ``markov_rank``
                 0 is DeepSpec's DFlash (no Markov head): a dflash drafter with anchor rows.
                 (``DSparkDraftModel``, which this layout was once written as, is read too; vLLM
                 registers that name for DeepSeek-V4's DSpark, so it is no longer written.)
``speculators``  The speculators package (``DFlashSpeculator``/``DSparkSpeculator``): the Qwen3
                 fields nested in ``transformer_layer_config``; ``aux_hidden_state_layer_ids``
                 index ``hidden_states`` (entry 0 is the embedding), so they are taps + 1.
``floorgap``     This repository's own layout for what no engine runs: the prefix-attention kind
                 (``head.*`` weights) and the short-convolution/slot-embedding extras. It is the
                 dspark-style config plus ``floorgap_config`` (the full ``DrafterConfig``). No
                 serving engine loads it.

Trimmed vocabulary and mask embedding (both as vLLM's DFlash model, ``qwen3_dflash.py``, and
EAGLE-3 load them). A drafter with a draft vocabulary of N tokens writes ``draft_vocab_size: N``
at the top level (``vocab_size`` stays the target's), its head rows as ``lm_head.weight``
[N, hidden] and ``d2t`` (int64 [N], the offset of draft index i: target id = i + d2t[i]); no
``t2d`` (vLLM skips it). SGLang's DFlash has no reduced draft vocabulary (its draft borrows
the target's head), so such a folder serves in vLLM only. A trained mask embedding is written
as ``mask_embedding.pt``, ``{"embedding": [hidden], "mask_token_id": id}``, the file both
vLLM and SGLang read beside the weights (vLLM ignores a mask tensor inside the safetensors);
the config keeps the mask token id the engines feed.

Row convention. A DFlash block has gamma + 1 rows [committed, mask x gamma] and row k + 1
proposes slot k (engine ``block_size`` B gives B - 1 drafts): ``block_size = gamma + 1``.
DSpark and prefix attention sample from the anchor: gamma rows, row k proposes slot k, so
``block_size = gamma``. A folder's ``sample_from_anchor`` overrides its kind's convention
(``DrafterConfig.anchor_rows``); ``Qwen3DSparkModel`` folders are anchor-row without saying
so, and a speculators DSpark folder without the key is refused (exports before the key
existed used DFlash rows, later ones anchor rows: vllm-project/vllm#56792).

Layer configs: z-lab's and DeepSpec's folders have no ``target_hidden_size`` and speculators'
may leave it null (``fc`` then reads taps of the drafter's width); speculators write
``transformer_layer_config`` as a diff, so what it leaves out is Qwen3's default. What no
import runs is refused by field name: sliding-window layers (``layer_types``), a tap on the
embedding (DeepSpec's ``-1``), Gemma-4 drafters (``Gemma4DSparkModel``), gated or recurrent
Markov heads.

Size: about 800 lines, because every layout's writer and its strict reader sit together (a
field added to one side is seen missing on the other), with the folder detection that
``floorgap inspect`` shares with the import.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from floorgap.config import KIND_ORDER
from floorgap.models.drafters import Drafter, DrafterConfig, build_drafter
from floorgap.models.targets import dtype_name, text_config
from floorgap.records import atomic_dir

__all__ = ["CONFIG_FILE", "FORMATS", "INDEX_FILE", "WEIGHTS_FILE", "BLOCK_LAYOUTS",
           "ENGINE_LAYOUTS", "declared_layout", "describe_folder", "detect_format",
           "export_drafter", "file_tensor_name", "import_drafter", "layout_reading",
           "read_engine_config", "resolve_checkpoint"]

FORMATS = ("dflash", "dspark", "speculators", "floorgap")
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MASK_EMBEDDING_FILE = "mask_embedding.pt"
INDEX_FILE = "model.safetensors.index.json"
DEFAULT_MAX_POSITIONS = 40960  # Qwen3's; engines size their rotary cache by it

_ENGINE_ARCH = {"dflash": "DFlashDraftModel", "dspark": "Qwen3DSparkModel"}
_LEGACY_ARCH = {"DSparkDraftModel": "dspark"}  # read, no longer written (see the docstring)
# released drafters whose layers are not Qwen3 decoder layers
_REFUSED_ARCH = {"Gemma4DSparkModel": "its layers are gemma4_text layers (global_head_dim, "
                                      "attention_k_eq_v, four norms and a scalar per layer)"}
_SPECULATORS_ARCH = {"dflash": "DFlashSpeculator", "dspark": "DSparkSpeculator"}
_FLOORGAP_ARCH = {"dflash": "FloorgapDFlashDraftModel", "dspark": "FloorgapDSparkDraftModel",
                  "prefix_attention": "FloorgapPrefixAttentionDraftModel"}
_OWN_PREFIXES = ("markov_head.", "confidence_head.", "head.")  # kept as is in files
_SHARED_PREFIXES = ("embed_tokens.", "lm_head.")                 # the target's tables
_EXTRAS = ("short_conv", "slot_embeddings")                      # no engine has these modules
_VOCAB_MAPS = ("d2t", "t2d")                                     # a trimmed vocabulary's maps
_MASK_PARAM = "mask_embed"                                       # in mask_embedding.pt


# --------------------------------------------------------------------------------------------
# Names


def file_tensor_name(name: str) -> str:
    """The file name of drafter ``state_dict`` entry ``name`` (engines have no ``backbone``)."""
    return name.removeprefix("backbone.")


def _drafter_name(file_name: str) -> str | None:
    """The ``state_dict`` name of file tensor ``file_name``; None for tensors that are not the
    drafter's own (the target's shared tables, rotary caches), which engines may store."""
    name = file_name.removeprefix("model.")
    if (name.startswith(_SHARED_PREFIXES) or "rotary_emb" in name.split(".")
            or name in _VOCAB_MAPS):
        return None
    return name if name.startswith(_OWN_PREFIXES) or name == _MASK_PARAM else f"backbone.{name}"


# --------------------------------------------------------------------------------------------
# Export


def export_drafter(drafter: Drafter, folder: str | os.PathLike[str], fmt: str, *,
                   target_name: str | None = None, target_architecture: str | None = None,
                   dtype: torch.dtype = torch.float32, num_target_layers: int | None = None,
                   max_position_embeddings: int = DEFAULT_MAX_POSITIONS) -> Path:
    """Write ``drafter`` as a ``fmt`` checkpoint folder (``config.json`` + ``model.safetensors``).

    ``target_name``/``target_architecture`` fill the speculators ``verifier``;
    ``num_target_layers`` is the target's depth for ``dflash_config`` (the drafter does not
    know it; default: the least depth its taps need, ``max(taps) + 1``). Weights are cast to
    ``dtype``; the default fp32 makes an export/import round trip bitwise.

    The folder is written beside its destination and renamed into place, so it exists
    completely or not at all; an earlier export there is replaced, any other folder is refused.
    Raises ValueError for a kind the format cannot hold (prefix attention, or the short_conv /
    slot_embeddings options, outside ``floorgap``).
    """
    cfg = drafter.cfg
    _check_exportable(cfg, fmt)
    depth = num_target_layers if num_target_layers is not None else max(cfg.taps) + 1
    state = {k: v.detach() for k, v in drafter.state_dict().items() if k != _MASK_PARAM}
    if fmt != "floorgap" and cfg.input_scale != 1.0:
        cfg, state = fold_input_scale(cfg, state)
    config = _export_config(cfg, fmt, dtype, depth, max_position_embeddings,
                            target_name, target_architecture)
    tensors = {file_tensor_name(k): v.to("cpu", dtype).contiguous() for k, v in state.items()}
    if drafter.trimmed:
        ids = drafter.draft_ids.detach().to("cpu", torch.int64)
        tensors["d2t"] = ids - torch.arange(len(ids), dtype=torch.int64)
        tensors["lm_head.weight"] = drafter.head_weight().detach().to("cpu", dtype).contiguous()
    mask = None
    if drafter.mask_embed is not None:
        mask = {"embedding": drafter.mask_embed.detach().to("cpu", dtype).contiguous(),
                "mask_token_id": int(cfg.mask_token_id)}
    return _write_folder(Path(folder), config, tensors, mask)


#: the residual branches' output maps, which a folded input scale divides
_BRANCH_OUTPUTS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def fold_input_scale(cfg: DrafterConfig, state: Mapping[str, torch.Tensor]
                     ) -> tuple[DrafterConfig, dict[str, torch.Tensor]]:
    """The same drafter with its block rows fed as they are (``input_scale`` 1), for layouts
    whose engines feed the embeddings unscaled (``init: target_scaled``).

    Rows times s make a residual stream s times the one of rows fed as they are with every
    branch output map (``o_proj``, ``down_proj``) divided by s; every RMS norm on the stream
    reads both alike once its epsilon is divided by s^2, and the norms off the stream (the
    fusion's, q/k) see a change of eps / |x|^2 (~1e-9 here). Raises ValueError for modules on
    the stream that do not scale (slot embeddings, short convolutions)."""
    s = float(cfg.input_scale)
    if cfg.slot_embeddings or cfg.short_conv:
        raise ValueError("an input scale folds into plain decoder layers only, not slot "
                         "embeddings or short convolutions")
    folded = {k: v / s if k.endswith(_BRANCH_OUTPUTS) else v for k, v in state.items()}
    return replace(cfg, input_scale=1.0, rms_eps=cfg.rms_eps / s ** 2), folded


def _check_exportable(cfg: DrafterConfig, fmt: str) -> None:
    if fmt not in FORMATS:
        raise ValueError(f"unknown checkpoint format {fmt!r}; expected one of {FORMATS}")
    if fmt == "floorgap":
        return
    if cfg.kind == "prefix_attention":
        raise ValueError("no engine runs the prefix_attention drafter; export it as 'floorgap'")
    if fmt == "dflash" and (cfg.kind != "dflash" or cfg.sample_from_anchor):
        raise ValueError(f"the dflash format holds a dflash drafter with DFlash rows, not a "
                         f"{cfg.kind} one{' with anchor rows' if cfg.sample_from_anchor else ''}"
                         " (export an anchor-row dflash drafter as dspark, markov_rank 0)")
    if fmt == "dspark" and (cfg.kind not in ("dflash", "dspark") or not cfg.sample_from_anchor):
        raise ValueError("the dspark format holds anchor-row dspark drafters and anchor-row "
                         f"dflash ones (markov_rank 0), not a {cfg.kind} drafter with DFlash rows")
    for option in _EXTRAS:
        if getattr(cfg, option):
            raise ValueError(f"the {fmt} format cannot hold a drafter with {option}=True (no "
                             "engine has that module); export it as 'floorgap'")


def _qwen3_fields(cfg: DrafterConfig, dtype: torch.dtype, max_positions: int) -> dict[str, Any]:
    """The Qwen3 decoder config of the drafter's layers (what engines build them from)."""
    return {"model_type": "qwen3", "hidden_size": cfg.hidden_size,
            "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
            "num_key_value_heads": cfg.n_kv_heads or cfg.n_heads,
            "head_dim": cfg.head_dim or cfg.hidden_size // cfg.n_heads,
            "intermediate_size": cfg.intermediate_size, "hidden_act": "silu",
            "rms_norm_eps": cfg.rms_eps, "rope_theta": cfg.rope_theta,
            "max_position_embeddings": max_positions, "vocab_size": cfg.vocab_size,
            "attention_bias": False, "tie_word_embeddings": False,
            "torch_dtype": dtype_name(dtype)}


def _export_config(cfg: DrafterConfig, fmt: str, dtype: torch.dtype, depth: int,
                   max_positions: int, target_name: str | None,
                   target_architecture: str | None) -> dict[str, Any]:
    qwen3 = _qwen3_fields(cfg, dtype, max_positions)
    if fmt == "speculators":
        config = _speculators_config(cfg, qwen3, target_name, target_architecture)
    elif fmt == "dspark":
        config = _dspark_config(cfg, qwen3, depth)
    else:
        config = _draft_model_config(cfg, fmt, qwen3, depth)
    if cfg.kind == "dspark":  # a vanilla Markov head whose embedding feeds the confidence
        config.update(markov_rank=cfg.markov_rank, markov_head_type="vanilla",
                      enable_confidence_head=True, confidence_head_with_markov=True)
    if cfg.draft_vocab is not None:
        config["draft_vocab_size"] = cfg.draft_vocab_size
    return config


def _draft_model_config(cfg: DrafterConfig, fmt: str, qwen3: dict[str, Any], depth: int
                        ) -> dict[str, Any]:
    """The ``dflash`` and ``floorgap`` layouts' config."""
    arch = _FLOORGAP_ARCH[cfg.kind] if fmt == "floorgap" else _ENGINE_ARCH[fmt]
    config: dict[str, Any] = {
        "architectures": [arch], **qwen3,
        "block_size": cfg.block_rows, "target_hidden_size": cfg.target_hidden,
        "dflash_config": {"block_size": cfg.block_rows, "target_layer_ids": list(cfg.taps),
                          "mask_token_id": cfg.mask_token_id, "num_target_layers": depth},
        # the block layout, declared: engines that read it run the rows as trained, and
        # `floorgap check` refuses a DFlash folder that does not say
        "sample_from_anchor": cfg.sample_from_anchor,
    }
    if cfg.kind != "dflash":
        config.update(mask_token_id=cfg.mask_token_id, enable_confidence_head=True)
    if fmt == "floorgap":
        # the import reads the vocabulary from d2t and the mask embedding from its file, as in
        # the other layouts
        config["floorgap_config"] = asdict(cfg)
    return config


def _dspark_config(cfg: DrafterConfig, qwen3: dict[str, Any], depth: int) -> dict[str, Any]:
    """``Qwen3DSparkModel``'s config, with the keys DeepSpec's ``build_draft_config`` writes."""
    config: dict[str, Any] = {
        "architectures": [_ENGINE_ARCH["dspark"]], **qwen3,
        "layer_types": ["full_attention"] * cfg.n_layers,
        "block_size": cfg.block_rows, "num_target_layers": depth,
        "target_layer_ids": list(cfg.taps), "mask_token_id": cfg.mask_token_id,
    }
    if cfg.kind != "dspark":  # DeepSpec's DFlash: no Markov head, no confidence head
        config.update(markov_rank=0, enable_confidence_head=False)
    return config


def _speculators_config(cfg: DrafterConfig, qwen3: dict[str, Any], target_name: str | None,
                        target_architecture: str | None) -> dict[str, Any]:
    return {
        "architectures": [_SPECULATORS_ARCH[cfg.kind]], "speculators_model_type": cfg.kind,
        "transformer_layer_config": qwen3, "draft_vocab_size": cfg.draft_vocab_size,
        "block_size": cfg.block_rows, "target_hidden_size": cfg.target_hidden,
        "aux_hidden_state_layer_ids": [t + 1 for t in cfg.taps],
        "mask_token_id": cfg.mask_token_id, "sample_from_anchor": cfg.sample_from_anchor,
        "torch_dtype": qwen3["torch_dtype"],
        "speculators_config": {
            "algorithm": cfg.kind,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": cfg.gamma}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": target_name,
                         "architectures": [target_architecture] if target_architecture else []},
        },
    }


# An export's own files, and the marker Snakemake leaves in a directory output.
_EXPORT_FILES = (CONFIG_FILE, WEIGHTS_FILE, INDEX_FILE, MASK_EMBEDDING_FILE, ".snakemake_timestamp")


def _write_folder(dest: Path, config: dict[str, Any], tensors: dict[str, Tensor],
                  mask: dict[str, Any] | None = None) -> Path:
    from safetensors.torch import save_file

    if dest.exists() and not _is_export(dest):
        raise ValueError(f"{dest} exists and is not a drafter checkpoint folder; not replacing it")
    with atomic_dir(dest) as tmp:
        (tmp / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(tmp / WEIGHTS_FILE), metadata={"format": "pt"})
        if mask is not None:
            with open(tmp / MASK_EMBEDDING_FILE, "wb") as fh:
                torch.save(mask, fh)   # a file object: the bytes do not depend on its name
    return dest


def _is_export(path: Path) -> bool:
    """Whether ``path`` is a folder that holds nothing but an earlier export's files."""
    return path.is_dir() and all(
        p.name in _EXPORT_FILES or (p.name.startswith("model-") and p.suffix == ".safetensors")
        for p in path.iterdir())


# --------------------------------------------------------------------------------------------
# Config reading


def _read_json(folder: Path) -> dict[str, Any]:
    path = folder / CONFIG_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{folder} has no {CONFIG_FILE}; not a drafter checkpoint folder")
    return json.loads(path.read_text())


def detect_format(config: Mapping[str, Any]) -> str:
    """The format of a parsed ``config.json`` (speculators type, floorgap config, architecture)."""
    archs = [str(a) for a in config.get("architectures") or []]
    if "speculators_model_type" in config:
        return "speculators"
    if "floorgap_config" in config or any(a in _FLOORGAP_ARCH.values() for a in archs):
        return "floorgap"
    for arch, why in _REFUSED_ARCH.items():
        if arch in archs:
            raise ValueError(f"architectures {arch} is not supported: {why}, which the "
                             "Qwen3-style drafter backbone cannot run")
    for arch, fmt in _LEGACY_ARCH.items():
        if arch in archs:
            return fmt
    for fmt, arch in _ENGINE_ARCH.items():
        if arch in archs:
            return fmt
    raise ValueError(f"unrecognised drafter checkpoint (architectures {archs}); expected one of "
                     f"{sorted(_ENGINE_ARCH.values())} or a speculators/floorgap config")


def _need(config: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in config or config[key] is None:
        raise ValueError(f"{where}: config.json lacks {key!r}")
    return config[key]


def _rope_theta(layer: Mapping[str, Any], where: str) -> float:
    if layer.get("rope_theta") is not None:
        return float(layer["rope_theta"])
    params = layer.get("rope_parameters") or {}  # transformers >= 5 nests it here
    if params.get("rope_theta") is not None and params.get("rope_type", "default") == "default":
        return float(params["rope_theta"])
    raise ValueError(f"{where}: config.json gives no plain rope_theta (scaled rotary embeddings "
                     "are not supported)")


def _layer_fields(layer: Mapping[str, Any], where: str) -> dict[str, Any]:
    """DrafterConfig fields of a Qwen3 layer config; refuses what the drafter cannot run."""
    if layer.get("hidden_act", "silu") != "silu" or layer.get("attention_bias", False):
        raise ValueError(f"{where}: only silu MLPs without attention biases are supported")
    kinds = list(layer.get("layer_types") or [])
    sliding = [i for i, t in enumerate(kinds) if t != "full_attention"]
    if sliding:
        raise ValueError(f"{where}: layer_types gives layers {sliding} {kinds[sliding[0]]!r} "
                         f"(window {layer.get('sliding_window')}); the drafter backbone runs "
                         "full attention only, which would be a different drafter")
    hidden = int(_need(layer, "hidden_size", where))
    heads = int(_need(layer, "num_attention_heads", where))
    return {
        "hidden_size": hidden,
        "n_layers": int(_need(layer, "num_hidden_layers", where)),
        "n_heads": heads,
        "n_kv_heads": int(layer.get("num_key_value_heads") or heads),
        "head_dim": int(layer.get("head_dim") or hidden // heads),
        "intermediate_size": int(_need(layer, "intermediate_size", where)),
        "rms_eps": float(layer.get("rms_norm_eps", 1e-6)),
        "rope_theta": _rope_theta(layer, where),
        "vocab_size": int(_need(layer, "vocab_size", where)),
    }


def _markov_fields(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    head_type = config.get("markov_head_type", "vanilla")
    if head_type != "vanilla":
        raise ValueError(f"{where}: markov_head_type {head_type!r} is not supported (only "
                         "'vanilla', a low-rank embedding + linear map)")
    if not config.get("confidence_head_with_markov", True):
        raise ValueError(f"{where}: a confidence head without the Markov embedding "
                         "(confidence_head_with_markov=false) is not supported")
    return {"markov_rank": int(_need(config, "markov_rank", where))}


#: The block layouts: 1+N (row 0 holds the anchor and proposes nothing, row k + 1 proposes
#: slot k; z-lab's DFlash) and anchor-first (row k proposes slot k; DeepSpec's, DSpark).
BLOCK_LAYOUTS = {False: "1+N", True: "anchor-first"}
#: Where folders declare their layout: floorgap's and llama.cpp's ``sample_from_anchor`` (top
#: level or in ``dflash_config``), SGLang's proposed ``dflash_config.query_zero_predicts_next``.
LAYOUT_FIELDS = ("sample_from_anchor", "dflash_config.sample_from_anchor",
                 "dflash_config.query_zero_predicts_next")
#: The layout each engine runs a folder of each served format with, whatever the folder
#: declares: vLLM 0.32's DFlash drafts from 1 + num_speculative_tokens query rows (bonus token
#: and masks) and reads no layout field; its DSpark and SGLang 0.5's DSPARK start at the anchor;
#: SGLang 0.5's DFLASH runs 1+N (a field to honour the declaration is an open proposal).
ENGINE_LAYOUTS = {"vllm": {"dflash": "1+N", "dspark": "anchor-first"},
                  "sglang": {"dflash": "1+N", "dspark": "anchor-first"}}


def declared_layout(config: Mapping[str, Any]) -> tuple[str, str] | None:
    """(layout, field) a folder's ``config.json`` declares (:data:`LAYOUT_FIELDS`), or None
    when it declares none. Two fields that disagree are a ValueError naming both."""
    found = {}
    for name in LAYOUT_FIELDS:
        section, _, key = name.rpartition(".")
        value = (config.get(section) or {}).get(key) if section else config.get(key)
        if value is not None:
            found[name] = BLOCK_LAYOUTS[bool(value)]
    if len(set(found.values())) > 1:
        raise ValueError("config.json declares two block layouts: "
                         + ", ".join(f"{k} ({v})" for k, v in found.items())
                         + "; keep the one the drafter was trained with")
    return next(((v, k) for k, v in found.items()), None)


def _block_fields(out: dict[str, Any], config: Mapping[str, Any], kind: str, block: int,
                  taps: list[int], mask: Any, where: str, anchor: bool | None) -> dict[str, Any]:
    """``out`` (the layer fields) completed with what every engine layout states about the
    block: kind, gamma and row convention, taps, target width, mask token and the DSpark
    Markov fields. ``anchor`` is the layout's row convention when the folder does not state
    ``sample_from_anchor``; None: the folder must state it."""
    declared = declared_layout(config)
    if declared is not None:
        anchor = declared[0] == BLOCK_LAYOUTS[True]
    if anchor is None:
        raise ValueError(f"{where}: config.json has no sample_from_anchor, and {kind} folders "
                         "of this layout exist with either block convention (anchor rows, or "
                         "DFlash rows where the anchor proposes nothing); add "
                         "sample_from_anchor: true or false, as the drafter was trained")
    bad = [t for t in taps if t < 0]
    if bad:
        raise ValueError(f"{where}: target layer ids {bad} read the embedding output; the "
                         "drafter taps decoder layers 0..L-1 only")
    target_hidden = config.get("target_hidden_size") or out["hidden_size"]
    out.update(kind=kind, gamma=block if anchor else block - 1, taps=taps,
               target_hidden=int(target_hidden), mask_token_id=None if mask is None else int(mask))
    if anchor != (kind != "dflash"):
        out["anchor_rows"] = anchor
    if kind == "dspark":
        out.update(_markov_fields(config, where))
    return out


def _draft_model_fields(config: Mapping[str, Any], fmt: str, where: str) -> dict[str, Any]:
    """Fields of the dflash (z-lab's, and this exporter's) and dspark (``Qwen3DSparkModel``)
    layouts; the kind of a dspark folder is its ``markov_rank``'s (0: dflash)."""
    dc = config.get("dflash_config") or {}
    out = _layer_fields(config, where)
    block = int(dc.get("block_size") or _need(config, "block_size", where))
    mask = dc.get("mask_token_id", config.get("mask_token_id"))
    ids = dc.get("target_layer_ids", config.get("target_layer_ids"))
    if ids is None:
        raise ValueError(f"{where}: config.json gives no target_layer_ids (top level or in "
                         "dflash_config)")
    kind = fmt
    if fmt == "dspark" and int(_need(config, "markov_rank", where)) == 0:
        kind = "dflash"
    return _block_fields(out, config, kind, block, [int(t) for t in ids], mask, where,
                         anchor=fmt == "dspark")


def _speculators_fields(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    from transformers import Qwen3Config

    kind = config["speculators_model_type"]
    if kind not in _SPECULATORS_ARCH:
        raise ValueError(f"{where}: speculators model type {kind!r} is not supported; expected "
                         f"one of {sorted(_SPECULATORS_ARCH)}")
    # written as a diff (to_diff_dict): what it leaves out is Qwen3's default
    layer = _need(config, "transformer_layer_config", where)
    out = _layer_fields({**Qwen3Config().to_dict(), **layer}, where)
    aux = _need(config, "aux_hidden_state_layer_ids", where)
    taps = [int(t) - 1 for t in aux]  # hidden_states[0] is the embedding output
    # speculators' DFlash always had DFlash rows; its DSpark took anchor rows with the key
    return _block_fields(out, config, kind, int(_need(config, "block_size", where)), taps,
                         config.get("mask_token_id"), where,
                         anchor=False if kind == "dflash" else None)


def _floorgap_fields(config: Mapping[str, Any], where: str) -> dict[str, Any]:
    known = {f.name for f in fields(DrafterConfig)}
    return {k: v for k, v in _need(config, "floorgap_config", where).items() if k in known}


def _config_fields(config: Mapping[str, Any], fmt: str, where: str) -> dict[str, Any]:
    if fmt == "speculators":
        return _speculators_fields(config, where)
    if fmt == "floorgap":
        return _floorgap_fields(config, where)
    return _draft_model_fields(config, fmt, where)


def read_engine_config(folder: str | os.PathLike[str], fmt: str | None = None
                       ) -> tuple[str, dict[str, Any]]:
    """(format, DrafterConfig fields) of checkpoint folder ``folder``.

    The format is detected from ``config.json`` unless ``fmt`` is given (then it must agree).
    ``gamma`` follows the row convention: block_size - 1 for dflash, block_size otherwise;
    ``taps`` are ``target_layer_ids`` (or speculators' aux ids - 1); ``vocab_size`` is the
    vocabulary the drafter was trained for. Unsupported variants raise ValueError.
    """
    folder = Path(folder)
    config = _read_json(folder)
    found = detect_format(config)
    if fmt is not None and fmt != found:
        raise ValueError(f"{folder} holds a {found} checkpoint, not {fmt}")
    return found, _config_fields(config, found, str(folder))


def describe_folder(folder: str | os.PathLike[str]) -> dict[str, Any]:
    """What the import makes of a checkpoint folder, from its ``config.json`` alone (no
    weights are read): layout, architecture, kind and order, gamma and block rows, taps,
    widths, vocabularies, attention and mask token. Raises ValueError naming the field an
    import would refuse."""
    folder = Path(folder)
    config = _read_json(folder)
    fmt, f = read_engine_config(folder)
    cfg = DrafterConfig(**{k: v for k, v in f.items() if k != "vocab_size"})
    layer = config.get("transformer_layer_config") or config
    n_layers = int(f.get("n_layers", cfg.n_layers))
    rows = "anchor" if cfg.sample_from_anchor else "dflash"
    return {
        "folder": str(folder), "layout": fmt,
        "architecture": (config.get("architectures") or [None])[0],
        "kind": cfg.kind, "order": KIND_ORDER[cfg.kind], "gamma": cfg.gamma,
        "block_rows": cfg.block_rows, "row_convention": rows,
        "rows": ("row k proposes slot k (row 0 the anchor)" if cfg.sample_from_anchor else
                 "row k + 1 proposes slot k (row 0 the anchor proposes nothing)"),
        "taps": list(cfg.taps), "layers": n_layers, "hidden_size": cfg.hidden_size,
        "target_hidden_size": f.get("target_hidden"), "heads": cfg.n_heads,
        "kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "vocab_size": f.get("vocab_size"),
        "draft_vocab_size": config.get("draft_vocab_size") or f.get("vocab_size"),
        "attention": list(layer.get("layer_types") or ["full_attention"] * n_layers),
        "mask_token_id": cfg.mask_token_id,
        "mask_embedding": (folder / MASK_EMBEDDING_FILE).is_file(),
        "markov_rank": cfg.markov_rank if cfg.kind == "dspark" else None,
        **layout_reading(config, fmt, BLOCK_LAYOUTS[cfg.sample_from_anchor]),
    }


def layout_reading(config: Mapping[str, Any], fmt: str, layout: str) -> dict[str, Any]:
    """How the folder's block layout is read: ``block_layout`` (the import's), the field that
    declares it (``layout_field``, None: the import assumed its layout's convention), and for
    a format the engines serve, the layout each engine runs it with (``engine_layouts``) and
    the engines that run it otherwise than it is read (``layout_mismatch``)."""
    declared = declared_layout(config)
    engines = {e: m[fmt] for e, m in ENGINE_LAYOUTS.items() if fmt in m}
    return {"block_layout": layout, "layout_field": declared[1] if declared else None,
            "engine_layouts": engines,
            "layout_mismatch": sorted(e for e, x in engines.items() if x != layout)}


# --------------------------------------------------------------------------------------------
# Import


def _with_gamma(cfg_fields: dict[str, Any], gamma: int | None, where: str) -> dict[str, Any]:
    """Fields evaluated at ``gamma`` slots instead of the stored block's: allowed when the
    block it needs fits in the stored one (fewer rows than trained is what the engines run
    when they cap the draft length)."""
    stored = int(cfg_fields["gamma"])
    if gamma is None or gamma == stored:
        return cfg_fields
    if gamma < 1:
        raise ValueError(f"{where}: gamma must be >= 1, got {gamma}")
    rows = DrafterConfig(kind=cfg_fields["kind"], gamma=gamma).block_rows
    stored_rows = DrafterConfig(kind=cfg_fields["kind"], gamma=stored).block_rows
    if rows > stored_rows:
        raise ValueError(f"{where}: gamma={gamma} needs {rows} block rows, the checkpoint's "
                         f"block has {stored_rows} (at most gamma={stored})")
    if cfg_fields.get("slot_embeddings"):
        raise ValueError(f"{where}: slot embeddings are trained for gamma={stored}; "
                         f"cannot evaluate at gamma={gamma}")
    return {**cfg_fields, "gamma": gamma}


def _check_target(cfg_fields: Mapping[str, Any], target_model: nn.Module, where: str) -> None:
    hidden = int(text_config(target_model.config).hidden_size)
    if int(cfg_fields["hidden_size"]) != hidden:
        raise ValueError(f"{where}: drafter hidden_size {cfg_fields['hidden_size']} differs from "
                         f"the target's {hidden} (the target's output head is shared)")
    vocab = int(target_model.get_output_embeddings().weight.shape[0])
    stored = cfg_fields.get("vocab_size")
    if stored is not None and int(stored) != vocab:
        raise ValueError(f"{where}: the drafter was trained for a vocabulary of {stored}, the "
                         f"target has {vocab}")
    mask = cfg_fields.get("mask_token_id")
    if mask is not None and not 0 <= int(mask) < vocab:
        raise ValueError(f"{where}: mask_token_id {mask} outside the target's vocabulary")


def _weight_files(folder: Path) -> list[Path]:
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [folder / f for f in sorted(set(weight_map.values()))]
    if (folder / WEIGHTS_FILE).is_file():
        return [folder / WEIGHTS_FILE]
    raise FileNotFoundError(f"{folder} has neither {WEIGHTS_FILE} nor {INDEX_FILE}")


def read_weights(folder: str | os.PathLike[str]) -> dict[str, Tensor]:
    """Every tensor of the folder's safetensors file or shards, by file name (on the CPU)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    tensors: dict[str, Tensor] = {}
    for path in _weight_files(folder):
        for name, value in load_file(str(path)).items():
            if name in tensors:
                raise ValueError(f"{folder}: tensor {name!r} is stored twice")
            tensors[name] = value
    return tensors


def _match_names(drafter: Drafter, tensors: Mapping[str, Tensor], where: str,
                 optional: set[str]) -> dict[str, tuple[str, Tensor]]:
    """drafter name -> (file name, tensor), checked: no unknown, missing or misshapen tensor."""
    expected = drafter.state_dict()
    matched: dict[str, tuple[str, Tensor]] = {}
    for file_name, value in tensors.items():
        name = _drafter_name(file_name)
        if name is None:
            continue
        if name not in expected:
            raise ValueError(f"{where}: unknown tensor {file_name!r} (the {drafter.cfg.kind} "
                             "drafter has no such parameter)")
        if tuple(value.shape) != tuple(expected[name].shape):
            raise ValueError(f"{where}: tensor {file_name!r} has shape {tuple(value.shape)}, "
                             f"the drafter expects {tuple(expected[name].shape)}")
        matched[name] = (file_name, value)
    missing = [file_tensor_name(n) for n in expected if n not in matched and n not in optional]
    if missing:
        raise ValueError(f"{where}: missing tensor {missing[0]!r}"
                         + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""))
    return matched


@torch.no_grad()
def _load_strict(drafter: Drafter, tensors: Mapping[str, Tensor], where: str,
                 optional: set[str]) -> None:
    """Load the file tensors into ``drafter``, cast to its dtype and device; ``optional``
    drafter names that are absent are zero."""
    matched = _match_names(drafter, tensors, where, optional)
    state = {}
    for name, current in drafter.state_dict().items():
        value = matched[name][1] if name in matched else torch.zeros_like(current)
        state[name] = value.to(device=current.device, dtype=current.dtype)
    drafter.load_state_dict(state, strict=True)


def import_drafter(folder: str | os.PathLike[str], target_model: nn.Module, *,
                   fmt: str | None = None, gamma: int | None = None) -> Drafter:
    """A :class:`Drafter` on ``target_model`` from checkpoint folder ``folder``.

    The format is detected from ``config.json`` unless ``fmt`` is given. ``gamma`` overrides
    the slots implied by the stored block_size (e.g. a DFlash trained with block size 16
    evaluated at gamma 7) when the block it needs fits. Weights load strictly: an unknown,
    missing or misshapen tensor raises ValueError naming it and the folder. The target's
    tables (``embed_tokens.*``, ``lm_head.*``, also under ``model.``) and ``rotary_emb.*`` are
    skipped, and a ``model.`` prefix is accepted. A missing ``confidence_head.proj.bias`` is
    zero, as is the whole confidence head of a checkpoint trained without one
    (``enable_confidence_head: false``; it does not enter the proposal). Weights are cast to
    the drafter's dtype.
    """
    folder = Path(folder)
    where = str(folder)
    config = _read_json(folder)
    _, cfg_fields = read_engine_config(folder, fmt)
    cfg_fields = _with_gamma(cfg_fields, gamma, where)
    _check_target(cfg_fields, target_model, where)
    tensors = read_weights(folder)
    mask = _read_mask_embedding(folder, cfg_fields.get("mask_token_id"), where)
    cfg_fields = {**cfg_fields, "mask_embedding": mask is not None,
                  "draft_vocab": _draft_vocabulary(config, tensors, target_model, where)}
    drafter = build_drafter(DrafterConfig(**cfg_fields), target_model)
    optional = {"confidence_head.proj.bias"}
    if not config.get("enable_confidence_head", True):
        optional.add("confidence_head.proj.weight")
    if mask is not None:
        tensors = {**tensors, _MASK_PARAM: mask}
    _load_strict(drafter, tensors, where, optional)
    return drafter


def _draft_vocabulary(config: Mapping[str, Any], tensors: Mapping[str, Tensor],
                      target_model: nn.Module, where: str) -> list[int] | None:
    """The target ids of a trimmed draft vocabulary (``draft_vocab_size`` below the target's
    vocabulary, ``d2t`` offsets, ``lm_head.weight`` the target's rows there); None for a
    full one. A head of its own (rows that are not the target's) is refused: the drafter
    shares the target's head."""
    head = target_model.get_output_embeddings().weight
    vocab = int(head.shape[0])
    n = config.get("draft_vocab_size")
    if n is None or int(n) == vocab:
        return None
    n = int(n)
    d2t = tensors.get("d2t", tensors.get("model.d2t"))
    if d2t is None or tuple(d2t.shape) != (n,):
        raise ValueError(f"{where}: draft_vocab_size {n} needs a d2t tensor of shape ({n},) "
                         "(target id = draft index + d2t)")
    ids = torch.arange(n, dtype=torch.int64) + d2t.to(torch.int64)
    if bool((ids < 0).any() or (ids >= vocab).any()) or bool((ids[1:] <= ids[:-1]).any()):
        raise ValueError(f"{where}: d2t maps the draft vocabulary outside the target's "
                         f"{vocab} tokens or not in ascending order")
    rows = tensors.get("lm_head.weight")
    if rows is None:
        raise ValueError(f"{where}: a trimmed vocabulary needs lm_head.weight [{n}, hidden] "
                         "(engines size the draft head by draft_vocab_size)")
    mine = head.detach().to("cpu")[ids].to(rows.dtype)
    if tuple(rows.shape) != tuple(mine.shape) or not torch.equal(rows, mine):
        raise ValueError(f"{where}: lm_head.weight is not the target's output head at the "
                         "d2t rows; a draft head of its own is not supported")
    return ids.tolist()


def _read_mask_embedding(folder: Path, mask_token_id: int | None, where: str) -> Tensor | None:
    """The trained mask embedding of ``mask_embedding.pt`` (a tensor, or ``{"embedding",
    "mask_token_id"}`` whose id must be the config's), or None."""
    path = folder / MASK_EMBEDDING_FILE
    if not path.is_file():
        return None
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, Mapping):
        if mask_token_id is not None and int(obj.get("mask_token_id", mask_token_id)) != \
                int(mask_token_id):
            raise ValueError(f"{where}: {MASK_EMBEDDING_FILE} is for mask token "
                             f"{obj['mask_token_id']}, config.json says {mask_token_id}")
        obj = obj["embedding"]
    return obj.reshape(-1)


# --------------------------------------------------------------------------------------------
# Config entries


def resolve_checkpoint(entry: Mapping[str, Any]) -> Path:
    """The local folder of a checkpoint config entry ``{format, path}`` or
    ``{format, hub, revision?}``.

    A ``path`` must be a folder holding ``config.json``. A ``hub`` id is fetched with
    ``huggingface_hub.snapshot_download`` (``config.json`` and the safetensors files only);
    when that fails the error says the hub is unreachable and to give ``path`` to a downloaded
    folder instead. The hub branch is not exercised by the tests (they run without network).
    """
    fmt = entry.get("format")
    if fmt not in FORMATS:
        raise ValueError(f"checkpoint entry {dict(entry)}: format must be one of {FORMATS}")
    if ("path" in entry) == ("hub" in entry):
        raise ValueError(f"checkpoint entry {dict(entry)}: give exactly one of 'path' and 'hub'")
    if "path" in entry:
        path = Path(entry["path"]).expanduser()
        if not (path / CONFIG_FILE).is_file():
            raise FileNotFoundError(f"checkpoint folder {path} does not exist or has no "
                                    f"{CONFIG_FILE}")
        return path
    return _download(str(entry["hub"]), entry.get("revision"))


def _download(repo_id: str, revision: str | None) -> Path:
    try:
        from huggingface_hub import snapshot_download

        local = snapshot_download(repo_id=repo_id, revision=revision,
                                  allow_patterns=[CONFIG_FILE, "*.safetensors*"])
    except Exception as exc:  # offline hubs fail with many error types; all mean the same
        raise ConnectionError(
            f"could not fetch {repo_id}" + (f"@{revision}" if revision else "")
            + f" from the Hugging Face hub ({type(exc).__name__}: {exc}); the hub may be "
            "unreachable from here: download the folder elsewhere and give its 'path' instead"
        ) from exc
    return Path(local)
