#!/usr/bin/env python3
"""Compact weights against float weights on one backend: `tally score` run with `--weights compact`
and `--weights float` on the same model, same request, same run; wall time and peak resident
memory of each (on a software adapter such as lavapipe, device memory is host memory, so the
peak RSS counts the GPU's buffers too). Each run is done twice, the first warming CubeCL's
autotune cache; the second is reported.

Usage: python3 benches/compact_weights.py --tally target/release/tally --backend wgpu
       --model web/dist/models/SmolLM2-135M-Instruct.Q4_1.gguf [--model other.gguf ...]
       [--out benches/results/compact-weights-wgpu-lavapipe.json]
"""

import argparse
import json
import os
import platform
import subprocess
from pathlib import Path


def measured(tally, backend, model, weights):
    """Peak RSS (MiB) and seconds of the second of two runs, the table it printed. Each run is
    timed by a fresh interpreter: its children's peak RSS is then that run's alone."""
    code = ("import resource, subprocess, sys, time, json; a = json.loads(sys.argv[1]); t = time.monotonic(); "
            "d = subprocess.run(a, capture_output=True, text=True); s = time.monotonic() - t; "
            "print(json.dumps([d.returncode, s, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, d.stdout, d.stderr[-2000:]]))")
    args = [tally, "score", "--model", model, "--backend", backend, "--weights", weights, "--query", "The capital of France is",
            "--item", " Paris", "--item", " Rome", "--item", " a city in Europe", "--label", " Paris", "--label", " Rome"]
    result = None
    for _ in range(2):
        out = subprocess.run(["python3", "-c", code, json.dumps(args)], capture_output=True, text=True, check=True).stdout
        code_, seconds, peak_mib, table, errors = json.loads(out)
        if code_ != 0:
            # Recorded, not fatal: float weights may not fit where compact ones do.
            return {"failed": errors.strip().splitlines()[-2:]}
        result = {"seconds": round(seconds, 2), "peak_rss_mib": round(peak_mib), "scores": table.strip().splitlines()}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tally", default="target/release/tally")
    parser.add_argument("--backend", default="wgpu")
    parser.add_argument("--model", action="append", required=True)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for model in args.model:
        compact, float_ = (measured(args.tally, args.backend, model, weights) for weights in ("compact", "float"))
        if "failed" in compact:
            raise SystemExit(f"{model}: compact weights failed: {compact['failed']}")
        row = {"model": Path(model).name, "file_mib": round(Path(model).stat().st_size / 2**20), "compact": compact, "float": float_}
        if "failed" in float_:
            print(f"{row['model']} ({row['file_mib']} MiB): compact {compact['peak_rss_mib']} MiB {compact['seconds']} s; float failed: {float_['failed']}")
        else:
            if compact["scores"] != float_["scores"]:
                raise SystemExit(f"{model}: the two forms scored differently:\n{compact['scores']}\n{float_['scores']}")
            row["peak_ratio_float_over_compact"] = round(float_["peak_rss_mib"] / compact["peak_rss_mib"], 2)
            row["time_ratio_compact_over_float"] = round(compact["seconds"] / float_["seconds"], 2)
            print(f"{row['model']} ({row['file_mib']} MiB): compact {compact['peak_rss_mib']} MiB {compact['seconds']} s, "
                  f"float {float_['peak_rss_mib']} MiB {float_['seconds']} s")
        rows.append(row)
    if args.out:
        machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "backend": args.backend}
        args.out.write_text(json.dumps({"machine": machine, "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
