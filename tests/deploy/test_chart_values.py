"""What the chart's values do: role overrides, the accelerator switch, model sources, optional
features (off renders nothing), guards against contradictory settings, and the invariants every
pod keeps (non-root, probes, drain)."""

from __future__ import annotations

import json
import re
from typing import Any

import deploy_support as ds
import pytest
import yaml

GPU_RESOURCES = ("amd.com/gpu", "nvidia.com/gpu")


def worker_container(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    (container,) = ds.worker_group(docs, role)["template"]["spec"]["containers"]
    return container


def render_error(values: dict[str, Any]) -> str:
    import helm_python

    with pytest.raises(helm_python.HelmError) as info:
        ds.render(values)
    return str(info.value)


# --- Worker groups: defaults merged with per-role blocks ----------------------------------------


def test_role_blocks_override_defaults_and_leave_the_other_role_alone() -> None:
    docs = ds.render(
        {
            "workers": {
                "defaults": {
                    "nodeSelector": {"pool": "gpu"},
                    "tolerations": [{"key": "a", "operator": "Exists"}],
                    "env": [{"name": "SHARED", "value": "1"}],
                },
                "prefill": {
                    "replicas": 3,
                    "minReplicas": 2,
                    "maxReplicas": 6,
                    "tpSize": 4,
                    "nodeSelector": {"dspark.io/pool": "prefill"},
                    "resources": {"requests": {"cpu": "100"}},
                    "affinity": {
                        "nodeAffinity": {
                            "preferredDuringSchedulingIgnoredDuringExecution": [
                                {
                                    "weight": 1,
                                    "preference": {
                                        "matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]
                                    },
                                }
                            ]
                        }
                    },
                },
            }
        }
    )
    prefill, decode = ds.worker_group(docs, "prefill"), ds.worker_group(docs, "decode")
    assert (prefill["replicas"], prefill["minReplicas"], prefill["maxReplicas"]) == (3, 2, 6)
    assert (decode["replicas"], decode["minReplicas"], decode["maxReplicas"]) == (1, 1, 4)

    # Maps merge key by key: the role's node selector adds to the shared one.
    assert prefill["template"]["spec"]["nodeSelector"] == {"pool": "gpu", "dspark.io/pool": "prefill"}
    assert decode["template"]["spec"]["nodeSelector"] == {"pool": "gpu"}
    # resources merge too: prefill's cpu request replaces the default, its memory stays.
    prefill_res = worker_container(docs, "prefill")["resources"]
    assert prefill_res["requests"]["cpu"] == "100" and prefill_res["requests"]["memory"] == "256Gi"
    assert worker_container(docs, "decode")["resources"]["requests"]["cpu"] == "32"
    assert "affinity" in prefill["template"]["spec"] and "affinity" not in decode["template"]["spec"]

    env_p, env_d = ds.env_of(worker_container(docs, "prefill")), ds.env_of(worker_container(docs, "decode"))
    assert env_p["DSPARK_ROLE"] == "prefill" and env_d["DSPARK_ROLE"] == "decode"
    assert env_p["SHARED"] == env_d["SHARED"] == "1"
    # TP 4 on an 8-GPU pod: two engines; decode keeps TP = all 8 GPUs, one engine.
    assert (env_p["DSPARK_TENSOR_PARALLEL_SIZE"], env_p["DSPARK_REPLICAS"]) == ("4", "2")
    assert (env_d["DSPARK_TENSOR_PARALLEL_SIZE"], env_d["DSPARK_REPLICAS"]) == ("8", "1")
    # Vendor tolerations come first, then the shared ones.
    tolerations = [t["key"] for t in decode["template"]["spec"]["tolerations"]]
    assert tolerations == ["amd.com/gpu", "a"]


def test_zero_overrides_are_kept() -> None:
    """`minReplicas: 0` in a role block wins over the default 1 (a plain mergeOverwrite drops it)."""
    docs = ds.render({"workers": {"prefill": {"minReplicas": 0, "replicas": 0}}})
    prefill = ds.worker_group(docs, "prefill")
    assert (prefill["minReplicas"], prefill["replicas"]) == (0, 0)


def test_gpus_per_pod_per_role() -> None:
    docs = ds.render({"workers": {"prefill": {"gpusPerPod": 4, "tpSize": 2}}})
    limits = worker_container(docs, "prefill")["resources"]["limits"]
    assert limits["amd.com/gpu"] == 4
    assert ds.worker_group(docs, "prefill")["rayStartParams"]["num-gpus"] == "4"
    assert ds.env_of(worker_container(docs, "prefill"))["DSPARK_REPLICAS"] == "2"
    assert worker_container(docs, "decode")["resources"]["limits"]["amd.com/gpu"] == 8


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"workers": {"decode": {"tpSize": 3}}}, "tpSize 3 does not divide gpusPerPod 8"),
        ({"workers": {"prefill": {"replicas": 9}}}, "minReplicas <= replicas <= maxReplicas"),
        ({"accelerator": {"type": "cpu"}, "workers": {"decode": {"tpSize": 2}}}, "needs GPUs"),
        ({"gateway": {"autoscaling": {"enabled": True}}, "keda": {"enabled": True}}, "turn one off"),
        ({"rayCluster": {"autoscaler": {"enabled": True}}, "planner": {"enabled": True}}, "turn one off"),
    ],
)
def test_contradictory_values_fail_with_a_message(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


# --- Accelerator switch ------------------------------------------------------------------------


def test_amd_is_the_default_accelerator() -> None:
    docs = ds.render()
    for role in ("prefill", "decode"):
        group = ds.worker_group(docs, role)
        resources = worker_container(docs, role)["resources"]
        assert resources["limits"]["amd.com/gpu"] == resources["requests"]["amd.com/gpu"] == 8
        assert "nvidia.com/gpu" not in resources["limits"]
        assert group["rayStartParams"]["num-gpus"] == "8"
        assert group["template"]["spec"]["securityContext"]["supplementalGroups"] == [44, 109]
        assert worker_container(docs, role)["image"].endswith(":0.1.0-rocm")
    # The head and the gateway ask for no GPU.
    head = ds.one(docs, "RayCluster")["spec"]["headGroupSpec"]
    assert not set(head["template"]["spec"]["containers"][0]["resources"]["limits"]) & set(GPU_RESOURCES)
    assert head["rayStartParams"]["num-gpus"] == "0"


def test_nvidia_switches_resource_image_and_env() -> None:
    docs = ds.render(profile="nvidia")
    for role in ("prefill", "decode"):
        container = worker_container(docs, role)
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert "amd.com/gpu" not in container["resources"]["limits"]
        assert container["image"].endswith(":0.1.0-cuda")
        env = ds.env_of(container)
        # NVLink multicast off for NCCL, torch symmetric memory and NVSHMEM.
        assert (
            env["NCCL_NVLS_ENABLE"],
            env["TORCH_SYMM_MEM_DISABLE_MULTICAST"],
            env["NVSHMEM_DISABLE_NVLS"],
        ) == ("0", "1", "1")
        spec = ds.worker_group(docs, role)["template"]["spec"]
        assert "supplementalGroups" not in spec["securityContext"]
        assert spec["nodeSelector"]["nvidia.com/gpu.present"] == "true"
        assert [t["key"] for t in spec["tolerations"]] == ["nvidia.com/gpu"]
    # Only the selected vendor's env reaches the workers.
    assert "NCCL_NVLS_ENABLE" not in ds.env_of(worker_container(ds.render(), "decode"))


def test_cpu_requests_no_accelerator() -> None:
    docs = ds.render(profile="cpu-dev")
    for role in ("prefill", "decode"):
        container = worker_container(docs, role)
        for kind in ("limits", "requests"):
            assert not set(container["resources"][kind]) & set(GPU_RESOURCES)
        assert ds.worker_group(docs, role)["rayStartParams"]["num-gpus"] == "0"
        env = ds.env_of(container)
        assert (env["DSPARK_TENSOR_PARALLEL_SIZE"], env["DSPARK_REPLICAS"]) == ("1", "1")
        assert container["image"] == "localhost/dspark-serve:0.1.0-cpu"
        assert "tolerations" not in ds.worker_group(docs, role)["template"]["spec"]


def test_mi35x_profile_disaggregates_prefill_and_decode() -> None:
    docs = ds.render(profile="mi35x-disaggregated")
    prefill, decode = ds.worker_group(docs, "prefill"), ds.worker_group(docs, "decode")
    assert prefill["template"]["spec"]["nodeSelector"]["dspark.io/pool"] == "prefill"
    assert decode["template"]["spec"]["nodeSelector"]["dspark.io/pool"] == "decode"
    for group in (prefill, decode):
        assert group["template"]["spec"]["nodeSelector"]["feature.node.kubernetes.io/amd-gpu"] == "true"
    assert ds.env_of(worker_container(docs, "prefill"))["DSPARK_REPLICAS"] == "2"
    assert ds.env_of(worker_container(docs, "decode"))["DSPARK_REPLICAS"] == "1"


def test_unknown_accelerator_is_rejected() -> None:
    assert "accelerator" in render_error({"accelerator": {"type": "tpu"}})


# --- Model source ------------------------------------------------------------------------------


def volume_mounts(
    docs: list[dict[str, Any]], volume: str, env: str
) -> dict[str, tuple[dict[str, Any], dict[str, Any], str]]:
    """where -> (the volume, its mount, the container's `env` variable) for every container
    that mounts `volume`."""
    found = {}
    for where, spec in ds.pod_specs(docs):
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            for mount in container.get("volumeMounts", []):
                if mount["name"] == volume:
                    found[where] = (volumes[volume], mount, ds.env_of(container)[env])
    return found


@pytest.mark.parametrize(
    ("model", "volume"),
    [
        (
            {"source": "pvc", "pvc": {"claimName": "weights"}, "path": "llama"},
            {"persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
        ),
        (
            {
                "source": "hostPath",
                "hostPath": {"path": "/data/models", "type": "Directory"},
                "path": "llama",
            },
            {"hostPath": {"path": "/data/models", "type": "Directory"}},
        ),
        (
            {
                "source": "image",
                "image": {"reference": "registry.example.com/llama:1", "pullPolicy": "Always"},
                "path": "llama",
            },
            {"image": {"reference": "registry.example.com/llama:1", "pullPolicy": "Always"}},
        ),
    ],
)
def test_model_is_mounted_read_only_in_the_workers(model: dict[str, Any], volume: dict[str, Any]) -> None:
    mounts = volume_mounts(ds.render({"model": model}), "model", "DSPARK_MODEL")
    # The gateway takes its tokenizer from the workers: no weights there.
    assert set(mounts) == {"RayCluster/dspark-dspark-serve/prefill", "RayCluster/dspark-dspark-serve/decode"}
    for spec_volume, mount, model_path in mounts.values():
        assert spec_volume == {"name": "model", **volume}
        assert mount == {"name": "model", "mountPath": "/models", "readOnly": True}
        assert model_path == "/models/llama"


def test_model_source_none_passes_the_name_and_mounts_nothing() -> None:
    docs = ds.render({"model": {"source": "none", "name": "/opt/models/smollm2.gguf"}})
    assert volume_mounts(docs, "model", "DSPARK_MODEL") == {}
    assert ds.env_of(worker_container(docs, "decode"))["DSPARK_MODEL"] == "/opt/models/smollm2.gguf"
    assert "model.name is required" in render_error({"model": {"source": "none"}})


@pytest.mark.parametrize(
    ("cache", "volume"),
    [
        ({}, {"emptyDir": {}}),
        ({"sizeLimit": "8Gi"}, {"emptyDir": {"sizeLimit": "8Gi"}}),
        (
            {"source": "pvc", "pvc": {"claimName": "kernels"}, "mountPath": "/cache"},
            {"persistentVolumeClaim": {"claimName": "kernels"}},
        ),
    ],
)
def test_workers_keep_compiled_kernels_on_the_compile_cache(cache: dict[str, Any], volume: dict[str, Any]) -> None:
    caches = volume_mounts(ds.render({"compileCache": cache}), "compile-cache", "TRITON_CACHE_DIR")
    assert set(caches) == {"RayCluster/dspark-dspark-serve/prefill", "RayCluster/dspark-dspark-serve/decode"}
    mount_path = cache.get("mountPath", "/var/cache/dspark")
    for spec_volume, mount, triton_dir in caches.values():
        assert spec_volume == {"name": "compile-cache", **volume}
        assert mount == {"name": "compile-cache", "mountPath": mount_path}  # writable
        assert triton_dir == f"{mount_path}/triton"


def test_compile_cache_values_are_checked() -> None:
    bad_source = render_error({"compileCache": {"source": "hostPath"}})
    assert "/compileCache/source': value must be one of 'emptyDir', 'pvc'" in bad_source
    missing = render_error({"compileCache": {"source": "pvc", "pvc": {"claimName": ""}}})
    assert "compileCache.pvc.claimName is required" in missing


@pytest.mark.parametrize(("shared", "env"), [(None, "true"), (False, "false")])
def test_gateways_share_the_worker_caps_by_default(shared: bool | None, env: str) -> None:
    """Several gateway replicas count each other's requests against a worker's capacity."""
    values = {} if shared is None else {"gateway": {"sharedAdmission": shared}}
    containers = [
        c for d in ds.objects(ds.render(values), "Deployment") for c in d["spec"]["template"]["spec"]["containers"]
    ]
    (gateway,) = [c for c in containers if c["name"] == "gateway"]
    assert ds.env_of(gateway)["DSPARK_SHARED_ADMISSION"] == env


# --- Optional features render nothing when off -----------------------------------------------------


@pytest.mark.parametrize(
    ("values", "kinds_gone"),
    [
        ({"gateway": {"autoscaling": {"enabled": False}}}, {"HorizontalPodAutoscaler"}),
        (
            {"gateway": {"pdb": {"enabled": False}}, "workers": {"defaults": {"pdb": {"enabled": False}}}},
            {"PodDisruptionBudget"},
        ),
        ({"monitoring": {"serviceMonitor": {"enabled": False}}}, {"ServiceMonitor"}),
        ({"monitoring": {"prometheusRule": {"enabled": False}}}, {"PrometheusRule"}),
        ({"planner": {"enabled": False}}, {"Role", "RoleBinding"}),
    ],
)
def test_disabled_features_render_nothing(values: dict[str, Any], kinds_gone: set[str]) -> None:
    before = {d["kind"] for d in ds.render()}
    after = {d["kind"] for d in ds.render(values)}
    assert kinds_gone <= before and not kinds_gone & after


def test_off_by_default_features_render_nothing(default_docs: list[dict[str, Any]]) -> None:
    kinds = {d["kind"] for d in default_docs}
    assert not kinds & {"Ingress", "ScaledObject", "NetworkPolicy"}
    assert "autoscalerOptions" not in ds.one(default_docs, "RayCluster")["spec"]
    assert ds.one(default_docs, "RayCluster")["spec"]["enableInTreeAutoscaling"] is False
    # Only the two optional templates' files are empty, not missing.
    files = ds.render_files()
    for template in ("gateway-ingress.yaml", "keda-scaledobject.yaml", "networkpolicy.yaml"):
        assert not files[f"dspark-serve/templates/{template}"].strip()


def test_planner_off_removes_its_objects() -> None:
    names = {(d["kind"], d["metadata"]["name"]) for d in ds.render({"planner": {"enabled": False}})}
    assert not [n for n in names if n[1].endswith("-planner")]


def test_dashboards_off_removes_the_configmaps() -> None:
    def dashboards(docs: list[dict[str, Any]]) -> list[str]:
        return [d["metadata"]["name"] for d in ds.objects(docs, "ConfigMap") if "-dashboard-" in d["metadata"]["name"]]

    assert len(dashboards(ds.render())) == len(ds.dashboard_files())
    assert dashboards(ds.render({"monitoring": {"dashboards": {"enabled": False}}})) == []


def test_fixed_replicas_without_autoscaling() -> None:
    gateway = ds.one(ds.render(profile="cpu-dev"), "Deployment", "-gateway")
    assert gateway["spec"]["replicas"] == 1
    assert "replicas" not in ds.one(ds.render(), "Deployment", "-gateway")["spec"]


def test_kuberay_autoscaler_bounds() -> None:
    docs = ds.render(
        {
            "planner": {"enabled": False},
            "rayCluster": {"autoscaler": {"enabled": True}},
            "workers": {"decode": {"minReplicas": 2, "replicas": 2, "maxReplicas": 10}},
        }
    )
    spec = ds.one(docs, "RayCluster")["spec"]
    assert spec["enableInTreeAutoscaling"] is True
    assert spec["autoscalerOptions"]["upscalingMode"] == "Default"
    decode = ds.worker_group(docs, "decode")
    assert (decode["minReplicas"], decode["maxReplicas"]) == (2, 10)


def test_keda_scales_the_gateway_on_dspark_metrics() -> None:
    docs = ds.render({"keda": {"enabled": True}, "gateway": {"autoscaling": {"enabled": False}}})
    scaled = ds.one(docs, "ScaledObject")
    assert scaled["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "dspark-dspark-serve-gateway",
    }
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == "prometheus"
        names = ds.series_names_in(trigger["metadata"]["query"])
        assert names and names <= ds.EXPORTED_SERIES
        assert 'namespace="llm"' in trigger["metadata"]["query"]
    assert "HorizontalPodAutoscaler" not in {d["kind"] for d in docs}


# --- Invariants of every pod -----------------------------------------------------------------------


def all_containers(docs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(f"{where}/{c['name']}", c) for where, spec in ds.pod_specs(docs) for c in spec["containers"]]


@pytest.mark.parametrize("profile", [None, *ds.PROFILES])
def test_security_context_everywhere(profile: str | None) -> None:
    docs = ds.render(profile=profile)
    for where, spec in ds.pod_specs(docs):
        assert spec["securityContext"]["runAsNonRoot"] is True, where
        assert spec["securityContext"]["runAsUser"] == 10001, where
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
    for where, container in all_containers(docs):
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False, where
        assert ctx["readOnlyRootFilesystem"] is True, where
        assert ctx["capabilities"]["drop"] == ["ALL"], where
        assert not ctx.get("privileged"), where
        mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
        assert {"/tmp", "/home/dspark"} <= mounts, f"{where}: read-only root needs writable /tmp and $HOME"


def test_only_the_planner_gets_an_api_token(default_docs: list[dict[str, Any]]) -> None:
    for where, spec in ds.pod_specs(default_docs):
        assert spec["automountServiceAccountToken"] is where.endswith("-planner"), where


def test_probes_are_sized_for_model_load(default_docs: list[dict[str, Any]]) -> None:
    gateway = ds.one(default_docs, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert gateway["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert gateway["livenessProbe"]["httpGet"]["path"] == "/health"
    assert gateway["startupProbe"]["httpGet"]["path"] == "/health"
    head = ds.one(default_docs, "RayCluster")["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert head[probe]["exec"]["command"] == ["/opt/dspark/ray-node.sh", "check", "head"]
    for role in ("prefill", "decode"):
        container = worker_container(default_docs, role)
        # Liveness follows the Ray node; readiness waits for the engines' model load, which
        # never restarts the pod: DSPARK_READY_TIMEOUT bounds it (30 minutes).
        assert container["livenessProbe"]["exec"]["command"] == ["/opt/dspark/ray-node.sh", "check", "worker"]
        assert container["startupProbe"]["exec"]["command"] == ["/opt/dspark/ray-node.sh", "check", "worker"]
        assert container["readinessProbe"]["exec"]["command"] == ["/opt/dspark/ray-node.sh", "ready"]
        assert ds.env_of(container)["DSPARK_READY_TIMEOUT"] == "1800"
    slow = ds.render({"workers": {"decode": {"loadTimeoutSeconds": 5400}}})
    assert ds.env_of(worker_container(slow, "decode"))["DSPARK_READY_TIMEOUT"] == "5400"


def test_ray_nodes_have_shared_memory(default_docs: list[dict[str, Any]]) -> None:
    expected = {"head": "8Gi", "prefill": "64Gi", "decode": "64Gi", "dspark-dspark-serve-gateway": "1Gi"}
    for where, spec in ds.pod_specs(default_docs):
        if where.endswith("-planner"):
            continue
        (shm,) = [v for v in spec["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": expected[where.rsplit("/", 1)[1]]}
        assert {"name": "dshm", "mountPath": "/dev/shm"} in spec["containers"][0]["volumeMounts"]


def test_graceful_drain(default_docs: list[dict[str, Any]]) -> None:
    gateway = ds.one(default_docs, "Deployment", "-gateway")["spec"]["template"]["spec"]
    assert gateway["terminationGracePeriodSeconds"] == 120
    assert gateway["containers"][0]["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    raycluster = ds.one(default_docs, "RayCluster")
    for where, container in all_containers([raycluster]):
        # the head leaves the cluster; a worker first drains its engines (docs/design.md §6.9)
        verb = "stop" if "head" in where else "drain"
        assert container["lifecycle"]["preStop"]["exec"]["command"] == ["/opt/dspark/ray-node.sh", verb], where
    for role in ("prefill", "decode"):
        assert ds.worker_group(default_docs, role)["template"]["spec"]["terminationGracePeriodSeconds"] == 120


def test_pod_disruption_budgets_select_their_pods(default_docs: list[dict[str, Any]]) -> None:
    budgets = {d["metadata"]["name"]: d["spec"] for d in ds.objects(default_docs, "PodDisruptionBudget")}
    gateway_labels = ds.one(default_docs, "Deployment", "-gateway")["spec"]["template"]["metadata"]["labels"]
    assert budgets["dspark-dspark-serve-gateway"]["selector"]["matchLabels"].items() <= gateway_labels.items()
    for role in ("prefill", "decode"):
        # KubeRay labels each pod with its cluster and group.
        assert budgets[f"dspark-dspark-serve-{role}"]["selector"]["matchLabels"] == {
            "ray.io/cluster": "dspark-dspark-serve",
            "ray.io/group": role,
        }
        assert budgets[f"dspark-dspark-serve-{role}"]["maxUnavailable"] == 1


# --- Wiring between objects ----------------------------------------------------------------------


def test_ray_nodes_run_the_node_script_from_the_chart(default_docs: list[dict[str, Any]]) -> None:
    raycluster = ds.one(default_docs, "RayCluster")
    assert raycluster["metadata"]["annotations"]["ray.io/overwrite-container-cmd"] == "true"
    script = ds.one(default_docs, "ConfigMap", "-ray-node")["data"]["ray-node.sh"]
    assert script == (ds.CHART_DIR / "files" / "ray-node.sh").read_text().rstrip("\n")
    head = raycluster["spec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    gateway = ds.one(default_docs, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert head["command"] == ["/opt/dspark/ray-node.sh", "head"]
    assert worker_container(default_docs, "decode")["command"] == ["/opt/dspark/ray-node.sh", "worker"]
    assert gateway["command"] == ["/opt/dspark/ray-node.sh", "gateway"]
    for container in (head, gateway, worker_container(default_docs, "prefill")):
        assert {"name": "ray-node", "mountPath": "/opt/dspark", "readOnly": True} in container["volumeMounts"]
    env = ds.env_of(worker_container(default_docs, "decode"))
    assert (env["DSPARK_RAY_ADDRESS"], env["DSPARK_MAX_RESTARTS"]) == ("auto", "0")


def test_gateway_joins_the_ray_cluster_through_the_head_service(default_docs: list[dict[str, Any]]) -> None:
    gateway = ds.one(default_docs, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    env = ds.env_of(gateway)
    cluster = ds.one(default_docs, "RayCluster")["metadata"]["name"]
    # KubeRay names the head Service `<cluster>-head-svc`; 6379 is the GCS port.
    assert env["RAY_HEAD_ADDRESS"] == f"{cluster}-head-svc:6379"
    assert env["DSPARK_RAY_ADDRESS"] == "auto"
    assert env["DSPARK_PORT"] == "8000" and env["DSPARK_HOST"] == "0.0.0.0"
    assert "DSPARK_API_KEYS" not in env and "RAY_AUTH_MODE" not in env
    with_keys = ds.render({"gateway": {"apiKeys": {"existingSecret": "keys"}, "args": ["--log-level", "debug"]}})
    container = ds.one(with_keys, "Deployment", "-gateway")["spec"]["template"]["spec"]["containers"][0]
    assert ds.env_of(container)["DSPARK_API_KEYS"] == {"secretKeyRef": {"name": "keys", "key": "api-keys"}}
    assert container["args"] == ["--log-level", "debug"]


def test_ray_auth_token_reaches_every_ray_node() -> None:
    docs = ds.render({"rayCluster": {"authToken": {"existingSecret": "ray-token"}}})
    nodes = [c for where, c in all_containers(docs) if not where.endswith("-planner/planner")]
    assert len(nodes) == 4  # gateway, head, prefill, decode
    for container in nodes:
        env = ds.env_of(container)
        assert env["RAY_AUTH_MODE"] == "token"
        assert env["RAY_AUTH_TOKEN"] == {"secretKeyRef": {"name": "ray-token", "key": "token"}}


def test_service_and_servicemonitor_select_the_gateway(default_docs: list[dict[str, Any]]) -> None:
    pod_labels = ds.one(default_docs, "Deployment", "-gateway")["spec"]["template"]["metadata"]["labels"]
    service = ds.one(default_docs, "Service", "-gateway")
    assert service["spec"]["selector"].items() <= pod_labels.items()
    monitor = ds.one(default_docs, "ServiceMonitor")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"][0]["port"] == service["spec"]["ports"][0]["name"] == "http"
    assert monitor["spec"]["endpoints"][0]["path"] == "/metrics"


def test_planner_may_get_and_patch_only_its_raycluster(default_docs: list[dict[str, Any]]) -> None:
    cluster = ds.one(default_docs, "RayCluster")["metadata"]["name"]
    role = ds.one(default_docs, "Role", "-planner")
    assert role["rules"] == [
        {
            "apiGroups": ["ray.io"],
            "resources": ["rayclusters"],
            "resourceNames": [cluster],
            "verbs": ["get", "patch"],
        }
    ]
    binding = ds.one(default_docs, "RoleBinding", "-planner")
    planner = ds.one(default_docs, "Deployment", "-planner")["spec"]["template"]["spec"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": planner["serviceAccountName"], "namespace": "llm"}
    ]
    env = ds.env_of(planner["containers"][0])
    assert planner["containers"][0]["args"] == ["planner"]
    assert env["DSPARK_RAYCLUSTER"] == cluster
    assert env["DSPARK_PROMETHEUS_URL"] == "http://prometheus-operated.monitoring.svc:9090"
    assert (env["DSPARK_TTFT_TARGET_S"], env["DSPARK_TPOT_TARGET_S"]) == ("2", "0.1")
    assert (env["DSPARK_PREFILL_MIN_REPLICAS"], env["DSPARK_DECODE_MAX_REPLICAS"]) == ("1", "4")


def test_network_policies_when_enabled() -> None:
    docs = ds.render({"networkPolicy": {"enabled": True}})
    policies = {d["metadata"]["name"]: d["spec"] for d in ds.objects(docs, "NetworkPolicy")}
    assert set(policies) == {
        "dspark-dspark-serve-gateway",
        "dspark-dspark-serve-ray",
        "dspark-dspark-serve-planner",
    }
    release_pods = {
        "podSelector": {
            "matchLabels": {"app.kubernetes.io/instance": "dspark", "app.kubernetes.io/name": "dspark-serve"}
        }
    }
    # The API port from anywhere (no peers configured); Ray traffic from this release's pods.
    assert policies["dspark-dspark-serve-gateway"]["ingress"] == [
        {"ports": [{"port": "http", "protocol": "TCP"}]},
        {"from": [release_pods]},
    ]
    assert policies["dspark-dspark-serve-ray"]["ingress"][0] == {"from": [release_pods]}
    assert policies["dspark-dspark-serve-ray"]["podSelector"]["matchLabels"] == {
        "ray.io/cluster": "dspark-dspark-serve"
    }
    assert "ingress" not in policies["dspark-dspark-serve-planner"]


def test_long_release_names_keep_kuberay_names_short() -> None:
    name = "a-very-long-release-name-for-a-production-llm"
    docs = ds.render(name=name)
    cluster = ds.one(docs, "RayCluster")["metadata"]["name"]
    assert len(f"{cluster}-head-svc") <= 63
    assert all(len(d["metadata"]["name"]) <= 63 for d in docs)


# --- Values documentation and schema ---------------------------------------------------------


def schema_paths(schema: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted paths the values schema names (following local $refs)."""
    root = json.loads((ds.CHART_DIR / "values.schema.json").read_text())
    if "$ref" in schema:
        schema = root["definitions"][schema["$ref"].rsplit("/", 1)[1]]
    paths = {prefix} if prefix else set()
    for key, sub in schema.get("properties", {}).items():
        paths |= schema_paths(sub, f"{prefix}.{key}" if prefix else key)
    return paths


def test_every_value_is_documented_in_values_readme_and_schema() -> None:
    text = (ds.CHART_DIR / "values.yaml").read_text()
    documented = ds.documented_values(text)
    # Every value a user can set is documented, itself or as part of a documented map.
    for leaf in ds.leaf_paths(yaml.safe_load(text)):
        parts = leaf.split(".")
        assert any(".".join(parts[:n]) in documented for n in range(len(parts), 0, -1)), (
            f"{leaf} has no `# --` description in values.yaml"
        )
    readme = (ds.CHART_DIR / "README.md").read_text()
    in_readme = set(re.findall(r"^\| `([^`]+)` \|", readme, re.M))
    assert sorted(set(documented) - in_readme) == [], "values missing from charts/dspark-serve/README.md"
    assert sorted(in_readme - set(documented)) == [], "README documents values that do not exist"
    schema = json.loads((ds.CHART_DIR / "values.schema.json").read_text())
    assert sorted(set(documented) - schema_paths(schema)) == [], "values missing from values.schema.json"


@pytest.mark.parametrize(
    "values",
    [
        {"workers": {"prefil": {"replicas": 2}}},
        {"accelerator": {"type": "intel"}},
        {"model": {"source": "s3"}},
        {"workers": {"decode": {"replicas": "two"}}},
        {"gateway": {"autoscalling": {"enabled": False}}},
        {"slo": {"ttftP95Seconds": -1}},
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any]) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError):
        ds.render(values)


def test_profiles_pass_the_schema() -> None:
    import helm_python

    chart = helm_python.Chart.load(ds.CHART_DIR)
    for profile in ds.PROFILES:
        chart.validate_schema(chart.merge_values(ds.load_profile(profile)))
