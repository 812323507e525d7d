#!/usr/bin/env python3
"""Where one kernel's warps wait, instruction by instruction, from Nsight Compute's samples.

The ncu stage's kernel-level numbers say *that* the flash kernel is latency-bound (on the H200,
2026-11-27: 6.8 cycles between a warp's instructions, `wait` 2.1 and `long_scoreboard` 1.9 of
them) but not *where*: at the barrier a key step starts with, behind the `HMMA` chains, in the
softmax's exponentials, on the spilled address. ncu's SourceCounters section samples every
warp's program counter with the reason it is not issuing; its source page, exported as CSV
(`ncu --import R.ncu-rep --page source --csv --print-source sass`), holds one row per SASS
instruction: the address, the instruction, its samples (all, and not issued), how often it
ran, one column per stall reason (`stall_long_sb`, ...) and, for shared-memory instructions,
the excess wavefronts that bank conflicts cost. This script reads that page for one kernel and
writes a markdown report:

- the kernel's samples by stall reason;
- by region: before the key loop, the key loop, after it (the key loop: the longest backward
  branch's body; the other loops, such as a barrier's wait loop, are named apart);
- inside the key loop, by kind of instruction (tensor cores, shared-memory reads, the copies,
  the barrier, softmax arithmetic, the rest), each with its samples, executions and top reasons;
- the hottest instructions with their reasons;
- the shared-memory instructions' excess wavefronts (bank conflicts), where the page has them.

    ncu_source.py SOURCE_CSV [--kernel REGEX] [--top 30] [--title T] > report.md

Column names have changed between ncu versions (`(All Cycles)` then `(All Samples)`; a `#`
column in front; per-reason columns only in newer ones): each is found by its prefix, and a
page without per-reason columns still gets the regions and hottest instructions by samples.
"""
import argparse
import csv
import io
import re
import sys

BRANCH_TARGET = re.compile(r"\bBRA\b[^;]*?\b(0x[0-9a-fA-F]+)\b")
# Instruction kinds inside the key loop, by opcode (the part before the first dot).
KINDS = [
    ("tensor cores", {"HMMA"}),
    ("shared-memory reads", {"LDSM", "LDS"}),
    ("copies (cp.async, global)", {"LDGSTS", "LDGDEPBAR", "DEPBAR", "LDG", "STG", "LDL", "STL"}),
    ("barrier", {"SYNCS", "BAR", "NANOSLEEP", "WARPSYNC"}),
    ("softmax arithmetic", {"MUFU", "FMNMX", "FMUL", "FADD", "FFMA", "FSEL", "FSETP", "F2FP", "SHFL", "FMNMX3"}),
]
OTHER_KIND = "integer, control, other"


def number(text):
    try:
        return float(str(text).replace(",", ""))
    except ValueError:
        return 0.0


def opcode(text):
    """`@!P0 LDGSTS.E.BYPASS.128 [R1], ...` → `LDGSTS`."""
    text = re.sub(r"^@!?U?P\w+\s+", "", text.strip())
    return text.split()[0].split(".")[0] if text else ""


def kind_of(op):
    for name, ops in KINDS:
        if op in ops:
            return name
    return OTHER_KIND


def read_kernels(text):
    """{kernel name: [row dict]} from a source page's CSV (one block a profiled kernel)."""
    kernels, name, header = {}, None, None
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        if row[0] == "Kernel Name":
            name, header = (row[1] if len(row) > 1 else "?"), None
            continue
        if header is None:
            if "Address" in row and "Source" in row:
                header = row
                kernels.setdefault(name or "?", [])
            continue
        if len(row) < len(header):
            continue
        kernels[name or "?"].append(dict(zip(header, row)))
    return kernels


def column(header, prefix):
    """The first column whose name starts with `prefix` (ncu's names have changed suffixes)."""
    return next((c for c in header if c.startswith(prefix)), None)


class Instruction:
    def __init__(self, row, base, samples, not_issued, executed, reasons, excess):
        self.offset = int(row["Address"], 16) - base
        self.text = " ".join(row["Source"].split())
        self.op = opcode(self.text)
        self.samples = number(row.get(samples, 0)) if samples else 0.0
        self.not_issued = number(row.get(not_issued, 0)) if not_issued else 0.0
        self.executed = number(row.get(executed, 0)) if executed else 0.0
        self.reasons = {reason[len("stall_"):]: number(row[reason]) for reason in reasons}
        self.excess = number(row.get(excess, 0)) if excess else 0.0


def instructions_of(rows):
    """The page's instructions in address order, each at its offset from the first."""
    header = list(rows[0].keys())
    addressed = [row for row in rows if re.fullmatch(r"0x[0-9a-fA-F]+", row.get("Address", "").strip())]
    if not addressed:
        return [], 0
    base = min(int(row["Address"], 16) for row in addressed)
    samples = column(header, "Warp Stall Sampling (All")
    not_issued = column(header, "Warp Stall Sampling (Not-issued")
    executed = column(header, "Instructions Executed")
    reasons = [c for c in header if c.startswith("stall_") and "Not Issued" not in c]
    excess = column(header, "L1 Wavefronts Shared Excessive")
    found = [Instruction(row, base, samples, not_issued, executed, reasons, excess) for row in addressed]
    return sorted(found, key=lambda i: i.offset), base


def key_loop(instructions, base):
    """The key loop as (first, last) offsets and how it was found, and the other loops: the
    body of the longest backward branch holding tensor-core instructions (else the longest).
    A branch's target prints as an address (an offset where it is below the kernel's first);
    where no target can be read, the span from the first `HMMA` to the last."""
    bodies = []
    for instruction in instructions:
        target = BRANCH_TARGET.search(instruction.text)
        if not target:
            continue
        address = int(target.group(1), 16)
        first = address - base if address >= base else address
        if 0 <= first < instruction.offset:  # (a branch to itself, after `EXIT`, is no loop)
            bodies.append((first, instruction.offset))
    if bodies:
        with_tensor = [b for b in bodies if any(b[0] <= i.offset <= b[1] and i.op == "HMMA" for i in instructions)]
        chosen = max(with_tensor or bodies, key=lambda b: b[1] - b[0])
        return chosen, "its backward branch", [b for b in bodies if b != chosen]
    tensor = [i.offset for i in instructions if i.op == "HMMA"]
    if tensor:
        return (min(tensor), max(tensor)), "first to last HMMA: no branch target readable", []
    return None, "", []


def share(part, whole):
    return f"{100 * part / whole:.1f} %" if whole else "—"


def top_reasons(instructions, count=3):
    totals = {}
    for instruction in instructions:
        for reason, value in instruction.reasons.items():
            totals[reason] = totals.get(reason, 0.0) + value
    whole = sum(totals.values())
    ranked = sorted(((v, r) for r, v in totals.items() if v > 0), reverse=True)[:count]
    return ", ".join(f"{r} {share(v, whole)}" for v, r in ranked) or "—"


def report(kernel, rows, top, title):
    instructions, base = instructions_of(rows)
    total = sum(i.samples for i in instructions)
    if total <= 0:
        sys.exit(f"{kernel}: the source page has no warp samples (was the SourceCounters section collected?)")
    lines = [f"## {title or kernel}", ""]
    lines.append(f"`{kernel}`: {len(instructions)} SASS instructions, {total:,.0f} warp samples "
                 f"({share(sum(i.not_issued for i in instructions), total)} not issued).")
    lines.append("")
    reasons = {}
    for instruction in instructions:
        for reason, value in instruction.reasons.items():
            reasons[reason] = reasons.get(reason, 0.0) + value
    if any(reasons.values()):
        whole = sum(reasons.values())
        lines += ["| stall reason | samples | share |", "|---|---:|---:|"]
        for value, reason in sorted(((v, r) for r, v in reasons.items() if v > 0), reverse=True):
            lines.append(f"| {reason} | {value:,.0f} | {share(value, whole)} |")
        lines.append("")
    else:
        lines += ["(This page has no per-reason columns: samples only.)", ""]

    loop, found_by, other_loops = key_loop(instructions, base)
    lines += ["| region | instructions | samples | share | executed (warp instructions) | top reasons |", "|---|---:|---:|---:|---:|---|"]
    if loop:
        inside = lambda i: loop[0] <= i.offset <= loop[1]
        in_other = lambda i: not inside(i) and any(a <= i.offset <= b for a, b in other_loops)
        regions = [
            ("before the key loop", [i for i in instructions if i.offset < loop[0] and not in_other(i)]),
            (f"the key loop ({loop[0]:#x}..{loop[1]:#x}, {found_by})", [i for i in instructions if inside(i)]),
            ("other loops (waits)", [i for i in instructions if in_other(i)]),
            ("after the key loop", [i for i in instructions if i.offset > loop[1] and not in_other(i)]),
        ]
    else:
        regions = [("the whole kernel (no loop found)", instructions)]
    for name, part in regions:
        if part:
            samples = sum(i.samples for i in part)
            lines.append(f"| {name} | {len(part)} | {samples:,.0f} | {share(samples, total)} | {sum(i.executed for i in part):,.0f} | {top_reasons(part)} |")
    lines.append("")

    if loop:
        body = [i for i in instructions if loop[0] <= i.offset <= loop[1]]
        lines += ["Inside the key loop, by kind of instruction:", "",
                  "| kind | instructions | samples | share of the kernel's | executed | samples per execution | top reasons |",
                  "|---|---:|---:|---:|---:|---:|---|"]
        for name in [k for k, _ in KINDS] + [OTHER_KIND]:
            part = [i for i in body if kind_of(i.op) == name]
            if part:
                samples, executed = sum(i.samples for i in part), sum(i.executed for i in part)
                per = f"{samples / executed:.3f}" if executed else "—"
                lines.append(f"| {name} | {len(part)} | {samples:,.0f} | {share(samples, total)} | {executed:,.0f} | {per} | {top_reasons(part)} |")
        lines.append("")

    lines += [f"The {top} instructions with the most samples (offset from the kernel's first):", "",
              "| offset | instruction | samples | share | executed | top reasons |", "|---:|---|---:|---:|---:|---|"]
    for i in sorted(instructions, key=lambda i: -i.samples)[:top]:
        text = i.text if len(i.text) <= 60 else i.text[:57] + "..."
        lines.append(f"| {i.offset:#x} | `{text}` | {i.samples:,.0f} | {share(i.samples, total)} | {i.executed:,.0f} | {top_reasons([i], 2)} |")
    lines.append("")

    conflicted = [i for i in instructions if i.excess > 0]
    if conflicted:
        by_op = {}
        for i in conflicted:
            by_op[i.op] = by_op.get(i.op, 0.0) + i.excess
        lines.append("Shared memory's excess wavefronts (bank conflicts): " +
                     ", ".join(f"{op} {value:,.0f}" for op, value in sorted(by_op.items(), key=lambda kv: -kv[1])) + ".")
    else:
        lines.append("Shared memory's excess wavefronts (bank conflicts): none on this page.")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source_csv")
    parser.add_argument("--kernel", default="", help="a regex the kernel's name must match (the first that does)")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--title", default="")
    args = parser.parse_args()
    with open(args.source_csv, encoding="utf-8", errors="replace") as f:
        kernels = read_kernels(f.read())
    chosen = [(name, rows) for name, rows in kernels.items() if rows and re.search(args.kernel, name)]
    if not chosen:
        sys.exit(f"no kernel matching {args.kernel!r} with instructions in {args.source_csv} (found: {', '.join(kernels) or 'none'})")
    sys.stdout.write(report(chosen[0][0], chosen[0][1], args.top, args.title))


if __name__ == "__main__":
    main()
