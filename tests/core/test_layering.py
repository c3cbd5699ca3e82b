"""The house's shape: the import graph of ``xconf/`` and ``hydra_plugins/`` has no cycle, and
no module imports one of a higher layer than its own (``LAYERS``, lowest first; the same
order is drawn in docs/architecture.md). Every import counts, even a lazy one inside a
function or one under ``TYPE_CHECKING``: each still ties the two modules together."""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

# Scanned from this file's own checkout (not the installed package), so the test judges the
# tree it sits in.
ROOT = Path(__file__).resolve().parents[2]
TREES = ("xconf", "hydra_plugins")

# Lowest first. A module belongs to the layer of its longest matching prefix (the package
# root ``xconf`` names only the facade, ``xconf/__init__.py``, never its submodules); it may
# import its own layer and any lower one, never a higher one.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "xconf.errors",
            "xconf.canonical",
            "xconf.interrupts",
            "xconf.case_record",
            "xconf.rollout_correction",
            "xconf.full_vocab",
            "xconf.shown_text",
            "xconf.runtime.deadline",
            "xconf.runtime.ranks",
            "xconf.runtime.requests",
            "xconf.runtime.readback",
        ),
    ),
    ("vocabulary", ("xconf.knobs", "xconf.experiment", "xconf.contract")),
    ("operators", ("xconf.operators",)),
    ("storage", ("xconf.artifacts", "xconf.run_output")),
    (
        "planning",
        (
            "xconf.config",
            "xconf.planner",
            "xconf.execution_plan",
            "xconf.runtime.loading",
            "xconf.runtime.input_limits",
        ),
    ),
    ("kernels", ("xconf.ops", "xconf.testing")),
    (
        "runtime",
        ("xconf.runtime", "xconf.engine_cache", "xconf.comparison", "xconf.case_documents"),
    ),
    (
        "verification",
        (
            "xconf.runner",
            "xconf.side_scoring",
            "xconf.verify",
            "xconf.verify_verdict",
            "xconf.verify_plan",
            "xconf.judge",
        ),
    ),
    ("adapters", ("xconf.adapters", "xconf.launchers")),
    ("report", ("xconf.report",)),
    ("service", ("xconf.session", "xconf.sweep", "xconf.sweep_service")),
    ("features", ("xconf.localize", "xconf.inloop", "xconf.fix")),
    ("plugins", ("hydra_plugins",)),
    ("front_ends", ("xconf.cli",)),
    ("facade", ("xconf",)),
)


@functools.cache
def module_names() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(source: str, module: str, is_package: bool) -> list[tuple[int, str]]:
    """Every module ``source`` (module ``module``) imports, with its line: absolute imports,
    relative ones resolved, and ``from X import name`` counted as both ``X`` and ``X.name``
    (``name`` may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def edges(modules: Mapping[str, Path]) -> dict[str, dict[str, int]]:
    """Module -> the scanned modules it imports (with the first line that does). ``from X
    import name`` is an edge to ``X.name`` when that is a module, else to ``X``."""
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        targets: dict[str, int] = {}
        by_line: dict[int, list[str]] = {}
        source = path.read_text(encoding="utf-8")
        for line, target in _imported(source, name, path.name == "__init__.py"):
            by_line.setdefault(line, []).append(target)
        for line, listed in by_line.items():
            for target in listed:
                submodules = [t for t in listed if t.startswith(target + ".") and t in modules]
                if target in modules and target != name and not submodules:
                    targets.setdefault(target, line)
        graph[name] = targets
    return graph


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, layer)
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            below = module.startswith(prefix + ".") and prefix != "xconf"
            if (module == prefix or below) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def upward(graph: Mapping[str, Mapping[str, int]], modules: Mapping[str, Path]) -> list[str]:
    breaches = []
    for name, targets in sorted(graph.items()):
        own = layer_of(name)
        for target, line in sorted(targets.items()):
            theirs = layer_of(target)
            if own is not None and theirs is not None and theirs > own:
                breaches.append(
                    f"{modules[name].relative_to(ROOT)}:{line} ({LAYERS[own][0]}) imports "
                    f"{target} ({LAYERS[theirs][0]})"
                )
    return breaches


def test_the_import_scan_sees_every_form_of_import() -> None:
    # The scan must catch the forms an import takes: lazy, by name, aliased, relative, typed.
    forms = [
        "def f():\n    from xconf.cli.localize import show\n",
        "from xconf import cli\n",
        "import xconf.cli.render as r\n",
        "from .cli import main\n",
        "from ..cli import render\n",
        "if TYPE_CHECKING:\n    from xconf.cli.render import ConsoleView\n",
    ]
    modules = {"from ..cli": "xconf.localize.service"}
    for form in forms:
        where = next((m for k, m in modules.items() if k in form), "xconf.session")
        imported = [m for _, m in _imported(form, where, is_package=False)]
        assert any(m == "xconf.cli" or m.startswith("xconf.cli.") for m in imported), form
    clean = "from xconf.client_side import x\nimport xconf.clinic\nfrom . import cli_names\n"
    found = [m for _, m in _imported(clean, "xconf.session", is_package=False)]
    assert not any(m == "xconf.cli" or m.startswith("xconf.cli.") for m in found)


def test_the_checks_catch_a_planted_cycle_and_upward_import() -> None:
    # The checkers themselves, on a graph with one cycle and one upward import.
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1}, "d": {"a": 1}, "e": {}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b": 1}, "b": {}}) == []
    assert layer_of("xconf.knobs") < layer_of("xconf.session")  # type: ignore[operator]
    assert layer_of("xconf.runtime.loading") == layer_of("xconf.config.strict")  # longest prefix
    assert layer_of("xconf") == len(LAYERS) - 1 and layer_of("json") is None
    assert layer_of("xconf.new_module") is None  # a new module must be placed
    fake = {"xconf.knobs": ROOT / "xconf/knobs.py", "xconf.session": ROOT / "xconf/session.py"}
    breach = upward({"xconf.knobs": {"xconf.session": 7}, "xconf.session": {}}, fake)
    assert breach == ["xconf/knobs.py:7 (vocabulary) imports xconf.session (service)"]


def test_every_module_has_a_layer() -> None:
    modules = module_names()
    assert len(modules) > 100  # the scan really walks both trees
    missing = sorted(name for name in modules if layer_of(name) is None)
    assert not missing, "modules without a layer (place them in LAYERS):\n" + "\n".join(missing)


@functools.cache
def _graph() -> dict[str, dict[str, int]]:
    return edges(module_names())  # parsed once for the two checks below


def test_the_import_graph_has_no_cycle() -> None:
    found = cycles(_graph())
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_imports_a_higher_layer() -> None:
    breaches = upward(_graph(), module_names())
    assert not breaches, "imports against the layer order:\n" + "\n".join(breaches)
