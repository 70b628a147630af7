"""The Helm chart, rendered by the real helm binary and checked object by object.

Scenarios are the chart's own ci/*-values.yaml files (the chart-testing convention). Every
rendered object must validate strictly against the Kubernetes 1.31 schema; custom resources
(InferencePool, KEDA's ScaledObject) against the CRD schemas vendored in tests/deploy/crds/
(ServiceMonitor and PrometheusRule have none there: their fields are asserted here). Then
assertions in the style of helm-unittest check probes, resources, args, labels and wiring between
objects. The newer options (ingress, KEDA, InferencePool, pod extras, the test hook) are in
test_helm_options.py.
"""

from __future__ import annotations

import base64
import json

import pytest
import yaml

from tests.deploy._crds import crd_fixtures, validate_custom_resource
from tests.deploy._tools import CHART, DASHBOARD, RULES, by_kind, need_module, one
from tests.deploy.conftest import scenarios

K8S_VERSION = "1.31.0"
OPERATOR_CRDS = {"ServiceMonitor", "PrometheusRule"}   # no vendored schema: asserted field by field


def container(docs: list[dict]) -> dict:
    """The server container (sidecars may sit beside it)."""
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    (server,) = [c for c in pod["containers"] if c["name"] == "specserve"]
    return server


def is_test_hook(doc: dict) -> bool:
    return doc["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"


def flags(docs: list[dict]) -> dict[str, str]:
    """The container's ``--flag value`` pairs (a later flag wins, as in argparse)."""
    args = container(docs)["args"]
    assert all(isinstance(a, str) for a in args), args
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        assert args[i].startswith("--"), f"stray argument {args[i]!r} in {args}"
        if i + 1 < len(args) and not args[i + 1].startswith("--"):
            out[args[i]] = args[i + 1]
            i += 2
        else:
            out[args[i]] = ""
            i += 1
    return out


def test_lint_strict(helm) -> None:
    proc = helm("lint", "--strict", str(CHART))
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("scenario", scenarios())
def test_every_object_validates_against_kubernetes_schema(render, scenario: str) -> None:
    kubernetes_validate = need_module("kubernetes_validate", "kubernetes-validate")
    docs = render(scenario)
    assert by_kind(docs, "Deployment") and by_kind(docs, "Service")
    vendored = crd_fixtures()
    for doc in docs:
        where = f"{scenario}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] in OPERATOR_CRDS:
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
        elif f"{doc['apiVersion']}/{doc['kind']}" in vendored:
            errors = validate_custom_resource(doc)
            assert not errors, f"{where}: " + "; ".join(errors)
        else:
            try:
                kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
            except kubernetes_validate.ValidationError as e:  # pragma: no cover - the failure message
                pytest.fail(f"{where}: {e.message} at {list(e.path)}")
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/instance"] == "rel"
        # the test pod leaves out the name label, so the Service, PDB and pool never select it
        assert labels.get("app.kubernetes.io/name") == (None if is_test_hook(doc) else "specserve"), where


@pytest.mark.parametrize("scenario", scenarios())
def test_labels_and_selectors_agree(render, scenario: str) -> None:
    docs = render(scenario)
    dep = one(docs, "Deployment")
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    selector = dep["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert "app.kubernetes.io/version" not in selector, "a version in the selector breaks upgrades"
    svc = one(docs, "Service")
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http"]
    assert svc["spec"]["ports"][0]["targetPort"] == "http"
    assert container(docs)["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    for pdb in by_kind(docs, "PodDisruptionBudget"):
        assert pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_probes_on_health_with_a_generous_startup(render) -> None:
    c = container(render("default"))
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    startup = c["startupProbe"]
    # weight loading of an 8B pair from a network volume takes minutes: allow at least 15
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 15 * 60
    # once started, a dead engine (503) must be noticed within about a minute
    live = c["livenessProbe"]
    assert live["periodSeconds"] * live["failureThreshold"] <= 120
    assert c["readinessProbe"]["periodSeconds"] <= 10


def test_default_args_resources_and_volumes(render) -> None:
    docs = render("default")
    f = flags(docs)
    assert f == {"--port": "8000", "--model": "demo", "--draft-model": "demo",
                 "--num-speculative-tokens": "4", "--rejection-sample-method": "probabilistic",
                 "--draft-sample-method": "sample", "--gpu-memory-utilization": "0.9",
                 "--dtype": "auto", "--max-num-seqs": "64", "--shutdown-timeout": "30",
                 "--log-level": "info"}
    c = container(docs)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert "nvidia.com/gpu" not in c["resources"].get("requests", {})
    assert c["image"] == "ghcr.io/specserve/specserve:0.1.0"
    assert "SPECSERVE_API_KEY" not in {e["name"] for e in c["env"]}
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    claim = one(docs, "PersistentVolumeClaim")["metadata"]["name"]
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] == claim
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert mounts == {"models": "/models", "dshm": "/dev/shm", "tmp": "/tmp"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "HOME", "value": "/tmp"} in c["env"], "caches need a writable HOME"
    assert pod["terminationGracePeriodSeconds"] > 30, "must outlast --shutdown-timeout"
    assert one(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    assert not by_kind(docs, "ServiceMonitor") and not by_kind(docs, "HorizontalPodAutoscaler")


def test_production_values_reach_the_command_line_and_pod(render) -> None:
    docs = render("production")
    f = flags(docs)
    assert f["--model"] == "/models/Qwen3-8B" and f["--draft-model"] == "/models/Qwen3-0.6B"
    assert f["--num-speculative-tokens"] == "5"
    assert f["--rejection-sample-method"] == "strict" and f["--draft-sample-method"] == "greedy"
    assert f["--max-model-len"] == "8192" and f["--gpu-memory-utilization"] == "0.85"
    assert f["--served-model-name"] == "qwen3-8b" and f["--dtype"] == "bfloat16"
    dep = one(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert dep["spec"]["replicas"] == 2
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "podAntiAffinity" in pod["affinity"]
    assert pod["priorityClassName"] == "inference-high"
    assert pod["imagePullSecrets"] == [{"name": "registry-creds"}]
    assert pod["terminationGracePeriodSeconds"] == 75
    assert container(docs)["image"] == "registry.example.com/ml/specserve:0.1.0-cu128"
    pvc = one(docs, "PersistentVolumeClaim")["spec"]
    assert pvc["storageClassName"] == "fast-ssd" and pvc["accessModes"] == ["ReadWriteMany"]
    assert pvc["resources"]["requests"]["storage"] == "200Gi"
    assert {"name": "NCCL_DEBUG", "value": "WARN"} in container(docs)["env"]
    # the ServiceMonitor and dashboards may live in the monitoring namespace; the SM still looks in "llm"
    sm = one(docs, "ServiceMonitor")
    assert sm["metadata"]["namespace"] == "monitoring"
    assert sm["spec"]["namespaceSelector"] == {"matchNames": ["llm"]}
    assert one(docs, "ConfigMap")["metadata"]["namespace"] == "monitoring"


def test_servicemonitor_selects_the_service_port(render) -> None:
    docs = render("servicemonitor")
    sm, svc = one(docs, "ServiceMonitor"), one(docs, "Service")
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    port_names = {p["name"] for p in svc["spec"]["ports"]}
    (endpoint,) = sm["spec"]["endpoints"]
    assert endpoint["port"] in port_names
    assert endpoint["path"] == "/metrics" and endpoint["interval"] == "10s"
    assert sm["spec"]["namespaceSelector"]["matchNames"] == ["llm"]
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    # the Service's selector reaches the pods whose container serves that port
    assert container(docs)["ports"][0]["name"] == endpoint["port"]


def test_prometheus_rule_ships_the_tested_rules_file(render) -> None:
    rule = one(render("servicemonitor"), "PrometheusRule")
    assert rule["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_hpa_scales_the_deployment(render) -> None:
    docs = render("hpa")
    hpa, dep = one(docs, "HorizontalPodAutoscaler"), one(docs, "Deployment")
    assert "replicas" not in dep["spec"], "the HPA owns the replica count"
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["kind"], ref["name"], ref["apiVersion"]) == ("Deployment", dep["metadata"]["name"], "apps/v1")
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["pods"]["metric"]["name"] == "specserve_num_requests_waiting"
    assert metric["pods"]["target"] == {"type": "AverageValue", "averageValue": "2"}


def test_existing_claim_is_mounted_and_no_claim_is_created(render) -> None:
    docs = render("existing-claim")
    assert not by_kind(docs, "PersistentVolumeClaim")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models"]["persistentVolumeClaim"] == {"claimName": "models-rwx"}
    c = container(docs)
    assert {"name": "models", "mountPath": "/data"} in c["volumeMounts"]
    assert {"name": "HF_HOME", "value": "/data/.hf"} in c["env"]
    assert {"name": "TRITON_CACHE_DIR", "value": "/data/.triton-cache"} in c["env"]
    assert flags(docs)["--model"] == "/data/Qwen3-8B"


def test_api_key_from_chart_secret(render) -> None:
    docs = render("api-key")
    secret = one(docs, "Secret")
    assert base64.b64decode(secret["data"]["api-key"]).decode() == "sk-test-only"
    env = {e["name"]: e for e in container(docs)["env"]}
    ref = env["SPECSERVE_API_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": secret["metadata"]["name"], "key": "api-key"}
    assert "sk-test-only" not in json.dumps(one(docs, "Deployment")), "the key must not sit in the pod spec"


def test_api_key_from_existing_secret(render) -> None:
    docs = render("api-key-existing-secret")
    assert not by_kind(docs, "Secret")
    env = {e["name"]: e for e in container(docs)["env"]}
    assert env["SPECSERVE_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": "team-llm-keys", "key": "specserve"}


def test_cpu_without_draft(render) -> None:
    docs = render("cpu-no-draft")
    f = flags(docs)
    assert "--draft-model" not in f and "--num-speculative-tokens" not in f
    assert f["--device"] == "cpu"
    c = container(docs)
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["models"] == {"name": "models", "emptyDir": {}}
    assert "TRITON_CACHE_DIR" not in {e["name"] for e in c["env"]}   # no volume to keep it on
    assert not by_kind(docs, "PersistentVolumeClaim") and not by_kind(docs, "ConfigMap")


def test_dashboard_configmap_for_the_grafana_sidecar(render) -> None:
    cm = one(render("default"), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "specserve"
    assert cm["data"] == {"specserve.json": DASHBOARD.read_text()}, "the chart must ship deploy/grafana/specserve.json"


def test_notes_tell_how_to_curl(helm) -> None:
    proc = helm("install", "rel", str(CHART), "--dry-run=client", "--namespace", "llm",
                "--values", str(CHART / "ci" / "api-key-values.yaml"))
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    assert "kubectl --namespace llm port-forward service/rel-specserve 8000:8000" in notes
    assert "curl -s http://127.0.0.1:8000/v1/completions" in notes
    assert 'Authorization: Bearer $SPECSERVE_API_KEY' in notes
    assert "get secret rel-specserve-api-key" in notes


BAD_VALUES = [
    (["--set", "model.numSpeculativeTokens=17"], "/model/numSpeculativeTokens': maximum"),
    (["--set", "model.numSpeculativeTokens=0"], "/model/numSpeculativeTokens': minimum"),
    (["--set", "model.rejectionSampleMethod=lenient"], "/model/rejectionSampleMethod"),
    (["--set", "model.gpuMemoryUtilization=1.5"], "/model/gpuMemoryUtilization"),
    (["--set-json", "model.gpuMemoryUtilization=0"], "/model/gpuMemoryUtilization"),
    (["--set", "model.targte=/models/x"], "additional properties 'targte' not allowed"),
    (["--set", "model.target="], "/model/target': minLength"),
    (["--set", "shm.sizeLimit=lots"], "/shm/sizeLimit"),
    (["--set", "serviceMonitor.interval=15"], "/serviceMonitor/interval': got number, want string"),
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set", "gpu.count=-1"], "/gpu/count': minimum"),
    (["--set", "apiKey.enabled=true"], "apiKey.enabled=true needs apiKey.existingSecret"),
    (["--set", "apiKey.value=a", "--set", "apiKey.existingSecret=b"], "not both"),
    (["--set", "autoscaling.enabled=true", "--set", "autoscaling.minReplicas=9"], "exceeds autoscaling.maxReplicas"),
]


@pytest.mark.parametrize("args,message", BAD_VALUES, ids=[a[-1] for a, _ in BAD_VALUES])
def test_bad_values_are_refused_with_a_clear_message(helm, args: list[str], message: str) -> None:
    proc = helm.template_raw(*args)
    assert proc.returncode != 0, f"{args} rendered:\n{proc.stdout[:500]}"
    assert message in proc.stderr, proc.stderr


def test_numeric_strings_from_set_are_accepted(helm) -> None:
    docs = helm.template("--set", "model.gpuMemoryUtilization=0.95",
                         "--set", "autoscaling.enabled=true", "--set", "autoscaling.targetWaitingRequests=2.5")
    assert flags(docs)["--gpu-memory-utilization"] == "0.95"
    assert one(docs, "HorizontalPodAutoscaler")["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "2.5"
