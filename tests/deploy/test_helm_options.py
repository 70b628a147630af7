"""The chart's scale-out and extension options, rendered by the real helm binary.

Ingress, runtime class and topology spread, pod extras (init containers, sidecars, volumes, envFrom),
the rollout deadline, the Secret checksum, the helm test hook, KEDA and the InferencePool. Every
scenario's objects are also validated strictly in test_helm_chart.py (Kubernetes schema, or the
vendored CRD schema for InferencePool and ScaledObject); here the wiring between objects is checked.
The test hook's script is also run against a real server in test_helm_hook_live.py.
"""

from __future__ import annotations

import pytest
import yaml

from tests.deploy._crds import validate_custom_resource
from tests.deploy._tools import CHART, by_kind, need_module, one
from tests.deploy.test_helm_chart import K8S_VERSION, container, flags, is_test_hook


def pod_spec(docs: list[dict]) -> dict:
    return one(docs, "Deployment")["spec"]["template"]["spec"]


def selects(selector: dict, labels: dict) -> bool:
    return selector.items() <= labels.items()


def test_progress_deadline_outlasts_the_startup_budget(render, helm) -> None:
    for scenario in ("default", "production", "keda"):
        docs = render(scenario)
        startup = container(docs)["startupProbe"]
        budget = startup["periodSeconds"] * startup["failureThreshold"]
        assert one(docs, "Deployment")["spec"]["progressDeadlineSeconds"] > budget, scenario
    # derived from the probe when it changes, and refused when set at or below the budget
    docs = helm.template("--set", "probes.startup.failureThreshold=300")
    assert one(docs, "Deployment")["spec"]["progressDeadlineSeconds"] == 10 * 300 + 600
    docs = helm.template("--set", "progressDeadlineSeconds=1500")
    assert one(docs, "Deployment")["spec"]["progressDeadlineSeconds"] == 1500
    proc = helm.template_raw("--set", "progressDeadlineSeconds=1200")
    assert proc.returncode != 0 and "must exceed the startup probe's budget of 1200 s" in proc.stderr


def test_ingress_routes_to_the_service_port(render) -> None:
    docs = render("ingress")
    ing, svc = one(docs, "Ingress"), one(docs, "Service")
    assert ing["spec"]["ingressClassName"] == "nginx"
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert ing["spec"]["tls"] == [{"secretName": "llm-example-com-tls", "hosts": ["llm.example.com"]}]
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "llm.example.com"
    paths = {p["path"]: p for p in rule["http"]["paths"]}
    assert {p: v["pathType"] for p, v in paths.items()} == {"/v1": "Prefix", "/health": "Exact"}
    for p in paths.values():
        backend = p["backend"]["service"]
        assert backend["name"] == svc["metadata"]["name"]
        assert backend["port"]["name"] in {port["name"] for port in svc["spec"]["ports"]}
    assert not by_kind(render("default"), "Ingress")


def test_runtime_class_and_topology_spread(render) -> None:
    docs = render("runtime-class")
    pod = pod_spec(docs)
    assert pod["runtimeClassName"] == "nvidia"
    pod_labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    zone, host = pod["topologySpreadConstraints"]
    assert zone["topologyKey"] == "topology.kubernetes.io/zone" and zone["whenUnsatisfiable"] == "ScheduleAnyway"
    # a constraint without a labelSelector counts this release's server pods
    assert selects(zone["labelSelector"]["matchLabels"], pod_labels)
    assert zone["labelSelector"]["matchLabels"] == one(docs, "Deployment")["spec"]["selector"]["matchLabels"]
    assert host["whenUnsatisfiable"] == "DoNotSchedule" and selects(host["labelSelector"]["matchLabels"], pod_labels)
    assert "runtimeClassName" not in pod_spec(render("default"))
    assert "topologySpreadConstraints" not in pod_spec(render("default"))


def test_pod_extras_reach_the_pod(render) -> None:
    docs = render("extras")
    pod = pod_spec(docs)
    assert [c["name"] for c in pod["containers"]] == ["specserve", "auth-proxy"]
    assert [c["name"] for c in pod["initContainers"]] == ["copy-weights"]
    volumes = {v["name"] for v in pod["volumes"]}
    assert volumes == {"models", "dshm", "tmp", "weights-src", "proxy-config"}
    # every mount of every container names a volume of the pod
    for c in pod["containers"] + pod["initContainers"]:
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, (c["name"], m["name"])
    server = container(docs)
    assert {"name": "weights-src", "mountPath": "/weights-src", "readOnly": True} in server["volumeMounts"]
    assert server["envFrom"] == [{"secretRef": {"name": "hf-token"}},
                                 {"configMapRef": {"name": "specserve-env", "optional": True}}]
    assert "envFrom" not in container(render("default"))
    # the chart's own env stays in place beside envFrom
    assert {"name": "HOME", "value": "/tmp"} in server["env"]


def test_secret_checksum_rolls_the_pods(render, helm) -> None:
    docs = render("extras")
    annotations = one(docs, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["example.com/team"] == "ml", "podAnnotations still apply"
    checksum = annotations["checksum/secret"]
    assert len(checksum) == 64 and int(checksum, 16) >= 0
    other = helm.template("--values", str(CHART / "ci" / "extras-values.yaml"), "--set", "apiKey.value=sk-rotated")
    rotated = one(other, "Deployment")["spec"]["template"]["metadata"]["annotations"]["checksum/secret"]
    assert rotated != checksum, "a new key must change the pod template, so the pods restart"
    # no chart-made Secret, nothing to hash
    for scenario in ("default", "api-key-existing-secret"):
        meta = one(render(scenario), "Deployment")["spec"]["template"]["metadata"]
        assert "checksum/secret" not in meta.get("annotations", {}), scenario


def hook_pod(docs: list[dict]) -> dict:
    (pod,) = [d for d in by_kind(docs, "Pod") if is_test_hook(d)]
    return pod


def test_helm_test_hook_checks_health_and_a_completion(render) -> None:
    docs = render("api-key")
    pod = hook_pod(docs)
    assert pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert pod["spec"]["restartPolicy"] == "Never"
    # it must not count as a server pod anywhere
    svc = one(docs, "Service")
    assert not selects(svc["spec"]["selector"], pod["metadata"]["labels"])
    assert not selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"], pod["metadata"]["labels"])
    (c,) = pod["spec"]["containers"]
    assert c["command"][:2] == ["python3", "-c"]
    script = c["command"][2]
    assert script == (CHART / "files" / "helm_test.py").read_text()
    assert "/health" in script and "/v1/completions" in script
    compile(script, "helm_test.py", "exec")
    env = {e["name"]: e for e in c["env"]}
    assert env["SPECSERVE_URL"]["value"] == f"http://{svc['metadata']['name']}:{svc['spec']['ports'][0]['port']}"
    assert env["SPECSERVE_MODEL"]["value"] == "demo"
    assert env["SPECSERVE_API_KEY"]["valueFrom"]["secretKeyRef"] == {"name": one(docs, "Secret")["metadata"]["name"],
                                                                    "key": "api-key"}
    assert c["image"] == container(docs)["image"], "the server image is already on the node"
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert "SPECSERVE_API_KEY" not in {e["name"] for e in hook_pod(render("default"))["spec"]["containers"][0]["env"]}
    assert hook_pod(render("production"))["spec"]["containers"][0]["env"][1]["value"] == "qwen3-8b"


def test_keda_scales_on_waiting_requests(render) -> None:
    docs = render("keda")
    so, dep, svc = one(docs, "ScaledObject"), one(docs, "Deployment"), one(docs, "Service")
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert "replicas" not in dep["spec"], "KEDA's HPA owns the replica count"
    assert not by_kind(docs, "HorizontalPodAutoscaler"), "KEDA makes its own HPA"
    ref = so["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", dep["metadata"]["name"])
    assert (so["spec"]["minReplicaCount"], so["spec"]["maxReplicaCount"]) == (1, 8)
    (trigger,) = so["spec"]["triggers"]
    assert trigger["type"] == "prometheus" and trigger["metricType"] == "AverageValue"
    meta = trigger["metadata"]
    assert meta["serverAddress"] == "http://kube-prometheus-stack-prometheus.monitoring.svc:9090"
    assert meta["threshold"] == "3" and meta["activationThreshold"] == "0"
    # the query sums this release's waiting requests (labels a ServiceMonitor scrape attaches)
    assert meta["query"] == f'sum(specserve:num_requests_waiting{{namespace="llm", service="{svc["metadata"]["name"]}"}})'
    # the HPA behaviour KEDA passes on is a valid autoscaling/v2 behaviour
    kubernetes_validate = need_module("kubernetes_validate", "kubernetes-validate")
    behavior = so["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 600
    kubernetes_validate.validate({
        "apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "x"},
        "spec": {"scaleTargetRef": ref, "maxReplicas": 8, "behavior": behavior}}, K8S_VERSION, strict=True)


def test_keda_query_follows_the_metrics_prefix(helm) -> None:
    docs = helm.template("--values", str(CHART / "ci" / "keda-values.yaml"), "--set", "metrics.prefix=vllm")
    query = one(docs, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    assert query.startswith("sum(vllm:num_requests_waiting{")
    assert flags(docs)["--metrics-prefix"] == "vllm"
    docs = helm.template("--values", str(CHART / "ci" / "keda-values.yaml"), "--set", "keda.query=sum(up)")
    assert one(docs, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"] == "sum(up)"


def test_inference_pool_selects_the_server_pods(render) -> None:
    docs = render("inference-pool")
    pool, dep = one(docs, "InferencePool"), one(docs, "Deployment")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert selects(pool["spec"]["selector"]["matchLabels"], pod_labels)
    assert not selects(pool["spec"]["selector"]["matchLabels"], hook_pod(docs)["metadata"]["labels"])
    assert pool["spec"]["targetPorts"] == [{"number": container(docs)["ports"][0]["containerPort"]}]
    assert pool["spec"]["endpointPickerRef"] == {"kind": "Service", "name": "qwen-epp",
                                                 "port": {"number": 9002}, "failureMode": "FailOpen"}
    # the endpoint picker reads vLLM's names, so the server must export them
    assert flags(docs)["--metrics-prefix"] == "vllm"
    assert "--metrics-prefix" not in flags(render("default"))


def test_the_vendored_crd_schemas_catch_mistakes(render) -> None:
    """The validator is not a rubber stamp: broken copies of the rendered objects are refused."""
    pool = one(render("inference-pool"), "InferencePool")
    broken = yaml.safe_load(yaml.safe_dump(pool))
    broken["spec"]["targetPortNumber"] = 8000                      # the pre-v1 field name
    assert any("targetPortNumber" in e for e in validate_custom_resource(broken))
    broken = yaml.safe_load(yaml.safe_dump(pool))
    del broken["spec"]["endpointPickerRef"]["port"]                # CEL: port needed for a Service
    assert any("port is required" in e for e in validate_custom_resource(broken))
    broken = yaml.safe_load(yaml.safe_dump(pool))
    broken["spec"]["endpointPickerRef"]["failureMode"] = "FailSoft"
    assert validate_custom_resource(broken)
    broken = yaml.safe_load(yaml.safe_dump(pool))
    broken["spec"]["targetPorts"] = [{"number": 8000}, {"number": 8000}]
    assert any("unique" in e for e in validate_custom_resource(broken))
    so = one(render("keda"), "ScaledObject")
    broken = yaml.safe_load(yaml.safe_dump(so))
    broken["spec"]["triggers"][0]["metadata"]["threshold"] = 3     # trigger metadata is strings only
    assert validate_custom_resource(broken)
    broken = yaml.safe_load(yaml.safe_dump(so))
    broken["spec"]["maxReplicas"] = 8                              # the HPA's spelling, not KEDA's
    assert any("maxReplicas" in e for e in validate_custom_resource(broken))


BAD_VALUES = [
    (["--set", "keda.enabled=true", "--set", "autoscaling.enabled=true"], "not both"),
    (["--set", "keda.enabled=true", "--set", "keda.minReplicas=5", "--set", "keda.maxReplicas=2"],
     "keda.minReplicas (5) exceeds keda.maxReplicas (2)"),
    (["--set", "inferencePool.enabled=true", "--set", "metrics.prefix=vllm"], "needs inferencePool.endpointPicker.serviceName"),
    (["--set", "inferencePool.enabled=true", "--set", "inferencePool.endpointPicker.serviceName=epp"], "needs metrics.prefix=vllm"),
    (["--set", "metrics.prefix=sglang"], "/metrics/prefix"),
    (["--set", "gpu.count=2"], "/gpu/count': maximum"),
    (["--set", "ingress.enabled=true", "--set-json", "ingress.hosts=[]"], "needs at least one entry in ingress.hosts"),
    (["--set-json", "sidecars=[{\"image\": \"x\"}]"], "missing property 'name'"),
    (["--set-json", "topologySpreadConstraints=[{\"maxSkew\": 1, \"topologyKey\": \"zone\"}]"], "whenUnsatisfiable"),
    (["--set", "runtimeClassName=Nvidia_Runtime"], "/runtimeClassName"),
]


@pytest.mark.parametrize("args,message", BAD_VALUES, ids=[a[-1] for a, _ in BAD_VALUES])
def test_bad_option_values_are_refused(helm, args: list[str], message: str) -> None:
    proc = helm.template_raw(*args)
    assert proc.returncode != 0, f"{args} rendered:\n{proc.stdout[:500]}"
    assert message in proc.stderr, proc.stderr
