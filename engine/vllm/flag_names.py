"""Engine flags that no vLLM source names at all, found without importing vLLM.

Whether `--bogus` is a vLLM flag is vLLM's parser's to say, and building that parser
imports vLLM and torch: 10 to 20 s before "Unknown flag" on a busy host. vLLM's flags
are the fields of `EngineArgs` (engine/arg_utils.py) and of its config classes
(config/*.py), so a flag whose name appears nowhere in those files' text cannot be one.
That is read from the installed package's source, never imported: a flag named there
somewhere (or a prefix of such a name, which argparse takes as an abbreviation) is left
for vLLM's parser to judge, so this check only ever answers "surely unknown" or nothing.
"""

from __future__ import annotations

import importlib.util
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Sequence

_SOURCES = ("engine/arg_utils.py", "config/*.py", "utils/argparse_utils.py")


@cache
def _vllm_source() -> str | None:
    """The text of the files that define vLLM's engine flags; None when there is no vLLM
    here (or no readable source), and nothing can be said without it."""
    try:
        spec = importlib.util.find_spec("vllm")  # finds the package; runs none of it
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    texts: list[str] = []
    for pattern in _SOURCES:
        for path in sorted(root.glob(pattern)):
            try:
                texts.append(path.read_text(encoding="utf-8", errors="replace"))
            except OSError:
                return None
    return "\n".join(texts) if texts and (root / "engine/arg_utils.py").exists() else None


def surely_unknown(argv: Sequence[str]) -> str | None:
    """The first `--flag` of `argv` that vLLM's flag sources never name, or a first word
    that is no flag at all; None when every one might be vLLM's (or there is no vLLM
    source to read)."""
    if argv and not argv[0].startswith("-"):
        return argv[0]  # vLLM's engine flags take no positional word, and none precedes it
    source = None
    for word in argv:
        if not word.startswith("--") or len(word) < 3 or word[2] == "-":
            continue
        # --name=value, --json-arg.key (vLLM's dotted keys), --name_with_underscores.
        name = re.split(r"[=.+]", word[2:], maxsplit=1)[0].replace("-", "_")
        if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", name):
            continue
        source = source if source is not None else _vllm_source()
        if source is None:
            return None
        names = [name, name[3:]] if name.startswith("no_") and len(name) > 3 else [name]
        dashed = "--" + name.replace("_", "-")
        if dashed in source or any(re.search(r"\b" + re.escape(n), source) for n in names):
            continue
        return word.split("=", 1)[0]
    return None
