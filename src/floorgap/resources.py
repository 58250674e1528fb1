"""A resource plan before submission: the peak device and host memory of every job that runs
the target through floorgap's own probes, from the target's ``config.json``, the config's
sizes and the longest context, checked against what the job asks SLURM for.

The estimates count what dominates at paper scale and nothing else:

* **weights**: the safetensors files of the materialised target (or, without them, the
  parameter count of its config) in the target's dtype;
* **KV cache**: 2 x layers x kv_heads x head_dim values per token and row, for the rows of one
  forward over the longest context the job reads. Where the target decodes its paths with a
  shared prefix (:func:`floorgap.attention.shared_prefix_support`) the rollouts and MI hold the
  context once and only the paths' own tokens per row, and their attention scores over the
  context ``[rows, heads, queries, context]`` (scores, their copy joined with the suffix's and
  the float32 softmax) are counted instead;
* **full-vocabulary tensors** the probes keep on the device in float32: the rollouts' p_k of
  every path and slot ``[gamma, M, V]`` and the revealed predecessors ``[gamma, J, M, V]``, the
  logits of one forward ``[rows, V]`` (three copies: logits, the law's softmax, the sample's
  cumulative sum), and a teacher-forced forward's ``[tokens, V]``.

The longest context is what the corpus can hold: ``corpus.max_prompt_tokens +
corpus.max_new_tokens`` (anchors sit inside the responses), plus gamma. Weights are read
straight onto the device (``models.targets.load_target``), so a GPU job's host memory is the
process baseline; a CPU job holds everything in host memory. The engine-run jobs (serving,
the local API server) size their own caches (vLLM's ``gpu_memory_utilization``) and are
checked for the weights only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from floorgap.attention import shared_prefix_support

GIB = 1024 ** 3
# Python, torch and CUDA context of one job in host memory (measured: ~1.5 GB for a CPU job of
# the smoke target before its first forward); a CUDA context takes about as much on the device
PROCESS_BYTES = 2 * GIB
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
QK_NORM_MODELS = ("qwen3", "gemma3", "gemma4")


@dataclass(frozen=True)
class ModelShape:
    """What the plan reads of a target's ``config.json`` (its text config for a multimodal
    target)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qk_norm: bool = False  # per-head query and key norms (Qwen3, Gemma-3/4)
    shared_prefix: bool = False  # paths decode after a context held once

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ModelShape:
        text = config.get("text_config") or config
        heads = int(text["num_attention_heads"])
        hidden = int(text["hidden_size"])
        return cls(layers=int(text["num_hidden_layers"]), hidden=hidden, heads=heads,
                   kv_heads=int(text.get("num_key_value_heads") or heads),
                   head_dim=int(text.get("head_dim") or hidden // heads),
                   intermediate=int(text["intermediate_size"]), vocab=int(text["vocab_size"]),
                   tied=bool(config.get("tie_word_embeddings",
                                        text.get("tie_word_embeddings", False))),
                   qk_norm=str(text.get("model_type", "")).startswith(QK_NORM_MODELS),
                   shared_prefix=shared_prefix_support(config) is None)

    @property
    def parameters(self) -> int:
        """Embedding, head (unless tied), attention and SwiGLU MLP of every layer, norms
        (a dense decoder's; a mixture-of-experts config is not estimated)."""
        attn = self.hidden * self.heads * self.head_dim * 2 \
            + self.hidden * self.kv_heads * self.head_dim * 2
        per_layer = attn + 3 * self.hidden * self.intermediate + 2 * self.hidden \
            + (2 * self.head_dim if self.qk_norm else 0)
        tables = self.vocab * self.hidden * (1 if self.tied else 2)
        return tables + self.layers * per_layer + self.hidden

    def kv_bytes(self, tokens: int, rows: int, dtype_bytes: int) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * tokens * rows * dtype_bytes

    def path_parts(self, context: int, new: int, queries: int, rows: int, dtype_bytes: int
                   ) -> dict[str, int]:
        """The cache (and, with a shared prefix, the attention scores) of ``rows`` paths that
        hold ``new`` tokens after ``context`` and read ``queries`` tokens per forward."""
        if not self.shared_prefix:
            return {"kv_cache": self.kv_bytes(context + new, rows, dtype_bytes)}
        scores = rows * self.heads * queries * (context + new)
        return {"kv_cache": self.kv_bytes(context, 1, dtype_bytes)
                + self.kv_bytes(new, rows, dtype_bytes),
                "attention_scores": scores * (3 * dtype_bytes + 4)}


@dataclass
class JobPlan:
    """The estimate of one rule's jobs on one target, beside what the rule asks for."""

    rule: str
    target: str
    device_bytes: int
    host_bytes: int
    parts: dict[str, int] = field(default_factory=dict)
    gpus: int = 0
    mem_mb: int | None = None
    note: str = ""

    def problems(self, gpu_memory_gb: float) -> list[str]:
        """Why the job cannot fit what it declares (empty when it fits)."""
        out = []
        if self.gpus and self.device_bytes > gpu_memory_gb * GIB:
            biggest = max(self.parts, key=self.parts.get)
            out.append(f"{self.rule} ({self.target}): needs ~{self.device_bytes / GIB:.1f} GiB "
                       f"of GPU memory, the GPU has {gpu_memory_gb:g} GiB (largest part: "
                       f"{biggest}, {self.parts[biggest] / GIB:.1f} GiB)")
        if self.mem_mb is not None and self.host_bytes > self.mem_mb * 2 ** 20:
            out.append(f"{self.rule} ({self.target}): needs ~{self.host_bytes / GIB:.1f} GiB of "
                       f"host memory, the rule asks for mem_mb={self.mem_mb}")
        return out


def weight_bytes(model_dir: Path | None, shape: ModelShape, dtype: str) -> int:
    """The target's safetensors bytes when materialised, else its parameters in ``dtype``."""
    if model_dir is not None:
        files = list(Path(model_dir).glob("*.safetensors"))
        if files:
            return sum(f.stat().st_size for f in files)
    return shape.parameters * DTYPE_BYTES[dtype]


def _logits(rows: int, vocab: int) -> int:
    return 3 * rows * vocab * 4


def probe_jobs(cfg: Mapping[str, Any], target: str, shape: ModelShape, weights: int
               ) -> dict[str, dict[str, int]]:
    """Device-resident parts of each probe rule of ``target`` (its merged settings ``cfg``)."""
    dtype = cfg["targets"][target]["dtype"]
    b = DTYPE_BYTES[dtype]
    gamma = int(cfg["anchors"]["gamma"])
    context = int(cfg["corpus"]["max_prompt_tokens"]) + int(cfg["corpus"]["max_new_tokens"])
    ro = cfg["rollouts"]
    fb, m, j = int(ro["forward_batch"]), int(ro["paths"]), int(ro["reveal_paths"])
    v = shape.vocab
    # with a shared prefix the J reveals of a step are one forward of J queries per row
    reads = max(j, 1) if shape.shared_prefix else 1
    rollouts = {"weights": weights, **shape.path_parts(context, gamma + j, reads, fb, b),
                "path_probs": gamma * m * v * 4, "revealed": gamma * j * m * v * 4,
                "logits": _logits(fb * reads, v)}
    variants = {"weights": weights, **shape.path_parts(context, gamma, 1, fb, b),
                "path_probs": gamma * m * v * 4, "logits": _logits(fb, v)}
    mi_paths = max(int(cfg["mi"]["paths"]), int(cfg["mi"]["screen_paths"]))
    # MI's conditioned reads append up to gamma tokens per row in one forward
    mi = {"weights": weights, **shape.path_parts(context, gamma, gamma, fb, b),
          "path_probs": gamma * mi_paths * v * 4, "logits": _logits(fb, v)}
    cb = int(cfg["corpus"]["batch_size"])
    corpus = {"weights": weights, "kv_cache": shape.kv_bytes(context, cb, b),
              "logits": _logits(cb, v)}
    td = cfg["drafters"]["training_data"]
    tb = int(td.get("batch_size", cb))
    prompt = int(cfg["corpus"]["max_prompt_tokens"])
    seq = prompt + int(td["max_new_tokens"])
    # a data pass in another precision holds a cast copy beside the target; the cache holds at
    # most batch_tokens padded tokens; the prefill keeps every layer's states when it reads tap
    # features, else about two, for the whole batch where a sliding window forbids prefill
    # groups; each decode step's logits become float32 probabilities and a float64 cumulative
    # sum; the agreement checks' teacher-forced forwards read one sequence's logits (two laws
    # with a copy)
    db = DTYPE_BYTES[td.get("dtype", dtype)]
    copy = weights * db // b if db != b else 0
    cached = min(tb * seq, int(td.get("batch_tokens") or tb * seq))
    states = (shape.layers + 1 if td.get("store_features") else 2) * tb * prompt * shape.hidden
    drafter_data = {"weights": weights, "data_pass_copy": copy,
                    "kv_cache": shape.kv_bytes(cached, 1, db), "prefill_states": states * db,
                    "step_logits": tb * v * (4 + 4 + 8),
                    "teacher_forced_logits": (2 if copy else 1) * 2 * seq * v * 4}
    return {"rollouts": rollouts, "mi": mi, "floor_variants": variants,
            "corpus": corpus, "drafter_data": drafter_data,
            "serving": {"weights": weights}, "api_floors": {"weights": weights}}


def plan(settings: Mapping[str, Any], target: str, shape: ModelShape,
         model_dir: Path | None, declared: Mapping[str, Mapping[str, Any]]) -> list[JobPlan]:
    """The :class:`JobPlan` of every estimated rule of ``target``; ``declared`` maps a rule to
    the resources its jobs ask for (``gpu``, ``mem_mb``; rules absent from it do not run)."""
    entry = settings["targets"][target]
    weights = weight_bytes(model_dir, shape, entry["dtype"])
    on_gpu = str(entry["device"]).startswith("cuda")
    out = []
    for rule, parts in probe_jobs(settings, target, shape, weights).items():
        if rule not in declared:
            continue
        res = declared[rule]
        parts = {k: int(x) for k, x in parts.items() if x}
        total = sum(parts.values()) + (PROCESS_BYTES if on_gpu else 0)
        host = PROCESS_BYTES + (0 if on_gpu else sum(parts.values()))
        note = "engine-managed cache: weights only" if rule in ("serving", "api_floors") else ""
        out.append(JobPlan(rule, target, total if on_gpu else 0, host, parts,
                           gpus=int(res.get("gpu", 0) or 0),
                           mem_mb=int(res["mem_mb"]) if res.get("mem_mb") else None, note=note))
    return out


#: Headroom over the host estimate when a job's mem_mb is sized from it (allocator, libraries).
HOST_MARGIN = 1.25


def host_mem_mb(settings: Mapping[str, Any], target: str, rule: str, model_dir: str | Path,
                ceiling_mb: int) -> int:
    """``mem_mb`` of a probe job of ``target``, sized from the materialised model in
    ``model_dir`` (its plan's host memory with :data:`HOST_MARGIN`, in steps of 500 MB); before
    the model exists (a dry run) the rule's own ``ceiling_mb``."""
    config = Path(model_dir) / "config.json"
    if not config.is_file():
        return int(ceiling_mb)
    found = plan(settings, target, read_model_config(config), Path(model_dir), {rule: {}})
    if not found:
        return int(ceiling_mb)
    mb = found[0].host_bytes * HOST_MARGIN / 2 ** 20
    return int(-(-mb // 500) * 500)


def largest_forward_batch(settings: Mapping[str, Any], target: str, shape: ModelShape,
                          weights: int, gpu_memory_gb: float) -> int:
    """The largest rollouts.forward_batch whose rollouts job fits ``gpu_memory_gb`` (0: none)."""
    best = 0
    for fb in range(1, int(settings["rollouts"]["paths"]) + 1):
        trial = {**settings, "rollouts": {**settings["rollouts"], "forward_batch": fb,
                                          "reveal_paths": min(fb, settings["rollouts"]
                                                              ["reveal_paths"])}}
        need = sum(probe_jobs(trial, target, shape, weights)["rollouts"].values())
        if need + PROCESS_BYTES > gpu_memory_gb * GIB:
            break
        best = fb
    return best


def read_model_config(path: Path) -> ModelShape:
    return ModelShape.from_config(json.loads(Path(path).read_text()))
