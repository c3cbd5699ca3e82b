"""The layering rule: the command-line front-ends (``xconf/cli``) sit on top; nothing below
them imports them, not even lazily inside a function or under ``TYPE_CHECKING``."""

from __future__ import annotations

import ast
from pathlib import Path

import xconf

PACKAGE = Path(xconf.__file__).resolve().parent
UI = "xconf.cli"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


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


def _is_ui(module: str) -> bool:
    return module == UI or module.startswith(UI + ".")


def test_the_import_scan_sees_every_form_of_import() -> None:
    # The scan must catch the forms a breach takes: lazy, by name, aliased, relative, typed.
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
        assert any(_is_ui(m) for m in imported), (form, imported)
    clean = "from xconf.client_side import x\nimport xconf.clinic\nfrom . import cli_names\n"
    assert not any(_is_ui(m) for _, m in _imported(clean, "xconf.session", is_package=False))


def test_nothing_outside_cli_imports_cli() -> None:
    offenders = []
    sources = sorted(PACKAGE.rglob("*.py"))
    assert len(sources) > 50  # the scan really walks the package
    for path in sources:
        if _module_name(path) == UI or _module_name(path).startswith(UI + "."):
            continue
        offenders += [
            f"{path.relative_to(PACKAGE.parent)}:{line} imports {module}"
            for line, module in _imported(
                path.read_text(encoding="utf-8"), _module_name(path), path.name == "__init__.py"
            )
            if _is_ui(module)
        ]
    assert not offenders, "core modules import the CLI:\n" + "\n".join(offenders)
