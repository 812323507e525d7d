#!/usr/bin/env python3
"""Multi-item scoring on a GGUF file — by default the real SmolLM2-135M-Instruct (Q4_1) — tally
against llama.cpp, in the same run on the same CPU threads.

Workload: a 200-token query, 100 items of 10 tokens, 2 labels; a fresh random query per request
(no cross-request cache helps either side).
- tally: `tally serve --backend cpu` over HTTP, one /v1/score request per query.
- llama.cpp (PyPI `xllamacpp`), its best path for this: the query evaluated once with the prompt
  cache on, then each item sent as a continuation of the cached query (`cache_prompt`), one
  next-token distribution per item (`n_probs`).
Reports items/s (median over requests, after one warm-up each) and the ratio, and each side's peak
resident memory (tally: the server process's VmHWM; llama.cpp: a child process of its own, beside
the same child importing xllamacpp without a model, Python's share); writes JSON.

Usage: python3 benches/cpu_vs_llama_cpp.py [--tally target/release/tally] [--requests 5]
       [--model F.gguf --vocab N --labels A,B] [--out benches/results/smollm2-vs-llama-cpp-cpu.json]
       (needs xllamacpp; a Qwen3-0.6B-shaped Q8_0 file: benches/make_gguf.py)
"""

import argparse
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

import xllamacpp

REPO = Path(__file__).resolve().parent.parent
QUERY_TOKENS, ITEMS, ITEM_TOKENS = 200, 100, 10
THREADS = os.cpu_count()
# Set from the command line (SmolLM2's by default): label ids, and the range random ids come from.
LABELS = [9230, 2838]  # SmolLM2's " Yes", " No"
TOKEN_IDS = range(17, 49152)  # SmolLM2: ids 0-16 are control tokens


def workload(rng):
    ids = lambda n: [rng.randrange(TOKEN_IDS.start, TOKEN_IDS.stop) for _ in range(n)]
    return ids(QUERY_TOKENS), [ids(ITEM_TOKENS) for _ in range(ITEMS)]


def post(url, body):
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=600).read())


def time_tally(binary, model, requests, rng):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([binary, "serve", "--model", model, "--backend", "cpu", "--port", str(port), "--prefix-cache-mib", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        seconds = []
        for i in range(requests + 1):
            query, items = workload(rng)
            start = time.perf_counter()
            reply = post(url + "/v1/score", {"query": query, "items": items, "label_token_ids": LABELS})
            assert len(reply["scores"]) == ITEMS
            if i > 0:
                seconds.append(time.perf_counter() - start)
        return seconds, peak_mib(server.pid)
    finally:
        server.terminate()
        server.wait()


def peak_mib(pid):
    """A live process's peak resident memory (VmHWM), MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")) / 1024


def in_child(job, *args):
    """`job(*args)` in a fresh child process: its result and the child's peak resident MiB."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(1, maxtasksperchild=1) as pool:
        return pool.apply(with_peak, (job, *args))


def with_peak(job, *args):
    return job(*args), peak_mib(os.getpid())


def python_baseline():
    """What a child that imports xllamacpp and loads nothing holds (counted in llama.cpp's peak)."""
    return xllamacpp.__version__


def time_llama_cpp(model, requests, seed, labels, token_ids):
    global LABELS, TOKEN_IDS  # a spawned child starts from the defaults
    LABELS, TOKEN_IDS = labels, token_ids
    rng = random.Random(seed)
    params = xllamacpp.CommonParams()
    params.model.path = model
    params.n_ctx = 4096
    params.cpuparams.n_threads = THREADS
    server = xllamacpp.Server(params)
    complete = lambda ids: server.handle_completions({"prompt": ids, "n_predict": 1, "n_probs": len(LABELS),
                                                      "temperature": 0, "cache_prompt": True})
    seconds = []
    for i in range(requests + 1):
        query, items = workload(rng)
        start = time.perf_counter()
        complete(query)
        for item in items:
            reply = complete(query + item)
            assert reply["usage"]["prompt_tokens_details"]["cached_tokens"] >= QUERY_TOKENS, "the query was not reused"
        if i > 0:
            seconds.append(time.perf_counter() - start)
    return seconds


def cpu_name():
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tally", default=os.environ.get("CARGO_TARGET_DIR", str(REPO / "target")) + "/release/tally")
    parser.add_argument("--requests", type=int, default=5)
    parser.add_argument("--out", default=str(REPO / "benches" / "results" / "smollm2-vs-llama-cpp-cpu.json"))
    parser.add_argument("--model", help="a GGUF file (default: SmolLM2-135M-Instruct Q4_1, fetched once)")
    parser.add_argument("--vocab", type=int, help="random ids are drawn below this (default: SmolLM2's 49,152)")
    parser.add_argument("--labels", help="two label token ids, comma-separated (default: SmolLM2's \" Yes\", \" No\")")
    args = parser.parse_args()
    global LABELS, TOKEN_IDS
    if args.labels:
        LABELS = [int(label) for label in args.labels.split(",")]
    if args.vocab:
        TOKEN_IDS = range(0, args.vocab)
    model = args.model or subprocess.run([str(REPO / "scripts" / "fetch-smollm2.sh")], check=True, capture_output=True, text=True).stdout.strip()

    tally, tally_peak = time_tally(args.tally, model, args.requests, random.Random(1))
    _, baseline_peak = in_child(python_baseline)
    llama, llama_peak = in_child(time_llama_cpp, model, args.requests, 1, LABELS, TOKEN_IDS)
    rate = lambda seconds: ITEMS / statistics.median(seconds)
    result = {
        "benchmark": f"{Path(model).name}, multi-item scoring",
        "workload": {"query_tokens": QUERY_TOKENS, "items": ITEMS, "item_tokens": ITEM_TOKENS, "labels": len(LABELS),
                     "requests": args.requests},
        "machine": f"{cpu_name()} ({THREADS} threads)",
        "model_file_mib": Path(model).stat().st_size / 2**20,
        "tally": {"path": "tally serve --backend cpu, one /v1/score request", "items_per_s": rate(tally), "seconds": tally,
                  "peak_rss_mib": tally_peak},
        "llama_cpp": {"path": "xllamacpp: query cached once, each item a continuation (cache_prompt)",
                      "version": xllamacpp.__version__, "items_per_s": rate(llama), "seconds": llama,
                      "peak_rss_mib": llama_peak, "peak_rss_mib_of_python_importing_xllamacpp": baseline_peak},
        "tally_over_llama_cpp": rate(tally) / rate(llama),
        "tally_peak_over_llama_cpp_peak": tally_peak / llama_peak,
    }
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"tally {rate(tally):.1f} items/s, llama.cpp {rate(llama):.1f} items/s: {result['tally_over_llama_cpp']:.2f}x; "
          f"peak memory tally {tally_peak:.0f} MiB, llama.cpp {llama_peak:.0f} MiB (Python alone {baseline_peak:.0f})")


if __name__ == "__main__":
    main()
