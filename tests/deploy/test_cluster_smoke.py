"""`make cluster-smoke` (scripts/cluster_smoke): its pure parts here, fast (what it extracts from
the rendered chart, the KubeRay emulation for the cpu-dev profile, the metrics check), and the
smoke itself as a slow test (root, buildah and the CPU image; about 5 minutes)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys

import deploy_support as ds
import pytest

from scripts.cluster_smoke import kuberay, manifests
from scripts.cluster_smoke.__main__ import timing_table
from scripts.cluster_smoke.pods import container_env, hosts_file
from scripts.cluster_smoke.serving import HISTOGRAMS, histogram_counts

PROFILE = "cpu-dev"


@pytest.fixture(scope="module")
def docs() -> list[dict]:
    return manifests.render(PROFILE)


@pytest.fixture(scope="module")
def release(docs: list[dict]) -> manifests.Release:
    return manifests.extract(docs)


def _container(template: dict) -> dict:
    return template["spec"]["containers"][0]


# --- Extraction from the rendered manifests ---------------------------------------------------


def test_renders_like_the_chart_tests(docs: list[dict]) -> None:
    """The smoke's rendering is the tests' rendering (same values, same objects)."""
    theirs = ds.render(profile=PROFILE, name=manifests.RELEASE, namespace=manifests.NAMESPACE)
    assert sorted(map(str, docs)) == sorted(map(str, theirs))


def test_four_pods_with_the_rendered_commands(release: manifests.Release, docs: list[dict]) -> None:
    assert set(release.pods) == {"head", "prefill", "decode", "gateway"}
    cluster = ds.one(docs, "RayCluster")
    head = _container(cluster["spec"]["headGroupSpec"]["template"])
    assert list(release.pods["head"].command) == head["command"]
    for role in ("prefill", "decode"):
        rendered = _container(ds.worker_group(docs, role)["template"])
        plan = release.pods[role]
        assert list(plan.command) == rendered["command"]
        assert list(plan.args) == rendered.get("args", [])
        assert dict(plan.env) == ds.env_of(rendered)
        assert plan.node_type == "worker" and plan.group == role
    gateway = _container(ds.one(docs, "Deployment", "-gateway")["spec"]["template"])
    assert list(release.pods["gateway"].command) == gateway["command"]
    assert dict(release.pods["gateway"].env) == ds.env_of(gateway)
    assert release.overwrite_cmd, "KubeRay must run the chart's command (ray.io/overwrite-container-cmd)"


def test_probes_extracted(release: manifests.Release, docs: list[dict]) -> None:
    head = release.pods["head"].probes
    rendered = _container(ds.one(docs, "RayCluster")["spec"]["headGroupSpec"]["template"])
    assert head["startup"].kind == "exec"
    assert list(head["startup"].command) == rendered["startupProbe"]["exec"]["command"]
    assert head["startup"].failure_threshold == rendered["startupProbe"]["failureThreshold"]
    decode = release.pods["decode"].probes
    assert (
        list(decode["readiness"].command)
        == _container(ds.worker_group(docs, "decode")["template"])["readinessProbe"]["exec"]["command"]
    )
    gateway = release.pods["gateway"]
    ready = gateway.probes["readiness"]
    assert (ready.kind, ready.path) == ("http", "/ready")
    assert ready.port == gateway.ports["http"], "the named port resolves to the container port"


def test_mounts_and_volumes(release: manifests.Release) -> None:
    values = manifests.load_values(PROFILE)
    for role, plan in release.pods.items():
        mounts = {m.path: m for m in plan.mounts}
        node_script = mounts["/opt/dspark"]
        assert node_script.read_only and "configMap" in node_script.volume
        assert node_script.volume["configMap"]["name"] in release.config_maps
        assert "ray-node.sh" in release.config_maps[node_script.volume["configMap"]["name"]]
        assert mounts["/dev/shm"].volume["emptyDir"]["medium"] == "Memory"
        if role in ("prefill", "decode"):
            model = mounts["/models"]
            assert model.read_only and model.volume["hostPath"]["path"] == values["model"]["hostPath"]["path"]
    assert release.pods["decode"].run_as == (10001, 10001)
    assert release.pods["decode"].restart_policy == "Always"


def test_config_map_is_the_chart_file(release: manifests.Release) -> None:
    script = (manifests.CHART_DIR / "files" / "ray-node.sh").read_text()
    (data,) = [d for d in release.config_maps.values() if "ray-node.sh" in d]
    assert data["ray-node.sh"].strip() == script.strip()


# --- KubeRay emulation ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantity", "value"),
    [("250m", 1), ("1", 1), ("0", 0), ("1.5", 2), ("2Gi", 2**31), ("4Gi", 2**32), ("100M", 10**8), ("1e3", 1000)],
)
def test_quantity_value_rounds_up(quantity: str, value: int) -> None:
    assert kuberay.quantity_value(quantity) == value


def test_convert_param_map_rules() -> None:
    flags = kuberay.convert_param_map(
        {"num-cpus": "0", "block": "true", "disable-usage-stats": "false", "include-dashboard": "false"}
    )
    assert flags == " --block  --include-dashboard=false  --num-cpus=0 "


def _flags(command: str) -> dict[str, str]:
    words = shlex.split(command)
    return {w[2:].split("=", 1)[0]: (w.split("=", 1)[1] if "=" in w else "true") for w in words if w.startswith("--")}


def test_head_start_command_for_the_cpu_profile(release: manifests.Release) -> None:
    head = release.pods["head"]
    fqdn = kuberay.fqdn_head_service(release.cluster_name, release.namespace)
    command = kuberay.ray_start_command("head", head.ray_start_params, head.resources, "6379", fqdn)
    assert command.startswith("ray start --head ")
    memory = kuberay.quantity_value(head.resources["limits"]["memory"])
    assert _flags(command) == {
        "head": "true",
        "block": "true",
        "dashboard-agent-listen-port": "52365",
        "dashboard-host": "0.0.0.0",
        "memory": str(memory),
        "metrics-export-port": "8080",
        "num-cpus": "0",
        "num-gpus": "0",
    }


def test_worker_start_command_for_the_cpu_profile(release: manifests.Release) -> None:
    decode = release.pods["decode"]
    fqdn = kuberay.fqdn_head_service(release.cluster_name, release.namespace)
    assert fqdn == f"{release.cluster_name}-head-svc.{release.namespace}.svc.cluster.local"
    command = kuberay.ray_start_command("worker", decode.ray_start_params, decode.resources, "6379", fqdn)
    assert command == (
        f"ray start  --address={fqdn}:6379  --block  --dashboard-agent-listen-port=52365 "
        f" --memory={kuberay.quantity_value(decode.resources['limits']['memory'])}  --metrics-export-port=8080 "
        f" --num-cpus={kuberay.quantity_value(decode.resources['requests']['cpu'])}  --num-gpus=0 "
    )


def test_gpu_limit_sets_num_gpus() -> None:
    resources = {"limits": {"amd.com/gpu": "8", "memory": "1Gi"}, "requests": {"cpu": "32"}}
    flags = _flags(kuberay.generate_ray_start_command("worker", {}, resources))
    assert (flags["num-gpus"], flags["num-cpus"], flags["memory"]) == ("8", "32", str(2**30))


def test_operator_env(release: manifests.Release) -> None:
    env = dict(container_env(release, release.pods["decode"], "pod-x"))
    fqdn = kuberay.fqdn_head_service(release.cluster_name, release.namespace)
    assert env["RAY_ADDRESS"] == f"{fqdn}:6379"
    assert env["FQ_RAY_IP"] == fqdn and env["RAY_IP"] == f"{release.cluster_name}-head-svc"
    assert env["RAY_CLOUD_INSTANCE_ID"] == "pod-x" and env["RAY_NODE_TYPE_NAME"] == "decode"
    assert env["KUBERAY_GEN_RAY_START_CMD"].startswith("ray start  --address=")
    assert env["DSPARK_ROLE"] == "decode", "the chart's env comes first and stays"
    head = dict(container_env(release, release.pods["head"], "pod-h"))
    assert head["RAY_ADDRESS"] == "127.0.0.1:6379" and head["RAY_NODE_TYPE_NAME"] == "headgroup"
    assert "KUBERAY_GEN_RAY_START_CMD" not in dict(container_env(release, release.pods["gateway"], "pod-g"))


def test_user_env_wins_over_operator_defaults() -> None:
    env = kuberay.operator_env(
        node_type="worker",
        existing={"RAY_ADDRESS"},
        fqdn="c-head-svc.ns.svc.cluster.local",
        port="6379",
        start_cmd="ray start",
        cluster_name="c",
        namespace="ns",
        pod_name="p",
        group="g",
    )
    assert "RAY_ADDRESS" not in dict(env)


# --- Serving checks and report ---------------------------------------------------------------------


def test_histogram_counts() -> None:
    text = "\n".join(
        [
            "# TYPE dspark_time_to_first_token_seconds histogram",
            'dspark_time_to_first_token_seconds_bucket{le="1.0",model="m"} 1.0',
            'dspark_time_to_first_token_seconds_bucket{le="+Inf",model="m"} 2.0',
            'dspark_time_to_first_token_seconds_count{model="m"} 2.0',
            'dspark_time_to_first_token_seconds_sum{model="m"} 0.5',
            "# TYPE other_total counter",
            "other_total 3.0",
        ]
    )
    counts = histogram_counts(text + "\n")
    assert counts == {"dspark_time_to_first_token_seconds": 2.0}
    assert HISTOGRAMS[0] in counts and HISTOGRAMS[1] not in counts


def test_hosts_file_and_timing_table() -> None:
    hosts = hosts_file([("10.0.0.2", ["a", "a.ns.svc.cluster.local"])])
    assert "10.0.0.2\ta a.ns.svc.cluster.local" in hosts.splitlines()
    table = timing_table([("image build", 0.0), ("cluster ready", 61.25)])
    assert table.splitlines()[-1] == "| cluster ready |    61.2 |"


# --- The smoke itself ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_cluster_smoke_runs() -> None:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("the cluster smoke needs root and iproute2 (network namespaces)")
    env = {**os.environ, "PYTHONPATH": str(manifests.REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "scripts.cluster_smoke"],
        cwd=manifests.REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, f"cluster smoke failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    assert "cluster smoke passed" in done.stdout
    assert "kill decode to recovered" in done.stdout
