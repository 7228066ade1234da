"""The planner's RayCluster writes against a strict API server (tests/services/kube_api.py):
content types, optimistic concurrency, named victims on a decrease."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from services.planner.kube import (
    GROUP,
    PLURAL,
    VERSION,
    RayClusterError,
    RayClusterScaler,
    ReplicaChange,
    custom_objects_api,
)
from tests.services.kube_api import JSON_PATCH, StrictKubeApi, apply_json_patch

NAMESPACE, CLUSTER = "serving", "dspark-ray"
RAYCLUSTERS = "apis/ray.io/v1/rayclusters"


def raycluster(prefill: int = 1, decode: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "ray.io/v1",
        "kind": "RayCluster",
        "metadata": {"name": CLUSTER, "namespace": NAMESPACE},
        "spec": {
            "headGroupSpec": {"rayStartParams": {}},
            "workerGroupSpecs": [
                {"groupName": "prefill", "replicas": prefill, "minReplicas": 1, "maxReplicas": 4},
                {"groupName": "decode", "replicas": decode, "minReplicas": 1, "maxReplicas": 4},
            ],
        },
    }


@pytest.fixture
def kube() -> Iterator[StrictKubeApi]:
    api = StrictKubeApi()
    api.put(RAYCLUSTERS, raycluster(prefill=2, decode=3))
    try:
        yield api
    finally:
        api.close()


def stored(kube: StrictKubeApi) -> dict[str, Any]:
    return kube.get(RAYCLUSTERS, NAMESPACE, CLUSTER)


def groups(kube: StrictKubeApi) -> dict[str, dict[str, Any]]:
    return {g["groupName"]: g for g in stored(kube)["spec"]["workerGroupSpecs"]}


def patch(kube: StrictKubeApi, body: Any, **kwargs: Any) -> Any:
    api = custom_objects_api(kube.url)
    return api.patch_namespaced_custom_object(GROUP, VERSION, NAMESPACE, PLURAL, CLUSTER, body, **kwargs)


OPS = [{"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 4}]


def test_server_refuses_a_json_patch_sent_as_a_merge_patch(kube: StrictKubeApi) -> None:
    with pytest.raises(ApiException) as caught:
        patch(kube, OPS)  # the client's default content type: merge patch
    assert caught.value.status == 400
    assert kube.patches()[-1].content_type == "application/merge-patch+json"
    with pytest.raises(ApiException) as caught:
        patch(kube, {"spec": {}}, _content_type="application/strategic-merge-patch+json")
    assert caught.value.status == 415  # no strategic merge for custom resources
    assert groups(kube)["prefill"]["replicas"] == 2


def test_server_applies_json_patch_bumps_the_version_and_refuses_stale_ones(kube: StrictKubeApi) -> None:
    before = stored(kube)["metadata"]["resourceVersion"]
    patch(kube, OPS, _content_type=JSON_PATCH)
    after = stored(kube)["metadata"]["resourceVersion"]
    assert groups(kube)["prefill"]["replicas"] == 4 and after != before
    with pytest.raises(ApiException) as caught:
        patch(
            kube,
            [*OPS, {"op": "replace", "path": "/metadata/resourceVersion", "value": before}],
            _content_type=JSON_PATCH,
        )
    assert caught.value.status == 409
    with pytest.raises(ApiException) as caught:
        patch(
            kube,
            {"metadata": {"resourceVersion": before}, "spec": {"x": 1}},
            _content_type="application/merge-patch+json",
        )
    assert caught.value.status == 409
    with pytest.raises(ApiException) as caught:
        patch(
            kube,
            [{"op": "test", "path": "/spec/workerGroupSpecs/0/groupName", "value": "decode"}],
            _content_type=JSON_PATCH,
        )
    assert caught.value.status == 422
    assert stored(kube)["metadata"]["resourceVersion"] == after


def test_json_patch_semantics() -> None:
    doc = {"a": {"b": [1, 2]}, "c": 1}
    ops = [
        {"op": "add", "path": "/a/b/-", "value": 3},
        {"op": "move", "from": "/c", "path": "/d"},
        {"op": "copy", "from": "/a/b/0", "path": "/a/e"},
        {"op": "remove", "path": "/a/b/1"},
        {"op": "test", "path": "/d", "value": 1},
    ]
    assert apply_json_patch(doc, ops) == {"a": {"b": [1, 3], "e": 1}, "d": 1}
    assert doc == {"a": {"b": [1, 2]}, "c": 1}


def test_scaler_sends_a_conditional_json_patch(kube: StrictKubeApi) -> None:
    scaler = RayClusterScaler(custom_objects_api(kube.url), NAMESPACE, CLUSTER)
    scaler.set_replicas({"prefill": ReplicaChange(3, "TTFT"), "decode": ReplicaChange(3)})
    (sent,) = kube.patches()
    assert sent.content_type == JSON_PATCH
    assert {"op": "replace", "path": "/spec/workerGroupSpecs/0/replicas", "value": 3} in sent.body
    assert sent.body[-1]["path"] == "/metadata/resourceVersion"
    assert groups(kube)["prefill"]["replicas"] == 3 and groups(kube)["decode"]["replicas"] == 3


def test_scaler_rereads_and_retries_on_conflict(kube: StrictKubeApi) -> None:
    """Another writer changes the object between the scaler's read and its patch."""
    api = custom_objects_api(kube.url)
    real_get = api.get_namespaced_custom_object
    reads = 0

    def get_then_race(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        obj = real_get(*args, **kwargs)
        if reads == 1:  # someone else adds a worker group at the front meanwhile
            specs = [{"groupName": "extra", "replicas": 1}, *obj["spec"]["workerGroupSpecs"]]
            patch(kube, {"spec": {"workerGroupSpecs": specs}}, _content_type="application/merge-patch+json")
        return obj

    api.get_namespaced_custom_object = get_then_race
    RayClusterScaler(api, NAMESPACE, CLUSTER).set_replicas({"decode": ReplicaChange(2, victims=("decode-a",))})
    statuses = [r.body[-1]["value"] for r in kube.patches() if isinstance(r.body, list)]
    assert len(statuses) == 2 and statuses[0] != statuses[1]  # the first attempt was stale
    current = groups(kube)
    assert current["decode"]["replicas"] == 2 and current["prefill"]["replicas"] == 2  # not the stale index
    assert current["extra"]["replicas"] == 1


def test_scaler_gives_up_after_bounded_conflicts(kube: StrictKubeApi) -> None:
    api = custom_objects_api(kube.url)
    real_get = api.get_namespaced_custom_object

    def always_stale(*args: Any, **kwargs: Any) -> Any:
        obj = real_get(*args, **kwargs)
        patch(
            kube,
            {"metadata": {"labels": {"touched": str(len(kube.requests))}}},
            _content_type="application/merge-patch+json",
        )
        return obj

    api.get_namespaced_custom_object = always_stale
    with pytest.raises(RayClusterError, match="409"):
        RayClusterScaler(api, NAMESPACE, CLUSTER, max_attempts=3).set_replicas({"prefill": ReplicaChange(3)})
    assert len([r for r in kube.patches() if isinstance(r.body, list)]) == 3
    assert groups(kube)["prefill"]["replicas"] == 2


def test_decrease_names_its_victims_and_increase_clears_them(kube: StrictKubeApi) -> None:
    scaler = RayClusterScaler(custom_objects_api(kube.url), NAMESPACE, CLUSTER)
    scaler.set_replicas({"decode": ReplicaChange(1, "idle", victims=("decode-b", "decode-c"))})
    decode = groups(kube)["decode"]
    assert decode["replicas"] == 1 and decode["minReplicas"] == 1
    assert decode["scaleStrategy"] == {"workersToDelete": ["decode-b", "decode-c"]}
    scaler.set_replicas({"decode": ReplicaChange(2)})
    assert groups(kube)["decode"]["scaleStrategy"] == {"workersToDelete": []}
    scaler.set_replicas({"decode": ReplicaChange(2)})  # already there: nothing sent
    assert len(kube.patches()) == 2
