"""How busy each pytest worker was, from the lines tests/conftest.py writes: the suite
lasts as long as its busiest worker, so this says which tests to shorten or move."""

from __future__ import annotations

import sys
from collections import defaultdict
from pathlib import Path


def summary(lines: list[str]) -> list[str]:
    busy: dict[str, float] = defaultdict(float)
    tests: dict[str, int] = defaultdict(int)
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4:
            continue
        worker, began_s, took_s, _ = parts
        began, took = float(began_s), float(took_s)
        busy[worker] += took
        tests[worker] += 1
        first[worker] = min(first.get(worker, began), began)
        last[worker] = max(last.get(worker, began + took), began + took)
    start = min(first.values(), default=0.0)
    return [
        f"{w}: {tests[w]} tests, busy {busy[w]:.0f} s, "
        f"from {first[w] - start:.0f} s to {last[w] - start:.0f} s"
        for w in sorted(busy)
    ]


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: test_timeline.py TIMELINE_FILE", file=sys.stderr)
        return 2
    path = Path(sys.argv[1])
    if not path.exists():
        print(f"no timeline at {path}")
        return 0
    for row in summary(path.read_text(encoding="utf-8").splitlines()):
        print(f"ci: worker {row}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
