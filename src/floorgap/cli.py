"""The console command ``floorgap``: ``floorgap <stage> [options]`` runs one stage.

``floorgap --help`` lists the stages (:data:`floorgap.stages.STAGES`); ``floorgap <stage>
--help`` shows a stage's options. Every Snakemake rule calls this command.

``floorgap inspect FOLDER`` (:func:`inspect`) prints, as JSON, what the importer makes of a
drafter checkpoint folder's ``config.json`` (layout, kind, gamma and block rows, taps, widths,
vocabularies, attention), or the field it refuses, before any GPU time is spent on it.

One more command is not a stage: ``floorgap decompose FOLDER`` (:func:`decompose`) launches the
workflow for a drafter checkpoint folder of your own. It writes a config overlay with a
``decompose`` entry for the folder (``results/decompose/<name>.yaml``), runs Snakemake from
the repository root on the base config plus that overlay, up to the drafter's decomposition
table, and prints the table.
"""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from floorgap import __version__
from floorgap.stages import STAGES
from floorgap.stages._cli import EXIT_STAGE_ERROR, run_stage

#: Commands that are not stages (they launch the workflow): name -> one line of help.
COMMANDS = {"decompose": "FOLDER: floor and model gap of your own drafter checkpoint folder "
                         "(runs the workflow)",
            "inspect": "FOLDER: what the import makes of a checkpoint folder's config.json "
                       "(JSON), or the field it refuses"}


def usage() -> str:
    width = max(map(len, [*STAGES, *COMMANDS]))
    lines = ["usage: floorgap <stage> [options]   (floorgap <stage> --help for a stage's options)",
             "", "Information floors and model gaps in block drafting: the stages of the workflow.",
             "", "stages:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in STAGES.items()]
    lines += ["", "commands:"]
    lines += [f"  {name:<{width}}  {text}" for name, text in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Dispatch ``argv`` (default ``sys.argv[1:]``) to the named stage's ``run`` (or to the
    ``decompose`` command)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(usage())
        return 0 if args else 2
    if args[0] == "--version":
        print(f"floorgap {__version__}")
        return 0
    name = args[0]
    if name == "decompose":
        return decompose(args[1:])
    if name == "inspect":
        return inspect(args[1:])
    if name not in STAGES:
        print(f"floorgap: unknown stage {name!r}; stages: {', '.join(STAGES)}; commands: "
              f"{', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"floorgap.stages.{name}")
    if hasattr(module, "run"):  # a stage with its own entry (bench: subcommands)
        return int(module.run(args[1:]) or 0)
    return run_stage(module.main, module.build_parser(), args[1:])


# ------------------------------------------------------------------------ floorgap inspect


def inspect(argv: Sequence[str]) -> int:
    """``floorgap inspect FOLDER``: the import's reading of the folder as JSON on stdout (exit
    0), or ``{"folder", "refused"}`` with the reason (exit 1)."""
    import json

    parser = argparse.ArgumentParser(
        prog="floorgap inspect",
        description="Read a drafter checkpoint folder's config.json (no weights) and print what "
                    "floorgap's import makes of it, or the field it refuses.")
    parser.add_argument("folder", type=Path, help="checkpoint folder holding config.json")
    args = parser.parse_args(list(argv))
    from floorgap.models.engine_formats import describe_folder

    try:
        print(json.dumps(describe_folder(args.folder), indent=2))
    except (ValueError, FileNotFoundError) as exc:
        print(json.dumps({"folder": str(args.folder), "refused": str(exc)}, indent=2))
        return 1
    return 0


# ------------------------------------------------------------------------ floorgap decompose


class DecomposeError(RuntimeError):
    """A ``floorgap decompose`` invocation that cannot run; the message says what to change."""


def decompose_parser() -> argparse.ArgumentParser:
    """The options of ``floorgap decompose``."""
    parser = argparse.ArgumentParser(
        prog="floorgap decompose",
        description="Split your drafter's rejection into information floor and model gap: "
                    "import its checkpoint folder, evaluate it on the workflow's rollout paths "
                    "and print its decomposition table by slot.")
    parser.add_argument("folder", type=Path,
                        help="drafter checkpoint folder (config.json + safetensors weights)")
    parser.add_argument("--name", default="user",
                        help="the drafter's name in the results (default: user)")
    parser.add_argument("--format", default="auto",
                        choices=["auto", "dflash", "dspark", "speculators"],
                        help="checkpoint layout (default: detected from config.json)")
    parser.add_argument("--kind", choices=["dflash", "dspark"], default=None,
                        help="drafter kind; needed only for a speculators folder whose config "
                             "does not say it")
    parser.add_argument("--configfile", type=Path, default=None,
                        help="base workflow config (default: config.yaml of the repository)")
    parser.add_argument("--target", default=None,
                        help="target model key of the config (default: its primary target)")
    parser.add_argument("--cores", default="all", help="Snakemake --cores (default: all)")
    parser.add_argument("--dry-run", action="store_true",
                        help="show the jobs Snakemake would run, run none")
    return parser


def repository_root(start: Path | None = None) -> Path:
    """The floorgap checkout to run the workflow in: the current folder when it holds the
    workflow, else the checkout this package was installed from (editable installs)."""
    here = Path.cwd() if start is None else start
    for candidate in (here, Path(__file__).resolve().parents[2]):
        if (candidate / "Snakefile").is_file() and (candidate / "workflow" / "rules").is_dir():
            return candidate
    raise DecomposeError("no floorgap workflow found (a folder with Snakefile and "
                         "workflow/rules/): run floorgap decompose from the repository root")


def detect_checkpoint(folder: Path, fmt: str, kind: str | None) -> tuple[str, str | None]:
    """(format, kind) of the overlay entry: the format read from ``config.json`` when ``fmt``
    is ``auto`` (else checked against it), and for a speculators folder the kind its config
    names unless ``kind`` is given."""
    from floorgap.models.engine_formats import read_engine_config

    if not (folder / "config.json").is_file():
        raise DecomposeError(f"{folder} has no config.json; give a drafter checkpoint folder "
                             "(config.json + model.safetensors)")
    try:
        found, fields = read_engine_config(folder, None if fmt == "auto" else fmt)
    except ValueError as exc:
        raise DecomposeError(f"{exc}; pass --format to name the folder's layout") from exc
    if found == "floorgap":
        raise DecomposeError(f"{folder} is in floorgap's own layout, which no engine runs; "
                             "export the drafter as dflash, dspark or speculators")
    if found == "speculators" and kind is None:
        kind = str(fields["kind"])
    if kind is not None and kind != fields["kind"]:
        raise DecomposeError(f"{folder} holds a {fields['kind']} drafter, not {kind}; drop "
                             "--kind or fix it")
    return found, kind


def _config_target(base: Path, target: str | None) -> str:
    """The target to decompose on: ``target`` (checked) or the base config's primary one."""
    import yaml

    cfg = yaml.safe_load(base.read_text()) or {}
    targets = list(cfg.get("targets") or {})
    if target is None:
        target = cfg.get("primary_target") or (targets[0] if targets else None)
    if target not in targets:
        raise DecomposeError(f"target {target!r} is not one of the targets of {base} "
                             f"({', '.join(map(str, targets))}); pass --target")
    return str(target)


def _snakemake_command(root: Path, base: Path, overlay: Path, files: list[str],
                       args: argparse.Namespace) -> list[str]:
    # The files to build go before --configfile, which takes every following word as a config
    # file; Snakemake merges the config files in order, so the overlay adds to the base.
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(root / "Snakefile"), *files,
           "--cores", str(args.cores)]
    if args.dry_run:
        cmd.append("--dry-run")
    return cmd + ["--configfile", str(base), str(overlay)]


def _plan(args: argparse.Namespace) -> tuple[Path, list[str], list[str]]:
    """(repository root, Snakemake command, decomposition files) of a decompose invocation;
    writes the overlay config."""
    from floorgap.config import DECOMPOSITION_EXTS, ConfigError, decompose_overlay, write_overlay

    root = repository_root()
    folder = args.folder.expanduser().resolve()
    base = (args.configfile or root / "config.yaml").expanduser().resolve()
    if not base.is_file():
        raise DecomposeError(f"config file {base} does not exist; pass --configfile")
    fmt, kind = detect_checkpoint(folder, args.format, args.kind)
    target = _config_target(base, args.target)
    try:
        overlay = decompose_overlay(args.name, folder, fmt, kind)
    except ConfigError as exc:
        raise DecomposeError(str(exc)) from exc
    overlay_path = write_overlay(root / "results" / "decompose" / f"{args.name}.yaml", overlay)
    files = [f"results/{target}/decomposition/{args.name}.{ext}" for ext in DECOMPOSITION_EXTS]
    return root, _snakemake_command(root, base, overlay_path, files, args), files


def decompose(argv: Sequence[str]) -> int:
    """``floorgap decompose FOLDER [options]``: run the workflow up to the decomposition of
    the drafter in ``FOLDER`` and print its markdown table. Returns the exit status (2 for a
    bad invocation, Snakemake's status when the workflow fails)."""
    args = decompose_parser().parse_args(list(argv))
    try:
        root, cmd, files = _plan(args)
    except DecomposeError as exc:
        print(f"floorgap decompose: {exc}", file=sys.stderr)
        return EXIT_STAGE_ERROR
    print(f"floorgap decompose: running {' '.join(cmd[1:])} in {root}", file=sys.stderr)
    code = subprocess.run(cmd, cwd=root, check=False).returncode
    if code != 0:
        print(f"floorgap decompose: Snakemake exited with status {code}; see its messages "
              "above and the logs under results/logs/", file=sys.stderr)
        return code
    if not args.dry_run:
        md = root / files[-1]
        print(md.read_text())
        print(f"tables: {', '.join(str(root / f) for f in files)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
