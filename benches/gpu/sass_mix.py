#!/usr/bin/env python3
"""Instruction mix of a kernel's loops in its sm_90a SASS, without a GPU.

`tests/cuda_codegen.rs` with `TALLY_CUDA_CODEGEN_DUMP=DIR` leaves every kernel of tally's it
generated in DIR (`<i>.cu`, `<i>.ptx`, `<i>.cubin`, and `index.tsv`: index, kernel, what
generated it). This script disassembles the cubins whose generator line holds `--match`
(with `nvdisasm`, from PyPI's `nvidia-cuda-nvdisasm`) and, for each loop (a backward branch),
prints how many instructions its body holds by opcode, and the shortest and longest paths
through one iteration (the body's blocks as a graph), with the shortest path's own mix, and how
many instructions lie before the first loop and after the last: for the flash kernel the key step, where
the shortest path is a full prefix step with no reads left to issue and the longest an item step
with masks. Per warp, per iteration: a static count, not a measurement — what it shows is where
instructions go beside the tensor-core ones (`HMMA`), and that is what changed when it falls.

    benches/gpu/sass_mix.py DIR --match 'rows: 128, keys: 64, stages: 2, loads: Ldmatrix }), prefixes [2020'
"""

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?)\s*;")
LABEL = re.compile(r"^(\.L_x_\d+):")
BRANCH = re.compile(r"\bBRA\b.*?`?\(?(\.L_x_\d+)")


def parse(sass):
    """[(address, text)] in order, and {label: address}."""
    instructions, labels, pending = [], {}, []
    for line in sass.splitlines():
        label = LABEL.match(line)
        if label:
            pending.append(label.group(1))
            continue
        instruction = INSTRUCTION.match(line)
        if instruction:
            address = int(instruction.group(1), 16)
            for name in pending:
                labels[name] = address
            pending = []
            instructions.append((address, instruction.group(2)))
    return instructions, labels


def opcode(text):
    """`@!P0 LDG.E.128 R4, ...` → `LDG`."""
    text = re.sub(r"^@!?U?P\w+\s+", "", text)
    return text.split()[0].split(".")[0]


def is_unconditional(text):
    return not text.startswith("@")


def paths(body, labels):
    """Shortest and longest instruction counts from the body's first instruction to its last
    (the backward branch), over the blocks of the body (a DAG once the back edge is dropped),
    and the instructions of the shortest path."""
    start, end = body[0][0], body[-1][0]
    position = {address: i for i, (address, _) in enumerate(body)}
    leaders = {0}
    for i, (_, text) in enumerate(body):
        target = BRANCH.search(text)
        if target:
            if i + 1 < len(body):
                leaders.add(i + 1)
            address = labels.get(target.group(1))
            if address is not None and start <= address <= end:
                leaders.add(position[address])
    for address in labels.values():
        if start <= address <= end:
            leaders.add(position[address])
    leaders = sorted(leaders)
    blocks = [(first, (leaders[k + 1] if k + 1 < len(leaders) else len(body))) for k, first in enumerate(leaders)]
    block_of = {first: k for k, (first, _) in enumerate(blocks)}
    successors = []
    for k, (first, stop) in enumerate(blocks):
        last = body[stop - 1][1]
        next_blocks = []
        target = BRANCH.search(last)
        if target and stop - 1 != len(body) - 1:
            address = labels.get(target.group(1))
            if address is not None and start <= address <= end and address > body[stop - 1][0]:
                next_blocks.append(block_of[position[address]])
            if not (is_unconditional(last) and "BRA" in last.split()[0]) and k + 1 < len(blocks):
                next_blocks.append(k + 1)
        elif stop - 1 != len(body) - 1 and k + 1 < len(blocks):
            next_blocks.append(k + 1)
        successors.append(next_blocks)
    shortest = [None] * len(blocks)
    longest = [None] * len(blocks)
    shortest_next = [None] * len(blocks)
    for k in reversed(range(len(blocks))):
        size = blocks[k][1] - blocks[k][0]
        onward = [n for n in successors[k] if shortest[n] is not None]
        if k == len(blocks) - 1:
            shortest[k] = longest[k] = size
        elif onward:
            shortest_next[k] = min(onward, key=lambda n: shortest[n])
            shortest[k] = size + shortest[shortest_next[k]]
            longest[k] = size + max(longest[n] for n in onward)
    path, k = [], 0
    while k is not None:
        first, stop = blocks[k]
        path.extend(text for _, text in body[first:stop])
        k = shortest_next[k]
    return shortest[0], longest[0], path


def loops(instructions, labels):
    """Every loop body (first instruction through its backward branch), innermost last."""
    found = []
    for i, (address, text) in enumerate(instructions):
        target = BRANCH.search(text)
        if target and labels.get(target.group(1), address + 1) <= address:
            first = next(j for j, (a, _) in enumerate(instructions) if a == labels[target.group(1)])
            found.append(instructions[first:i + 1])
    return found


def report(name, sass):
    instructions, labels = parse(sass)
    print(f"## {name}: {len(instructions)} instructions, {sum(opcode(t) == 'HMMA' for _, t in instructions)} HMMA")
    # (The `BRA` to itself after the last `EXIT` is a loop of one: not counted.)
    bodies = [body for body in loops(instructions, labels) if len(body) >= 8]
    if bodies:
        # Run once a cube: for the flash kernel the query staged and the first copies issued
        # before the key loop, the output stored after it.
        first, last = min(body[0][0] for body in bodies), max(body[-1][0] for body in bodies)
        before = sum(address < first for address, _ in instructions)
        after = sum(address > last for address, _ in instructions)
        print(f"outside the loops: {before} instructions before the first, {after} after the last")
    for body in bodies:
        mix = collections.Counter(opcode(text) for _, text in body)
        shortest, longest, path = paths(body, labels)
        print(f"loop {body[0][0]:#x}..{body[-1][0]:#x}: {len(body)} instructions in its body; one iteration runs {shortest}–{longest}")
        print("   body:          " + ", ".join(f"{op} {n}" for op, n in mix.most_common(24)))
        print("   shortest path: " + ", ".join(f"{op} {n}" for op, n in collections.Counter(opcode(text) for text in path).most_common(24)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump", help="TALLY_CUDA_CODEGEN_DUMP's folder")
    parser.add_argument("--match", default="", help="text the generator's line must hold")
    parser.add_argument("--nvdisasm", default=os.environ.get("NVDISASM") or shutil.which("nvdisasm") or "nvdisasm")
    args = parser.parse_args()
    with open(os.path.join(args.dump, "index.tsv")) as index:
        rows = [line.rstrip("\n").split("\t", 2) for line in index if line.strip()]
    chosen = [row for row in rows if args.match in row[2]]
    if not chosen:
        sys.exit(f"no kernel in {args.dump}/index.tsv was generated by anything holding {args.match!r}")
    for number, kernel, generated_by in chosen:
        cubin = os.path.join(args.dump, f"{number}.cubin")
        if not os.path.exists(cubin):
            print(f"## {kernel} ({generated_by}): no cubin (it did not assemble)")
            continue
        try:
            sass = subprocess.run([args.nvdisasm, "-c", cubin], check=True, capture_output=True, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as error:
            sys.exit(f"nvdisasm failed on {cubin}: {error} (pip install nvidia-cuda-nvdisasm; NVDISASM=its path)")
        report(f"{kernel} — {generated_by}", sass)


if __name__ == "__main__":
    main()
