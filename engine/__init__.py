"""kvscope's engine layer: vLLM and everything about inference, with no UI in it.

Nothing in this package imports Textual or `tui`; tests/test_boundary.py checks it.
"""
