#!/usr/bin/env python3
"""The browser page, end to end, in headless Chromium on its software WebGPU (SwiftShader).

Starts `tally serve --web web/dist` on loopback (the server the page compares with), opens the
page, and over the DevTools protocol (a pipe, stdlib only) calls `tally.load` on every fixture
model and `tally.score` on the float64 reference cases, with tally's kernels and with the plain path:
every probability within 1e-3 relative (plus a 1e-9 floor) of the reference, and the load-time
kernel check passed. Then checks bad input gets clear errors and drives the page's own form on
its default model (SmolLM2-135M where web/build.sh included it) with the server comparison on:
bars drawn, page == server == the float64 reference, kernels and plain path. Then the matmul
kernels tuned after those scores: each chosen one checked right, and each forced on every matmul
against the reference; and a second visit that keeps the choices. Keeps a screenshot of the
page; timings go to --json.

usage: tests/browser/run.py --tally target/release/tally [--dist web/dist] [--chromium chromium]
                            [--screenshot out.png] [--json out.json]
Exit status 0 only if every check passed.
"""

import argparse
import base64
import json
import os
import pathlib
import select
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "fixtures" / "cases"
FLAGS = ["--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--remote-debugging-pipe",
         "--window-size=1000,1400"]


class DevTools:
    """Chromium's DevTools protocol over --remote-debugging-pipe (fd 3 in, fd 4 out, NUL-separated JSON)."""

    def __init__(self, chromium):
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        self.profile = tempfile.TemporaryDirectory(ignore_cleanup_errors=True)
        args = [chromium, *FLAGS, f"--user-data-dir={self.profile.name}", "about:blank"]

        def fds():
            os.dup2(to_browser_r, 3)
            os.dup2(from_browser_w, 4)

        self.process = subprocess.Popen(args, preexec_fn=fds, pass_fds=(3, 4), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.buffer = b""
        self.next_id = 0
        self.events = []

    def send(self, method, params=None, session=None, timeout=600):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while time.time() < deadline:
            reply = self.receive(deadline)
            if reply is None:
                break
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)
            self.echo_problem(reply)
        raise TimeoutError(f"{method}: no answer in {timeout} s")

    @staticmethod
    def echo_problem(event):
        """Prints the page's errors and warnings as they happen: a hang then shows its cause."""
        params = event.get("params", {})
        if event.get("method") == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning"):
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params["args"])
            print(f"  page {params['type']}: {text[:2000]}", file=sys.stderr, flush=True)
        elif event.get("method") == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            print(f"  page exception: {details.get('exception', {}).get('description') or details.get('text')}", file=sys.stderr, flush=True)

    def receive(self, deadline):
        """The next message, or None if none came before the deadline."""
        while b"\0" not in self.buffer:
            if not select.select([self.from_browser], [], [], max(0.0, deadline - time.time()))[0]:
                return None
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed the DevTools pipe")
            self.buffer += chunk
        message, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self):
        self.process.kill()
        self.process.wait()
        self.profile.cleanup()


class Page:
    def __init__(self, devtools, url):
        self.devtools = devtools
        target = devtools.send("Target.createTarget", {"url": url})["targetId"]
        self.session = devtools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        devtools.send("Runtime.enable", session=self.session)
        self.wait_for("typeof window.tally === 'object' && typeof window.page === 'object'")

    def evaluate(self, expression, timeout=600):
        """The value of a JS expression (awaited); a rejected promise raises with its message."""
        result = self.devtools.send("Runtime.evaluate", {"expression": expression, "awaitPromise": True, "returnByValue": True,
                                                          "timeout": timeout * 1000}, self.session, timeout + 5)
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise RuntimeError(details.get("exception", {}).get("description") or details.get("text"))
        return result["result"].get("value")

    def wait_for(self, condition, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.evaluate(f"Boolean({condition})"):
                return
            time.sleep(0.1)
        raise TimeoutError(f"page never satisfied {condition}")

    def console(self):
        return [" ".join(str(a.get("value", a.get("description", ""))) for a in e["params"]["args"])
                for e in self.devtools.events if e.get("method") == "Runtime.consoleAPICalled"]

    def screenshot(self, path):
        data = self.devtools.send("Page.captureScreenshot", {"format": "png"}, self.session)["data"]
        pathlib.Path(path).write_bytes(base64.b64decode(data))


SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def model_source(dist, model):
    """The URL tally.load takes for a fixture model: its .gguf file, or its directory."""
    ggufs = sorted((dist / "models" / model).glob("*.gguf"))
    return f"models/{model}/{ggufs[0].name}" if ggufs else f"models/{model}"


def close_enough(got, expected, tolerance=1e-3):
    return all(len(g) == len(e) and all(abs(a - b) <= tolerance * abs(b) + 1e-9 for a, b in zip(g, e)) for g, e in zip(got, expected)) \
        and len(got) == len(expected)


def reference_cases(dist):
    """(source, [(name, request, expected)]) per fixture model."""
    by_model = {}
    for path in sorted(CASES.glob("*.json")):
        case = json.loads(path.read_text())
        by_model.setdefault(model_source(dist, case["model"]), []).append((path.stem, case["request"], case["expected_scores"]))
    return by_model


def smollm2_case():
    """The float64 reference's `capitals` case on SmolLM2: (request, expected scores)."""
    case = json.loads((ROOT / "tests" / "fixtures" / "smollm2.json").read_text())["cases"][0]
    return case["request"], case["expected_scores"]


def smollm2_expected():
    """The page's default request on SmolLM2 (items France and Italy, labels Paris and Rome):
    that corner of the float64 reference's `capitals` case."""
    request, expected = smollm2_case()
    assert request["label_token_ids"][:2] == [7042, 7268] and request["items"][:2] == [" France is", " Italy is"]
    return [row[:2] for row in expected[:2]]


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_tally(binary, dist):
    """`tally serve --web dist` on the page's default model; returns (process, base URL)."""
    model = dist / "models" / SMOLLM2
    model = model if model.is_file() else dist / "models" / "wide-vocab"
    port = free_port()
    process = subprocess.Popen([binary, "serve", "--model", str(model), "--web", str(dist), "--host", "127.0.0.1", "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        if process.poll() is not None:
            sys.exit(f"tally serve exited with {process.returncode}")
        try:
            # It listens before its model is loaded; /health answers 200 once it serves.
            with urllib.request.urlopen(f"{base}/health", timeout=1):
                return process, base
        except OSError:
            time.sleep(0.2)
    process.kill()
    sys.exit("tally serve was not ready in 120 s")


def check_models(page, dist, failures, report):
    """Every reference case, both paths; per model the load, first and warm score times."""
    for source, cases in sorted(reference_cases(dist).items()):
        started = time.time()
        info = page.evaluate(f"tally.load({json.dumps(source)})")
        timing = {"model": source, "load_s": time.time() - started, "load_phases_s": info.get("load_seconds"), "kernel_check": info["kernel_check"]}
        report["adapter"] = info.get("adapter")
        if sorted(info.get("load_seconds") or {}) != ["check", "download", "upload"]:
            failures.append(f"{source}: load phases {info.get('load_seconds')}, not download, upload and check")
        if not info["kernel_check"]["passed"]:
            failures.append(f"{source}: {info['kernel_check']['message']}")
        for kernels in (True, False):
            page.evaluate(f"tally.setKernels({json.dumps(kernels)})")
            path = "kernels" if kernels else "plain"
            for name, request, expected in cases:
                started = time.time()
                response = page.evaluate(f"tally.score({json.dumps(request)})")
                seconds = time.time() - started
                ok = close_enough(response["scores"], expected)
                report["cases"].append({"case": name, "path": path, "ok": ok, "seconds": seconds})
                print(f"{'ok  ' if ok else 'FAIL'} {name} ({path}, {seconds:.1f} s)", flush=True)
                if not ok:
                    failures.append(f"{name} ({path}): {response['scores']} != {expected}")
            # The first case once more: the warm time, every kernel compiled (and the matmul
            # tuning the scores started done: it would run first).
            page.evaluate("tally.tuned()")
            started = time.time()
            page.evaluate(f"tally.score({json.dumps(cases[0][1])})")
            timing[f"first_score_s_{path}"] = next(c["seconds"] for c in report["cases"] if c["case"] == cases[0][0] and c["path"] == path)
            timing[f"warm_score_s_{path}"] = time.time() - started
        report["models"].append(timing)


def check_bad_input(page, failures):
    """Each rejects with a clear message; nothing hangs."""
    for what, expression, needle in [
        ("empty items", "tally.score({query: [1], items: [], label_token_ids: [1]})", "at least one item"),
        ("id out of range", "tally.score({query: [1], items: [[999999]], label_token_ids: [1]})", "out of range"),
        ("not a request", "tally.score({query: 5})", "invalid request"),
        ("missing model", "tally.load('models/no-such-model')", "404"),
        ("not a model file", "tally.load('index.html.gguf')", "404"),
        ("picker without weights", "tally.load([new File(['{}'], 'config.json')])", "pick one .gguf file"),
        ("corrupt GGUF", "tally.load([new File(['not a gguf file at all'], 'broken.gguf')])", "GGUF"),
    ]:
        try:
            page.evaluate(expression, timeout=120)
            failures.append(f"{what}: accepted")
        except RuntimeError as error:
            if needle not in str(error):
                failures.append(f"{what}: unclear error {error}")


def check_labels_as_text(page, smollm2, failures):
    """Labels as words resolve to the tokenizer's ids (the page's default labels are words); a
    word of two tokens is refused with the CLI's message."""
    words, ids = ([" Paris", " Rome"], [7042, 7268]) if smollm2 else ([" Yes", " No"], [7414, 2308])
    failed_before = len(failures)
    got = page.evaluate(f"tally.labelIds({json.dumps(words)})")
    if got != ids:
        failures.append(f"labels as text: {words} resolved to {got}, not {ids}")
    try:
        page.evaluate("tally.labelIds([' France is'])")
        failures.append("labels as text: a label of two tokens was accepted")
    except RuntimeError as error:
        if "exactly one token" not in str(error):
            failures.append(f"labels as text: unclear error {error}")
    print(f"{'ok  ' if len(failures) == failed_before else 'FAIL'} labels as text: {words} -> {got}", flush=True)


def check_matmul_choices(page, dist, failures, report):
    """The checked matmul choice: once the scores so far have been followed by their tuning,
    every shape class met has a choice, each tuned class chose a candidate found right against
    the float64 product, and the page's model scores the reference case within tolerance with
    every chosen kernel forced on every class (and the register block every class starts on)."""
    tuned = page.evaluate("tally.tuned()")
    report["matmul"] = tuned
    failed_before = len(failures)
    if tuned["untuned"]:
        failures.append(f"matmul choice: classes met but never tuned: {tuned['untuned']}")
    if not tuned["choices"]:
        failures.append("matmul choice: nothing was tuned after the scores")
    for trial in tuned["tuned"]:
        verdicts = {c["kernel"]: c["verdict"] for c in trial["candidates"]}
        if trial["chosen"] is None or verdicts.get(trial["chosen"]) != "right":
            failures.append(f"matmul choice: {trial['shape']} chose {trial['chosen']} ({verdicts})")
        print(f"  {trial['shape']} -> {trial['chosen']} ({', '.join(f'{k} {v}' for k, v in verdicts.items() if v != 'right')} not right)", flush=True)
    smollm2 = (dist / "models" / SMOLLM2).is_file()
    if smollm2:
        request, expected = smollm2_case()
    else:
        request, expected = next((r, e) for name, r, e in reference_cases(dist)[model_source(dist, "wide-vocab")] if name == "wide_vocab_text")
    page.evaluate("tally.setKernels(true)")
    for kernel in sorted(set(tuned["choices"].values()) | {"block-8x8"}):
        page.evaluate(f"tally.forceMatmul({json.dumps(kernel)})")
        response = page.evaluate(f"tally.score({json.dumps(request)})")
        ok = close_enough(response["scores"], expected)
        print(f"{'ok  ' if ok else 'FAIL'} every matmul on {kernel}", flush=True)
        if not ok:
            failures.append(f"matmul {kernel} forced: {response['scores']} != {expected}")
    page.evaluate("tally.forceMatmul(null)")
    print(f"{'ok  ' if len(failures) == failed_before else 'FAIL'} matmul choice: {len(tuned['choices'])} classes chosen", flush=True)


def check_second_visit(devtools, base, dist, failures, report):
    """A second visit (a new page of the same origin): after the page's default request, every
    class it met takes the choice the first visit kept, checked again (untimed) — none is tuned
    anew — and the scores still match."""
    page = Page(devtools, f"{base}/web/index.html")
    failed_before = len(failures)
    started = time.time()
    info = page.evaluate("page.load(document.getElementById('model-url').value)")
    report["second_visit"] = {"load_s": time.time() - started, "load_phases_s": info.get("load_seconds")}
    page.evaluate("page.score()")
    after = page.evaluate("tally.tuned()")
    report["second_visit"]["restored"] = after["restored"]
    kept = [r for r in after["restored"] if r["verdict"] == "right"]
    if not kept or len(kept) != len(after["restored"]) or after["tuned"] or after["untuned"]:
        failures.append(f"second visit: kept choices {after['restored']}, tuned anew {[t['shape'] for t in after['tuned']]}, untuned {after['untuned']}")
    page.evaluate("page.score()")
    scores = json.loads(page.evaluate("JSON.stringify(window.lastScores)"))
    if (dist / "models" / SMOLLM2).is_file() and not close_enough(scores["page"]["scores"], smollm2_expected()):
        failures.append(f"second visit: SmolLM2 {scores['page']['scores']} != reference {smollm2_expected()}")
    print(f"{'ok  ' if len(failures) == failed_before else 'FAIL'} second visit: {len(kept)} kept matmul choices checked again and used", flush=True)


def check_page_form(page, dist, failures, report, screenshot):
    """The page as a person uses it: its default model (SmolLM2 where build.sh included it), the
    default request scored with the server comparison on (bars drawn, page == server, and on
    SmolLM2 == the float64 reference), then again with the kernels off."""
    smollm2 = (dist / "models" / SMOLLM2).is_file()
    timing = {"model": "page default: " + (SMOLLM2 if smollm2 else "wide-vocab")}
    page.evaluate("document.getElementById('compare').checked = true")
    started = time.time()
    page.evaluate("page.load(document.getElementById('model-url').value)")
    timing["load_s"] = time.time() - started
    check_labels_as_text(page, smollm2, failures)
    for kernels in (True, False):
        path = "kernels" if kernels else "plain"
        failed_before = len(failures)
        page.evaluate(f"tally.setKernels({json.dumps(kernels)})")
        started = time.time()
        page.evaluate("page.score()")
        timing[f"score_s_{path}_with_server"] = time.time() - started
        bars = page.evaluate("document.querySelectorAll('.fill.page').length")
        server_bars = page.evaluate("document.querySelectorAll('.fill.server').length")
        error = page.evaluate("document.getElementById('error').textContent")
        if bars < 2 or server_bars != bars or error:
            failures.append(f"page form ({path}): {bars} page bars and {server_bars} server bars, error {error!r}")
        # Each bar drawn as wide as its probability: fill width / track width.
        drawn = page.evaluate("[...document.querySelectorAll('.fill.page')].map(f => f.getBoundingClientRect().width / f.parentElement.getBoundingClientRect().width)")
        scores = json.loads(page.evaluate("JSON.stringify(window.lastScores ?? null)") or "null")
        if not scores or not scores.get("server"):
            failures.append(f"page form ({path}): no scores kept from the page and the server")
            continue
        wanted = [p for row in scores["page"]["scores"] for p in row]
        if len(drawn) != len(wanted) or any(abs(d - p) > 0.01 for d, p in zip(drawn, wanted)):
            failures.append(f"page form ({path}): bars drawn at {drawn}, probabilities {wanted}")
        if not close_enough(scores["page"]["scores"], scores["server"]["scores"]):
            failures.append(f"page form ({path}): page and server disagree: {scores}")
        if smollm2 and not close_enough(scores["page"]["scores"], smollm2_expected()):
            failures.append(f"page form ({path}): SmolLM2 {scores['page']['scores']} != reference {smollm2_expected()}")
        print(f"{'ok  ' if len(failures) == failed_before else 'FAIL'} page form, {timing['model']} ({path}, {timing[f'score_s_{path}_with_server']:.1f} s)", flush=True)
        if kernels and screenshot:
            page.screenshot(screenshot)
    report["models"].append(timing)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tally", required=True, help="the tally binary (it serves the page and the comparison API)")
    parser.add_argument("--dist", default=str(ROOT / "web" / "dist"))
    parser.add_argument("--chromium", default="chromium")
    parser.add_argument("--screenshot", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    dist = pathlib.Path(args.dist).resolve()
    if not (dist / "index.html").is_file():
        sys.exit(f"{dist} has no index.html: run web/build.sh first")

    server, base = start_tally(args.tally, dist)
    devtools = DevTools(args.chromium)
    failures, report = [], {"cases": [], "models": []}
    try:
        page = Page(devtools, f"{base}/web/index.html")
        check_models(page, dist, failures, report)
        check_bad_input(page, failures)
        check_page_form(page, dist, failures, report, args.screenshot)
        check_matmul_choices(page, dist, failures, report)
        report["console"] = page.console()
        check_second_visit(devtools, base, dist, failures, report)
    finally:
        devtools.close()
        server.kill()
        server.wait()
    report["failures"] = failures
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    for failure in failures:
        print("FAIL", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
