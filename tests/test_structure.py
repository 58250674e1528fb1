"""The package's shape: layers only point down, no function is too long to read, one stage
name everywhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "floorgap"

#: Layer of each top-level part of the package; a module may import only its own layer or lower
#: ones. Bottom: shared plumbing (errors, progress, seeds, records, sampling, the config
#: resolver, the resource plan's arithmetic); then the estimators (maths); the sampling law, data, models and probes (they run
#: models), with the engine plugins (code a serving engine loads into itself); analysis
#: (records -> summaries); reports (summaries -> figures and tables) and the benchmarks (they
#: time probes and analysis); the stage commands; the console entry.
LAYERS: dict[str, int] = {
    "floorgap": 0, "errors": 0, "progress": 0, "seeds": 0, "records": 0, "config": 0,
    "notation": 0, "resources": 0, "attention": 0,
    "estimators": 1,
    "sampling": 2, "data": 2, "models": 2, "probes": 2, "engine_plugins": 2,
    "analysis": 3,
    "reports": 4, "bench": 4,
    "stages": 5, "rehearsal": 5,
    "cli": 6, "__main__": 6,
}
MAX_FUNCTION_LINES = 80


def module_name(path: Path, root: Path = SRC) -> str:
    parts = ["floorgap", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int:
    parts = module.split(".")
    key = parts[1] if len(parts) > 1 else "floorgap"
    if key not in LAYERS:
        raise KeyError(f"{module}: no layer assigned; add {key!r} to LAYERS in {__file__}")
    return LAYERS[key]


def floorgap_imports(source: str, module: str) -> set[str]:
    """Every floorgap module ``source`` imports (at any depth, absolute or relative)."""
    found: set[str] = set()
    package = module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "floorgap")
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([base] if base else []))
            if base.split(".")[0] != "floorgap":
                continue
            if base == "floorgap":  # `from floorgap import x`: x is a submodule or a name
                found.update(f"floorgap.{a.name}" if a.name in LAYERS else base for a in node.names)
            else:
                found.add(base)
    return found


def upward_imports(modules: dict[str, str]) -> list[str]:
    """``importer -> imported`` for every import that points to a higher layer."""
    bad = []
    for module, source in sorted(modules.items()):
        for imported in sorted(floorgap_imports(source, module)):
            if layer_of(imported) > layer_of(module):
                bad.append(f"{module} (layer {layer_of(module)}) -> {imported} "
                           f"(layer {layer_of(imported)})")
    return bad


def package_sources() -> dict[str, str]:
    """Module name -> source; a package's ``__init__`` is keyed ``<package>.__init__`` so that
    its relative imports resolve inside the package."""
    return {module_name(p) + (".__init__" if p.stem == "__init__" and p.parent != SRC else ""):
            p.read_text() for p in sorted(SRC.rglob("*.py"))}


def test_layers_only_point_down() -> None:
    assert upward_imports(package_sources()) == []


def import_cycle(modules: dict[str, str]) -> list[str]:
    """One import cycle among ``modules`` (imports at any depth, lazy ones too), or []."""
    import graphlib

    names = {m.removesuffix(".__init__"): m for m in modules}
    graph = {name: {i for i in floorgap_imports(modules[key], key) if i in names and i != name}
             for name, key in names.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return []


def test_no_import_cycle() -> None:
    assert import_cycle(package_sources()) == []


def test_cycle_check_catches_a_lazy_cycle() -> None:
    modules = {"floorgap.reports.a": "from floorgap.reports.b import X\n",
               "floorgap.reports.b": "def f():\n    from floorgap.reports.a import Y\n",
               "floorgap.reports.c": "from floorgap.reports.a import X\n"}
    assert sorted(set(import_cycle(modules))) == ["floorgap.reports.a", "floorgap.reports.b"]


def test_layer_check_catches_an_inverted_import() -> None:
    # An estimator that reaches up into the analysis layer, and a data module that imports a
    # stage command (the old `from floorgap.cli import StageError`), are both caught.
    modules = {
        "floorgap.estimators.bad": "from floorgap.analysis.floors import summarise\n",
        "floorgap.data.bad": "def f():\n    from floorgap.stages._cli import run_stage\n",
        "floorgap.reports.fine": "from floorgap.analysis import floors\nfrom . import common\n",
    }
    bad = upward_imports(modules)
    assert bad == [
        "floorgap.data.bad (layer 2) -> floorgap.stages._cli (layer 5)",
        "floorgap.estimators.bad (layer 1) -> floorgap.analysis.floors (layer 3)",
    ]


def test_every_module_has_a_layer() -> None:
    for module in package_sources():
        layer_of(module)


def long_functions(source: str, limit: int = MAX_FUNCTION_LINES) -> list[tuple[str, int]]:
    """Functions over ``limit`` lines, their docstring not counted (a numpydoc docstring is
    long by design; the code is what must stay readable)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            length = node.end_lineno - node.lineno + 1
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                length -= first.end_lineno - first.lineno + 1
            if length > limit:
                out.append((node.name, length))
    return out


def test_no_function_over_80_lines() -> None:
    found = {m: long for m, s in package_sources().items() if (long := long_functions(s))}
    assert found == {}, f"split these into named steps (limit {MAX_FUNCTION_LINES} lines): {found}"


def test_function_length_check_counts_lines() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    assert long_functions(f"def f():\n{body}\n") == [("f", MAX_FUNCTION_LINES + 1)]
    assert long_functions(f"def f():\n{body}\n", limit=MAX_FUNCTION_LINES + 1) == []
    doc = '    """A docstring\n    over\n    three lines."""\n'
    assert long_functions(f"def f():\n{doc}{body}\n") == [("f", MAX_FUNCTION_LINES + 1)]


def test_library_modules_do_not_import_stages() -> None:
    for module, source in package_sources().items():
        if layer_of(module) < LAYERS["stages"]:
            assert not any(i.startswith("floorgap.stages") or i == "floorgap.cli"
                           for i in floorgap_imports(source, module)), module


@pytest.mark.parametrize("stage", sorted(__import__("floorgap.stages").stages.STAGES))
def test_each_stage_has_its_module(stage: str) -> None:
    assert (SRC / "stages" / f"{stage}.py").is_file()


@pytest.mark.parametrize("stage", sorted(__import__("floorgap.stages").stages.STAGES))
def test_each_stage_imports_and_parses_its_help(stage: str) -> None:
    """Every stage module imports in-process (the fast tier touches every module of src/) and
    builds a parser whose help names its options."""
    import importlib

    module = importlib.import_module(f"floorgap.stages.{stage}")
    assert "usage:" in module.build_parser().format_help()


def test_every_library_module_imports() -> None:
    """Every module of src/ but ``__main__`` (which runs the command) imports in-process."""
    import importlib

    for path in sorted(SRC.rglob("*.py")):
        parts = path.relative_to(SRC.parent).with_suffix("").parts
        name = ".".join(parts).removesuffix(".__init__")
        if name != "floorgap.__main__":
            importlib.import_module(name)


def test_each_stage_module_is_listed() -> None:
    from floorgap.stages import STAGES

    modules = {p.stem for p in (SRC / "stages").glob("*.py") if not p.stem.startswith("_")}
    assert modules == set(STAGES)


RULES = SRC.parents[1] / "workflow" / "rules"


def test_rules_call_the_floorgap_command() -> None:
    import re

    from floorgap.stages import STAGES

    text = "\n".join(p.read_text() for p in sorted(RULES.glob("*.smk")))
    assert "python -m floorgap" not in text
    commands = re.findall(r'"floorgap (\w+) ', text)
    assert commands and set(commands) <= set(STAGES)
    # every stage the workflow runs has its rule file, named like it (values shares paper.smk,
    # the benchmarks are run by hand)
    assert set(commands) - {"values"} <= {p.stem for p in RULES.glob("*.smk")}


def test_snakefile_includes_every_rule_file() -> None:
    import re

    snakefile = (SRC.parents[1] / "Snakefile").read_text()
    included = set(re.findall(r'include: "workflow/rules/(\w+)\.smk"', snakefile))
    assert included == {p.stem for p in RULES.glob("*.smk")}


def test_console_help_lists_every_stage(capsys) -> None:
    from floorgap.cli import main
    from floorgap.stages import STAGES

    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    for stage in STAGES:
        assert f"  {stage} " in out
    assert main(["no-such-stage"]) == 2


def test_python_dash_m_is_the_console_command() -> None:
    import subprocess
    import sys

    import floorgap.__main__ as entry  # importing it runs nothing
    from floorgap.cli import main

    assert entry.main is main
    res = subprocess.run([sys.executable, "-m", "floorgap", "--version"], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.startswith("floorgap ")


#: Report modules whose items read summaries only: they load without torch, so each of their
#: report jobs (one process per item) skips the tensor stack's import.
TORCH_FREE_REPORTS = ("registry", "common", "floor_items", "gap_items", "serving_items",
                      "budget_items", "decomposition", "check")


def test_summary_only_report_modules_load_without_torch() -> None:
    import subprocess
    import sys

    mods = ", ".join(f"floorgap.reports.{m}" for m in TORCH_FREE_REPORTS)
    code = (f"import sys, {mods}; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]", res.stdout


# ------------------------------------------------------------------ code nothing uses


def unused_code(paths: list[Path]) -> list[str]:
    """What vulture finds unused in ``paths`` (at 60% confidence and above), given that the
    workflow's rule files, the tests and the reviewed whitelist (tests/unused_whitelist.py) use
    names too. A name that appears anywhere in the rule files counts as used there (they call
    the config's specs and the stages by name)."""
    import keyword
    import re
    import tempfile

    import vulture

    repo = SRC.parents[1]
    words: set[str] = set()
    for rule in [repo / "Snakefile", *sorted((repo / "workflow").rglob("*.smk")),
                 *sorted((repo / "workflow").rglob("*.py"))]:
        words |= set(re.findall(r"\b[A-Za-z_]\w*\b", rule.read_text()))
    with tempfile.TemporaryDirectory() as tmp:
        rules = Path(tmp) / "rule_names.py"
        rules.write_text("".join(f"_.{w}\n" for w in sorted(words) if not keyword.iskeyword(w)))
        v = vulture.Vulture()
        v.scavenge([str(p) for p in paths] + [str(repo / "tests"), str(rules)])
        roots = [p.resolve() for p in paths]
        return [f"{item.filename}:{item.first_lineno}: {item.message}"
                for item in v.get_unused_code(min_confidence=60)
                if any(Path(item.filename).resolve().is_relative_to(r) for r in roots)]


def test_no_code_that_nothing_uses() -> None:
    assert unused_code([SRC]) == []


def test_the_unused_code_check_finds_a_function_nothing_calls(tmp_path) -> None:
    module = tmp_path / "module.py"
    module.write_text("def used():\n    return 1\n\n\ndef forgotten():\n    return 2\n\n\n"
                      "print(used())\n")
    found = unused_code([module])
    assert len(found) == 1 and "unused function 'forgotten'" in found[0]



#: numpydoc section headings, as ``inspect.cleandoc`` leaves them
NUMPYDOC_SECTIONS = ("Parameters\n----------\n", "Returns\n-------\n")


def estimator_doc_problems(source: str, where: str) -> list[str]:
    """What a module's public functions lack: a numpydoc ``Parameters`` section (when they take
    any), a ``Returns`` section and a reference to the paper ("Sec." or "App.")."""
    import inspect

    problems = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        doc = inspect.cleandoc(ast.get_docstring(node, clean=False) or "") + "\n"
        args = node.args
        takes = args.posonlyargs + args.args + args.kwonlyargs
        wants = NUMPYDOC_SECTIONS if takes else NUMPYDOC_SECTIONS[1:]
        missing = [s.split("\n")[0] for s in wants if s not in doc]
        if not ("Sec." in doc or "App." in doc):
            missing.append("a paper reference (Sec./App.)")
        if missing:
            problems.append(f"{where}:{node.lineno} {node.name}: no {', '.join(missing)}")
    return problems


def test_public_estimators_document_their_arguments_and_the_paper() -> None:
    """Every public estimator says what it takes and returns (numpydoc) and where the paper
    defines what it computes."""
    problems = [p for path in sorted((SRC / "estimators").glob("*.py"))
                for p in estimator_doc_problems(path.read_text(), path.name)]
    assert problems == []


def test_the_estimator_docstring_check_finds_what_is_missing() -> None:
    documented = ('def floor(p, q):\n    """The floor (paper Sec. 2).\n\n    Parameters\n'
                  '    ----------\n    p : Tensor\n        A.\n    q : Tensor\n        B.\n\n'
                  '    Returns\n    -------\n    Tensor\n        C.\n    """\n')
    assert estimator_doc_problems(documented, "m.py") == []
    bare = 'def floor(p):\n    """The floor."""\n\n\ndef _helper(x):\n    return x\n'
    assert estimator_doc_problems(bare, "m.py") == [
        "m.py:1 floor: no Parameters, Returns, a paper reference (Sec./App.)"]


#: Modules past this many lines say why in their docstring, in a paragraph starting "Size:".
MAX_MODULE_LINES = 600


def long_modules_without_reason(sources: dict[str, str], limit: int = MAX_MODULE_LINES
                                ) -> list[str]:
    return [m for m, s in sources.items() if len(s.splitlines()) > limit
            and "\nSize:" not in (ast.get_docstring(ast.parse(s), clean=False) or "")]


def test_long_modules_state_why() -> None:
    assert long_modules_without_reason(package_sources()) == [], (
        "split these, or say why they are long in a 'Size:' paragraph of the docstring")


def test_the_module_length_check_finds_a_long_module_without_a_reason() -> None:
    body = "x = 1\n" * 5
    sources = {"a": '"""Short."""\n' + body, "b": '"""Long.\n\nSize: one concept."""\n' + body}
    assert long_modules_without_reason(sources, limit=3) == ["a"]


def private_imports(source: str) -> list[str]:
    """``module._name`` for every private name ``source`` imports from another floorgap
    module: a helper two modules share has one public home instead."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("floorgap"):
            found += [f"{node.module}.{a.name}" for a in node.names
                      if a.name.startswith("_") and not a.name.startswith("__")]
    return found


def test_no_private_name_is_imported_across_modules() -> None:
    found = {m: bad for m, s in package_sources().items() if (bad := private_imports(s))}
    assert found == {}, f"give these helpers a public name in one module: {found}"


def test_the_private_import_check_finds_one() -> None:
    assert private_imports("from floorgap.reports.common import GapSummary, _ci\n") == [
        "floorgap.reports.common._ci"]
    assert private_imports("from floorgap import __version__\nimport floorgap._x\n") == []


# ------------------------------------------------------------- the config's resolvers

def upward_calls(source: str, classes: dict[str, type]) -> list[str]:
    """``Class.name`` for each ``self.name`` (in a method of a resolver class) and each
    ``spec.name`` (in a function whose ``spec`` is annotated with one) that the class itself
    does not have: a resolver reaching a family above it, the circle a family's methods close
    through ``self`` where no import shows it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and node.name in classes:
            scopes = [(classes[node.name], "self", f) for f in node.body
                      if isinstance(f, ast.FunctionDef)]
        elif isinstance(node, ast.FunctionDef) and node.args.args \
                and node.args.args[0].arg == "spec" and node.args.args[0].annotation is not None:
            cls = classes.get(ast.unparse(node.args.args[0].annotation).strip("'\""))
            scopes = [(cls, "spec", node)] if cls is not None else []
        else:
            continue
        for cls, name, body in scopes:
            fields = set(getattr(cls, "__dataclass_fields__", ())) | {"_settings"}
            for sub in ast.walk(body):
                if isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) \
                        and sub.value.id == name and not hasattr(cls, sub.attr) \
                        and sub.attr not in fields:
                    found.append(f"{cls.__name__}.{sub.attr}")
    return sorted(set(found))


def resolver_classes() -> dict[str, type]:
    import floorgap.config as config
    from floorgap.config.base import SpecCore

    return {c.__name__: c for c in {SpecCore, *config.WorkflowSpec.__mro__}
            if isinstance(c, type) and issubclass(c, SpecCore)}


def test_each_config_resolver_reads_only_its_own_family_and_those_below() -> None:
    """config/: base <- drafters <- checks <- serving (probes and reports on base); a method
    (or a check_* function) uses only what its class has, so the families form a line."""
    classes = {k: v for k, v in resolver_classes().items() if k != "WorkflowSpec"}
    found = {p.name: bad for p in sorted((SRC / "config").glob("*.py"))
             if (bad := upward_calls(p.read_text(), classes))}
    assert found == {}, f"move what these reach to the family below both: {found}"


def test_the_resolver_check_finds_a_call_upward() -> None:
    source = ("class DrafterSpecs(SpecCore):\n    def x(self):\n        return self.check_served('a')\n"
              "def check_it(spec: SpecCore) -> None:\n    spec.export_formats('a')\n")
    assert upward_calls(source, resolver_classes()) == ["DrafterSpecs.check_served",
                                                        "SpecCore.export_formats"]


def epochs_rules(source: str) -> int:
    """How many ``.get("epochs", ...)`` a source holds: the per-drafter epochs rule."""
    return sum(1 for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Attribute) and n.func.attr == "get" and n.args
               and isinstance(n.args[0], ast.Constant) and n.args[0].value == "epochs")


def test_the_epochs_rule_has_one_home() -> None:
    """An entry's epochs (its own, else drafters.train.epochs) are read in
    config.drafter_epochs alone: the trainer writes as many epoch files as the evaluation
    groups read."""
    found = {m: n for m, s in package_sources().items() if (n := epochs_rules(s))}
    assert found == {"floorgap.config.base": 1}, found


def test_the_epochs_rule_check_counts_a_second_home() -> None:
    assert epochs_rules("a = v.get('epochs', t['epochs'])\nb = v.get('epochs')\n") == 2


def imports_between(sources: dict[str, str], lower: str, upper: str) -> list[str]:
    """``module -> imported`` for each module of package ``lower`` importing from ``upper``."""
    return sorted(f"{m} -> {i}" for m, s in sources.items()
                  if m.startswith(f"floorgap.{lower}.")
                  for i in floorgap_imports(s, m) if i.startswith(f"floorgap.{upper}"))


def test_models_do_not_import_data() -> None:
    """data/ and models/ share a layer but point one way: data builds the corpus and the
    training records by running the target (models/); models read a training record through
    models/examples.py, its one reader, and never import data/."""
    assert imports_between(package_sources(), "models", "data") == []


def test_the_direction_check_finds_a_model_module_importing_data() -> None:
    sources = {"floorgap.models.x": "from floorgap.data.drafter_data import block_index\n"}
    assert imports_between(sources, "models", "data") == [
        "floorgap.models.x -> floorgap.data.drafter_data"]


# ------------------------------------------------------------- a drafter kind's one row

def test_every_place_a_kind_appears_follows_its_row_in_kinds() -> None:
    """config/kinds.KINDS is the table of kinds: the drafter classes, the lookup kinds, the
    schema's enums and the engine layouts agree with it, so a kind is added there (and its
    class) and a second list of kinds fails here."""
    import yaml

    from floorgap.config import DRAFTER_KINDS, KINDS, LOOKUP_KINDS, SERVED_FORMATS
    from floorgap.models.drafters import DRAFTER_CLASSES
    from floorgap.models.engine_formats import FORMATS

    schema = yaml.safe_load((SRC.parents[1] / "workflow/schemas/config.schema.yaml").read_text())
    defs = schema["$defs"]
    assert tuple(DRAFTER_CLASSES) == DRAFTER_KINDS
    assert tuple(defs["drafter_variant"]["properties"]["kind"]["enum"]) == DRAFTER_KINDS
    lookups = schema["properties"]["drafters"]["properties"]["lookups"]
    assert tuple(lookups["additionalProperties"]["properties"]["kind"]["enum"]) == LOOKUP_KINDS
    formats = {f for kind in KINDS.values() for f in kind.formats}
    assert formats | {"floorgap"} == set(FORMATS)
    checkpoint = defs["drafter_variant"]["properties"]["checkpoint"]["properties"]["format"]
    assert set(checkpoint["enum"]) == formats and set(SERVED_FORMATS) < formats


#: Where a module imports floorgap inside a function on purpose: the console and the config
#: resolver stay light (``floorgap --help``, the Snakefile's parse), the reports load without
#: torch (test_summary_only_report_modules_load_without_torch), ``_cli`` sets the threads.
LAZY_IMPORTERS = ("floorgap.cli", "floorgap.config", "floorgap.reports", "floorgap.resources",
                  "floorgap.rehearsal", "floorgap.stages._cli", "floorgap.engine_plugins",
                  "floorgap.__main__")


def local_floorgap_imports(source: str) -> list[str]:
    """``line: module`` of each import of a floorgap module inside a function."""
    found = []
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("floorgap"):
                    found.append(f"{node.lineno}: {node.module}")
                elif isinstance(node, ast.Import):
                    found += [f"{node.lineno}: {a.name}" for a in node.names
                              if a.name.startswith("floorgap")]
    return sorted(set(found))


def test_library_modules_import_floorgap_at_the_top() -> None:
    """What a module needs of the package is read at its top, where the import graph shows it;
    only the light entry points (LAZY_IMPORTERS) defer theirs."""
    found = {m: bad for m, s in package_sources().items()
             if not m.startswith(LAZY_IMPORTERS) and (bad := local_floorgap_imports(s))}
    assert found == {}, f"move these imports to the module's top: {found}"


def test_the_local_import_check_finds_one() -> None:
    source = "import os\n\ndef f():\n    from floorgap.records import read_table\n    import json\n"
    assert local_floorgap_imports(source) == ["4: floorgap.records"]
