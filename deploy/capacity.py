"""How many tally replicas a load needs: a queueing model fed with one replica's measured request
time, and a check of that model against a real server on this machine.

The model: requests arrive at random (Poisson) at `rate` per second; the picker sends each to the
replica with the fewest requests waiting (the queue scorer's choice); a replica scores one request
at a time, each taking the measured warm request time (tally batches queued requests into shared
passes, which on a saturated device does the same work in about the same time, so the model
ignores batching). It simulates that and reports the smallest replica count whose P99 latency
(waiting + scoring) meets the target.

    python3 deploy/capacity.py plan --request-seconds 0.589 --items-per-request 500 --items-per-second 10000 --p99 2
    python3 deploy/capacity.py validate --tally target/release/tally --json benches/results/capacity-model-cpu.json

`validate` serves SmolLM2 on the CPU, times lone requests (one after another) of the shape below,
then runs `tally bench load` (Poisson arrivals) of that shape at fractions of that capacity and
compares the measured P50/P99 with the model's for one replica.
"""

import argparse
import heapq
import json
import math
import pathlib
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

REPO = pathlib.Path(__file__).resolve().parents[1]
# `validate`'s request: small enough that a run of a few hundred requests takes a minute here.
SHAPE = {"prompt_tokens": 64, "items_per_request": 8, "item_tokens": 8}


def simulate(replicas, rate, request_seconds, requests=200_000, seed=0):
    """Latencies (s) of `requests` Poisson arrivals at `rate`/s over `replicas` FIFO replicas,
    each arrival sent to the replica with the fewest requests (waiting + running)."""
    rng = random.Random(seed)
    # Per replica: when its last request finishes, and the finish times of those it holds.
    busy_until = [0.0] * replicas
    held = [[] for _ in range(replicas)]
    latencies = []
    now = 0.0
    for _ in range(requests):
        now += rng.expovariate(rate)
        for heap in held:
            while heap and heap[0] <= now:
                heapq.heappop(heap)
        r = min(range(replicas), key=lambda i: (len(held[i]), busy_until[i]))
        finish = max(now, busy_until[r]) + request_seconds
        busy_until[r] = finish
        heapq.heappush(held[r], finish)
        latencies.append(finish - now)
    return latencies


def window_p99s(rate, request_seconds, requests, windows=400):
    """The P99s of `windows` runs of `requests` arrivals each, starting empty: how far a measured
    run of that length may fall from the long-run P99 by chance alone."""
    return sorted(percentile(simulate(1, rate, request_seconds, requests=requests, seed=1 + w), 0.99) for w in range(windows))


def percentile(values, p):
    ordered = sorted(values)
    return ordered[max(0, math.ceil(len(ordered) * p) - 1)]


def plan(request_seconds, items_per_request, items_per_second, p99_seconds, max_replicas=512):
    """The smallest replica count meeting `p99_seconds` at `items_per_second`, and its P50/P99."""
    rate = items_per_second / items_per_request
    if p99_seconds < request_seconds:
        raise SystemExit(f"a P99 of {p99_seconds} s is below one request's {request_seconds} s: no replica count meets it")
    # Each replica scores at most 1/request_seconds requests a second.
    replicas = max(1, math.ceil(rate * request_seconds))
    while replicas <= max_replicas:
        if rate * request_seconds / replicas < 1:
            latencies = simulate(replicas, rate, request_seconds, requests=50_000)
            p99 = percentile(latencies, 0.99)
            if p99 <= p99_seconds:
                return {"replicas": replicas, "utilisation": rate * request_seconds / replicas, "p50_s": percentile(latencies, 0.5), "p99_s": p99}
        replicas += 1
    raise SystemExit(f"more than {max_replicas} replicas")


def free_port():
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def lone_request_seconds(url, count=30, seed=0):
    """Seconds each of `count` requests of SHAPE takes sent one after another (none waits)."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(3, 49_152) for _ in range(n)]
    seconds = []
    for _ in range(count + 3):
        body = {"query": ids(SHAPE["prompt_tokens"]), "items": [ids(SHAPE["item_tokens"]) for _ in range(SHAPE["items_per_request"])], "label_token_ids": [0, 1]}
        request = urllib.request.Request(f"{url}/v1/score", json.dumps(body).encode(), {"Content-Type": "application/json"})
        started = time.monotonic()
        urllib.request.urlopen(request, timeout=60).read()
        seconds.append(time.monotonic() - started)
    return seconds[3:]  # the first few warm the allocator and caches


def validate(tally, out):
    """One replica on this CPU: measured latency percentiles under Poisson load against the model's."""
    model = subprocess.run([str(REPO / "scripts" / "fetch-smollm2.sh")], check=True, capture_output=True, text=True).stdout.strip()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([tally, "serve", "--model", model, "--backend", "cpu", "--port", str(port), "--max-queue", "1024", "--prefix-cache-mib", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        shape_args = [arg for key, value in SHAPE.items() for arg in (f"--{key.replace('_', '-')}", str(value))]
        with tempfile.TemporaryDirectory() as scratch:
            def load(qps, duration, name):
                path = pathlib.Path(scratch) / f"{name}.json"
                subprocess.run([tally, "bench", "load", "--url", url, "--qps", str(qps), "--duration", str(duration), "--out", str(path), *shape_args],
                               check=True, stdout=subprocess.DEVNULL)
                return json.loads(path.read_text())

            lone = lone_request_seconds(url)
            request_seconds = statistics.median(lone)
            print(f"lone requests: median {1e3 * request_seconds:.0f} ms (of {len(lone)})")
            runs = []
            for utilisation in (0.5, 0.8):
                qps = utilisation / request_seconds
                measured = load(qps, 60, f"load-{utilisation}")
                model_latencies = simulate(1, qps, request_seconds)
                runs.append({
                    "utilisation": utilisation, "qps": qps, "requests_ok": measured["requests_ok"], "requests_failed": measured["requests_failed"],
                    "measured_ms": {"p50": measured["latency_ms"]["p50"], "p99": measured["latency_ms"]["p99"]},
                    "model_ms": {"p50": 1e3 * percentile(model_latencies, 0.5), "p99": 1e3 * percentile(model_latencies, 0.99)},
                })
                runs[-1]["p99_measured_over_model"] = runs[-1]["measured_ms"]["p99"] / runs[-1]["model_ms"]["p99"]
                same_length = window_p99s(qps, request_seconds, measured["requests_sent"])
                runs[-1]["model_p99_ms_of_runs_this_long"] = {"p5": 1e3 * percentile(same_length, 0.05), "p50": 1e3 * percentile(same_length, 0.5), "p95": 1e3 * percentile(same_length, 0.95)}
                print(f"utilisation {utilisation}: {qps:.2f} qps, P99 measured {runs[-1]['measured_ms']['p99']:.0f} ms, model {runs[-1]['model_ms']['p99']:.0f} ms "
                      f"(runs of {measured['requests_sent']} requests: {runs[-1]['model_p99_ms_of_runs_this_long']})")
    finally:
        server.terminate()
        server.wait()
    report = {
        "benchmark": "capacity-model",
        "what": "one tally replica (CPU, SmolLM2-135M Q4_1, prefix cache off) under `tally bench load` Poisson arrivals (64-token query, 8 items x 8 tokens, fresh random ids), against deploy/capacity.py's model fed the median lone-request time",
        "machine": f"{platform.processor() or platform.machine()}, {platform.system()}",
        "date": time.strftime("%Y-%m-%d"),
        "shape": SHAPE,
        "lone_request_ms": {"median": 1e3 * request_seconds, "min": 1e3 * min(lone), "max": 1e3 * max(lone), "count": len(lone)},
        "runs": runs,
    }
    if out:
        pathlib.Path(out).write_text(json.dumps(report, indent=2) + "\n")
    return report


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    planning = commands.add_parser("plan", help="replicas for a target items/s at a P99")
    planning.add_argument("--request-seconds", type=float, required=True, help="one warm request's time on one replica (measured)")
    planning.add_argument("--items-per-request", type=int, required=True)
    planning.add_argument("--items-per-second", type=float, required=True, help="the target load")
    planning.add_argument("--p99", type=float, required=True, help="the P99 latency target, seconds")
    checking = commands.add_parser("validate", help="the model against a real server on this machine")
    checking.add_argument("--tally", required=True)
    checking.add_argument("--json")
    args = parser.parse_args()
    if args.command == "plan":
        print(json.dumps(plan(args.request_seconds, args.items_per_request, args.items_per_second, args.p99)))
    else:
        validate(args.tally, args.json)


if __name__ == "__main__":
    sys.exit(main())
