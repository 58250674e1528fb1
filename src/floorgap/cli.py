"""The console command ``floorgap``: ``floorgap <stage> [options]`` runs one stage.

``floorgap --help`` lists the stages (:data:`floorgap.stages.STAGES`); ``floorgap <stage>
--help`` shows a stage's options. Every Snakemake rule calls this command.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from floorgap import __version__
from floorgap.stages import STAGES
from floorgap.stages._cli import run_stage


def usage() -> str:
    width = max(map(len, STAGES))
    lines = ["usage: floorgap <stage> [options]   (floorgap <stage> --help for a stage's options)",
             "", "Information floors and model gaps in block drafting: the stages of the workflow.",
             "", "stages:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in STAGES.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv`` (default ``sys.argv[1:]``) to the named stage's ``run``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"floorgap {__version__}")
        return 0
    name = args[0]
    if name not in STAGES:
        print(f"floorgap: unknown stage {name!r}; stages: {', '.join(STAGES)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"floorgap.stages.{name}")
    if hasattr(module, "run"):  # a stage with its own entry (bench: subcommands)
        return int(module.run(args[1:]) or 0)
    return run_stage(module.main, module.build_parser(), args[1:])


if __name__ == "__main__":
    sys.exit(main())
