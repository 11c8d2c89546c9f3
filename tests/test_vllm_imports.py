"""The scan that marks tests `engine` when they import vLLM (tests/vllm_imports.py)."""

from __future__ import annotations

from vllm_imports import scan_source


def test_an_import_at_module_level_marks_every_test() -> None:
    found = scan_source("from engine.vllm.options import build_engine_settings\n")
    assert found.whole_module
    assert found.marks("test_anything")


def test_an_import_in_a_test_marks_that_test_alone() -> None:
    source = """
def test_a():
    from vllm import SamplingParams

class TestB:
    def test_c(self):
        import engine.vllm.engine

def test_d():
    import vllm_imports, engine.vllmish
"""
    found = scan_source(source)
    assert not found.whole_module
    assert found.tests == {"test_a", "TestB.test_c"}
    assert not found.marks("test_d")


def test_a_helper_that_imports_vllm_marks_the_module() -> None:
    # Which tests call a helper or use a fixture, the scan cannot tell: all of them pay.
    found = scan_source("def _engine():\n    from engine import vllm\n")
    assert found.whole_module


def test_type_checking_imports_and_scripts_in_strings_do_not_count() -> None:
    source = '''
from typing import TYPE_CHECKING
if TYPE_CHECKING:
    from engine.vllm.engine import VllmEngine
else:
    import os
SCRIPT = """
from engine.vllm.engine import VllmEngine
"""
def test_a():
    run(SCRIPT)
'''
    found = scan_source(source)
    assert not found.whole_module
    assert found.tests == set()
