#!/usr/bin/env python3
"""The browser page against native tally on the same machine and the same requests.

In headless Chromium (WebGPU on SwiftShader) the page loads a model and scores one request:
load time, first score (every kernel compiled), the matmul tuning that follows it, warm score
(median of --warm); then a second visit (the choices kept): load and warm score. Natively,
`tally serve --backend wgpu` (Vulkan: lavapipe on a machine without a GPU) answers the same
request over HTTP: first and warm, with autotune's matmuls (the default) and with the page's
register-block matmul (`--matmul block`). Also the wasm module's size, raw and gzip. Writes one JSON
with the ratios page / native; the machine is in it.

usage: benches/browser_vs_native.py --tally target/release/tally [--dist web/dist] [--out FILE]
                                   [--model F.gguf ...]
--model adds a GGUF with a tokenizer (e.g. the Qwen3-0.6B-shaped Q8_0 of benches/make_gguf.py),
linked into the dist's models/ and scored with SmolLM2's 4-item request.
"""

import argparse
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
import run as browser  # noqa: E402  (the DevTools driver and `tally serve` starter of the browser test)

WIDE_VOCAB = "wide-vocab"


def requests(dist, extra_models):
    """(name, page URL, native path, request): the fixture with a tokenizer, SmolLM2 with 4 and
    with 20 items, and each extra model with SmolLM2's 4-item request."""
    fixture = json.loads((browser.CASES / "wide_vocab_text.json").read_text())["request"]
    out = [("wide-vocab fixture (2 layers, hidden 16, vocab 151936)", f"models/{WIDE_VOCAB}", dist / "models" / WIDE_VOCAB, fixture)]
    smollm2 = dist / "models" / browser.SMOLLM2
    if smollm2.is_file():
        case = json.loads((ROOT / "tests" / "fixtures" / "smollm2.json").read_text())["cases"][0]
        out.append(("SmolLM2-135M-Instruct Q4_1", f"models/{browser.SMOLLM2}", smollm2, case["request"]))
        countries = ["France", "Italy", "Germany", "Spain", "Portugal", "Greece", "Poland", "Austria", "Sweden", "Norway",
                     "Finland", "Denmark", "Ireland", "Belgium", "Hungary", "Romania", "Bulgaria", "Croatia", "Egypt", "Japan"]
        twenty = dict(case["request"], items=[f" {country} is" for country in countries])
        out.append(("SmolLM2-135M-Instruct Q4_1, 20 items", f"models/{browser.SMOLLM2}", smollm2, twenty))
    request = json.loads((ROOT / "tests" / "fixtures" / "smollm2.json").read_text())["cases"][0]["request"]
    for model in extra_models:
        model = pathlib.Path(model).resolve()
        link = dist / "models" / model.name
        if not link.exists():
            link.symlink_to(model)
        out.append((model.name, f"models/{model.name}", model, request))
    return out


def page_timings(devtools, base, url, request, warm):
    """First visit: load, first score, the background matmul tuning that follows it, warm scores.
    Second visit (a new page, the choices kept): load and a warm score."""
    page = browser.Page(devtools, f"{base}/web/index.html")
    page.evaluate("localStorage.clear()")  # a first visit: no choices kept from another model's run
    started = time.time()
    page.evaluate(f"tally.load({json.dumps(url)})")
    load_s = time.time() - started
    started = time.time()
    page.evaluate(f"tally.score({json.dumps(request)})")
    first_s = time.time() - started
    started = time.time()
    tuned = page.evaluate("tally.tuned()")
    tune_s = time.time() - started
    times = []
    for _ in range(warm):
        started = time.time()
        page.evaluate(f"tally.score({json.dumps(request)})")
        times.append(time.time() - started)
    adapter = page.evaluate("navigator.gpu.requestAdapter().then(a => `${a.info.vendor} ${a.info.architecture}`)")
    second = browser.Page(devtools, f"{base}/web/index.html")
    started = time.time()
    second.evaluate(f"tally.load({json.dumps(url)})")
    second_load_s = time.time() - started
    second.evaluate(f"tally.score({json.dumps(request)})")
    kept = second.evaluate("tally.tuned()")["restored"]
    started = time.time()
    second.evaluate(f"tally.score({json.dumps(request)})")
    second_warm_s = time.time() - started
    choices = {t["shape"]: {"chosen": t["chosen"], "ms": {c["kernel"]: c["millis"] for c in t["candidates"] if c["verdict"] == "right"},
                            "not_right": {c["kernel"]: c["verdict"] for c in t["candidates"] if c["verdict"] != "right"}} for t in tuned["tuned"]}
    return adapter, {"load_s": load_s, "first_score_s": first_s, "matmul_tuning_s": tune_s, "warm_score_s": statistics.median(times),
                     "second_visit": {"load_s": second_load_s, "choices_kept": sum(k["verdict"] == "right" for k in kept), "warm_score_s": second_warm_s},
                     "matmul_choices": choices}


def native_timings(binary, model, request, warm, matmul):
    port = browser.free_port()
    started = time.time()
    # Cold on both sides: the page has no warm-up, so the server skips its own.
    server = subprocess.Popen([binary, "serve", "--backend", "wgpu", "--matmul", matmul, "--no-warmup", "--model", str(model), "--host", "127.0.0.1", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1)
                break
            except OSError:
                if server.poll() is not None or time.time() - started > 300:
                    sys.exit(f"tally serve --backend wgpu --model {model} did not come up")
                time.sleep(0.2)
        load_s = time.time() - started
        body = json.dumps(request).encode()
        times = []
        for _ in range(1 + warm):
            started = time.time()
            with urllib.request.urlopen(urllib.request.Request(f"{url}/v1/score", body, {"Content-Type": "application/json"}), timeout=600) as r:
                r.read()
            times.append(time.time() - started)
        return {"load_s": load_s, "first_score_s": times[0], "warm_score_s": statistics.median(times[1:])}
    finally:
        server.kill()
        server.wait()


def machine():
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), platform.processor())
    return f"{cpu}, {os.cpu_count()} cores, no GPU: Chromium's WebGPU on SwiftShader, native wgpu on lavapipe"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tally", required=True)
    parser.add_argument("--dist", default=str(ROOT / "web" / "dist"))
    parser.add_argument("--chromium", default="chromium")
    parser.add_argument("--warm", type=int, default=5)
    parser.add_argument("--model", action="append", default=[], help="another GGUF to load and score (see above)")
    parser.add_argument("--out", default=str(ROOT / "benches" / "results" / "browser-vs-native-cpu.json"))
    args = parser.parse_args()
    dist = pathlib.Path(args.dist).resolve()
    wasm = dist / "pkg" / "tally_web_bg.wasm"
    result = {
        "benchmark": "the browser page vs native tally, same requests",
        "machine": machine(),
        "wasm_bytes": wasm.stat().st_size,
        "wasm_gzip_bytes": (dist / "pkg" / "tally_web_bg.wasm.gz").stat().st_size,
        "models": [],
    }
    server, base = browser.start_tally(args.tally, dist)
    devtools = browser.DevTools(args.chromium)
    try:
        for name, url, native_model, request in requests(dist, args.model):
            result["adapter"], in_page = page_timings(devtools, base, url, request, args.warm)
            # Natively with autotune's matmuls (the default) and with the page's (`--matmul block`).
            native = native_timings(args.tally, native_model, request, args.warm, "cubecl")
            native_block = native_timings(args.tally, native_model, request, args.warm, "block")
            result["models"].append({
                "model": name,
                "items": len(request["items"]),
                "page": in_page,
                "native_wgpu": native,
                "native_wgpu_matmul_block": native_block,
                "warm_score_ratio_page_over_native": in_page["warm_score_s"] / native["warm_score_s"],
                "warm_score_ratio_page_over_native_block": in_page["warm_score_s"] / native_block["warm_score_s"],
                "first_score_ratio_page_over_native": in_page["first_score_s"] / native["first_score_s"],
                "load_ratio_page_over_native": in_page["load_s"] / native["load_s"],
            })
            print(json.dumps(result["models"][-1]), flush=True)
    finally:
        devtools.close()
        server.kill()
        server.wait()
    pathlib.Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
