"""Benchmark (not a test): the article's 512-4096 sweep on this machine's CPU.

Prints the table and the two ratios that carry the article's finding, measured in one
run so machine noise cancels:
  TTFT(4096) / TTFT(512)       expected well above 4 (prefill is compute-bound)
  ITL(4096) / ITL(512)         expected below 1.5  (decode is memory-bound)
and measured ITL as a percentage of this CPU's roofline floor.

    .venv/bin/python benchmarks/prefill_vs_decode.py [--runs 3] [--output-len 128] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

KVSCOPE = str(Path(sys.executable).with_name("kvscope"))


def main() -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--runs", default="3")
    p.add_argument("--output-len", default="128")
    p.add_argument("--prompt-lens", default="512,1024,2048,4096")
    p.add_argument("--out", default=None, help="folder for sweep.json / sweep.csv")
    args, engine_flags = p.parse_known_args()
    out = Path(args.out or tempfile.mkdtemp(prefix="kvscope-sweep-"))
    out.mkdir(parents=True, exist_ok=True)
    cmd = [
        KVSCOPE,
        "bench",
        "--prompt-lens",
        args.prompt_lens,
        "--runs",
        args.runs,
        "--output-len",
        args.output_len,
        "--json",
        str(out / "sweep.json"),
        "--csv",
        str(out / "sweep.csv"),
        *engine_flags,
    ]
    print("$", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd)
    if rc not in (0, 3):
        return rc
    data = json.loads((out / "sweep.json").read_text())
    ok = [p for p in data["points"] if p["ok"]]
    if len(ok) < 2:
        print("not enough points for ratios")
        return 1
    first, last = ok[0], ok[-1]
    ttft_ratio = last["mean_ttft_ms"] / first["mean_ttft_ms"]
    itl_ratio = last["median_itl_ms"] / first["median_itl_ms"]
    print()
    print(
        f"prompt x{last['prompt_len'] / first['prompt_len']:.0f} "
        f"({first['prompt_len']} -> {last['prompt_len']} tokens)"
    )
    print(
        f"  TTFT ratio        {ttft_ratio:6.2f}   (expected well above 4)  "
        f"{'PASS' if ttft_ratio > 4 else 'FAIL'}"
    )
    print(
        f"  median ITL ratio  {itl_ratio:6.2f}   (expected below 1.5)     "
        f"{'PASS' if itl_ratio < 1.5 else 'FAIL'}"
    )
    for point in ok:
        if "itl_pct_of_floor" in point:
            print(
                f"  {point['prompt_len']:>5} tokens: median ITL {point['median_itl_ms']:.1f} ms "
                f"= {point['itl_pct_of_floor']:.0f}% of the floor "
                f"({point['itl_floor_ms']:.1f} ms); TTFT {point['mean_ttft_ms']:.0f} ms = "
                f"{point['ttft_pct_of_floor']:.0f}% of the floor ({point['ttft_floor_ms']:.0f} ms)"
            )
    print(f"files: {out}/sweep.json, {out}/sweep.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
