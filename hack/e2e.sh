#!/usr/bin/env bash
# `make e2e`: runledger's end-to-end tests on a real two-node cluster
# (RUNLEDGER_CLUSTER_NODES=N for another count).
#
# Usage: hack/e2e.sh [GO TEST ARGS...]     e.g. hack/e2e.sh -run TestHappyPath
#
#   0. a copy of the working tree (tracked and untracked files, not ignored
#      ones: your uncommitted changes are tested) inside a fresh 0700
#      directory, as a root user's home is; everything below runs from the
#      copy, so state the cluster keeps in the checkout that a non-root user
#      (postgres) must reach fails here. The copy shares bin/k8s/ (the
#      Kubernetes binaries) and .cluster/logs/ with this checkout and is
#      removed at the end
#   1. prerequisites: Debian packages, Kubernetes binaries (hack/demo.sh
#      prereqs; the first time builds from the Go module proxy)
#   2. a snapshot of the host (hack/host-check.sh); a cluster that is already
#      running (make demo) is taken down first, so the tests get a fresh one
#   3. the cluster, the runledger image and the operator, installed with
#      kubectl apply -k config/default and a kustomize image override
#      (hack/demo.sh install)
#   4. go test -tags e2e ./test/e2e/... -v -count=1 -timeout 40m
#      (output also in .cluster/logs/e2e.log of this checkout)
#   5. always: hack/cluster.sh down, then hack/host-check.sh compare: no
#      process, mount, network namespace, interface, iptables rule, sysctl,
#      cgroup or path left behind
#
# Exits non-zero when a test fails, the setup fails, or the host is not left
# as it was found. KEEP_CLUSTER=1 leaves the cluster running afterwards (for
# debugging; no host check then).
#
# A host that cannot run the cluster at all (not root, no network
# namespaces, no cgroup v1 pids hierarchy) skips the tests with the reason
# and exits 0, unless RUNLEDGER_E2E_REQUIRE=1 (CI sets it): then it fails.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
CLUSTER="${ROOT}/hack/cluster.sh"
HOSTCHECK="${ROOT}/hack/host-check.sh"
# Set in the copy (step 0): the checkout it was made from.
CHECKOUT="${RUNLEDGER_E2E_CHECKOUT:-}"

T0="${SECONDS}"
clock() { local s=$((SECONDS - T0)); printf '%dm%02ds' $((s / 60)) $((s % 60)); }
say() { printf '\n==> e2e: %s  [%s]\n' "$*" "$(clock)"; }
die() { echo "e2e: error: $*" >&2; exit 1; }

# skip REASON: this host cannot run the cluster.
skip() {
  if [[ "${RUNLEDGER_E2E_REQUIRE:-}" == 1 ]]; then die "cannot run on this host (RUNLEDGER_E2E_REQUIRE=1): $*"; fi
  echo "e2e: SKIPPED: this host cannot run the local cluster: $*"
  exit 0
}
[[ "$(id -u)" == 0 ]] || skip "not root (the cluster needs network namespaces, mounts and cgroups): run as root"
unshare --net true 2>/dev/null || skip "cannot create a network namespace (unshare --net failed)"
unshare --net ip link add rl-probe0 type veth peer name rl-probe1 2>/dev/null ||
  skip "cannot create a veth pair (the cluster's node is joined to the host by one)"
[[ -f /sys/fs/cgroup/pids/cgroup.procs ]] ||
  skip "no cgroup v1 pids hierarchy at /sys/fs/cgroup/pids (hack/cluster.sh tracks its processes there)"
command -v go >/dev/null || die "Go is not installed"

# existing: of the NUL-separated paths on stdin, those that exist (a tracked
# file deleted in the working tree is left out, as it is in the tree).
existing() {
  local f
  while IFS= read -r -d '' f; do
    if [[ -e "${f}" || -L "${f}" ]]; then printf '%s\0' "${f}"; fi
  done
}

# run_from_copy ARGS...: step 0; runs this script in the copy and exits with
# its status.
run_from_copy() {
  command -v git >/dev/null || die "git is not installed"
  git -C "${ROOT}" rev-parse --is-inside-work-tree >/dev/null 2>&1 ||
    die "${ROOT} is not a git checkout (the working tree is copied with git ls-files)"
  local parent copy rc=0
  parent="$(mktemp -d)"
  chmod 700 "${parent}" # what mktemp does anyway: the mode is the point
  copy="${parent}/runledger"
  trap 'rm -rf --one-file-system "${parent}"' EXIT
  say "copy of the working tree in ${copy} (the directory above it has mode 0700)"
  mkdir -p "${copy}/bin" "${ROOT}/bin/k8s" "${ROOT}/.cluster/logs"
  (cd "${ROOT}" && git ls-files -z --cached --others --exclude-standard | existing | tar --null -T - -cf -) |
    tar -xf - -C "${copy}"
  # The Kubernetes binaries take long to build: one cache, this checkout's.
  ln -s "${ROOT}/bin/k8s" "${copy}/bin/k8s"
  # The copy has no .git: the Makefile stamps the checkout's version instead.
  VERSION="$(git -C "${ROOT}" describe --always --dirty)"
  COMMIT="$(git -C "${ROOT}" rev-parse HEAD)"
  export VERSION COMMIT
  RUNLEDGER_E2E_CHECKOUT="${ROOT}" "${copy}/hack/e2e.sh" "$@" || rc=$?
  exit "${rc}"
}
if [[ -z "${CHECKOUT}" ]]; then run_from_copy "$@"; fi

# The logs (the cluster's and the tests') go to the checkout, they outlive the copy.
export RUNLEDGER_CLUSTER_LOGS="${CHECKOUT}/.cluster/logs"
LOG="${RUNLEDGER_CLUSTER_LOGS}/e2e.log"

say "prerequisites"
"${ROOT}/hack/demo.sh" prereqs

STATE_DIR="$("${CLUSTER}" state-dir)"
if [[ -d "${STATE_DIR}" ]]; then
  say "a cluster is running (make demo?): taking it down, the tests get a fresh one"
  "${CLUSTER}" down
elif [[ -e /run/netns/runledger ]]; then
  die "network namespace runledger exists but ${STATE_DIR} does not: a cluster hack/cluster.sh did not start (or an older version of it, which kept its state in .cluster/run of its checkout) is running; stop it first"
fi

SNAPSHOT="$(mktemp /tmp/runledger-host.XXXXXX)"
"${HOSTCHECK}" snapshot "${SNAPSHOT}"

TEST_RC=""
finish() {
  local rc=$?
  trap - EXIT INT TERM
  local host_rc=0
  if [[ "${KEEP_CLUSTER:-}" == 1 ]]; then
    say "KEEP_CLUSTER=1: the cluster keeps running (hack/cluster.sh down stops it); no host check"
  else
    say "take the cluster down"
    "${CLUSTER}" down || host_rc=1
    say "host check"
    "${HOSTCHECK}" compare "${SNAPSHOT}" || host_rc=1
  fi
  rm -f "${SNAPSHOT}"
  echo
  if [[ -z "${TEST_RC}" ]]; then
    echo "e2e: FAILED before the tests ran (exit ${rc}) [$(clock)]"
    [[ "${rc}" != 0 ]] || rc=1
  elif [[ "${TEST_RC}" != 0 ]]; then
    echo "e2e: tests FAILED (go test exit ${TEST_RC}; log: ${LOG#"${CHECKOUT}/"}) [$(clock)]"
    rc="${TEST_RC}"
  else
    echo "e2e: tests passed [$(clock)]"
  fi
  if [[ "${host_rc}" != 0 ]]; then
    echo "e2e: the host was NOT left as found (see above)"
    [[ "${rc}" != 0 ]] || rc=1
  elif [[ "${KEEP_CLUSTER:-}" != 1 ]]; then
    echo "e2e: the host is left as found"
  fi
  exit "${rc}"
}
trap finish EXIT
trap 'exit 130' INT TERM

# Two nodes: the tests of lost nodes power one off or cut it off.
export RUNLEDGER_CLUSTER_NODES="${RUNLEDGER_CLUSTER_NODES:-2}"
say "cluster of ${RUNLEDGER_CLUSTER_NODES} nodes and the operator (hack/demo.sh install)"
"${ROOT}/hack/demo.sh" install

say "go test -tags e2e ./test/e2e/... $*"
eval "$("${CLUSTER}" env)"
export RUNLEDGER_E2E_REQUIRE=1
set +e
(cd "${ROOT}" && go test -tags e2e ./test/e2e/... -v -count=1 -timeout 40m "$@") 2>&1 | tee "${LOG}"
TEST_RC="${PIPESTATUS[0]}"
set -e
grep -E '^(--- |ok |FAIL|PASS)' "${LOG}" | sed 's/^/    /' || true
