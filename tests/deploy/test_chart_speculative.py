"""The chart's `speculative` values and the GPU check reach the workers as `dspark-serve worker`
options (DSPARK_* env)."""

from __future__ import annotations

from typing import Any

import deploy_support as ds
import pytest

ROLES = ("prefill", "decode")


def worker_env(docs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    (container,) = ds.worker_group(docs, role)["template"]["spec"]["containers"]
    return ds.env_of(container)


def test_speculative_is_auto_by_default_with_the_shipped_drafter() -> None:
    for profile in (None, *ds.PROFILES):
        docs = ds.render(profile=profile)
        for role in ROLES:
            env = worker_env(docs, role)
            assert env["DSPARK_SPECULATIVE"] == "auto", (profile, role)
            for name in ("DSPARK_DRAFTER", "DSPARK_GAMMA", "DSPARK_SPECULATIVE_MAX_BATCH_SIZE"):
                assert name not in env, (profile, role, name)


def test_speculative_values_become_worker_env() -> None:
    docs = ds.render(
        {
            "model": {"path": "llama"},
            "speculative": {"mode": "on", "drafter": "drafters/llama", "gamma": 5, "maxBatchSize": 16},
        }
    )
    for role in ROLES:
        env = worker_env(docs, role)
        assert env["DSPARK_SPECULATIVE"] == "on"
        assert env["DSPARK_DRAFTER"] == "/models/drafters/llama"
        assert (env["DSPARK_GAMMA"], env["DSPARK_SPECULATIVE_MAX_BATCH_SIZE"]) == ("5", "16")


def test_drafter_is_passed_as_is_without_a_model_volume() -> None:
    docs = ds.render({"model": {"source": "none", "name": "/opt/m.gguf"}, "speculative": {"drafter": "/opt/d"}})
    assert worker_env(docs, "decode")["DSPARK_DRAFTER"] == "/opt/d"


@pytest.mark.parametrize(("mode", "rendered"), [(True, "on"), (False, "off"), ("off", "off")])
def test_unquoted_on_and_off_are_modes(mode: object, rendered: str) -> None:
    """YAML 1.1 reads `mode: on` as true."""
    assert worker_env(ds.render({"speculative": {"mode": mode}}), "decode")["DSPARK_SPECULATIVE"] == rendered


@pytest.mark.parametrize("speculative", [{"mode": "sometimes"}, {"gamma": 0}, {"maxBatchSize": "4"}, {"drafters": "x"}])
def test_schema_rejects_bad_speculative_values(speculative: dict[str, Any]) -> None:
    import helm_python

    with pytest.raises(helm_python.HelmError):
        ds.render({"speculative": speculative})


@pytest.mark.parametrize(
    ("profile", "values", "expected"),
    [
        (None, {}, {"prefill": ("8", "amd.com/gpu"), "decode": ("8", "amd.com/gpu")}),
        ("nvidia", {}, {"prefill": ("8", "nvidia.com/gpu"), "decode": ("8", "nvidia.com/gpu")}),
        (None, {"workers": {"prefill": {"gpusPerPod": 4, "tpSize": 4}}}, {"prefill": ("4", "amd.com/gpu")}),
    ],
)
def test_gpu_groups_require_their_gpus(
    profile: str | None, values: dict[str, Any], expected: dict[str, tuple[str, str]]
) -> None:
    docs = ds.render(values, profile)
    for role, (count, resource) in expected.items():
        env = worker_env(docs, role)
        assert (env["DSPARK_REQUIRE_GPUS"], env["DSPARK_GPU_RESOURCE"]) == (count, resource)


def test_groups_without_gpus_require_none() -> None:
    for docs in (ds.render(profile="cpu-dev"), ds.render({"workers": {"decode": {"gpusPerPod": 0, "tpSize": 1}}})):
        env = worker_env(docs, "decode")
        assert "DSPARK_REQUIRE_GPUS" not in env and "DSPARK_GPU_RESOURCE" not in env
    # The head and the gateway run no engine.
    docs = ds.render()
    for where, spec in ds.pod_specs(docs):
        if where.rsplit("/", 1)[1] in ROLES:
            continue
        for container in spec["containers"]:
            assert "DSPARK_REQUIRE_GPUS" not in ds.env_of(container), where
