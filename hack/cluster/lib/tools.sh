# shellcheck shell=bash
# Sourced by hack/cluster.sh: prerequisites (Debian packages, hack/tools) and images.

# --- prerequisites -----------------------------------------------------------------

ensure_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] ||
    missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
  if ((${#missing[@]} > 0)); then
    step "installing Debian packages: ${missing[*]} (once, ~1 min)"
    # A fresh machine may have empty package lists: update them first.
    apt-get update -qq >"${LOGS}/apt.log" 2>&1 ||
      { tail -20 "${LOGS}/apt.log" >&2; die "apt-get update failed (log: ${LOGS}/apt.log)"; }
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >>"${LOGS}/apt.log" 2>&1 ||
      { tail -20 "${LOGS}/apt.log" >&2; die "apt-get install failed (log: ${LOGS}/apt.log)"; }
  fi
  local c
  for c in nsenter setsid setpriv mountpoint ip ctr; do
    command -v "${c}" >/dev/null || die "${c} not found"
  done
}

# build_tool NAME [PACKAGE BINARY]: build hack/tools/NAME (its own module),
# or the PACKAGE it pins, into bin/cluster-tools/NAME (or BINARY).
build_tool() {
  mkdir -p "${TOOLS}"
  (cd "${ROOT}/hack/tools/$1" && GOWORK=off CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "${TOOLS}/${3:-$1}" "${2:-.}") ||
    die "building hack/tools/$1 failed"
}

# push_image NAME:TAG BIN ARG...: build an image of BIN for this machine's
# platform (bin/images/NAME, an OCI layout) and push it to the registry as
# ${REGISTRY}/NAME:TAG; print its reference by digest.
push_image() {
  local ref="${REGISTRY}/$1" bin="$2"
  shift 2
  [[ -x "${TOOLS}/image" ]] || build_tool image
  local args=() a layout
  for a in "$@"; do args+=(-arg "${a}"); done
  layout="${IMAGE_LAYOUTS}/$(echo "${ref%:*}" | tr '/:' '__')"
  "${TOOLS}/image" build -o "${layout}" -binary "linux/$(go env GOARCH)=${bin}" ${args[@]+"${args[@]}"} >&2 ||
    die "building the image of ${bin} failed"
  "${TOOLS}/image" push -insecure "${layout}" "${ref}" || die "pushing ${ref} failed"
}

