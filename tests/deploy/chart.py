"""The Helm chart `deploy/helm/tally`, rendered offline for each documented values set: the Go
Helm SDK through PyPI `helm-python-sdk` (no helm binary, no cluster). Shared by the chart check
and the server contract test."""

import pathlib

import helm_python as helm
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "tally"
SCHEMAS = REPO / "deploy" / "schemas"
RELEASE, NAMESPACE = "tally", "ranking"


def documented_values():
    """(name, values) for the chart's defaults and every file in its examples/ folder."""
    sets = [("defaults", {})]
    for path in sorted((CHART / "examples").glob("*.yaml")):
        sets.append((f"examples/{path.name}", yaml.safe_load(path.read_text()) or {}))
    return sets


def render(values):
    """Every object the chart renders for `values` (a dict), as parsed YAML."""
    chart = helm.Chart.load(str(CHART))
    try:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    finally:
        chart.close()
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def find(objects, kind, name=None):
    """The one object of `kind` (and `name`, if given)."""
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    if len(found) != 1:
        raise LookupError(f"{len(found)} objects of kind {kind} named {name or 'anything'}")
    return found[0]


def picker_config(objects):
    """The endpoint picker's EndpointPickerConfig, parsed from its ConfigMap."""
    config_map = find(objects, "ConfigMap")
    (text,) = config_map["data"].values()
    return yaml.safe_load(text)


def picker_metric_names(config):
    """What the picker reads from every pod's /metrics: the metric specs of the engine it uses."""
    (extractor,) = [p for p in config["plugins"] if p["type"] == "core-metrics-extractor"]
    parameters = extractor["parameters"]
    (engine,) = [e for e in parameters["engineConfigs"] if e["name"] == parameters["defaultEngine"]]
    specs = {key: engine[key] for key in ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec")}
    assert all(specs.values()), f"the picker reads an empty metric name: {specs}"
    assert not any(engine.get(key) for key in ("loraSpec", "cacheInfoSpec")), "tally serves no LoRA or cache-info metrics"
    return specs
