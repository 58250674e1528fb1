"""``floorgap bench rollouts``: the rollout probe against ``generate`` on a materialised target,
or at a paper target's published shape, shared prefix against copied prefix."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import floorgap.probes.rollouts as rollouts
from floorgap.bench.timing import Row, median_time, sync
from floorgap.data.domains import load_domain
from floorgap.models.model_cards import PUBLISHED_CONFIGS, published_config
from floorgap.models.shared_prefix import SharedPrefixCache, copied_prefix, shared_prefix_support
from floorgap.models.targets import chat_prompt_ids, load_target, torch_dtype
from floorgap.probes.rollouts import sample_block
from floorgap.resources import DTYPE_BYTES, GIB, PROCESS_BYTES, ModelShape, probe_jobs
from floorgap.sampling import SamplingLaw
from floorgap.seeds import BASE_SEED


def _bench_prompt(tokenizer: Any, target_tokens: int) -> list[int]:
    """A real chat-formatted prompt of about ``target_tokens`` tokens: the shipped Arena-Hard
    prompt whose templated length is closest to it."""
    best: list[int] | None = None
    for prompt in load_domain("arena-hard", BASE_SEED).prompts:
        ids = chat_prompt_ids(tokenizer, prompt.text)
        if best is None or abs(len(ids) - target_tokens) < abs(len(best) - target_tokens):
            best = ids
    assert best is not None
    return best


class ForwardCounter:
    """Counts the forwards of ``model`` and the prefix copies of the rollout probe's caches
    (rows of a copied prefix; 1 for a shared one) while active."""

    def __init__(self, model: Any) -> None:
        self.model, self.forwards, self.prefix_copies = model, 0, 0

    def __enter__(self) -> ForwardCounter:
        self._rollouts, self._path_cache = rollouts, rollouts.path_cache

        def counted(model: Any, prefix_cache: Any, rows: int) -> Any:
            cache = self._path_cache(model, prefix_cache, rows)
            self.prefix_copies += 1 if isinstance(cache, SharedPrefixCache) else rows
            return cache

        rollouts.path_cache = counted
        self._hook = self.model.register_forward_pre_hook(
            lambda *_: setattr(self, "forwards", self.forwards + 1))
        return self

    def __exit__(self, *exc: Any) -> None:
        self._rollouts.path_cache = self._path_cache
        self._hook.remove()


def _shape_model(name: str, layers: int | None, dtype: str, device: torch.device) -> Any:
    """A random-weight model of the published config ``name`` (``--shape``), ``layers`` deep
    when given (the widths kept: the count of forwards does not depend on depth)."""
    config = published_config(name)
    if layers:
        config.num_hidden_layers = int(layers)
        if getattr(config, "layer_types", None):
            config.layer_types = config.layer_types[:int(layers)]
    torch.manual_seed(0)
    default = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch_dtype(dtype))
        with torch.device(device):
            from transformers import AutoModelForCausalLM
            return AutoModelForCausalLM.from_config(config).eval()
    finally:
        torch.set_default_dtype(default)


BASELINE = "copied prefix (today's probe)"


def _shape_rollouts(args: argparse.Namespace) -> list[Row]:
    """``--shape``: the probe at a paper target's real widths on random weights and random
    context tokens: today's probe (copied prefix, ``--baseline-forward-batch``, J forwards per
    step) against the shared prefix (``--forward-batch``), seconds per anchor, forwards per
    anchor, prefix copies, peak device memory beside the plan."""
    names = {h.split("/")[-1].lower(): h for h in PUBLISHED_CONFIGS}
    hub = names.get(args.shape)
    if hub is None:
        raise SystemExit(f"--shape {args.shape}: one of {sorted(names)}")
    device = torch.device(args.device)
    model = _shape_model(hub, args.layers, args.dtype, device)
    shape = ModelShape.from_config({**PUBLISHED_CONFIGS[hub],
                                    "num_hidden_layers": model.config.num_hidden_layers})
    gen = torch.Generator().manual_seed(1)
    ctx = torch.randint(0, shape.vocab - 1000, (args.context,), generator=gen).tolist()
    M, gamma, J = args.paths, args.gamma, args.reveal_paths
    depth = (f"{model.config.num_hidden_layers} of "
             f"{PUBLISHED_CONFIGS[hub]['num_hidden_layers']} layers")
    rows = [Row(f"{hub} shape, random weights", None, "",
                f"{depth}, {args.dtype}, context {args.context}, M={M} gamma={gamma} J={J}")]
    times = {}
    for label, fb, ctxm in ((BASELINE, args.baseline_forward_batch, copied_prefix),
                            ("shared prefix", args.forward_batch, None)):
        def once(seed: int) -> None:
            sample_block(model, ctx, n_paths=M, gamma=gamma, law=SamplingLaw(),
                         anchor_seed=seed, forward_batch=fb, reveal_paths=J)
        with ctxm() if ctxm else contextlib.nullcontext():
            once(0)   # warm-up
            if device.type == "cuda":
                torch.cuda.synchronize(device)
                torch.cuda.reset_peak_memory_stats(device)
            with ForwardCounter(model) as counter:
                start = time.perf_counter()
                for r in range(args.repeats):
                    once(r + 1)
                sync(device)
                times[label] = (time.perf_counter() - start) / args.repeats
        peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
        settings = {"targets": {"t": {"dtype": args.dtype}}, "anchors": {"gamma": gamma},
                    "corpus": {"max_prompt_tokens": args.context, "max_new_tokens": 0,
                               "batch_size": 1},
                    "rollouts": {"forward_batch": fb, "paths": M, "reveal_paths": J},
                    "mi": {"paths": M, "screen_paths": M},
                    "drafters": {"training_data": {"max_new_tokens": 0}}}
        plan_shape = shape if ctxm is None else dataclasses.replace(shape, shared_prefix=False)
        weights = plan_shape.parameters * DTYPE_BYTES[args.dtype]
        plan = sum(probe_jobs(settings, "t", plan_shape, weights)["rollouts"].values())
        rows += [Row(f"{label}, forward_batch={fb}", times[label], "s/anchor", ""),
                 Row("  forwards per anchor", counter.forwards / args.repeats, "",
                     "prefill, decode steps and reveal reads"),
                 Row("  prefix KV copies per anchor", counter.prefix_copies / args.repeats, "",
                     "rows holding the context's keys and values"),
                 Row("  peak device memory", None if peak is None else peak / GIB, "GiB",
                     f"plan {(plan + PROCESS_BYTES * (device.type == 'cuda')) / GIB:.1f} GiB "
                     "(floorgap.resources)")]
    rows.append(Row("shared over copied prefix", times[BASELINE] / times["shared prefix"], "x",
                    "same run"))
    return rows


def run_rollouts(args: argparse.Namespace) -> list[Row]:
    """The rollout probe (one prefill shared by all paths) against ``generate`` with
    ``num_return_sequences=M`` (which prefills every copy), both returning the full-vocabulary
    next-token distribution at every slot of every path; and, at each forward batch, the
    probe on a per-row copy of the prefix's cache against the same probe with the prefix
    shared (:mod:`floorgap.models.shared_prefix`, where the model takes it), with
    ``--reveal-paths`` J revealed predecessors (one batched forward per step when shared).
    ``--shape``: at a paper target's widths instead (:func:`_shape_rollouts`)."""
    if args.shape:
        return _shape_rollouts(args)
    if not Path(args.model_dir, "floorgap_model.json").is_file():
        raise SystemExit(f"{args.model_dir} is not a materialised target; build it with "
                         f"`snakemake --cores all {args.model_dir}`")
    device = torch.device(args.device)
    model, tokenizer = load_target(args.model_dir, args.dtype, device)
    ctx = _bench_prompt(tokenizer, args.prompt_tokens)
    M, gamma, J = args.paths, args.gamma, args.reveal_paths
    ids = torch.tensor([ctx], device=device)
    eos = tokenizer.eos_token_id
    why_not = shared_prefix_support(model.config)

    def probe(forward_batch: int, reveal: int) -> Callable[[], Any]:
        return lambda: sample_block(model, ctx, n_paths=M, gamma=gamma, law=SamplingLaw(),
                                    anchor_seed=1, forward_batch=forward_batch,
                                    reveal_paths=reveal)

    @torch.inference_mode()
    def baseline() -> Any:
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True,
                             temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=gamma,
                             min_new_tokens=gamma, num_return_sequences=M,
                             return_dict_in_generate=True, output_logits=True,
                             pad_token_id=eos)
        return [torch.softmax(step.float(), -1) for step in out.logits]

    t_base = median_time(baseline, args.repeats, device)
    rows = [Row("generate(num_return_sequences=M)", t_base, "s",
                f"M={M} gamma={gamma}, prompt {len(ctx)} tokens, {args.dtype}, "
                f"shared prefix: {why_not or 'yes'}")]
    for fb in sorted({args.forward_batch, M}):
        with copied_prefix():
            t_copy = median_time(probe(fb, J), args.repeats, device)
        rows.append(Row(f"rollout probe, copied prefix, forward_batch={fb}, J={J}", t_copy,
                        "s", "prefill once, a cache copy per row, J reveal forwards per step"))
        t = t_copy
        if why_not is None:
            t = median_time(probe(fb, J), args.repeats, device)
            rows += [Row(f"rollout probe, shared prefix, forward_batch={fb}, J={J}", t, "s",
                         "prefix KV held once, the J reveals in one forward per step"),
                     Row(f"  shared over copied prefix (fb={fb})", t_copy / t, "x", "")]
        rows += [Row(f"  speed-up over generate (fb={fb})", t_base / t, "x",
                     "goal >= 3x" if J == 0 else "the probe also reads J reveals"),
                 Row(f"  throughput (fb={fb})", M * gamma / t, "tok/s",
                     "sampled tokens with full-vocabulary reads")]
    return rows
