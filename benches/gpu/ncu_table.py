#!/usr/bin/env python3
"""Nsight Compute's view of the top kernels, as a markdown table.

Reads the details page of an `ncu` report as CSV (`ncu --import R.ncu-rep --csv --page details
--print-units base`): one row per metric per profiled launch. Launches are grouped by kernel
name and sorted by their summed duration; each kernel gets its launches, time, share, the
speed-of-light throughputs (SM, memory, DRAM, L2; averaged over its launches, weighted by
duration), its DRAM traffic in GB/s and the tensor pipes' busy share where the report has those
metrics, its occupancy and its launch shape, and where the report has the stall metrics
(`smsp__average_warps_issue_stalled_*_per_issue_active.ratio`) the cycles a warp waits between
two issued instructions and the three reasons that take most of them. `bound` reads the speed of light: the larger of SM and memory throughput, and
`latency` where both stay under 60 %.

    ncu_table.py DETAILS_CSV [--top 20] [--title T] [--out ncu.md]
"""
import argparse
import csv
import io
import sys

# Duration units ncu prints (base units with --print-units base; scaled ones otherwise), in ms.
DURATION_MS = {"nsecond": 1e-6, "ns": 1e-6, "usecond": 1e-3, "us": 1e-3, "msecond": 1.0, "ms": 1.0, "second": 1e3, "s": 1e3}
THROUGHPUTS = [("SM %", "Compute (SM) Throughput"), ("memory %", "Memory Throughput"), ("DRAM %", "DRAM Throughput"),
               ("L2 %", "L2 Cache Throughput")]
TENSOR_PREFIX = "sm__pipe_tensor_op_"
DRAM_RATE = "dram__bytes.sum.per_second"
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
CYCLES_PER_ISSUE = "Warp Cycles Per Issued Instruction"
# Rates ncu prints (bytes per second in base units; scaled ones otherwise), in GB/s.
RATE_GBPS = {"byte/second": 1e-9, "byte/s": 1e-9, "Kbyte/second": 1e-6, "Mbyte/second": 1e-3, "Gbyte/second": 1.0,
             "Tbyte/second": 1e3, "B/s": 1e-9, "KB/s": 1e-6, "MB/s": 1e-3, "GB/s": 1.0, "TB/s": 1e3}


def number(text):
    """A metric value as a float (thousands separators dropped), or None for n/a and the like."""
    try:
        return float(text.replace(",", ""))
    except (AttributeError, ValueError):
        return None


def launches(text):
    """Each profiled launch: {"kernel", "block", "grid", "metrics": {name: (unit, value)}}, in ID order."""
    lines = text.splitlines()
    # ncu's own messages (==PROF==, ==WARNING==) and the program's output may come first.
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    by_id = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        if not row.get("ID") or row.get("Kernel Name") is None:
            continue
        launch = by_id.setdefault(row["ID"], {"kernel": row["Kernel Name"], "block": row.get("Block Size", ""),
                                              "grid": row.get("Grid Size", ""), "metrics": {}})
        launch["metrics"][row.get("Metric Name", "")] = (row.get("Metric Unit", ""), row.get("Metric Value", ""))
    return [by_id[key] for key in sorted(by_id, key=lambda k: (len(k), k))]


def duration_ms(launch):
    unit, value = launch["metrics"].get("Duration", ("", ""))
    value = number(value)
    return value * DURATION_MS[unit] if value is not None and unit in DURATION_MS else None


def metric(launch, name):
    return number(launch["metrics"].get(name, ("", ""))[1])


def dram_gbps(launch):
    unit, value = launch["metrics"].get(DRAM_RATE, ("", ""))
    value = number(value)
    return value * RATE_GBPS[unit] if value is not None and unit in RATE_GBPS else None


def tensor_busy(launch):
    """The busiest tensor pipe's share of active cycles, where the report measured one."""
    values = [number(value) for name, (_, value) in launch["metrics"].items() if name.startswith(TENSOR_PREFIX)]
    values = [v for v in values if v is not None]
    return max(values) if values else None


def stalls(launch):
    """{reason: cycles a warp spends stalled for it per issued instruction}, where measured."""
    found = {}
    for name, (_, value) in launch["metrics"].items():
        if name.startswith(STALL_PREFIX) and name.endswith(STALL_SUFFIX) and number(value) is not None:
            found[name[len(STALL_PREFIX):-len(STALL_SUFFIX)]] = number(value)
    return found


def top_stalls(group, count=3):
    """A kernel's `count` largest stall reasons, each weighted by its launches' durations."""
    reasons = sorted({reason for launch in group for reason in stalls(launch)})
    means = [(reason, weighted((stalls(launch).get(reason), duration_ms(launch)) for launch in group)) for reason in reasons]
    means = sorted(((reason, value) for reason, value in means if value is not None), key=lambda rv: -rv[1])
    return ", ".join(f"{reason} {value:.1f}" for reason, value in means[:count]) or "—"


def weighted(pairs):
    pairs = [(value, weight) for value, weight in pairs if value is not None]
    total = sum(weight for _, weight in pairs)
    return sum(value * weight for value, weight in pairs) / total if total > 0 else None


def table(rows, top, title):
    timed = [launch for launch in rows if duration_ms(launch) is not None]
    out = [f"## {title}", ""]
    if not timed:
        return out + ["No profiled launches with a duration in the report."]
    kernels = {}
    for launch in timed:
        kernels.setdefault(launch["kernel"], []).append(launch)
    total = sum(duration_ms(launch) for launch in timed)
    has_tensor = any(tensor_busy(launch) is not None for launch in timed)
    has_dram_rate = any(dram_gbps(launch) is not None for launch in timed)
    has_stalls = any(stalls(launch) for launch in timed)
    out += [f"{len(timed)} profiled launches of {len(kernels)} kernels, {total:.2f} ms in all (as ncu times them: caches "
            "flushed before each launch, clocks left alone).", ""]
    header = ["#", "kernel", "launches", "ms", "share", "mean µs"] + [label for label, _ in THROUGHPUTS]
    header += ["DRAM GB/s"] if has_dram_rate else []
    header += ["tensor %"] if has_tensor else []
    header += ["bound", "occupancy % (achieved / theoretical)", "registers", "block", "grid", "dynamic shared B"]
    header += ["cycles per issue", "stalled for (cycles per issue, top 3)"] if has_stalls else []
    out += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    ordered = sorted(kernels.items(), key=lambda kv: -sum(duration_ms(launch) for launch in kv[1]))
    fmt = lambda value, digits=1: "—" if value is None else f"{value:.{digits}f}"
    for i, (name, group) in enumerate(ordered[:top], 1):
        ms = sum(duration_ms(launch) for launch in group)
        mean = lambda metric_name: weighted((metric(launch, metric_name), duration_ms(launch)) for launch in group)
        throughputs = [mean(metric_name) for _, metric_name in THROUGHPUTS]
        sm, memory = throughputs[0], throughputs[1]
        if sm is None or memory is None:
            bound = "—"
        else:
            bound = "latency" if max(sm, memory) < 60 else ("compute" if sm >= memory else "memory")
        first = group[0]
        occupancy = f"{fmt(mean('Achieved Occupancy'))} / {fmt(metric(first, 'Theoretical Occupancy'))}"
        short = name if len(name) <= 80 else name[:77] + "..."
        cells = [str(i), f"`{short}`", str(len(group)), f"{ms:.3f}", f"{100 * ms / total:.1f} %", f"{1e3 * ms / len(group):.1f}"]
        cells += [fmt(value) for value in throughputs]
        cells += [fmt(weighted((dram_gbps(launch), duration_ms(launch)) for launch in group), 0)] if has_dram_rate else []
        cells += [fmt(weighted((tensor_busy(launch), duration_ms(launch)) for launch in group))] if has_tensor else []
        cells += [bound, occupancy, fmt(metric(first, "Registers Per Thread"), 0), first["block"], first["grid"],
                  fmt(metric(first, "Dynamic Shared Memory Per Block"), 0)]
        cells += [fmt(mean(CYCLES_PER_ISSUE)), top_stalls(group)] if has_stalls else []
        out.append("| " + " | ".join(cells) + " |")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--title", default="Nsight Compute")
    parser.add_argument("--out")
    args = parser.parse_args()
    with open(args.csv, errors="replace") as f:
        rows = launches(f.read())
    report = "\n".join(table(rows, args.top, args.title)) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(report)
    sys.stdout.write(report)
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
