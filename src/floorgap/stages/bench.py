"""Benchmarks of the project's hot paths.

    floorgap bench estimators [--json [PATH]] [--device cpu] [--threads N]
    floorgap bench rollouts [--model-dir results/models/smollm2-135m] [--paths 64]
                            [--forward-batch 16] [--reveal-paths 0]
    floorgap bench reveal [--model-dir results/models/smollm2-135m] [--results results]
                          [--target smollm2-135m] [--anchors-per-domain 4] [--max-reveal 8]
                          [--reveal-grid 1,2,4,8] [--bootstrap 2000] [--save-floors PATH]

Each subcommand is a function registered in ``BENCHMARKS``; it returns a list of result rows
(name, value, unit, note) that are printed as a table and optionally written as JSON. Inputs
are drawn with fixed seeds so runs are comparable.

Size: about 650 lines, three benchmarks (estimators, rollouts, reveal) behind one command,
each with its options, its timed runs and its table rows; the statistics they print come
from the library (:mod:`floorgap.analysis.reveal`, the estimators).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from floorgap.records import atomic_path


@dataclass(frozen=True)
class Row:
    """One benchmark result."""

    name: str
    value: float | None
    unit: str
    note: str = ""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_time(fn: Callable[[], Any], repeats: int, device: torch.device,
                warmup: int = 1) -> float:
    """Median wall time in seconds of ``repeats`` calls of ``fn`` after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _dirichlet(M: int, V: int, alpha: float, seed: int, dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    x = torch.as_tensor(rng.dirichlet(np.full(V, alpha), size=M))
    return (x / x.sum(-1, keepdim=True)).to(dtype=dtype, device=device)


# ------------------------------------------------------------------------- estimators

def bench_barycentre_vs_lp(args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Exact barycentre vs the HiGHS linear programme at M=64, V=1024 (float64)."""
    from floorgap.estimators.barycentre import tv_barycentre, tv_barycentre_lp

    M, V = 64, 1024
    rows: list[Row] = []
    t_bary, t_lp, diffs = [], [], []
    for i in range(args.lp_instances):
        P = _dirichlet(M, V, 0.1, seed=1000 + i, dtype=torch.float64, device=device)
        t_bary.append(median_time(lambda: tv_barycentre(P), args.repeats * 4, device))
        start = time.perf_counter()
        lp = tv_barycentre_lp(P, method=args.lp_method)
        t_lp.append(time.perf_counter() - start)
        diffs.append(abs(float(tv_barycentre(P).value) - float(lp.value)))
    tb, tl = statistics.median(t_bary), statistics.median(t_lp)
    note = f"M={M} V={V} float64, Dirichlet(0.1), {args.lp_instances} instance(s)"
    rows.append(Row("barycentre time (M=64,V=1024)", tb * 1e3, "ms", note))
    rows.append(Row(f"HiGHS LP time ({args.lp_method})", tl * 1e3, "ms", "tolerances 1e-10"))
    rows.append(Row("speed-up over HiGHS", tl / tb, "x", "goal >= 100"))
    rows.append(Row("max |value - LP value|", max(diffs), "", "goal <= 1e-9"))
    return rows


def bench_barycentre_vs_sort(args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Exact barycentre vs one torch.sort(P, dim=0) at M=256, V=49152 (float32)."""
    from floorgap.estimators.barycentre import tv_barycentre

    M, V = 256, 49152
    P = _dirichlet(M, V, 0.05, seed=2000, dtype=torch.float32, device=device)
    # Interleave the two measurements so that background load affects both alike.
    t_sort, t_bary = [], []
    for _ in range(args.repeats):
        t_sort.append(median_time(lambda: torch.sort(P, dim=0), 1, device))
        t_bary.append(median_time(lambda: tv_barycentre(P), 1, device))
    ts, tb = statistics.median(t_sort), statistics.median(t_bary)
    note = f"M={M} V={V} float32, median of {args.repeats}"
    return [Row("torch.sort(P, dim=0) time", ts * 1e3, "ms", note),
            Row("barycentre time (M=256,V=49152)", tb * 1e3, "ms", note),
            Row("barycentre / sort", tb / ts, "x", "goal <= 2")]


def bench_bootstrap(args: argparse.Namespace, device: torch.device) -> list[Row]:
    """Prompt bootstrap of 384 anchors x 7 slots with B = 10^4 replicates."""
    try:
        from floorgap.estimators.aggregate import prompt_bootstrap
    except (ImportError, AttributeError) as exc:
        return [Row("prompt bootstrap (384x7, B=1e4)", None, "ms", f"unavailable: {exc}")]
    n_anchors, n_prompts, n_slots, n_boot = 384, 170, 7, 10_000
    g = torch.Generator().manual_seed(3000)
    clusters = torch.cat([torch.arange(n_prompts),
                          torch.randint(0, n_prompts, (n_anchors - n_prompts,), generator=g)])
    num = torch.rand(n_anchors, n_slots, generator=g, dtype=torch.float64).to(device)
    pi = (0.2 + 0.8 * torch.rand(n_anchors, generator=g, dtype=torch.float64)).to(device)
    try:
        t = median_time(lambda: prompt_bootstrap(num, clusters, pi, n_boot=n_boot, seed=1),
                        max(3, args.repeats // 2), device)
    except TypeError as exc:  # signature differs from the one this benchmark expects
        return [Row("prompt bootstrap (384x7, B=1e4)", None, "ms", f"unavailable: {exc}")]
    return [Row("prompt bootstrap (384x7, B=1e4)", t * 1e3, "ms",
                f"{n_prompts} prompts, Hajek weights")]


def run_estimators(args: argparse.Namespace) -> list[Row]:
    device = torch.device(args.device)
    rows: list[Row] = []
    rows += bench_barycentre_vs_lp(args, device)
    rows += bench_barycentre_vs_sort(args, device)
    rows += bench_bootstrap(args, device)
    return rows


BENCHMARKS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                            Callable[[argparse.Namespace], list[Row]]]] = {}


def _estimators_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement")
    p.add_argument("--lp-instances", type=int, default=1,
                   help="random instances for the LP comparison")
    p.add_argument("--lp-method", default="highs-ipm",
                   choices=["highs", "highs-ipm", "highs-ds"],
                   help="HiGHS solver for the reference LP (highs-ipm is the fastest here)")


BENCHMARKS["estimators"] = ("barycentre vs LP and sort; prompt bootstrap",
                            _estimators_options, run_estimators)


# ------------------------------------------------------------------------- rollouts

def _bench_prompt(tokenizer: Any, target_tokens: int) -> list[int]:
    """A real chat-formatted prompt of about ``target_tokens`` tokens: the shipped Arena-Hard
    prompt whose templated length is closest to it."""
    from floorgap.data.domains import load_domain
    from floorgap.models.targets import chat_prompt_ids
    from floorgap.seeds import BASE_SEED

    best: list[int] | None = None
    for prompt in load_domain("arena-hard", BASE_SEED).prompts:
        ids = chat_prompt_ids(tokenizer, prompt.text)
        if best is None or abs(len(ids) - target_tokens) < abs(len(best) - target_tokens):
            best = ids
    assert best is not None
    return best


class _ForwardCounter:
    """Counts the forwards of ``model`` and the prefix copies of the rollout probe's caches
    (rows of a copied prefix; 1 for a shared one) while active."""

    def __init__(self, model: Any) -> None:
        self.model, self.forwards, self.prefix_copies = model, 0, 0

    def __enter__(self) -> _ForwardCounter:
        import floorgap.probes.rollouts as rollouts
        from floorgap.models.shared_prefix import SharedPrefixCache

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
    from floorgap.models.model_cards import published_config
    from floorgap.models.targets import torch_dtype

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
    from floorgap.models.model_cards import PUBLISHED_CONFIGS
    from floorgap.models.shared_prefix import copied_prefix
    from floorgap.probes.rollouts import sample_block
    from floorgap.resources import DTYPE_BYTES, GIB, PROCESS_BYTES, ModelShape, probe_jobs
    from floorgap.sampling import SamplingLaw

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
            with _ForwardCounter(model) as counter:
                start = time.perf_counter()
                for r in range(args.repeats):
                    once(r + 1)
                _sync(device)
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
    from pathlib import Path

    from floorgap.models.shared_prefix import copied_prefix, shared_prefix_support
    from floorgap.models.targets import load_target
    from floorgap.probes.rollouts import sample_block
    from floorgap.sampling import SamplingLaw

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


def _rollouts_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-dir", default="results/models/smollm2-135m",
                   help="materialised target folder (default: the embedded model)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--paths", type=int, default=64, help="M")
    p.add_argument("--gamma", type=int, default=8, help="block length")
    p.add_argument("--prompt-tokens", type=int, default=300, help="approximate prompt length")
    p.add_argument("--forward-batch", type=int, default=16, help="probe forward batch")
    p.add_argument("--reveal-paths", type=int, default=0,
                   help="J, revealed predecessors read per step (the importance route)")
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement")
    p.add_argument("--shape", default=None, metavar="qwen3-4b|qwen3-8b|qwen3-14b",
                   help="a paper target's published shape on random weights instead of a "
                        "materialised model (floorgap.models.model_cards)")
    p.add_argument("--layers", type=int, default=None,
                   help="with --shape: this many layers (CPU; forwards per anchor do not "
                        "depend on depth)")
    p.add_argument("--context", type=int, default=1024, help="with --shape: context tokens")
    p.add_argument("--baseline-forward-batch", type=int, default=32,
                   help="with --shape: forward batch of the copied-prefix baseline")


BENCHMARKS["rollouts"] = ("rollout probe vs generate(num_return_sequences=M)",
                          _rollouts_options, run_rollouts)


# ------------------------------------------------------------------------- reveal

def reveal_floors(block: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``[gamma, J]`` importance-route floors of each revealed predecessor j at each slot, and
    the Kish ESS of their weights (float64, CPU): the probe's
    :func:`floorgap.probes.rollouts.revealed_floors`, kept per j instead of averaged. Slot 0
    (no predecessor) and a j whose weights are all zero are NaN."""
    from floorgap.probes.rollouts import revealed_floors

    if block.revealed is None:
        raise ValueError("the block was sampled without revealed predecessors")
    gamma, J = block.probs.shape[0], block.revealed.shape[1]
    values = torch.full((gamma, J), float("nan"), dtype=torch.float64)
    ess = torch.full((gamma, J), float("nan"), dtype=torch.float64)
    for k in range(1, gamma):
        rw = revealed_floors(block, k)
        values[k] = rw.value.double().cpu()
        ess[k] = rw.ess.double().cpu()
    return values, ess


def _reveal_rows(J: int, st: dict[str, Any], ref: tuple[int, dict[str, Any]], *, last: int,
                 n_anchors: int, n_boot: int, n_prompts: int, level: float) -> list[Row]:
    """The rows of one J (``st``: its statistics from
    :func:`floorgap.analysis.reveal.reveal_stats`; ``ref`` = (J, statistics) of the reference J
    of the width ratios)."""
    rows: list[Row] = []
    for key, label in (("last", f"slot {last}"), ("mean", f"slots 1-{last} mean")):
        est, lo, hi, n_used, _ = st[key]
        ref_width = ref[1][key][2] - ref[1][key][1]
        rows += [Row(f"J={J} {label}: T1 reweighted", est, "",
                     f"Hajek; {level:.0%} [{lo:.4f}, {hi:.4f}], width {hi - lo:.4f}; "
                     f"{n_used} anchors"),
                 Row(f"J={J} {label}: interval width", hi - lo, "",
                     f"prompt bootstrap B={n_boot}, {n_prompts} prompts"),
                 Row(f"J={J} {label}: width ratio vs J={ref[0]}", (hi - lo) / ref_width, "x")]
    sd_all, sd_last = st["sd"]
    rows.append(Row(f"J={J} within-anchor sd over j", None if J < 2 else sd_all, "",
                    "needs J >= 2" if J < 2 else
                    f"mean over anchor x slots 1-{last}; slot {last}: {sd_last:.4f}"))
    rows.append(Row(f"J={J} within-j variance share", st["mean"][4], "",
                    f"approx., of the slot mean's bootstrap variance; slot {last}: "
                    f"{st['last'][4]:.3f}"))
    rows.append(Row(f"J={J} decode forwards per step", float(1 + J), "x",
                    "(1+J)/(1+0), relative to no reveal"))
    cells, empty = st["undefined"]
    rows.append(Row(f"J={J} undefined (j, slot, anchor) cells", float(cells), "n",
                    f"of {J * (last) * n_anchors}; anchor-slots with no defined j: {empty}"))
    return rows


def reveal_summary(floors: torch.Tensor, pi: torch.Tensor, prompts: list[str],
                   grid: list[int], *, n_boot: int, seed: int | None = None,
                   level: float = 0.95) -> list[Row]:
    """Per-J summary rows of the importance route from per-j floors
    (:func:`floorgap.analysis.reveal.reveal_stats`, which says what each number is): for the
    last slot and for the mean over slots 1..gamma-1 the Hajek mean with its interval, the
    width and its ratio to the first J of the grid; then the within-anchor sd over j, the
    within-j variance share, the decode forwards per step relative to no reveal, and the count
    of undefined cells."""
    from floorgap.analysis.reveal import reveal_stats

    floors = torch.as_tensor(floors, dtype=torch.float64)
    stats, n_clusters = reveal_stats(floors, pi, prompts, grid, n_boot=n_boot, seed=seed,
                                     level=level)
    n, gamma, _ = floors.shape
    first = min(stats)
    rows: list[Row] = []
    for J in sorted(stats):
        rows += _reveal_rows(J, stats[J], (first, stats[first]), last=gamma - 1,
                             n_anchors=n, n_boot=n_boot, n_prompts=n_clusters, level=level)
    return rows


def _reveal_anchors(args: argparse.Namespace) -> tuple[list[Any], list[list[int]], list[str],
                                                        int]:
    """The first ``--anchors-per-domain`` anchor rows of every domain file (file order), their
    contexts, the domains and gamma (``--gamma``, else the anchors' metadata, else 7)."""
    from pathlib import Path

    from floorgap.data.anchors import anchor_contexts, check_anchors_gamma
    from floorgap.records import read_metadata, read_table

    base = Path(args.results, args.target)
    files = sorted((base / "anchors").glob("*.parquet"))
    if not files:
        raise SystemExit(f"no anchors under {base / 'anchors'}")
    gamma = args.gamma
    anchor_rows, contexts, domains = [], [], []
    for path in files:
        meta = read_metadata(path)
        if gamma is None:
            gamma = int(meta.get("gamma", 7))
        check_anchors_gamma(path, meta, gamma)
        anchors = read_table(path).head(args.anchors_per_domain)  # file order
        contexts += anchor_contexts(read_table(base / "corpus" / path.name), anchors)
        anchor_rows += list(anchors.itertuples(index=False))
        domains.append(path.stem)
    assert gamma is not None
    if gamma < 2:
        raise SystemExit("the importance route needs gamma >= 2")
    return anchor_rows, contexts, domains, gamma


def _save_reveal_floors(path: str, floors: torch.Tensor, ess: torch.Tensor, pi: torch.Tensor,
                        prompts: list[str], anchor_ids: list[str], seconds: list[float]) -> None:
    from floorgap.records import atomic_path

    with atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez(fh, floors=floors.numpy(), ess=ess.numpy(), pi=pi.numpy(),
                 prompts=np.array(prompts), anchor_ids=np.array(anchor_ids),
                 seconds=np.array(seconds))


def run_reveal(args: argparse.Namespace) -> list[Row]:
    """The importance route of T^(1) at the first anchors of every domain: one
    ``sample_block(reveal_paths=max_reveal)`` per anchor, the floor of every revealed
    predecessor at every slot, and the interval of the Hajek mean for each J of the grid."""
    import sys
    from pathlib import Path

    from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED
    from floorgap.models.targets import load_target
    from floorgap.probes.rollouts import sample_block
    from floorgap.sampling import SamplingLaw

    start = time.perf_counter()
    if not Path(args.model_dir, "floorgap_model.json").is_file():
        raise SystemExit(f"{args.model_dir} is not a materialised target; build it with "
                         f"`snakemake --cores all {args.model_dir}`")
    J_max = args.max_reveal
    if not 1 <= J_max <= min(args.forward_batch, args.paths):
        raise SystemExit("--max-reveal must lie in 1..min(--forward-batch, --paths)")
    grid = sorted({int(x) for x in args.reveal_grid.split(",") if x.strip()})
    if not grid or grid[0] < 1 or grid[-1] > J_max:
        raise SystemExit(f"--reveal-grid must hold values in 1..{J_max}")
    anchor_rows, contexts, domains, gamma = _reveal_anchors(args)
    model, _ = load_target(args.model_dir, args.dtype, torch.device(args.device))
    law = SamplingLaw()  # the evaluation law: temperature 1, no truncation
    n = len(anchor_rows)
    floors = torch.empty((n, gamma, J_max), dtype=torch.float64)
    ess = torch.empty_like(floors)
    t_sample, t_floor = [], []
    for i, (a, ctx) in enumerate(zip(anchor_rows, contexts)):
        block = sample_block(model, ctx, n_paths=args.paths, gamma=gamma, law=law,
                             anchor_seed=int(a.anchor_seed), forward_batch=args.forward_batch,
                             reveal_paths=J_max)
        t0 = time.perf_counter()
        floors[i], ess[i] = reveal_floors(block)
        t_floor.append(time.perf_counter() - t0)
        t_sample.append(block.seconds)
        del block
        print(f"[{i + 1}/{n}] {a.anchor_id}: context {len(ctx)}, sample {t_sample[-1]:.1f} s, "
              f"floors {t_floor[-1]:.1f} s; mean over j by slot "
              + " ".join(f"{float(v):.3f}" for v in floors[i, 1:].nanmean(-1)),
              file=sys.stderr, flush=True)
    pi = torch.tensor([float(a.pi) for a in anchor_rows], dtype=torch.float64)
    prompts = [str(a.prompt_id) for a in anchor_rows]
    if args.save_floors:
        _save_reveal_floors(args.save_floors, floors, ess, pi, prompts,
                            [str(a.anchor_id) for a in anchor_rows], t_sample)
    ess_ok = ess[:, 1:][torch.isfinite(floors[:, 1:])]
    rows = [
        Row("anchors", float(n), "n", f"first {args.anchors_per_domain} of each of "
            f"{', '.join(domains)} (file order); {len(set(prompts))} prompts"),
        Row("paths x gamma", float(args.paths * gamma), "", f"M={args.paths}, gamma={gamma}, "
            f"forward_batch={args.forward_batch}, max reveal {J_max}, law T={law.temperature} "
            f"top_p={law.top_p} top_k={law.top_k}, {args.dtype}"),
        Row(f"sample_block per anchor (J={J_max})", statistics.mean(t_sample), "s",
            f"min {min(t_sample):.1f}, max {max(t_sample):.1f}"),
        Row("per-j floors per anchor", statistics.mean(t_floor), "s",
            f"{gamma - 1} slots x {J_max} j"),
        Row("Kish ESS of the weights (mean)", float(ess_ok.mean()) if ess_ok.numel() else None,
            "", f"over defined (anchor, slot, j) cells; at most M-1 = {args.paths - 1}"),
        Row("Kish ESS of the weights (min)", float(ess_ok.min()) if ess_ok.numel() else None,
            ""),
    ]
    rows += reveal_summary(floors, pi, prompts, grid, n_boot=args.bootstrap,
                           seed=DEFAULT_BOOT_SEED)
    rows.append(Row("bench wall time", time.perf_counter() - start, "s"))
    return rows


def _reveal_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model-dir", default="results/models/smollm2-135m",
                   help="materialised target folder (default: the embedded model)")
    p.add_argument("--results", default="results",
                   help="folder holding <target>/anchors/<domain>.parquet and "
                        "<target>/corpus/<domain>.parquet")
    p.add_argument("--target", default="smollm2-135m", help="target name under --results")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--anchors-per-domain", type=int, default=4,
                   help="first N anchors of each domain file, in file order")
    p.add_argument("--paths", type=int, default=64, help="M")
    p.add_argument("--forward-batch", type=int, default=16, help="probe forward batch")
    p.add_argument("--max-reveal", type=int, default=8,
                   help="revealed predecessors sampled per anchor (<= forward batch)")
    p.add_argument("--reveal-grid", default="1,2,4,8",
                   help="comma-separated J values to summarise (each <= --max-reveal)")
    p.add_argument("--bootstrap", type=int, default=2000, help="prompt-bootstrap replicates")
    p.add_argument("--gamma", type=int, default=None,
                   help="block length (default: the anchors' metadata, else 7)")
    p.add_argument("--save-floors", default=None, metavar="PATH",
                   help="also write the per-j floors, ESS, pi and prompt ids as .npz")


BENCHMARKS["reveal"] = ("importance route of T^(1): interval width against revealed paths J",
                        _reveal_options, run_reveal)


# ------------------------------------------------------------------------- driver

def format_table(rows: list[Row]) -> str:
    width = max(len(r.name) for r in rows)
    lines = []
    for r in rows:
        if r.value is None:
            val = "n/a"
        elif r.unit == "" and abs(r.value) < 1e-3:
            val = f"{r.value:.3e}"
        else:
            val = f"{r.value:,.3f}"
        lines.append(f"{r.name:<{width}}  {val:>14} {r.unit:<3} {r.note}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="floorgap bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_options, run) in BENCHMARKS.items():
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--json", nargs="?", const="-", default=None, metavar="PATH",
                       help="also write the results as JSON to PATH (stdout if no PATH)")
        p.add_argument("--device", default="cpu", help="torch device (cpu, cuda, ...)")
        p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
        add_options(p)
        p.set_defaults(run=run)
    return parser


def run(argv: list[str] | None = None) -> int:
    """``floorgap bench <benchmark> [options]``: run one benchmark and print its table."""
    args = build_parser().parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    rows = args.run(args)
    print(f"floorgap bench {args.command}  (torch {torch.__version__}, device {args.device}, "
          f"threads {torch.get_num_threads()})")
    print(format_table(rows))
    if args.json is not None:
        payload = {"command": args.command, "device": args.device,
                   "torch": torch.__version__, "threads": torch.get_num_threads(),
                   "results": [asdict(r) for r in rows]}
        text = json.dumps(payload, indent=2)
        if args.json == "-":
            print(text)
        else:
            with atomic_path(args.json) as tmp:
                tmp.write_text(text + "\n", encoding="utf-8")
    return 0

