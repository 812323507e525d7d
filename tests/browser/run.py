#!/usr/bin/env python3
"""The browser page, end to end, in headless Chromium on its software WebGPU (SwiftShader).

Serves web/dist on loopback, opens the page, and over the DevTools protocol (a pipe, stdlib
only) calls `tally.load` on the fixture models and `tally.score` on the float64 fixture cases,
with tally's kernels and with the plain path: every probability within 1e-3 relative (plus a
1e-9 floor) of the reference. Then checks bad input gets clear errors, drives the page's own
form once, and keeps a screenshot of it.

usage: tests/browser/run.py [--dist web/dist] [--chromium chromium] [--screenshot out.png] [--json out.json]
Exit status 0 only if every check passed.
"""

import argparse
import base64
import functools
import http.server
import json
import os
import pathlib
import select
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "fixtures" / "cases"
FLAGS = ["--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--remote-debugging-pipe",
         "--window-size=1000,1400"]


class Quiet(http.server.SimpleHTTPRequestHandler):
    extensions_map = {**http.server.SimpleHTTPRequestHandler.extensions_map, ".wasm": "application/wasm", ".js": "text/javascript"}

    def log_message(self, *args):
        pass


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


def model_source(dist, model):
    """The URL tally.load takes for a fixture model: its .gguf file, or its directory."""
    ggufs = sorted((dist / "models" / model).glob("*.gguf"))
    return f"models/{model}/{ggufs[0].name}" if ggufs else f"models/{model}"


def close_enough(got, expected):
    return all(len(g) == len(e) and all(abs(a - b) <= 1e-3 * abs(b) + 1e-9 for a, b in zip(g, e)) for g, e in zip(got, expected)) \
        and len(got) == len(expected)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dist", default=str(ROOT / "web" / "dist"))
    parser.add_argument("--chromium", default="chromium")
    parser.add_argument("--screenshot", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    dist = pathlib.Path(args.dist)
    if not (dist / "index.html").is_file():
        sys.exit(f"{dist} has no index.html: run web/build.sh first")

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(dist)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/index.html"
    devtools = DevTools(args.chromium)
    failures, report = [], {"cases": []}
    try:
        page = Page(devtools, url)
        cases = sorted(CASES.glob("*.json"))
        by_model = {}
        for path in cases:
            case = json.loads(path.read_text())
            by_model.setdefault(case["model"], []).append((path.stem, case))
        for model, model_cases in sorted(by_model.items()):
            started = time.time()
            info = page.evaluate(f"tally.load({json.dumps(model_source(dist, model))})")
            load_s = time.time() - started
            for kernels in (True, False):
                page.evaluate(f"tally.setKernels({json.dumps(kernels)})")
                for name, case in model_cases:
                    started = time.time()
                    response = page.evaluate(f"tally.score({json.dumps(case['request'])})")
                    ok = close_enough(response["scores"], case["expected_scores"])
                    report["cases"].append({"case": name, "kernels": kernels, "ok": ok, "seconds": time.time() - started, "load_s": load_s})
                    print(f"{'ok  ' if ok else 'FAIL'} {name} ({'kernels' if kernels else 'plain'})", flush=True)
                    if not ok:
                        failures.append(f"{name} ({'kernels' if kernels else 'plain'}): {response['scores']} != {case['expected_scores']}")
            report["adapter"] = info.get("adapter")

        # Bad input: each rejects with a clear message, nothing hangs.
        for what, expression, needle in [
            ("empty items", "tally.score({query: [1], items: [], label_token_ids: [1]})", "at least one item"),
            ("id out of range", "tally.score({query: [1], items: [[999999]], label_token_ids: [1]})", "out of range"),
            ("not a request", "tally.score({query: 5})", "invalid request"),
            ("missing model", "tally.load('models/no-such-model')", "404"),
        ]:
            try:
                page.evaluate(expression, timeout=120)
                failures.append(f"{what}: accepted")
            except RuntimeError as error:
                if needle not in str(error):
                    failures.append(f"{what}: unclear error {error}")

        # The page's own form, as a person would use it: load the default model, score, see bars.
        page.evaluate("page.load(document.getElementById('model-url').value).then(() => page.score())")
        bars = page.evaluate("document.querySelectorAll('.bar').length")
        error = page.evaluate("document.getElementById('error').textContent")
        if bars < 2 or error:
            failures.append(f"the page drew {bars} bars, error {error!r}")
        if args.screenshot:
            page.screenshot(args.screenshot)
        report["console"] = page.console()
    finally:
        devtools.close()
        server.shutdown()
    report["failures"] = failures
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    for failure in failures:
        print("FAIL", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
