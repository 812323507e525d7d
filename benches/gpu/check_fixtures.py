#!/usr/bin/env python3
"""Every fixture case through a `tally` binary on one backend and dtype, against the float64
reference scores committed with the case, plus packed == per-item on each case's items: the first
three items scored one at a time are held to the reference too, and to the packed scores at the
same tolerance. Not a tenth of it, as before the H200 run of 2026-11-27: per-item requests run
other GEMM shapes (cuBLASLt picks its kernel by the rows), whose float32 sums add in another order,
and on a probability of 3e-7 a logit's absolute error of 1e-4 is a relative one (float32's
`qwen2_gguf_k_quants`: packed 4.4e-5 from float64, packed against per-item 1.2e-4). A packing
fault (an item seeing another) moves scores by far more than either tolerance.

    check_fixtures.py TALLY --backend cuda --dtype bfloat16 --tolerance 3e-2 [--out result.json]

One `tally serve` per model answers all of its cases, so a GPU backend starts (and compiles its
kernels) once per model, not once per request. Prints one line per case and exits non-zero when
any case is off. Only the standard library: it runs on the GPU machine as it is.
"""

import argparse
import itertools
import json
import pathlib
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures"


def matmul_flags(matmul):
    """A route name as tally's flags: `cublas-sync` is cuBLASLt with host syncs around each GEMM."""
    return ["--matmul", "cublas", "--cublas-ordering", "sync"] if matmul == "cublas-sync" else ["--matmul", matmul]


class Server:
    """`tally serve` for one model on a free port, stopped on exit."""

    def __init__(self, tally, model, backend, dtype, attention, matmul, elementwise, extra):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        # No warm-up: each fixture model would tune its own shapes; the load stage's server warms up.
        args = [tally, "serve", "--model", str(FIXTURES / "models" / model), "--port", str(self.port), "--backend", backend, "--dtype", dtype, "--attention", attention, *matmul_flags(matmul), "--elementwise", elementwise, "--no-warmup", *extra]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tally serve exited: {self.process.stderr.read().strip()[-500:]}")
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=1)
                return
            except OSError:
                time.sleep(0.2)
        raise RuntimeError("tally serve did not come up in 300 s")

    def score(self, request):
        body = json.dumps(request).encode()
        try:
            with urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/score", body), timeout=600) as response:
                return json.loads(response.read())["scores"]
        except urllib.error.HTTPError as error:
            raise RuntimeError(f"HTTP {error.code}: {error.read().decode()[:300]}") from None

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=60)


def worst_relative_error(got, expected):
    return max(abs(g - e) / abs(e) for gs, es in zip(got, expected) for g, e in zip(gs, es))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tally")
    parser.add_argument("--backend", default="cuda")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--attention", default="kernel", choices=["kernel", "tiled", "flash", "cascade"])
    parser.add_argument("--elementwise", default="auto", choices=["auto", "burn", "kernels"], help="auto: the backend's default (kernels on CUDA and the CPU, burn on wgpu)")
    parser.add_argument("--matmul", default="cubecl", choices=["cubecl", "cublas", "cublas-sync", "block"],
                        help="cublas-sync: cuBLASLt with host syncs around each GEMM (--cublas-ordering sync)")
    parser.add_argument("--tolerance", type=float, default=1e-3)
    parser.add_argument("--packed-tolerance", type=float, default=None, help="packed vs per-item (default: the tolerance)")
    parser.add_argument("--cases", default="", help="only cases whose name contains this")
    parser.add_argument("--tally-flags", default="", help="more flags for `tally serve`, e.g. '--fragment-loads elements'")
    parser.add_argument("--out")
    args = parser.parse_args()
    packed_tolerance = args.packed_tolerance if args.packed_tolerance is not None else args.tolerance

    results, failed = [], 0
    cases = [(path.stem, json.loads(path.read_text())) for path in sorted((FIXTURES / "cases").glob("*.json")) if args.cases in path.stem]
    for model, group in itertools.groupby(sorted(cases, key=lambda c: c[1]["model"]), key=lambda c: c[1]["model"]):
        try:
            server = Server(args.tally, model, args.backend, args.dtype, args.attention, args.matmul, args.elementwise, args.tally_flags.split())
        except RuntimeError as error:
            server, start_error = None, str(error)
        for name, case in group:
            row = {"case": name, "model": model, "items": len(case["request"]["items"])}
            start = time.monotonic()
            try:
                if server is None:
                    raise RuntimeError(start_error)
                packed = server.score(case["request"])
                row["reference_rel_error"] = worst_relative_error(packed, case["expected_scores"])
                # The first three items one at a time: packing must not change an item's answer.
                singles = [server.score({**case["request"], "items": [item]})[0] for item in case["request"]["items"][:3]]
                row["single_reference_rel_error"] = worst_relative_error(singles, case["expected_scores"][: len(singles)])
                row["packed_vs_single_rel_error"] = worst_relative_error(packed[: len(singles)], singles)
                row["ok"] = (max(row["reference_rel_error"], row["single_reference_rel_error"]) <= args.tolerance
                             and row["packed_vs_single_rel_error"] <= packed_tolerance)
            except (RuntimeError, KeyError, ValueError, OSError) as error:
                row["ok"], row["error"] = False, str(error)
            row["seconds"] = round(time.monotonic() - start, 2)
            failed += not row["ok"]
            results.append(row)
            detail = row.get("error") or f"reference {row['reference_rel_error']:.2e}  singles {row['single_reference_rel_error']:.2e}  packed/single {row['packed_vs_single_rel_error']:.2e}"
            print(f"{'ok  ' if row['ok'] else 'FAIL'} {args.backend}/{args.dtype}/{args.attention}/{args.matmul}/{args.elementwise} {name:40} {detail}", flush=True)
        if server is not None:
            server.stop()

    report = {"backend": args.backend, "dtype": args.dtype, "attention": args.attention, "matmul": args.matmul, "elementwise": args.elementwise, "tally_flags": args.tally_flags, "tolerance": args.tolerance, "packed_tolerance": packed_tolerance, "cases": results, "failed": failed}
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    print(f"{args.backend}/{args.dtype}: {len(results) - failed}/{len(results)} cases within {args.tolerance:g} of float64 (packed == single within {packed_tolerance:g})")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
