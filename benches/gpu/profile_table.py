#!/usr/bin/env python3
"""The top kernels of a profiled run, as a markdown table.

CubeCL (`CUBECL_DEBUG_OPTION=profile`) prints its cumulative per-kernel table at every sync; the
last one in the log covers the whole process. cuBLASLt GEMMs are not CubeCL kernels: tally prints
their table itself (`cuBLASLt GEMMs (...): ...`) at the end of `bench scenario`, and it is appended.
With `--warm-json`, an unprofiled run's scenario JSON of the same route, the kernels' and GEMMs'
GPU time is set against its warm request's wall time: what is left is time the GPU waited (for
the host's launches and work between passes, or syncs), which no per-kernel table shows.

    profile_table.py CUBECL_LOG [--stdout SCENARIO_STDOUT] [--warm-json SCENARIO_JSON] [--top 20] [--out profile.md]
"""
import argparse
import json
import os
import re
import sys

UNITS = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def milliseconds(text):
    match = re.fullmatch(r"([0-9.]+)\s*(ns|µs|us|ms|s)", text.strip())
    return float(match.group(1)) * UNITS[match.group(2)] if match else None


def last_table(lines):
    """Rows (name, ms, calls) of the last `| Name | Duration | Num Computed | Ratio |` table."""
    start = max((i for i, line in enumerate(lines) if re.match(r"\|\s*Name\s*\|\s*Duration\s*\|", line)), default=None)
    if start is None:
        return []
    rows = []
    for line in lines[start + 1:]:
        # Kernel names hold '|' themselves (CubeCL writes generics as `Kernel | Runtime | ...`):
        # the last three cells are the numbers, the name is all before them.
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 4:
            if rows:
                break
            continue
        name, duration, count = " | ".join(cells[:-3]), cells[-3], cells[-2]
        if name == "Total":
            break
        ms = milliseconds(duration)
        if ms is not None and count.isdigit():
            rows.append((name, ms, int(count)))
    return rows


def category(name):
    lower = name.lower()
    for key, label in (("multi_item", "attention (tally kernel)"), ("attention", "attention"), ("matmul", "matmul (CubeCL)"),
                       ("label", "LM head labels"), ("fuse", "fused elementwise"), ("reduce", "reductions"), ("copy", "copies"),
                       ("contiguous", "copies"), ("cast", "casts")):
        if key in lower:
            return label
    return "other"


def busy_line(kernel_ms, gemm_ms, warm_json):
    """The GPU's busy time in the profiled request against an unprofiled warm request's wall time."""
    try:
        with open(warm_json) as f:
            wall_ms = json.load(f)["warm_median"]["total_seconds"] * 1e3
    except (OSError, ValueError, KeyError, TypeError) as failure:
        return f"GPU busy against wall time: no warm request to compare with ({warm_json}: {failure!r})."
    busy_ms = kernel_ms + (gemm_ms or 0.0)
    parts = f"CubeCL kernels {kernel_ms:.1f} ms" + (f" + cuBLASLt GEMMs {gemm_ms:.1f} ms" if gemm_ms is not None else "")
    return (f"GPU busy against wall time: {parts} = {busy_ms:.1f} ms of an unprofiled warm request's {wall_ms:.1f} ms "
            f"({os.path.basename(warm_json)}): {wall_ms - busy_ms:.1f} ms ({100 * (wall_ms - busy_ms) / wall_ms:.0f} %) the GPU ran none of them "
            "(host work between passes, launches it waited for, syncs; profiling's own syncs make the kernels' sum an upper bound).")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("log")
    parser.add_argument("--stdout", help="the scenario's stdout, for tally's cuBLASLt table")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--title", default="Profile")
    parser.add_argument("--warm-json", help="an unprofiled scenario run of the same route, for its warm request's wall time")
    parser.add_argument("--out")
    args = parser.parse_args()

    try:
        with open(args.log, errors="replace") as f:
            rows = last_table(f.read().splitlines())
    except FileNotFoundError:  # a backend CubeCL does not run (the CPU rehearsal) logs nothing
        rows = []
    out = [f"## {args.title}", ""]
    if not rows:
        out.append("No CubeCL profile table in the log (was CUBECL_DEBUG_OPTION=profile set?).")
    else:
        total = sum(ms for _, ms, _ in rows)
        out += [f"CubeCL kernels: {total:.1f} ms over {sum(c for _, _, c in rows)} launches, {len(rows)} distinct kernels.", "",
                "| # | kernel | ms | launches | share |", "|---|---|---|---|---|"]
        for i, (name, ms, calls) in enumerate(sorted(rows, key=lambda r: -r[1])[: args.top], 1):
            name = name.replace(" | ", " / ")  # a '|' would end the markdown cell
            short = name if len(name) <= 110 else name[:107] + "..."
            out.append(f"| {i} | `{short}` | {ms:.2f} | {calls} | {100 * ms / total:.1f} % |")
        by_category = {}
        for name, ms, calls in rows:
            by_category[category(name)] = by_category.get(category(name), 0.0) + ms
        out += ["", "| category | ms | share |", "|---|---|---|"]
        for label, ms in sorted(by_category.items(), key=lambda kv: -kv[1]):
            out.append(f"| {label} | {ms:.2f} | {100 * ms / total:.1f} % |")
    gemm_ms = None
    if args.stdout:
        with open(args.stdout, errors="replace") as f:
            text = f.read()
        start = text.rfind("cuBLASLt GEMMs")
        if start >= 0:
            out += ["", text[start:].strip()]
            total = re.match(r"cuBLASLt GEMMs \([^)]*\): ([0-9.]+) ms in all", text[start:])
            gemm_ms = float(total.group(1)) if total else None
    if args.warm_json and rows:
        out += ["", busy_line(sum(ms for _, ms, _ in rows), gemm_ms, args.warm_json)]
    report = "\n".join(out) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    sys.stdout.write(report)


if __name__ == "__main__":
    main()
