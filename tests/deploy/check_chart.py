"""Checks the Helm chart offline: it lints (strict) and renders for every documented values set,
every rendered object validates against the Kubernetes schemas (PyPI `kubernetes-validate`,
strict: unknown fields fail) or, for custom resources, against its CRD's openAPIV3Schema
(deploy/schemas, vendored from upstream; `jsonschema`, as `check-jsonschema` uses), and values
the chart refuses fail with a message that says why.

    python3 tests/deploy/check_chart.py
"""

import pathlib
import sys

import helm_python as helm
import jsonschema
import kubernetes_validate
import yaml

from chart import CHART, SCHEMAS, documented_values, find, picker_config, picker_metric_names, render

# The chart's kubeVersion floor and the newest the validator knows.
KUBERNETES_VERSIONS = ["1.29.0", kubernetes_validate.latest_version()]


def crd_schemas():
    """(apiVersion, kind) → the openAPIV3Schema of that served version, from deploy/schemas."""
    schemas = {}
    for path in SCHEMAS.glob("*.yaml"):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd.get("kind") != "CustomResourceDefinition":
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if version.get("served"):
                    schemas[(f"{group}/{version['name']}", kind)] = version["schema"]["openAPIV3Schema"]
    return schemas


def validate(obj, schemas):
    """Problems with one rendered object (empty: valid)."""
    key = (obj["apiVersion"], obj["kind"])
    if key in schemas:
        validator = jsonschema.Draft7Validator(schemas[key])
        return [f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in validator.iter_errors(obj)]
    problems = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            problems.append(f"Kubernetes {version}: {'.'.join(map(str, error.path)) or '(root)'}: {error.message}")
        except kubernetes_validate.SchemaNotFoundError:
            problems.append(f"no schema for {key} in Kubernetes {version} or deploy/schemas")
    return problems


def check_values_set(name, values, schemas):
    failures = []
    objects = render(values)
    kinds = sorted({o["kind"] for o in objects})
    for obj in objects:
        for problem in validate(obj, schemas):
            failures.append(f"{name}: {obj['kind']} {obj['metadata']['name']}: {problem}")
    if any(o["kind"] == "InferencePool" for o in objects):
        # The picker's configuration is YAML the EPP parses: check it reads the names the
        # Deployment tells tally to serve (`--metrics-compat`), and is wired to the pool.
        config = picker_config(objects)
        names = picker_metric_names(config)
        args = find(objects, "Deployment", "tally")["spec"]["template"]["spec"]["containers"][0]["args"]
        engine = values.get("server", {}).get("metricNames", "tally")
        compat = [args[i + 1] for i, arg in enumerate(args) if arg == "--metrics-compat"]
        if compat != ([] if engine == "tally" else [engine]) or not names["queuedRequestsSpec"].startswith({"tally": "tally_", "vllm": "vllm:", "sglang": "sglang:"}[engine]):
            failures.append(f"{name}: the picker reads {names} but tally is started with --metrics-compat {compat}")
        pool = find(objects, "InferencePool")
        picker = find(objects, "Service", pool["spec"]["endpointPickerRef"]["name"])
        if pool["spec"]["endpointPickerRef"]["port"]["number"] not in [p["port"] for p in picker["spec"]["ports"]]:
            failures.append(f"{name}: the pool's endpointPickerRef port is not a port of the picker's Service")
    print(f"{'FAIL' if failures else 'ok  '} {name}: {len(objects)} objects ({', '.join(kinds)})")
    return failures


def check_refused(values, needle):
    """Values the chart must refuse, with a message containing `needle`."""
    try:
        render(values)
    except helm.HelmError as error:
        if needle in str(error):
            print(f"ok   refused {values}: {needle}")
            return []
        return [f"refused {values}, but the message does not say `{needle}`: {error}"]
    return [f"rendered {values}: it should be refused ({needle})"]


def check_validation_bites(schemas):
    """The validators themselves: an object each kind of check must refuse is refused."""
    objects = render(yaml.safe_load((CHART / "examples" / "gateway.yaml").read_text()))
    deployment, pool, monitor = (find(objects, kind, name) for kind, name in [("Deployment", "tally"), ("InferencePool", None), ("ServiceMonitor", None)])
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["pathh"] = "/health"
    del pool["spec"]["targetPorts"]
    monitor["spec"]["endpoints"][0]["interval"] = "every 15 seconds"
    failures = []
    for obj in (deployment, pool, monitor):
        problems = validate(obj, schemas)
        print(f"{'ok  ' if problems else 'FAIL'} a broken {obj['kind']} is refused: {problems[:1]}")
        if not problems:
            failures.append(f"a broken {obj['kind']} passed validation")
    return failures


def main():
    schemas = crd_schemas()
    failures = check_validation_bites(schemas)
    lint = helm.lint(str(CHART), strict=True, kube_version=f"v{KUBERNETES_VERSIONS[0]}")
    failures += [f"helm lint: {m['path']}: {m['error']}" for m in lint["messages"] if m["severity"] >= 2] + [f"helm lint: {e}" for e in lint["errors"]]
    print(f"{'FAIL' if failures else 'ok  '} helm lint --strict ({len(lint['messages'])} notes)")
    for name, values in documented_values():
        failures += check_values_set(name, values, schemas)
    failures += check_refused({"server": {"metricNames": "triton"}}, "server.metricNames")
    failures += check_refused({"model": {"source": "s3"}}, "model.source")
    for failure in failures:
        print("FAIL", failure)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
