"""Benchmarks of the project's hot paths.

    floorgap bench estimators [--json [PATH]] [--device cpu] [--threads N]
    floorgap bench rollouts [--model-dir results/models/smollm2-135m] [--paths 64]
                            [--forward-batch 16] [--reveal-paths 0]
    floorgap bench reveal [--model-dir results/models/smollm2-135m] [--results results]
                          [--target smollm2-135m] [--anchors-per-domain 4] [--max-reveal 8]
                          [--reveal-grid 1,2,4,8] [--bootstrap 2000] [--save-floors PATH]

Each subcommand is a function of :mod:`floorgap.bench` registered in ``BENCHMARKS`` with its
options; it returns a list of result rows (name, value, unit, note) that are printed as a
table and optionally written as JSON. Inputs are drawn with fixed seeds so runs are
comparable.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import asdict

import torch

from floorgap.bench.estimators import run_estimators
from floorgap.bench.reveal import run_reveal
from floorgap.bench.rollouts import run_rollouts
from floorgap.bench.timing import Row, format_table
from floorgap.records import atomic_path


def _estimators_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per measurement")
    p.add_argument("--lp-instances", type=int, default=1,
                   help="random instances for the LP comparison")
    p.add_argument("--lp-method", default="highs-ipm",
                   choices=["highs", "highs-ipm", "highs-ds"],
                   help="HiGHS solver for the reference LP (highs-ipm is the fastest here)")


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


#: Benchmark -> (one line of help, the function adding its options, the function running it).
BENCHMARKS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None],
                            Callable[[argparse.Namespace], list[Row]]]] = {
    "estimators": ("barycentre vs LP and sort; prompt bootstrap", _estimators_options,
                   run_estimators),
    "rollouts": ("rollout probe vs generate(num_return_sequences=M)", _rollouts_options,
                 run_rollouts),
    "reveal": ("importance route of T^(1): interval width against revealed paths J",
               _reveal_options, run_reveal),
}


# ------------------------------------------------------------------------- driver


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

