#!/usr/bin/env bash
# Build the dspark-serve image (Dockerfile at the repository root) for one flavor.
#
#   scripts/build-image.sh [options]
#
#   --flavor rocm|cuda|cpu   base image and tag suffix (default rocm: AMD MI35x)
#   --base IMAGE             base image instead of the flavor's
#   --repository NAME        image name (default: dspark-serve)
#   --tag TAG                full tag (default: <repository>:<version>-<flavor>)
#   --builder buildah|docker|podman   (default: the first one installed)
#   --make-local-base        first build a Debian bookworm base with Python from Debian
#                            packages (debootstrap; root needed) and use it: for machines that
#                            can reach Debian and PyPI mirrors but no container registry
#   --wheels DIR             a directory of wheels pip may use (mounted into the build; buildah,
#                            podman), e.g. a local CPU build of torch
#   --torch-index-url URL    an extra index for the cpu flavor's torch (default: the PyTorch CPU
#                            index, or none with --wheels: the torch wheel is then taken from DIR)
#   --dry-run                print the build command instead of running it
#
# buildah needs no daemon: it builds with the vfs storage driver and chroot isolation, which work
# inside an unprivileged container too. The chart's image tags are `<version>-<flavor>`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' "${ROOT}/pyproject.toml" | head -n1)"
LOCAL_BASE="localhost/dspark-base:bookworm"
TORCH_VERSION_CPU="2.13.0"

flavor=rocm base="" repository=dspark-serve tag="" builder="" make_base=0 wheels="" dry_run=0
torch_index_url=""

usage() { sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'; }
die() { echo "build-image: $*" >&2; exit 1; }

while (($#)); do
  case "$1" in
    --flavor) flavor="${2:?}"; shift 2 ;;
    --base) base="${2:?}"; shift 2 ;;
    --repository) repository="${2:?}"; shift 2 ;;
    --tag) tag="${2:?}"; shift 2 ;;
    --builder) builder="${2:?}"; shift 2 ;;
    --make-local-base) make_base=1; shift ;;
    --wheels) wheels="$(cd "${2:?}" && pwd)"; shift 2 ;;
    --torch-index-url) torch_index_url="${2:?}"; shift 2 ;;
    --dry-run) dry_run=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
  esac
done

case "${flavor}" in
  rocm) default_base="docker.io/rocm/pytorch:rocm7.0_ubuntu24.04_py3.12_pytorch_release_2.8.0" ;;
  cuda) default_base="docker.io/pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime" ;;
  cpu) default_base="docker.io/library/python:3.11-slim-bookworm" ;;
  *) die "--flavor must be rocm, cuda or cpu (got ${flavor})" ;;
esac
if ((make_base)); then
  [[ -z ${base} ]] || die "--make-local-base and --base exclude each other"
  [[ ${flavor} == cpu ]] || die "--make-local-base has no GPU runtime: use it with --flavor cpu"
  base="${LOCAL_BASE}"
fi
base="${base:-${default_base}}"
tag="${tag:-${repository}:${VERSION}-${flavor}}"

if [[ -z ${builder} ]]; then
  for candidate in buildah podman docker; do
    if command -v "${candidate}" >/dev/null; then builder="${candidate}"; break; fi
  done
  [[ -n ${builder} ]] || die "none of buildah, podman, docker is installed"
fi

run() {
  if ((dry_run)); then printf '%q ' "$@"; echo; else "$@"; fi
}

# A minimal Debian with Python, imported as an image: the base when no registry is reachable.
make_local_base() {
  command -v debootstrap >/dev/null || die "debootstrap is not installed (apt-get install debootstrap)"
  [[ ${builder} == buildah ]] || die "--make-local-base needs buildah"
  local rootfs container
  rootfs="$(mktemp -d)"
  trap 'rm -rf "${rootfs}"' RETURN
  run debootstrap --variant=minbase --include=python3,python3-pip,python3-venv,ca-certificates \
    bookworm "${rootfs}" http://deb.debian.org/debian
  if ((dry_run)); then return; fi
  rm -rf "${rootfs}"/var/cache/apt/archives/*.deb "${rootfs}"/var/lib/apt/lists/*
  container="$(buildah --storage-driver vfs from scratch)"
  buildah --storage-driver vfs copy "${container}" "${rootfs}" /
  buildah --storage-driver vfs config --cmd /bin/bash "${container}"
  buildah --storage-driver vfs commit --rm "${container}" "${LOCAL_BASE}"
}

((make_base)) && make_local_base

args=(--build-arg "BASE_IMAGE=${base}" -t "${tag}" -f "${ROOT}/Dockerfile")
if [[ ${flavor} == cpu ]]; then
  [[ -n ${torch_index_url} || -n ${wheels} ]] || torch_index_url="https://download.pytorch.org/whl/cpu"
  args+=(--build-arg "TORCH_VERSION=${TORCH_VERSION_CPU}" --build-arg "TORCH_INDEX_URL=${torch_index_url}")
fi
if [[ -n ${wheels} ]]; then
  [[ ${builder} != docker ]] || die "--wheels needs buildah or podman (build-time volumes)"
  args+=(-v "${wheels}:${wheels}:ro" --build-arg "PIP_FIND_LINKS=${wheels}")
fi

case "${builder}" in
  buildah)
    # pip inside the build verifies TLS with the host's certificates; the docker format keeps
    # the HEALTHCHECK (OCI images have none).
    run buildah --storage-driver vfs bud --isolation chroot --layers --format docker \
      -v /etc/ssl/certs:/etc/ssl/certs:ro "${args[@]}" "${ROOT}"
    ;;
  podman) run podman build "${args[@]}" "${ROOT}" ;;
  docker) run docker build "${args[@]}" "${ROOT}" ;;
  *) die "unknown builder ${builder}" ;;
esac
((dry_run)) || echo "built ${tag} (base ${base})"
