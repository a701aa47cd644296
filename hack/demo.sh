#!/usr/bin/env bash
# `make demo`: runledger on a real single-node Kubernetes cluster on this
# machine, from a fresh clone.
#
# Usage: hack/demo.sh          install what is missing, start the cluster,
#                              install the operator, run the sample and a
#                              second, overlapping run
#        hack/demo.sh down     stop everything (make demo-down)
#        hack/demo.sh prereqs  steps 1-2 only: what the cluster needs
#        hack/demo.sh install  steps 1-5 only: the cluster with the operator
#                              deployed (hack/e2e.sh uses it)
#
# What it does, each step skipped when already done:
#   1. Debian packages: containerd runc containernetworking-plugins iptables
#      postgresql (apt-get, ~1 min the first time)
#   2. Kubernetes binaries built from the Go module proxy (hack/k8s-bins.sh;
#      the first time ~15 min on 2 cores, cached in bin/k8s/ afterwards)
#   3. the runledger image (make image: no Docker daemon)
#   4. the cluster, its registry, PostgreSQL and its S3 object store
#      (SeaweedFS, make weed), in network namespace `runledger`
#      (hack/cluster.sh up); make push to the cluster's registry
#   5. the operator, the way users install a release: make build-installer
#      renders dist/install.yaml with the pushed image pinned by digest (the
#      cluster pulls it from its registry), kubectl apply -f
#      dist/install.yaml; waits for the rollout and the leader election
#   6. the ledger as docs/migrations.md sets it up: the administrator creates
#      a worker login (owning nothing) and an effect role, the owner (the
#      cluster's login runledger, database billing) the table invoices,
#      runledger migrate --grant-to --effect-role; the runs' Secret holds
#      the worker login's DSN
#   7. a run whose SQL effect writes invoices (one row per key)
#   8. the same keys under another run: nothing written twice (runledger
#      items, runledger key)
#   9. a run in which an item fails (the table's CHECK), listed with
#      runledger items --failed, the cause fixed, retried by a run with
#      batch.fromRun
#  10. a schedule's occurrence triggered twice: one run
#  11. a processor run: the example processor (examples/processor) charges
#      each item through the example payment service by its key; the worker
#      pod deleted after the charges, before the commit, its replacement
#      sends the items again with the same keys: each charged once; then the
#      commands to try next, each run first
#   Steps 6-11 are hack/demo/story.sh, printing each command a user types
#   and its output; their manifests and SQL are in config/samples/demo.
#
# Needs root (network namespaces, mounts, cgroups), Go and make.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
CLUSTER="${ROOT}/hack/cluster.sh"
NS=runledger-demo
SYSTEM_NS=runledger-system
LEASE=runledger-manager.processing.runledger.dev

T0="${SECONDS}"
# Steps 1-5 install; the story (hack/demo/story.sh) is steps 6-11.
STEPS=11
BOLD="" PLAIN=""
if [[ -t 1 ]]; then BOLD=$'\033[1m' PLAIN=$'\033[0m'; fi
say() { printf '\n%s==> %s%s  [%s]\n' "${BOLD}" "$*" "${PLAIN}" "$(clock)"; }
info() { echo "    $*"; }
die() { echo "demo: error: $*" >&2; exit 1; }
clock() { local s=$((SECONDS - T0)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }

[[ "$(id -u)" == 0 ]] || die "run as root: the cluster needs network namespaces, mounts and cgroups (sudo make demo)"

if [[ "${1:-}" == down ]]; then
  "${CLUSTER}" down
  exit 0
fi
MODE=all
case "${1:-}" in
  "") ;;
  prereqs | install) MODE="$1" ;;
  *) die "usage: hack/demo.sh [down|prereqs|install]" ;;
esac

command -v go >/dev/null || die "Go is not installed (https://go.dev/dl/; see go.mod for the version)"

# --- 1. Debian packages ------------------------------------------------------------
say "1/${STEPS} Debian packages"
missing=()
command -v containerd >/dev/null || missing+=(containerd)
command -v runc >/dev/null || missing+=(runc)
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] || missing+=(containernetworking-plugins)
command -v iptables >/dev/null || missing+=(iptables)
ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
command -v curl >/dev/null || missing+=(curl)
if ((${#missing[@]} > 0)); then
  info "installing ${missing[*]} with apt-get (first time only, ~1 min)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  info "installed"
else
  info "containerd, runc, CNI plugins, iptables, PostgreSQL: already installed"
fi

# --- 2. Kubernetes binaries --------------------------------------------------------
say "2/${STEPS} Kubernetes binaries (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy, kubectl)"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
BIN_DIR="$("${ROOT}/hack/k8s-bins.sh" --print-dir)"
todo=()
for c in "${COMPONENTS[@]}"; do [[ -x "${BIN_DIR}/${c}" ]] || todo+=("${c}"); done
if ((${#todo[@]} > 0)); then
  info "first time: building ${todo[*]} from source (Go module proxy)"
  info "~15 min on 2 cores with a cold Go build cache; cached in ${BIN_DIR#"${ROOT}/"} afterwards"
  "${ROOT}/hack/k8s-bins.sh" "${COMPONENTS[@]}" &
  build_pid=$!
  # A heartbeat, so that a long silent compile does not look like a hang.
  while kill -0 "${build_pid}" 2>/dev/null; do
    for _ in $(seq 60); do
      kill -0 "${build_pid}" 2>/dev/null || break
      sleep 1
    done
    if kill -0 "${build_pid}" 2>/dev/null; then info "... still compiling [$(clock)]"; fi
  done
  wait "${build_pid}" || die "building the Kubernetes binaries failed (see above)"
else
  info "cached in ${BIN_DIR#"${ROOT}/"}"
fi
if [[ "${MODE}" == prereqs ]]; then exit 0; fi

# --- 3. runledger ------------------------------------------------------------------
say "3/${STEPS} runledger image (make image; the first time also compiles for arm64)"
make -s -C "${ROOT}" image | sed 's/^/    /'

# --- 4. cluster --------------------------------------------------------------------
say "4/${STEPS} Kubernetes cluster, registry and PostgreSQL (hack/cluster.sh up); make push"
"${CLUSTER}" up
eval "$("${CLUSTER}" env)"
# Installed by digest: a rebuilt image is a new digest, so the Deployment
# rolls out again when you change the code and rerun the demo.
IMAGE="$(make -s -C "${ROOT}" push IMG="$("${CLUSTER}" registry)/runledger:dev" INSECURE=1 | tail -1)"
[[ "${IMAGE}" == *@sha256:* ]] || die "make push printed no digest: ${IMAGE}"
info "pushed ${IMAGE}"

# --- 5. operator -------------------------------------------------------------------
say "5/${STEPS} install the operator: make build-installer; kubectl apply -f dist/install.yaml"
make -s -C "${ROOT}" build-installer IMG="$("${CLUSTER}" registry)/runledger:dev" | tail -1 | sed 's/^/    /'
grep -qF "image: ${IMAGE}" "${ROOT}/dist/install.yaml" || die "dist/install.yaml does not pin the pushed image ${IMAGE}"
# One image setting: the workers run the manager's own image.
kubectl apply -f "${ROOT}/dist/install.yaml"
kubectl -n "${SYSTEM_NS}" rollout status deployment/runledger-manager --timeout=180s
for _ in $(seq 60); do
  holder="$(kubectl -n "${SYSTEM_NS}" get lease "${LEASE}" -o jsonpath='{.spec.holderIdentity}' 2>/dev/null || true)"
  pod="${holder%%_*}"
  if [[ -n "${pod}" ]] && kubectl -n "${SYSTEM_NS}" get pod "${pod}" -o jsonpath='{.spec.containers[0].image}' 2>/dev/null | grep -qx "${IMAGE}"; then
    break
  fi
  sleep 1
done
info "leader: ${holder:-none yet}"
kubectl -n "${SYSTEM_NS}" get deployment,pods -o wide | sed 's/^/    /'
if [[ "${MODE}" == install ]]; then exit 0; fi

# --- 6 and later: the story ------------------------------------------------------
# The ledger set up as docs/migrations.md says, runs with an SQL effect, the
# same keys again, a failed item retried, a schedule triggered twice
# (hack/demo/story.sh; its manifests in config/samples/demo).
# shellcheck source=hack/demo/story.sh
source "${ROOT}/hack/demo/story.sh"
story
