"""Shared plumbing of the stage commands (``floorgap <stage> ...``).

Every stage CLI is a thin argparse wrapper: it parses a ``--spec`` JSON object (built by the
Snakemake rule from the config), logs to the rule's log file (``--log``) and to stderr, shows
tqdm progress bars on stderr, and turns an expected failure (:class:`StageError`: a missing
package, a failed gate) into a one-line message and a non-zero exit status without a traceback.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from floorgap.errors import StageError
from floorgap.progress import Timer

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

#: Exit status of a stage that stopped on a :class:`StageError`.
EXIT_STAGE_ERROR = 2


def parse_spec(text: str) -> dict[str, Any]:
    """The ``--spec`` argument: a JSON object, or ``@path`` to a file holding one."""
    raw = Path(text[1:]).read_text() if text.startswith("@") else text
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise StageError(f"--spec is not valid JSON: {exc}") from exc
    if not isinstance(spec, dict):
        raise StageError("--spec must be a JSON object")
    return spec


def stage_parser(prog: str, description: str, *, spec: bool = True) -> argparse.ArgumentParser:
    """An argument parser with the options every stage shares (``--spec``, ``--log``, ``-v``)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    if spec:
        parser.add_argument("--spec", required=True, type=parse_spec,
                            help="JSON object with the stage's settings, or @file holding one")
    parser.add_argument("--log", type=Path, default=None,
                        help="log file (appended); messages also go to stderr")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch intra-op threads (the rule's `threads`); default: torch's "
                             "own choice, which honours OMP_NUM_THREADS")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    return parser


#: Help of the file options that mean the same in every stage that takes them.
FILE_HELP = {"--model-dir": "the materialised target (results/models/<target>)",
             "--gaps": "the gaps summary of the decompose group (gaps/decompose.parquet)",
             "--floors": "the floors summary of the same target (floors/summary.parquet)"}


def add_files(parser: argparse.ArgumentParser, *options: str,
              help: dict[str, str] | None = None) -> None:
    """Required file options: ``"--corpus"`` takes one path, ``"--paths+"`` one or more;
    ``help`` maps an option (without the ``+``) to its help text (else :data:`FILE_HELP`'s)."""
    for option in options:
        name = option.rstrip("+")
        parser.add_argument(name, required=True, type=Path,
                            nargs="+" if option.endswith("+") else None,
                            help={**FILE_HELP, **(help or {})}.get(name))


def bootstrap_settings(spec: dict[str, Any]) -> tuple[int, float, int]:
    """(replicates, interval level, seed) of an analysis spec; a missing key is a StageError."""
    from floorgap.estimators.aggregate import DEFAULT_BOOT_SEED  # the console parses without torch

    try:
        n_boot, level = int(spec["bootstrap"]), float(spec["level"])
    except KeyError as exc:
        raise StageError(f"--spec lacks analysis key {exc}") from exc
    return n_boot, level, int(spec.get("seed", DEFAULT_BOOT_SEED))


def set_threads(threads: int | None) -> None:
    """Limit torch to ``threads`` intra-op threads. On shared CPUs, more threads than the job
    was given makes every thread spin-wait: on 2 busy cores a 135M model decoded ~10x slower
    with 2 threads than with 1."""
    if threads is None:
        return
    if threads < 1:
        raise StageError("--threads must be >= 1")
    import torch

    torch.set_num_threads(threads)


def setup_logging(log_path: str | Path | None = None, *, verbose: bool = False) -> logging.Logger:
    """Log to stderr and, when given, to ``log_path``; return the ``floorgap`` logger."""
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_path is not None:
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(log_path, mode="a", encoding="utf-8"))
    # force: the handlers of an earlier call (tests run stages in one process) are closed
    logging.basicConfig(level=logging.WARNING, format=LOG_FORMAT, handlers=handlers, force=True)
    logger = logging.getLogger("floorgap")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.captureWarnings(True)
    return logger


def run_stage(main: Callable[[argparse.Namespace, logging.Logger], Any],
              parser: argparse.ArgumentParser, argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, set up logging, run ``main(args, logger)`` and map failures to exit codes.

    A :class:`StageError` is logged as one line and gives exit status 2; any other exception is
    logged with its traceback and re-raised (exit status 1).
    """
    try:
        args = parser.parse_args(argv)
    except StageError as exc:  # raised by a type= converter such as parse_spec
        parser.error(str(exc))
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for a stage that re-executes itself
    logger = setup_logging(args.log, verbose=args.verbose)
    timer = Timer()
    logger.info("%s: start", parser.prog)
    logger.debug("arguments: %s", vars(args))
    try:
        set_threads(getattr(args, "threads", None))
        main(args, logger)
    except StageError as exc:
        logger.error("%s: %s", parser.prog, exc)
        return EXIT_STAGE_ERROR
    except Exception:
        logger.exception("%s: failed after %.1f s", parser.prog, timer.seconds)
        raise
    logger.info("%s: done in %.1f s", parser.prog, timer.seconds)
    return 0

