"""Which tests import vLLM, read from a test module's source without running it.

conftest.py marks those tests `engine`, so that `make test-fast` (`-m "not engine"`) never
pays for importing vLLM. `engine.vllm` counts as vLLM: it is the room that exists to import
it (lazily, so importing the module alone costs nothing, but its callers pay). Imports under
`if TYPE_CHECKING:` never run and do not count; an import inside a string (a script for a
subprocess) is not an import.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

VLLM_MODULES = ("vllm", "engine.vllm")


@dataclass
class VllmImports:
    """Where one test module imports vLLM."""

    whole_module: bool = False
    """At import time, or in a helper or fixture (whose callers the source does not say)."""
    tests: set[str] = field(default_factory=set)
    """Tests that import it in their own body: `test_x`, or `TestClass.test_x`."""

    def marks(self, qualified_test_name: str) -> bool:
        return self.whole_module or qualified_test_name in self.tests


def _names_vllm(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in VLLM_MODULES)


def _is_vllm_import(node: ast.AST) -> bool:
    if isinstance(node, ast.Import):
        return any(_names_vllm(alias.name) for alias in node.names)
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
        if _names_vllm(node.module):
            return True
        # `from engine import vllm`
        return any(_names_vllm(f"{node.module}.{alias.name}") for alias in node.names)
    return False


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def scan_source(source: str) -> VllmImports:
    found = VllmImports()

    def visit(node: ast.AST, owner: str | None, in_class: str | None) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for statement in node.orelse:
                visit(statement, owner, in_class)
            return
        if _is_vllm_import(node):
            if owner is not None and owner.rsplit(".", 1)[-1].startswith("test"):
                found.tests.add(owner)
            else:
                found.whole_module = True
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and owner is None:
            owner = f"{in_class}.{node.name}" if in_class else node.name
        elif isinstance(node, ast.ClassDef) and owner is None and in_class is None:
            in_class = node.name
        for child in ast.iter_child_nodes(node):
            visit(child, owner, in_class)

    visit(ast.parse(source), None, None)
    return found
