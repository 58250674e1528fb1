"""Benchmarks of the project's hot paths.

    floorgap bench estimators [--json [PATH]] [--device cpu] [--threads N]
    floorgap bench rollouts [--model-dir results/models/smollm2-135m] [--paths 64]

Each subcommand is a function registered in ``BENCHMARKS``; it returns a list of result rows
(name, value, unit, note) that are printed as a table and optionally written as JSON. Inputs
are drawn with fixed seeds so runs are comparable.
"""

from __future__ import annotations

import argparse
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


def run_rollouts(args: argparse.Namespace) -> list[Row]:
    """The rollout probe (one prefill shared by all paths) against ``generate`` with
    ``num_return_sequences=M`` (which prefills every copy), both returning the full-vocabulary
    next-token distribution at every slot of every path."""
    from pathlib import Path

    from floorgap.models.targets import load_target
    from floorgap.probes.rollouts import sample_block
    from floorgap.sampling import SamplingLaw

    if not Path(args.model_dir, "floorgap_model.json").is_file():
        raise SystemExit(f"{args.model_dir} is not a materialised target; build it with "
                         f"`snakemake --cores all {args.model_dir}`")
    device = torch.device(args.device)
    model, tokenizer = load_target(args.model_dir, args.dtype, device)
    ctx = _bench_prompt(tokenizer, args.prompt_tokens)
    M, gamma = args.paths, args.gamma
    ids = torch.tensor([ctx], device=device)
    eos = tokenizer.eos_token_id

    def probe(forward_batch: int) -> Callable[[], Any]:
        return lambda: sample_block(model, ctx, n_paths=M, gamma=gamma, law=SamplingLaw(),
                                    anchor_seed=1, forward_batch=forward_batch)

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
                f"M={M} gamma={gamma}, prompt {len(ctx)} tokens, {args.dtype}")]
    for fb in sorted({args.forward_batch, M}):
        t = median_time(probe(fb), args.repeats, device)
        rows += [Row(f"rollout probe, forward_batch={fb}", t, "s", "prefill once, shared cache"),
                 Row(f"  speed-up over generate (fb={fb})", t_base / t, "x", "goal >= 3x"),
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
    p.add_argument("--repeats", type=int, default=3, help="timed repeats per measurement")


BENCHMARKS["rollouts"] = ("rollout probe vs generate(num_return_sequences=M)",
                          _rollouts_options, run_rollouts)


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

