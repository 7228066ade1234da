#!/usr/bin/env bash
# Entry point of the dspark-serve chart's Ray nodes: the RayCluster's head and worker pods, and
# the gateway pods, which join the cluster as nodes without resources. The RayCluster carries
# ray.io/overwrite-container-cmd=true, so KubeRay runs this instead of its own command and hands
# over the `ray start` command it generated in KUBERAY_GEN_RAY_START_CMD.
#
#   ray-node.sh head             start the Ray head (blocks)
#   ray-node.sh worker [ARGS]    join the cluster, run `dspark-serve worker ARGS` until this node's
#                                engine actors are ready, then stay as long as the node does
#   ray-node.sh gateway [ARGS]   join RAY_HEAD_ADDRESS as a node without CPUs or GPUs and serve
#                                `dspark-serve gateway ARGS`; the pod lives while both live
#   ray-node.sh check head|worker|gateway   liveness: the local raylet (on the head also the
#                                GCS) answers
#   ray-node.sh ready            readiness of a worker: its engines have loaded the model
#   ray-node.sh stop             preStop of the head: leave the Ray cluster (`ray stop`)
#   ray-node.sh drain            preStop of a worker: drain this node's engines (`dspark-serve
#                                drain`: no new requests, DSPARK_SHUTDOWN_GRACE seconds to finish,
#                                the rest moved to other workers), then leave the Ray cluster
#
# The dspark-serve commands read their settings from DSPARK_* variables set by the chart.
set -uo pipefail

RAYLET_HEALTH_URL=${RAYLET_HEALTH_URL:-http://127.0.0.1:52365/api/local_raylet_healthz}
GCS_HEALTH_URL=${GCS_HEALTH_URL:-http://127.0.0.1:8265/api/gcs_healthz}
RAY_NODE_WAIT_S=${RAY_NODE_WAIT_S:-300}
READY_FILE=${READY_FILE:-/tmp/dspark-engines.ready}
RAY_STOP_GRACE_S=${RAY_STOP_GRACE_S:-30}

log() { echo "ray-node: $*" >&2; }

# http_ok URL: the Ray health endpoint answers 2xx with "success" in its body.
http_ok() {
  python3 -c '
import sys, urllib.request
try:
    body = urllib.request.urlopen(sys.argv[1], timeout=2).read()
except Exception:
    sys.exit(1)
sys.exit(0 if b"success" in body else 1)
' "$1"
}

raise_fd_limit() {
  # Ray opens many sockets; KubeRay's own command does the same.
  ulimit -n 65536 2>/dev/null || log "could not raise the open-file limit (now $(ulimit -n))"
}

kuberay_start_cmd() {
  if [[ -z ${KUBERAY_GEN_RAY_START_CMD:-} ]]; then
    log "KUBERAY_GEN_RAY_START_CMD is not set (needs KubeRay >= 1.1 and ray.io/overwrite-container-cmd)"
    exit 2
  fi
  echo "${KUBERAY_GEN_RAY_START_CMD}"
}

leave_cluster() {
  ray stop --grace-period "${RAY_STOP_GRACE_S}" >/dev/null 2>&1
}

# start_ray CMD: run the blocking `ray start` command in the background (ray_pid) and wait until
# the local raylet is healthy.
start_ray() {
  raise_fd_limit
  # exec: $! is `ray start` itself, so signals and exit statuses reach it, not a subshell.
  eval "exec $1" &
  ray_pid=$!
  local deadline=$((SECONDS + RAY_NODE_WAIT_S)) status
  until http_ok "${RAYLET_HEALTH_URL}"; do
    if ! kill -0 "${ray_pid}" 2>/dev/null; then
      wait "${ray_pid}"
      status=$?
      log "ray start exited with status ${status} before the raylet was healthy"
      exit $((status == 0 ? 1 : status))
    fi
    if ((SECONDS >= deadline)); then
      log "raylet not healthy after ${RAY_NODE_WAIT_S}s"
      kill -TERM "${ray_pid}" 2>/dev/null
      exit 1
    fi
    sleep 1
  done
}

run_worker() {
  local cmd status
  cmd=$(kuberay_start_cmd) || exit 2
  rm -f "${READY_FILE}"
  start_ray "${cmd}"
  local worker_cmd_pid=""
  trap 'log "SIGTERM: leaving the Ray cluster"; [[ -n ${worker_cmd_pid} ]] && kill -TERM "${worker_cmd_pid}" 2>/dev/null;
        leave_cluster; kill -TERM "${ray_pid}" 2>/dev/null; exit 0' TERM INT

  # Starts this node's engine actors and returns once they have loaded the model.
  dspark-serve worker "$@" &
  worker_cmd_pid=$!
  wait "${worker_cmd_pid}"
  status=$?
  worker_cmd_pid=""
  if ((status != 0)); then
    log "dspark-serve worker failed (status ${status}); leaving the Ray cluster"
    leave_cluster
    kill -TERM "${ray_pid}" 2>/dev/null
    exit "${status}"
  fi
  touch "${READY_FILE}"
  log "engines of role ${DSPARK_ROLE:-?} ready"

  # The engines live in this node's raylet: the pod lives as long as the node.
  wait "${ray_pid}"
  status=$?
  log "ray exited (status ${status})"
  exit $((status == 0 ? 1 : status))
}

run_gateway() {
  local status gateway_pid
  if [[ -z ${RAY_HEAD_ADDRESS:-} ]]; then
    log "RAY_HEAD_ADDRESS (host:port of the Ray head's GCS) is not set"
    exit 2
  fi
  # Word splitting of RAY_START_EXTRA_ARGS is intended: it holds several options.
  start_ray "ray start --address=${RAY_HEAD_ADDRESS} --num-cpus=0 --num-gpus=0 --block ${RAY_START_EXTRA_ARGS:-}"

  dspark-serve gateway "$@" &
  gateway_pid=$!
  # SIGTERM (pod deletion): let the gateway finish its streams, then leave the Ray cluster.
  trap 'log "SIGTERM: stopping the gateway"; kill -TERM "${gateway_pid}" 2>/dev/null; wait "${gateway_pid}";
        leave_cluster; kill -TERM "${ray_pid}" 2>/dev/null; exit 0' TERM INT

  wait -n "${ray_pid}" "${gateway_pid}"
  status=$?
  if kill -0 "${gateway_pid}" 2>/dev/null; then
    log "ray exited (status ${status}); stopping the gateway"
    kill -TERM "${gateway_pid}" 2>/dev/null
    wait "${gateway_pid}"
  else
    log "dspark-serve gateway exited (status ${status}); leaving the Ray cluster"
    leave_cluster
    kill -TERM "${ray_pid}" 2>/dev/null
  fi
  # Either half alone is useless: a non-zero exit makes Kubernetes restart the container.
  exit $((status == 0 ? 1 : status))
}

check() {
  http_ok "${RAYLET_HEALTH_URL}" || { log "raylet not healthy"; exit 1; }
  if [[ $1 == head ]]; then
    http_ok "${GCS_HEALTH_URL}" || { log "GCS not healthy"; exit 1; }
  fi
  exit 0
}

case "${1:-}" in
  head)
    cmd=$(kuberay_start_cmd) || exit 2
    raise_fd_limit
    eval "exec ${cmd}"
    ;;
  worker) shift; run_worker "$@" ;;
  gateway) shift; run_gateway "$@" ;;
  check)
    case "${2:-}" in
      head | worker | gateway) check "$2" ;;
      *) log "usage: $0 check head|worker|gateway"; exit 2 ;;
    esac
    ;;
  ready)
    [[ -e ${READY_FILE} ]] || { log "engines not ready yet"; exit 1; }
    check worker
    ;;
  stop) leave_cluster ;;
  drain)
    dspark-serve drain || log "dspark-serve drain failed (status $?); leaving the cluster anyway"
    leave_cluster
    ;;
  *)
    echo "usage: $0 head | worker [ARGS] | gateway [ARGS] | check head|worker|gateway | ready | stop | drain" >&2
    exit 2
    ;;
esac
