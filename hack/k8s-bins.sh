#!/usr/bin/env bash
# Build (once) and cache Kubernetes binaries from the Go module proxy.
#
# Usage: hack/k8s-bins.sh [--print-dir] COMPONENT...
#
#   COMPONENT: kube-apiserver etcd kubectl kubelet kube-controller-manager
#              kube-scheduler kube-proxy
#   --print-dir: print the binary directory on stdout (everything else goes to
#              stderr), e.g. for controller-runtime envtest:
#
#     export KUBEBUILDER_ASSETS="$(hack/k8s-bins.sh --print-dir kube-apiserver etcd kubectl)"
#
# Binaries land in bin/k8s/<kubernetes version>/ and are only built when
# missing, so after the first run this is instant. The versions come from the
# wrapper modules, which are the single source of truth:
#   hack/tools/k8s/go.mod   k8s.io/kubernetes (+ its staging modules)
#   hack/tools/etcd/go.mod  go.etcd.io/etcd/server/v3
# Bumping the kubernetes version there changes the directory, so everything is
# rebuilt; bumping etcd alone is caught by a small version stamp next to it.
#
# Everything is built from go.mod/go.sum only (no vendoring, no git checkout),
# so the result is reproducible: -trimpath, no VCS stamping, and the build
# date is the release time of the k8s.io/kubernetes module, not "now".
set -euo pipefail

# --- locations ---------------------------------------------------------------
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
K8S_MOD_DIR="${ROOT}/hack/tools/k8s"
ETCD_MOD_DIR="${ROOT}/hack/tools/etcd"

# usage [EXIT_CODE]: print the header comment above as help.
usage() {
  sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

log() { echo "k8s-bins: $*" >&2; }
die() { log "error: $*"; exit 1; }

# mod_version GO_MOD MODULE: the required version of MODULE in GO_MOD, from
# either a single-line `require M vX` or a line `M vX` inside a require block.
mod_version() {
  awk -v m="$2" '
    $1 == "require" && $2 == m { print $3; exit }
    $1 == m && $2 ~ /^v[0-9]/  { print $2; exit }
  ' "$1"
}

# --- versions ----------------------------------------------------------------
K8S_VERSION="$(mod_version "${K8S_MOD_DIR}/go.mod" k8s.io/kubernetes)"
ETCD_VERSION="$(mod_version "${ETCD_MOD_DIR}/go.mod" go.etcd.io/etcd/server/v3)"
[[ "${K8S_VERSION}" =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] ||
  die "cannot parse k8s.io/kubernetes version from ${K8S_MOD_DIR}/go.mod (got '${K8S_VERSION}')"
[[ -n "${ETCD_VERSION}" ]] ||
  die "cannot find go.etcd.io/etcd/server/v3 in ${ETCD_MOD_DIR}/go.mod"
K8S_MAJOR=1
K8S_MINOR="${BASH_REMATCH[1]}"
# Staging modules (k8s.io/api, k8s.io/client-go, ...) are published as
# v0.<minor>.<patch> for kubernetes v1.<minor>.<patch>.
STAGING_VERSION="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"

BIN_DIR="${ROOT}/bin/k8s/${K8S_VERSION}"

# --- arguments -----------------------------------------------------------------
print_dir=false
components=()
for arg in "$@"; do
  case "${arg}" in
    --print-dir) print_dir=true ;;
    -h | --help) usage 0 ;;
    kube-apiserver | kube-controller-manager | kube-scheduler | kube-proxy | kubectl | kubelet | etcd)
      components+=("${arg}") ;;
    *) log "unknown argument: ${arg}"; usage ;;
  esac
done
[[ ${#components[@]} -gt 0 || "${print_dir}" == true ]] || usage

# --- build settings ------------------------------------------------------------
# Static binaries (no libc dependency), exactly what was resolved in
# go.mod/go.sum (-mod=readonly overrides a GOFLAGS=-mod=... from the
# environment), and no go.work from a parent directory: the wrapper modules
# are deliberately standalone.
export CGO_ENABLED=0
export GOWORK=off
GO_BUILD=(go build -mod=readonly -trimpath -buildvcs=false)

# Not available from the module proxy; override if you know it.
GIT_COMMIT="${K8S_GIT_COMMIT:-unknown}"
ETCD_GIT_SHA="${ETCD_GIT_SHA:-GitNotFound}"

# k8s_ldflags: version stamping as in kubernetes' hack/lib/version.sh, so
# `kube-apiserver --version` and `kubectl version` report v1.x.y instead of
# v0.0.0-master+$Format:%H$ (tools parse it), plus -s -w like release builds.
k8s_ldflags() {
  # Reproducible build date: the release time of the k8s.io/kubernetes module.
  local build_date
  build_date="$(cd "${K8S_MOD_DIR}" && go list -m \
    -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)"
  local -a flags=(-s -w)
  local pkg kv
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    for kv in \
      "gitVersion=${K8S_VERSION}" \
      "gitMajor=${K8S_MAJOR}" \
      "gitMinor=${K8S_MINOR}" \
      "gitTreeState=clean" \
      "gitCommit=${GIT_COMMIT}" \
      "buildDate=${build_date}"; do
      flags+=(-X "${pkg}.${kv}")
    done
  done
  echo "${flags[*]}"
}

# check_staging_replaces: every k8s.io staging replace in the wrapper go.mod
# must point at the release matching K8S_VERSION, or we'd silently build a
# mix of versions after a half-done bump.
check_staging_replaces() {
  local bad
  bad="$(awk -v v="${STAGING_VERSION}" \
    '$2 == "=>" && $3 ~ /^k8s\.io\// && $4 != v' "${K8S_MOD_DIR}/go.mod")"
  [[ -z "${bad}" ]] || die "these replaces in ${K8S_MOD_DIR}/go.mod are not at ${STAGING_VERSION}:
${bad}"
}

# Rough first-build times on 2 cores with a cold Go build cache; measured
# 2 min for etcd, 22 min for kube-apiserver and then 3 min for kubectl on a
# busy 2-core machine. Later components reuse most of the cache.
estimate() {
  case "$1" in
    etcd) echo "~2 min" ;;
    kubectl) echo "~3 min" ;;
    *) echo "~10-20 min" ;;
  esac
}

# A stamp next to each binary records what it was built from, so a version
# bump of a wrapper module triggers a rebuild even within the same directory.
stamp_of() {
  case "$1" in
    etcd) echo "go.etcd.io/etcd/server/v3@${ETCD_VERSION}" ;;
    *) echo "k8s.io/kubernetes@${K8S_VERSION}" ;;
  esac
}

tmp_files=()
cleanup() {
  if [[ ${#tmp_files[@]} -gt 0 ]]; then rm -f "${tmp_files[@]}"; fi
}
trap cleanup EXIT

# is_cached NAME: the binary exists and was built from the current versions.
is_cached() {
  local stamp_file="${BIN_DIR}/.$1.stamp"
  [[ -x "${BIN_DIR}/$1" && -f "${stamp_file}" &&
    "$(<"${stamp_file}")" == "$(stamp_of "$1")" ]]
}

# lock: take (once per run) an exclusive lock on the binary directory, so
# concurrent runs (e.g. parallel CI jobs or terminals) don't compile the same
# packages twice at once; the later run waits and then finds its binaries
# cached. Runs that find everything cached never take the lock.
locked=false
lock() {
  [[ "${locked}" == false ]] || return 0
  exec 9>"${BIN_DIR}/.lock"
  if ! flock -n 9; then
    log "waiting for another hack/k8s-bins.sh run to finish building in ${BIN_DIR}..."
    flock 9
  fi
  locked=true
}

# build NAME: build bin/k8s/<version>/NAME unless it is already there.
build() {
  local name="$1"
  local out="${BIN_DIR}/${name}"
  local stamp_file="${BIN_DIR}/.${name}.stamp"
  local stamp
  stamp="$(stamp_of "${name}")"

  is_cached "${name}" && return 0
  mkdir -p "${BIN_DIR}"
  lock
  is_cached "${name}" && return 0 # built by another run while we waited

  local version="${K8S_VERSION}"
  [[ "${name}" == etcd ]] && version="${ETCD_VERSION}"
  log "building ${name} ${version} (first time $(estimate "${name}") on $(nproc 2>/dev/null || echo '?') cores)..."

  # Build to a temporary name in the same directory and rename at the end:
  # rename is atomic, so an interrupted build never leaves a truncated
  # binary that would look cached next time.
  local tmp="${BIN_DIR}/.${name}.tmp.$$"
  tmp_files+=("${tmp}")
  local start=${SECONDS}

  if [[ "${name}" == etcd ]]; then
    (cd "${ETCD_MOD_DIR}" && "${GO_BUILD[@]}" \
      -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=${ETCD_GIT_SHA}" \
      -o "${tmp}" .)
  else
    check_staging_replaces
    # Build tags as in kubernetes release builds (hack/lib/golang.sh).
    (cd "${K8S_MOD_DIR}" && "${GO_BUILD[@]}" \
      -tags selinux,notest,grpcnotrace \
      -ldflags "$(k8s_ldflags)" \
      -o "${tmp}" "k8s.io/kubernetes/cmd/${name}")
  fi

  rm -f "${stamp_file}" # binary and stamp are replaced together
  mv -f "${tmp}" "${out}"
  echo "${stamp}" >"${stamp_file}"
  log "built ${out} in $((SECONDS - start))s"
}

for c in ${components[@]+"${components[@]}"}; do
  build "${c}"
done

if [[ "${print_dir}" == true ]]; then
  echo "${BIN_DIR}"
fi
