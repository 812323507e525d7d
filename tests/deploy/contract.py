"""The contract between the Helm chart and the server it deploys, on loopback: tally started with
the arguments the chart renders (device flags swapped for this machine's CPU) for every
documented values set that deploys the endpoint picker, then

- the chart's probe paths answer as the chart means them (readiness 200 once ready, liveness 200);
- every metric name the picker configuration reads exists, typed gauge, in range (requests
  waiting and running: whole numbers, waiting within --max-queue; cache use 0 to 1), and moves
  under load (read with `prometheus_client`'s parser, not tally's own code);
- scraping /metrics at 20 Hz (the picker's 50 ms) during load costs < 1% of throughput: the
  server's CPU time per scrape × 20 Hz, as a fraction of a core, must stay under 1%; the
  throughput with and without the scraper, in back-to-back pairs, is measured beside it (a gross effect,
  say lock contention, would show there);
- SIGTERM during requests: readiness turns 503 at once, every request completes, the process exits
  0 within the chart's grace period less its preStop sleep.

    python3 tests/deploy/contract.py --tally target/release/tally [--json out.json]
"""

import argparse
import http.client
import json
import math
import os
import pathlib
import platform
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from chart import REPO, documented_values, find, picker_config, picker_metric_names, render

SCRAPE_HZ = 20
REQUEST = {
    "query": "Review: the film was a delight from start to finish, funny and warm. Sentiment:",
    "items": [" positive", " negative", " mixed", " neutral", " great", " awful", " fine", " boring"],
    "label_token_ids": [9230, 2838],
}


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """`tally serve` with the chart's arguments, on loopback and this machine's CPU."""

    def __init__(self, tally, chart_args, model):
        self.port = free_port()
        args = list(chart_args)
        local = {"--model": model, "--host": "127.0.0.1", "--port": str(self.port), "--backend": "cpu", "--dtype": "float32"}
        for flag, value in local.items():
            args[args.index(flag) + 1] = value
        assert args[0] == "serve", args
        self.args = args
        self.process = subprocess.Popen([tally, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.log = []
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()

    def get(self, path, timeout=10):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            return response.status, response.read().decode()
        finally:
            connection.close()

    def wait_ready(self, path, seconds=120):
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tally exited with {self.process.returncode}: {''.join(self.log)[-2000:]}")
            try:
                if self.get(path, timeout=1)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"{path} did not answer 200 in {seconds} s")

    def cpu_seconds(self):
        """The server's user + system CPU time so far, from /proc (Linux)."""
        fields = pathlib.Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Clients:
    """`count` clients scoring REQUEST back to back over keep-alive connections."""

    def __init__(self, port, count):
        self.port, self.scored, self.errors = port, 0, []
        self.running = True
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.client, daemon=True) for _ in range(count)]
        for thread in self.threads:
            thread.start()

    def client(self):
        body = json.dumps(REQUEST)
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        while self.running:
            connection.request("POST", "/v1/score", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            answer = response.read()
            with self.lock:
                if response.status == 200:
                    self.scored += 1
                else:
                    self.errors.append((response.status, answer[:200]))

    def stop(self):
        self.running = False
        for thread in self.threads:
            thread.join()


class Scraper:
    """GETs /metrics at `hz` on one keep-alive connection; keeps each scrape's text and latency."""

    def __init__(self, port, hz, keep_texts=True):
        self.port, self.period, self.keep_texts = port, 1 / hz, keep_texts
        self.texts, self.latencies, self.running = [], [], True
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
        next_at = time.monotonic()
        while self.running:
            started = time.monotonic()
            connection.request("GET", "/metrics")
            text = connection.getresponse().read().decode()
            self.latencies.append(time.monotonic() - started)
            if self.keep_texts:
                self.texts.append(text)
            next_at += self.period
            time.sleep(max(0.0, next_at - time.monotonic()))

    def stop(self):
        self.running = False
        self.thread.join()


def parse_spec(spec):
    """A picker metric spec, `name` or `name{label="value",...}`: (name, {label: value})."""
    match = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?', spec)
    assert match, f"not a metric spec: {spec}"
    labels = dict(re.findall(r'(\w+)\s*=\s*"?([^",]*)"?', match.group(2) or ""))
    return match.group(1), labels


def read_specs(text, specs):
    """Each spec's (type, value) in one scrape; a missing one is (None, None)."""
    families = {family.name: family for family in text_string_to_metric_families(text)}
    found = {}
    for key, spec in specs.items():
        name, labels = parse_spec(spec)
        family = families.get(name)
        samples = [s for s in (family.samples if family else []) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]
        found[key] = (family.type if family else None, samples[0].value if len(samples) == 1 else None)
    return found


def check_metrics(texts, specs, max_queue):
    """Problems with the picker's metrics over a run of scrapes; and the largest value each took."""
    failures, largest = [], {key: 0.0 for key in specs}
    for text in texts:
        for key, (kind, value) in read_specs(text, specs).items():
            if kind != "gauge" or value is None:
                failures.append(f"{specs[key]}: type {kind}, value {value} (want one gauge series)")
                continue
            whole = key != "kvUsageSpec"
            upper = max_queue if key == "queuedRequestsSpec" else (1.0 if not whole else float("inf"))
            if value < 0 or value > upper or (whole and value != int(value)):
                failures.append(f"{specs[key]} = {value}: out of range")
            largest[key] = max(largest[key], value)
    for key in ("runningRequestsSpec", "kvUsageSpec"):
        if largest[key] <= 0:
            failures.append(f"{specs[key]} never rose above 0 under load")
    return sorted(set(failures)), largest


def throughput(server, clients_count, seconds, scrape):
    """Items/s scored by `clients_count` clients in `seconds`, with a 20 Hz scraper or without."""
    clients = Clients(server.port, clients_count)
    time.sleep(1.0)  # every client has a request in flight
    before, started = clients.scored, time.monotonic()
    scraper = Scraper(server.port, SCRAPE_HZ, keep_texts=False) if scrape else None
    time.sleep(seconds)
    scored, elapsed = clients.scored - before, time.monotonic() - started
    if scraper:
        scraper.stop()
    clients.stop()
    if clients.errors:
        raise RuntimeError(f"load answered errors: {clients.errors[:3]}")
    return scored * len(REQUEST["items"]) / elapsed


def scrape_cpu_seconds(server, scrapes=2000):
    """Server CPU seconds per /metrics answer, at rest (after load, so every series exists)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    for _ in range(20):
        connection.request("GET", "/metrics")
        connection.getresponse().read()
    before = server.cpu_seconds()
    for _ in range(scrapes):
        connection.request("GET", "/metrics")
        connection.getresponse().read()
    return (server.cpu_seconds() - before) / scrapes


def timed_score(port, request):
    """Seconds one /v1/score request takes on an otherwise idle server."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.monotonic()
    connection.request("POST", "/v1/score", json.dumps(request), {"Content-Type": "application/json"})
    connection.getresponse().read()
    connection.close()
    return time.monotonic() - started


def check_sigterm(server, objects, readiness, max_queue):
    """SIGTERM with requests in flight: readiness 503 at once, every request answered, exit 0 in time."""
    pod = find(objects, "Deployment", "tally")["spec"]["template"]["spec"]
    budget = pod["terminationGracePeriodSeconds"] - int(pod["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][1])
    # Enough work in flight to outlast the probe however fast this machine scores: concurrent
    # 64-item requests adding up to about two seconds (measured here), within the queue's bound.
    long_request = dict(REQUEST, items=REQUEST["items"] * 8)
    one_request = timed_score(server.port, long_request)
    copies = max(1, min(max_queue // 2, math.ceil(2.0 / one_request)))
    answers = []

    def in_flight():
        connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        connection.request("POST", "/v1/score", json.dumps(long_request), {"Content-Type": "application/json"})
        response = connection.getresponse()
        answers.append((response.status, len(json.loads(response.read()).get("scores", []))))

    clients = [threading.Thread(target=in_flight) for _ in range(copies)]
    for client in clients:
        client.start()
    time.sleep(0.1)
    started = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    time.sleep(0.02)
    failures = []
    status, body = server.get(readiness)
    if status != 503:
        failures.append(f"readiness after SIGTERM: {status} {body}")
    still_running = sum(client.is_alive() for client in clients)
    for client in clients:
        client.join()
    expected = [(200, len(long_request["items"]))] * copies
    if not still_running or answers != expected:
        failures.append(f"the {copies} requests in flight at SIGTERM ({still_running} still running after the probe; "
                        f"one takes {one_request:.2f} s alone): {answers}")
    try:
        code = server.process.wait(timeout=budget)
        if code != 0:
            failures.append(f"exit status {code} after SIGTERM")
    except subprocess.TimeoutExpired:
        failures.append(f"still running {budget} s after SIGTERM (the grace period less preStop)")
    return failures, {"sigterm_exit_seconds": time.monotonic() - started, "sigterm_requests_in_flight": copies,
                      "sigterm_one_request_seconds": one_request}


def run_values_set(tally, model, name, values, report):
    objects = render(values)
    specs = picker_metric_names(picker_config(objects))
    container = find(objects, "Deployment", "tally")["spec"]["template"]["spec"]["containers"][0]
    readiness, liveness = container["readinessProbe"]["httpGet"]["path"], container["livenessProbe"]["httpGet"]["path"]
    assert container["startupProbe"]["httpGet"]["path"] == readiness, "the startup probe waits for readiness"
    args = container["args"]
    max_queue = int(args[args.index("--max-queue") + 1])
    failures = []
    server = Server(tally, args, model)
    try:
        server.wait_ready(readiness)
        if server.get(liveness)[0] != 200:
            failures.append(f"liveness {liveness} does not answer 200")
        clients = Clients(server.port, 4)
        scraper = Scraper(server.port, SCRAPE_HZ)
        time.sleep(6)
        scraper.stop()
        clients.stop()
        problems, largest = check_metrics(scraper.texts, specs, max_queue)
        failures += problems + [f"load answered {status}: {body}" for status, body in clients.errors[:3]]
        entry = {"values": name, "picker_reads": specs, "scrapes": len(scraper.texts), "largest": {specs[k]: v for k, v in largest.items()},
                 "scrape_ms_p50": 1e3 * statistics.median(scraper.latencies), "scrape_ms_max": 1e3 * max(scraper.latencies)}
        if not report.get("scrape_cost"):
            report["scrape_cost"] = measure_scrape_cost(server, failures)
        sigterm_failures, sigterm = check_sigterm(server, objects, readiness, max_queue)
        failures += sigterm_failures
        entry.update(sigterm)
        report["values_sets"].append(entry)
    finally:
        server.stop()
    print(f"{'FAIL' if failures else 'ok  '} {name}: the picker reads {', '.join(specs.values())}")
    return [f"{name}: {failure}" for failure in failures]


def measure_scrape_cost(server, failures):
    """Scraping at 20 Hz against no scraping, in back-to-back pairs; and the server CPU a scrape costs.

    Each pair's two rounds run one after the other, in alternating order (without-with, then
    with-without), so a drift in the machine's speed over the minute, as on a shared CI runner,
    falls on both sides, and one order's bias cancels the other's in the geometric mean of the
    pairs' ratios, the ratio read. (A ratio of three unpaired medians once read 0.897 on a CI
    runner where the CPU cost below was 0.17% of a core; here pairs read 0.894 to 1.070, the
    round run second the faster in five of six; eight pairs read 0.835 to 1.354 in another run,
    whose mean of eight has a standard error of ~6%.)
    """
    pairs, seconds, clients = 8, 5, 4
    without, with_scraper, ratios = [], [], []
    for pair in range(pairs):
        order = (False, True) if pair % 2 == 0 else (True, False)
        measured = {scrape: throughput(server, clients, seconds, scrape) for scrape in order}
        without.append(measured[False])
        with_scraper.append(measured[True])
        ratios.append(measured[True] / measured[False])
    cpu_per_scrape = scrape_cpu_seconds(server)
    cores = os.cpu_count()
    cost = {
        "items_per_s_without": statistics.median(without),
        "items_per_s_with_20hz_scrape": statistics.median(with_scraper),
        "ratio": statistics.geometric_mean(ratios),
        "pair_ratios": ratios,
        "pairs": pairs, "seconds_per_round": seconds, "clients": clients,
        "server_cpu_us_per_scrape": cpu_per_scrape * 1e6,
        "cpu_fraction_of_one_core_at_20hz": cpu_per_scrape * SCRAPE_HZ,
        "cpu_fraction_of_machine_at_20hz": cpu_per_scrape * SCRAPE_HZ / cores,
    }
    print(f"     20 Hz scrape: {cost['server_cpu_us_per_scrape']:.0f} µs of server CPU a scrape = {100 * cost['cpu_fraction_of_one_core_at_20hz']:.3f}% of one core; "
          f"throughput {cost['items_per_s_with_20hz_scrape']:.1f} vs {cost['items_per_s_without']:.1f} items/s without; "
          f"ratio {cost['ratio']:.3f}x (geometric mean of pairs {', '.join(f'{r:.3f}' for r in ratios)})")
    if cost["cpu_fraction_of_one_core_at_20hz"] >= 0.01:
        failures.append(f"a 20 Hz scrape costs {100 * cost['cpu_fraction_of_one_core_at_20hz']:.2f}% of a core (limit 1%)")
    # The CPU bound above is the measure; this one catches what it cannot (a scrape holding a lock
    # the model thread needs). Paired rounds on a shared 2-core machine, where the harness's own
    # scraper and clients take CPU from the server, vary by up to a third a pair: only a gross
    # loss, over three standard errors below 1, fails.
    if cost["ratio"] < 0.8:
        failures.append(f"throughput with a 20 Hz scraper is {cost['ratio']:.3f}x without")
    return cost


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tally", required=True)
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    model = subprocess.run([str(REPO / "scripts" / "fetch-smollm2.sh")], check=True, capture_output=True, text=True).stdout.strip()
    report = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, {platform.system()}", "model": pathlib.Path(model).name,
              "backend": "cpu", "date": time.strftime("%Y-%m-%d"), "values_sets": []}
    failures = []
    with_picker = [(name, values) for name, values in documented_values() if values.get("inferencePool", {}).get("enabled")]
    assert with_picker, "no documented values set deploys the endpoint picker"
    for name, values in with_picker:
        failures += run_values_set(args.tally, model, name, values, report)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    for failure in failures:
        print("FAIL", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
