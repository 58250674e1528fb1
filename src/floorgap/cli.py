"""The console command ``floorgap``: ``floorgap <stage> [options]`` runs one stage.

``floorgap --help`` lists the stages (:data:`floorgap.stages.STAGES`); ``floorgap <stage>
--help`` shows a stage's options. Every Snakemake rule calls this command.

``floorgap inspect FOLDER`` (:func:`inspect`) prints, as JSON, what the importer makes of a
drafter checkpoint folder's ``config.json`` (layout, kind, gamma and block rows, taps, widths,
vocabularies, attention), or the field it refuses, before any GPU time is spent on it.
``floorgap plan`` (:func:`plan`) estimates each GPU job's memory against what it asks for;
``floorgap rehearsal`` (:func:`rehearsal`) derives a paper config's CPU rehearsal.

One more command is not a stage: ``floorgap decompose FOLDER`` (:func:`decompose`) launches the
workflow for a drafter checkpoint folder of your own. It writes a config overlay with a
``decompose`` entry for the folder (``results/decompose/<name>.yaml``), runs Snakemake from
the repository root on the base config plus that overlay, up to the drafter's decomposition
table, and prints the table. ``floorgap check FOLDER [FOLDER ...]`` (:func:`check`) does the
same for one or several folders up to one check page (``results/check/<name>/index.html``:
verdicts, figures, tables, paired differences) and prints its summary. ``floorgap claims``
(:func:`claims`) prints how many of the paper's findings held on a finished run.

Size: about 600 lines, the console's commands that are not stages (check, decompose, inspect,
plan, rehearsal, claims): each one's options, its one-line refusals of a bad invocation, and
the launch of the workflow the first two share.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from floorgap import __version__
from floorgap.config.kinds import ENGINE_KINDS, KINDS, SERVED_FORMATS
from floorgap.errors import StageError
from floorgap.stages import STAGES
from floorgap.stages._cli import EXIT_STAGE_ERROR, run_stage

#: Commands that are not stages (they launch the workflow): name -> one line of help.
COMMANDS = {"check": "FOLDER [FOLDER ...]: a report of verdicts on your drafters: "
                     "under-trained, near the floor, which is better (runs the workflow)",
            "compare": "RUN_A RUN_B: two finished runs side by side: records, the paper's numbers "
                       "and its findings' verdicts (exit 0 identical, 1 same conclusions, 3 a "
                       "number moved)",
            "decompose": "FOLDER: floor and model gap of your own drafter checkpoint folder "
                         "(runs the workflow)",
            "claims": "[--table paper/tables/claims.csv]: how many of the paper's findings held "
                      "on a finished run, and which did not",
            "inspect": "FOLDER: what the import makes of a checkpoint folder's config.json "
                       "(JSON), or the field it refuses",
            "plan": "--configfile X: each GPU job's memory estimated against what it asks "
                    "for, before submission",
            "rehearsal": "--configfile X --out DIR: X's whole DAG on CPU stand-ins (config and "
                         "stand-in checkpoints in DIR), for the same SLURM profile"}


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
    commands = {"decompose": decompose, "check": check, "inspect": inspect, "plan": plan,
                "rehearsal": rehearsal, "claims": claims, "compare": compare}
    if name in commands:
        return commands[name](args[1:])
    if name not in STAGES:
        print(f"floorgap: unknown stage {name!r}; stages: {', '.join(STAGES)}; commands: "
              f"{', '.join(COMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(f"floorgap.stages.{name}")
    if hasattr(module, "run"):  # a stage with its own entry (bench: subcommands)
        return int(module.run(args[1:]) or 0)
    return run_stage(module.main, module.build_parser(), args[1:])


# ------------------------------------------------------------------------ floorgap claims

def claims(argv: Sequence[str]) -> int:
    """``floorgap claims [--table T]``: the count line of a finished run's claims table and
    the findings that did not hold (the end of every run that wrote one)."""
    import pandas as pd

    from floorgap.reports.claims import NOT_HELD, count_line

    parser = argparse.ArgumentParser(prog="floorgap claims", description=COMMANDS["claims"])
    parser.add_argument("--table", type=Path, default=Path("paper/tables/claims.csv"),
                        help="the claims table of a run (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.table.is_file():
        print(f"floorgap claims: {args.table} does not exist; run the workflow's claims rule "
              "first (snakemake paper/tables/claims.csv)", file=sys.stderr)
        return 2
    table = pd.read_csv(args.table).drop_duplicates("claim")
    print(count_line(list(table["verdict"])))
    for row in table[table["verdict"] == NOT_HELD].itertuples(index=False):
        print(f"  not held: {row.claim} ({row.where})")
    return 0


# ------------------------------------------------------------------------ floorgap compare

#: Exit status of ``floorgap compare`` by outcome (2 is a bad invocation, as everywhere).
COMPARE_EXIT = {"identical": 0, "same conclusions": 1, "a number moved": 3}


def compare(argv: Sequence[str]) -> int:
    """``floorgap compare RUN_A RUN_B [--out DIR]``: the comparison's page on stdout (markdown)
    and in DIR (markdown, HTML, every estimate); the exit status says the outcome."""
    from floorgap.analysis.compare import compare_runs
    from floorgap.reports.compare_page import to_markdown, write_compare

    parser = argparse.ArgumentParser(prog="floorgap compare", description=COMMANDS["compare"])
    parser.add_argument("runs", type=Path, nargs=2, metavar="RUN",
                        help="folders a workflow ran in (each with results/ and paper/)")
    parser.add_argument("--out", type=Path, default=None,
                        help="folder for compare.md, compare.html and numbers.csv")
    parser.add_argument("--rtol", type=float, default=1e-6,
                        help="relative tolerance of 'equal within float tolerance'")
    parser.add_argument("--atol", type=float, default=1e-9, help="absolute tolerance")
    args = parser.parse_args(list(argv))
    try:
        cmp = compare_runs(*args.runs, rtol=args.rtol, atol=args.atol)
    except StageError as exc:
        print(f"floorgap compare: {exc}", file=sys.stderr)
        return 2
    print(to_markdown(cmp))
    if args.out is not None:
        write_compare(cmp, args.out)
    return COMPARE_EXIT[cmp.outcome]


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


# ------------------------------------------------------------------------ floorgap plan


def dry_run_jobs(dry_run_output: str) -> list[tuple[str, dict[str, str], dict[str, str]]]:
    """(rule, wildcards, resources) of every job in the listing of a Snakemake dry run."""
    import re

    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule )", dry_run_output):
        head = re.match(r"(?:local)?rule (\w+):", block)
        found = re.search(r"^\s+resources: (.*)$", block, re.M)
        if not (head and found):
            continue
        wild = re.search(r"^\s+wildcards: (.*)$", block, re.M)
        jobs.append((head.group(1),
                     dict(kv.split("=", 1) for kv in wild.group(1).split(", ")) if wild else {},
                     dict(kv.split("=", 1) for kv in found.group(1).split(", "))))
    return jobs


def declared_resources(dry_run_output: str) -> dict[str, dict[str, dict[str, str]]]:
    """target -> rule -> resources of its jobs, from the job listing of a Snakemake dry run
    (the largest value per resource over a rule's jobs)."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for name, wildcards, res in dry_run_jobs(dry_run_output):
        if "target" not in wildcards:
            continue
        rule = out.setdefault(wildcards["target"], {}).setdefault(name, {})
        for key, value in res.items():
            if value.isdigit() and rule.get(key, "0").isdigit():
                value = str(max(int(value), int(rule.get(key, "0"))))
            rule[key] = value
    return out


def plan(argv: Sequence[str]) -> int:
    """``floorgap plan --configfile X [...]``: the memory each job of the floorgap probes needs
    (``floorgap.resources``) beside what it asks for; exit 1 naming every job that cannot fit."""
    import yaml
    from snakemake.utils import update_config

    from floorgap.config import resolve
    from floorgap.resources import GIB, largest_forward_batch, plan as plan_jobs, read_model_config

    parser = argparse.ArgumentParser(
        prog="floorgap plan",
        description="Estimate the peak GPU and host memory of every job that runs the target "
                    "(model config, M, forward_batch, the longest context) and stop with the "
                    "rule's name when one cannot fit what it asks for.")
    parser.add_argument("--configfile", type=Path, nargs="+", required=True)
    parser.add_argument("--gpu-memory-gb", type=float, default=None,
                        help="memory of one GPU in GiB (default: cluster.gpu_memory_gb)")
    parser.add_argument("--model-config", action="append", default=[], metavar="TARGET=PATH",
                        help="a target's config.json (default: results/models/<target>/)")
    args = parser.parse_args(list(argv))
    root = repository_root()
    cfg: dict = {}
    for path in args.configfile:
        update_config(cfg, yaml.safe_load(path.read_text()) or {})
    spec = resolve(cfg)
    gpu_gb = args.gpu_memory_gb or float(cfg["cluster"]["gpu_memory_gb"])
    given = dict(item.split("=", 1) for item in args.model_config)
    # --forceall: every job of the config is planned, whatever results/ already holds (a dry
    # run of a finished workflow lists no jobs)
    res = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile",
                          str(root / "Snakefile"), "-n", "--forceall", "--cores", "all",
                          "--configfile", *map(str, args.configfile)],
                         cwd=root, capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout[-3000:] + res.stderr[-3000:], file=sys.stderr)
        return 2
    declared = declared_resources(res.stdout)
    problems: list[str] = []
    print(f"{'rule':<16} {'target':<16} {'GPU GiB':>8} {'host GiB':>8} {'asks':>18}  largest part")
    for target in spec.targets:
        model_dir = root / "results" / "models" / target
        config_json = Path(given.get(target, model_dir / "config.json"))
        if not config_json.is_file():
            print(f"{target}: no config.json at {config_json}; materialise the target first "
                  f"(snakemake --cores 1 results/models/{target} --configfile ...) or pass "
                  f"--model-config {target}=PATH")
            continue
        shape = read_model_config(config_json)
        settings = spec.settings(target)
        longest = sum(int(settings["corpus"][k]) for k in ("max_prompt_tokens", "max_new_tokens"))
        print(f"{target}: longest context {longest} tokens (corpus.max_prompt_tokens + "
              f"max_new_tokens), {shape.parameters / 1e9:.2f}B parameters, GPU {gpu_gb:g} GiB")
        jobs = plan_jobs(settings, target, shape, config_json.parent,
                         declared.get(target, {}))
        for job in jobs:
            asks = f"gpu={job.gpus} mem_mb={job.mem_mb}"
            biggest = max(job.parts, key=job.parts.get)
            print(f"{job.rule:<16} {target:<16} {job.device_bytes / GIB:>8.1f} "
                  f"{job.host_bytes / GIB:>8.1f} {asks:>18}  {biggest} "
                  f"{job.parts[biggest] / GIB:.1f} {job.note}")
            found = job.problems(gpu_gb)
            if found and job.rule == "rollouts" and job.gpus:
                fb = largest_forward_batch(settings, target, shape, job.parts["weights"],
                                           gpu_gb)
                found[0] += f"; rollouts.forward_batch {fb} would fit (set it for {target})"
            problems += found
    for line in problems:
        print(f"does not fit: {line}")
    return 1 if problems else 0


# ------------------------------------------------------------------------ floorgap rehearsal


def rehearsal(argv: Sequence[str]) -> int:
    """``floorgap rehearsal --configfile X --out DIR``: the rehearsal of paper config X
    (:mod:`floorgap.rehearsal`) in ``DIR/config.yaml``, its stand-in checkpoints beside it,
    validated and resolved like any config; prints the command that runs it."""
    import yaml

    from floorgap import rehearsal as reh_mod
    from floorgap.config import ConfigError, resolve, validate_config

    root = repository_root()
    parser = argparse.ArgumentParser(
        prog="floorgap rehearsal",
        description="Derive the CPU rehearsal of a paper config: sizes from the overlay, random "
                    "Qwen3 targets with the real tokenizer, released checkpoints in their own "
                    "layouts, shipped prompts, vLLM's CPU build. Every job asks SLURM for what "
                    "the paper run asks.")
    parser.add_argument("--configfile", type=Path, required=True, help="the paper config")
    parser.add_argument("--out", type=Path, required=True,
                        help="folder of the rehearsal (config, stand-ins; run the DAG in it)")
    parser.add_argument("--overlay", type=Path,
                        default=root / "workflow" / "configs" / "rehearsal.yaml")
    parser.add_argument("--serving-python", default=str(root / ".venv-serving" / "bin" / "python"),
                        help="the vLLM CPU environment's interpreter")
    args = parser.parse_args(list(argv))
    paper = yaml.safe_load(args.configfile.read_text()) or {}
    out = args.out.resolve()
    try:
        validate_config(copy.deepcopy(paper))
        reh = reh_mod.rehearsal_config(paper, yaml.safe_load(args.overlay.read_text()), out,
                                       serving_python=args.serving_python)
        resolve(copy.deepcopy(reh.config))
        reh_mod.fetch_qwen3_tokenizer(out / "tokenizers" / "qwen3")
        reh_mod.build_standins(reh)
    except (ConfigError, StageError) as exc:
        print(f"floorgap rehearsal: {exc}", file=sys.stderr)
        return 2
    path = reh_mod.write_rehearsal(reh, out, args.configfile)
    print(f"rehearsal of {args.configfile}: {path}")
    print("not checked by the rehearsal:")
    for line in reh.untested:
        print(f"  - {line}")
    print("run it:\n  snakemake --profile workflow/profiles/slurm --snakefile "
          f"{root / 'Snakefile'} --directory {out} --configfile {path}")
    return 0


# ------------------------------------------------------------------------ floorgap decompose


class DecomposeError(RuntimeError):
    """A ``floorgap decompose`` or ``floorgap check`` invocation that cannot run; the message
    says what to change."""


def _format_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """``--format``: a checkpoint layout the import reads, or ``auto``."""
    layouts = dict.fromkeys([*SERVED_FORMATS, *(f for k in KINDS.values() for f in k.formats)])
    parser.add_argument("--format", default="auto", choices=["auto", *layouts], help=help_text)


def decompose_parser() -> argparse.ArgumentParser:
    """The options of ``floorgap decompose``."""
    parser = argparse.ArgumentParser(
        prog="floorgap decompose",
        description="Split your drafter's rejection into information floor and model gap: "
                    "import its checkpoint folder, evaluate it on the workflow's rollout paths "
                    "and print its decomposition table by slot.")
    parser.add_argument("folder", type=Path,
                        help="drafter checkpoint folder (config.json + safetensors weights)")
    parser.add_argument("--name", default=None,
                        help="the drafter's name in the results (default: user, or user-user "
                             "where the config has a drafter named user)")
    _format_option(parser, "checkpoint layout (default: detected from config.json)")
    parser.add_argument("--kind", choices=ENGINE_KINDS, default=None,
                        help="drafter kind; needed only for a speculators folder whose config "
                             "does not say it")
    _workflow_options(parser)
    return parser


def _workflow_options(parser: argparse.ArgumentParser) -> None:
    """The options of a command that runs the workflow: base config, target, cores, dry run."""
    parser.add_argument("--configfile", type=Path, default=None,
                        help="base workflow config (default: config.yaml of the repository)")
    parser.add_argument("--target", default=None,
                        help="target model key of the config (default: its primary target)")
    parser.add_argument("--cores", default="all", help="Snakemake --cores (default: all)")
    parser.add_argument("--dry-run", action="store_true",
                        help="show the jobs Snakemake would run, run none")


def repository_root(start: Path | None = None) -> Path:
    """The floorgap checkout to run the workflow in: the current folder when it holds the
    workflow, else the checkout this package was installed from (editable installs)."""
    here = Path.cwd() if start is None else start
    for candidate in (here, Path(__file__).resolve().parents[2]):
        if (candidate / "Snakefile").is_file() and (candidate / "workflow" / "rules").is_dir():
            return candidate
    raise DecomposeError("no floorgap workflow found (a folder with Snakefile and "
                         "workflow/rules/): run floorgap from the repository root")


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
    if kind is None and found != fields["kind"]:
        # speculators folders hold either kind; a dspark folder with markov_rank 0 a dflash
        kind = str(fields["kind"])
    if kind is not None and kind != fields["kind"]:
        raise DecomposeError(f"{folder} holds a {fields['kind']} drafter, not {kind}; drop "
                             "--kind or fix it")
    return found, kind


def _base_config(root: Path, configfile: Path | None) -> Path:
    """The base workflow config: ``configfile`` (checked), else the repository's config.yaml."""
    base = (configfile or root / "config.yaml").expanduser().resolve()
    if not base.is_file():
        raise DecomposeError(f"config file {base} does not exist; pass --configfile")
    return base


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
    from floorgap.config import ConfigError, decompose_overlay, decomposition_paths, write_overlay

    root = repository_root()
    folder = args.folder.expanduser().resolve()
    base = _base_config(root, args.configfile)
    args.name, = _own_names([args.name] if args.name else None, ["user"], base)
    fmt, kind = detect_checkpoint(folder, args.format, args.kind)
    target = _config_target(base, args.target)
    try:
        overlay = decompose_overlay(args.name, folder, fmt, kind)
    except ConfigError as exc:
        raise DecomposeError(str(exc)) from exc
    overlay_path = write_overlay(root / "results" / "decompose" / f"{args.name}.yaml", overlay)
    files = decomposition_paths(target, args.name)
    return root, _snakemake_command(root, base, overlay_path, files, args), files


def decompose(argv: Sequence[str]) -> int:
    """``floorgap decompose FOLDER [options]``: run the workflow up to the decomposition of
    the drafter in ``FOLDER`` and print its markdown table. Returns the exit status (2 for a
    bad invocation, Snakemake's status when the workflow fails)."""
    args = decompose_parser().parse_args(list(argv))
    return _launch("decompose", args, lambda: _plan(args), lambda root, files: [
        (root / files[-1]).read_text(), f"tables: {', '.join(str(root / f) for f in files)}"])


def _launch(command: str, args: argparse.Namespace,
            plan: Callable[[], tuple[Path, list[str], list[str]]],
            show: Callable[[Path, list[str]], list[str]]) -> int:
    """Run a launcher: ``plan()`` (root, Snakemake command, files; a DecomposeError is exit
    status 2), the command in the root (its exit status, said when not 0), then print the
    lines ``show(root, files)`` unless it failed or was a dry run."""
    try:
        root, cmd, files = plan()
    except DecomposeError as exc:
        print(f"floorgap {command}: {exc}", file=sys.stderr)
        return EXIT_STAGE_ERROR
    print(f"floorgap {command}: running {' '.join(cmd[1:])} in {root}", file=sys.stderr)
    code = subprocess.run(cmd, cwd=root, check=False).returncode
    if code != 0:
        print(f"floorgap {command}: Snakemake exited with status {code}; see its messages "
              "above and the logs under results/logs/", file=sys.stderr)
    elif not args.dry_run:
        print("\n".join(show(root, files)))
    return code


# ------------------------------------------------------------------------ floorgap check


def check_parser() -> argparse.ArgumentParser:
    """The options of ``floorgap check``."""
    parser = argparse.ArgumentParser(
        prog="floorgap check",
        description="Check drafter checkpoint folders for one target: import each, evaluate it "
                    "on the workflow's rollout paths, and write a page of verdicts (loses to a "
                    "lookup table, within reach of its floor, which slot to fix first, which "
                    "drafter accepts longer) with the figures and tables behind them.")
    parser.add_argument("folders", type=Path, nargs="+",
                        help="drafter checkpoint folders (config.json + safetensors weights)")
    parser.add_argument("--name", action="append", default=None,
                        help="a drafter's name in the results, once per folder in order "
                             "(default: the folder's name, lower-cased)")
    parser.add_argument("--reference", action="append", default=None,
                        help="the weights a folder was exported from (a final.pt of the "
                             "drafters stage, e.g. results/<target>/drafters/<v>/final.pt), once "
                             "per folder in order, - for none: the check then names an export "
                             "or layout fault")
    parser.add_argument("--report", default=None,
                        help="the check's name, results/check/<report>/ (default: the drafters' "
                             "names joined by +)")
    _format_option(parser, "checkpoint layout of every folder (default: detected per folder)")
    parser.add_argument("--serve", action=argparse.BooleanOptionalAction, default=None,
                        help="serve each dflash or dspark folder in the config's engine on a few "
                             "rows per task and replay its rounds (default: on where the config "
                             "has a serving section)")
    parser.add_argument("--serve-rows", type=int, default=None, metavar="N",
                        help="rows per serving task each folder is served on (default 1)")
    parser.add_argument("--engine", choices=["vllm", "sglang"], default=None,
                        help="the engine the folders are served in (default: the config's "
                             "serving.engine); only vLLM's rounds can be replayed")
    _workflow_options(parser)
    return parser


def _own_names(given: list[str] | None, picked: list[str], base: Path) -> list[str]:
    """The drafter names of a decompose or check run: those given with ``--name`` (refused when
    the base config already names a drafter so), else the ``picked`` ones, each moved off the
    config's names (``-user``, ``-user-2``, ...) so a folder named like a variant runs."""
    import yaml

    from floorgap.config import resolve

    taken = set(resolve(yaml.safe_load(base.read_text()) or {}).drafter_names)
    if given:
        clash = [n for n in given if n in taken]
        if clash:
            raise DecomposeError(f"--name {clash[0]}: {base.name} already has a drafter named "
                                 f"{clash[0]!r}; pass another --name")
        return list(given)
    names: list[str] = []
    for name in picked:
        free, n = name, 1
        while free in taken or free in names:
            free = f"{name}-user" + (f"-{n}" if n > 1 else "")
            n += 1
        names.append(free)
    return names


def folder_name(folder: Path) -> str:
    """A drafter name from a folder's name: lower-cased, other characters than letters,
    digits, - and _ replaced by -."""
    import re

    name = re.sub(r"[^a-z0-9_-]+", "-", folder.name.lower()).strip("-_")
    return name or "drafter"


def _check_plan(args: argparse.Namespace, argv: Sequence[str]
                ) -> tuple[Path, list[str], list[str]]:
    """(repository root, Snakemake command, check files) of a check invocation; writes the
    overlay config (decompose entries for the folders and the check entry)."""
    import shlex

    from floorgap.config import ConfigError, check_paths, decompose_overlay, write_overlay

    root = repository_root()
    folders = [f.expanduser().resolve() for f in args.folders]
    base = _base_config(root, args.configfile)
    names = _own_names(args.name, [folder_name(f) for f in folders], base)
    if len(names) != len(folders):
        raise DecomposeError(f"{len(names)} --name for {len(folders)} folders; give one per "
                             "folder, in order, or none")
    if len(set(names)) != len(names):
        raise DecomposeError(f"the drafter names {names} repeat; pass --name once per folder")
    refs = args.reference or ["-"] * len(folders)
    if len(refs) != len(folders):
        raise DecomposeError(f"{len(refs)} --reference for {len(folders)} folders; give one per "
                             "folder, in order (- for a folder without one), or none")
    target = _config_target(base, args.target)
    report = args.report or "+".join(names)
    overlay: dict = {"decompose": {}}
    for name, folder in zip(names, folders):
        fmt, kind = detect_checkpoint(folder, args.format, None)
        layout_before_serving(name, folder, args.engine or _serving_engine(base))
        try:
            overlay["decompose"].update(decompose_overlay(name, folder, fmt, kind)["decompose"])
        except ConfigError as exc:
            raise DecomposeError(str(exc)) from exc
    path = root / "results" / "check" / f"{report}.yaml"
    overlay["check"] = {report: {
        "drafters": names, "target": target,
        "command": shlex.join(["floorgap", "check", *argv]),
        "configfiles": [str(base), str(path)]}}
    references = {n: str(Path(r).expanduser()) for n, r in zip(names, refs) if r != "-"}
    if references:
        overlay["check"][report]["references"] = references
    if args.serve_rows is not None and args.serve_rows < 1:
        raise DecomposeError(f"--serve-rows {args.serve_rows}: give at least 1 row per task")
    overlay["check"][report].update({k: v for k in ("serve", "engine", "serve_rows")
                                     if (v := getattr(args, k)) is not None})
    overlay_path = write_overlay(path, overlay)
    files = check_paths(report)
    return root, _snakemake_command(root, base, overlay_path, files, args), files


def _serving_engine(base: Path) -> str | None:
    """The base config's serving engine (None without a serving section)."""
    import yaml

    return ((yaml.safe_load(base.read_text()) or {}).get("serving") or {}).get("engine")


def layout_before_serving(name: str, folder: Path, engine: str | None) -> None:
    """Before anything runs: a DFlash folder must declare its block layout (both exist, and an
    engine that assumes the other accepts far less; refused, naming the key to add), and a
    layout the check's engine runs otherwise is said on stderr (the page flags it too)."""
    from floorgap.models.engine_formats import describe_folder
    from floorgap.reports.check import layout_verdict

    try:
        facts = describe_folder(folder)
    except ValueError as exc:
        raise DecomposeError(str(exc)) from exc
    if facts["layout"] == "dflash" and facts["layout_field"] is None:
        raise DecomposeError(f"{folder / 'config.json'} declares no block layout: add "
                             '"sample_from_anchor": false if the drafter was trained 1+N (row 0 '
                             "holds the anchor, rows 1..N propose; z-lab's) or true if "
                             "anchor-first (row k proposes slot k; DeepSpec's)")
    verdict = layout_verdict(name, facts, engine)
    if verdict is not None and verdict.flag:
        print(f"floorgap check: {verdict.text}", file=sys.stderr)


def check(argv: Sequence[str]) -> int:
    """``floorgap check FOLDER [FOLDER ...] [options]``: run the workflow up to one check page
    for the drafters in the folders and print its summary. Returns the exit status (2 for a
    bad invocation, Snakemake's status when the workflow fails)."""
    args = check_parser().parse_args(list(argv))
    return _launch("check", args, lambda: _check_plan(args, argv), lambda root, files: [
        (root / files[1]).read_text(), f"report: {root / files[0]}"])


if __name__ == "__main__":
    sys.exit(main())
