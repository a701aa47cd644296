#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, for `make demo` and
# `make e2e`: no Docker, no systemd; images come from the cluster's own OCI
# registry, as they come from a registry in any cluster.
#
# Usage: hack/cluster.sh COMMAND [ARGS]
#
#   up                  start the cluster (idempotent: reuses a healthy one)
#   down                stop it and leave the host as it was found
#   status              what runs, node state, addresses
#   state-dir           print the directory of the cluster's state
#   kubeconfig          print the admin kubeconfig path:
#                         export KUBECONFIG="$(hack/cluster.sh kubeconfig)"
#   env                 print shell exports (KUBECONFIG, KUBECACHEDIR, PATH,
#                       RUNLEDGER_DATABASE_URL):
#                         eval "$(hack/cluster.sh env)"
#   dsn                 print the PostgreSQL DSN, valid from the host and pods
#   registry            print the address of the cluster's registry
#                       (${REGISTRY}, plain HTTP; containerd pulls from it):
#                         make push IMG="$(hack/cluster.sh registry)/runledger:dev" INSECURE=1
#   push NAME:TAG BIN [ARG...]
#                       build an image from the static binary BIN (entrypoint
#                       /<name of BIN>, default args ARG..., user 65532), push
#                       it to the registry as ${REGISTRY}/NAME:TAG and print
#                       its reference by digest
#   apply-k DIR [--patch FILE]... [IMAGE=NEWIMAGE[:TAG|@DIGEST]]...
#                       kubectl apply -k DIR through a generated overlay that
#                       substitutes images (kustomize images:) and adds the
#                       given (strategic merge) patches
#   postgres stop|start|restart
#                       stop/start the cluster's PostgreSQL (tests of outages)
#   smoke               run pods that show the cluster works: a local image
#                       runs, pods reach the apiserver ClusterIP and PostgreSQL
#
# Everything runs as root inside a network namespace this script creates
# (${NETNS}), joined to the host by a veth pair: the host is ${HOST_IP}, the
# node ${NODE_IP}. The apiserver (https://${NODE_IP}:6443), PostgreSQL
# (${NODE_IP}:5432) and the registry (http://${REGISTRY}) listen on the node
# address, reachable from the host and from pods; nothing listens on or
# targets the host's other interfaces.
# Pods get ${POD_CIDR}, Services ${SERVICE_CIDR}; there is no cluster DNS.
#
# State (etcd, containerd, kubelet, PostgreSQL, registry, certificates) lives in
# ${RUN} (removed by `down`), outside the checkout:
# PostgreSQL runs as user postgres, who cannot enter a checkout under a 0700
# directory such as root's home. There is one cluster per machine (one
# netns, fixed addresses), so one state directory: `down` from any checkout
# stops the cluster.
# Logs go to .cluster/logs of the checkout (kept after `down`, rotated to
# .cluster/logs.prev by the next `up`; RUNLEDGER_CLUSTER_LOGS=DIR puts them
# in DIR instead, as hack/e2e.sh does).
# Binaries are built once from the Go module proxy (hack/k8s-bins.sh, cached
# in bin/k8s/); containerd, runc, the CNI plugins and iptables come from
# Debian packages, installed if missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"
CONF="${ROOT}/hack/cluster"
STATE="${ROOT}/.cluster" # this checkout's: logs and the lock
RUN=/var/lib/runledger-cluster
LOGS="${RUNLEDGER_CLUSTER_LOGS:-${STATE}/logs}"
PIDS="${RUN}/pids"
HOSTSAVE="${RUN}/host" # what the host looked like before `up`

NETNS=runledger
HOST_IF=rl-host
NODE_IF=rl-node
HOST_IP=10.250.0.1
NODE_IP=10.250.0.2
NET_PREFIX=30
NODE_NAME=runledger
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1 # the apiserver's ClusterIP, first of SERVICE_CIDR
PG_PORT=5432
PG_USER=runledger
PG_DB=runledger

IMAGE_LAYOUTS="${ROOT}/bin/images" # OCI layouts of the images pushed by push_image
TOOLS="${ROOT}/bin/cluster-tools"
REGISTRY="${NODE_IP}:5000"
PAUSE_IMAGE="${REGISTRY}/pause:dev"
SMOKE_IMAGE="${REGISTRY}/smoke:dev"

CGROUP_ROOT=runledger              # kubelet's cgroupRoot (pods), in every v1 hierarchy
DAEMON_CGROUP=runledger-daemons    # pids hierarchy: every daemon and shim, to prove none is left
K8S_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
DAEMONS=(registry containerd postgres etcd kube-apiserver kube-controller-manager kube-scheduler kube-proxy kubelet)

# Host sysctls that kubelet (vm.*, kernel.*) or kube-proxy and the CNI bridge
# plugin (net.*; those run in the netns, but the host values are checked too)
# may change. Saved by `up`, restored by `down`.
SYSCTLS=(
  kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.ip_forward net.ipv4.conf.all.route_localnet net.ipv4.conf.default.route_localnet
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
  net.netfilter.nf_conntrack_max
)
# Host paths the cluster software creates outside the state directory (see
# hack/cluster/*). `down` removes each one that did not exist before `up`.
HOST_PATHS=(/run/containerd /var/log/containers /var/lib/cni /var/lib/kubelet)

# --- output --------------------------------------------------------------------

T0=""
now_ms() { local t="${EPOCHREALTIME/[.,]/}"; echo $((t / 1000)); }
elapsed() { local ms=$(($(now_ms) - T0)); printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100)); }
step() { printf '[%6s] %s\n' "$(elapsed)" "$*" >&2; }
log() { echo "cluster: $*" >&2; }
warn() { echo "cluster: warning: $*" >&2; }
die() { echo "cluster: error: $*" >&2; exit 1; }
T0="$(now_ms)"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' |
    sed -e "s|\${NETNS}|${NETNS}|; s|\${HOST_IP}|${HOST_IP}|; s|\${NODE_IP}|${NODE_IP}|g" \
      -e "s|\${POD_CIDR}|${POD_CIDR}|; s|\${SERVICE_CIDR}|${SERVICE_CIDR}|; s|\${RUN}|${RUN}|" \
      -e "s|\${REGISTRY}|${REGISTRY}|g" >&2
  exit "${1:-2}"
}

# --- small helpers ---------------------------------------------------------------

in_ns() { nsenter --net="/run/netns/${NETNS}" -- "$@"; }
netns_exists() { [[ -e "/run/netns/${NETNS}" ]]; }
# The script's own kubectl calls keep their discovery cache in the state
# directory, not in ~/.kube.
kubectl_() { "${BIN_DIR}/kubectl" --kubeconfig "${RUN}/admin.kubeconfig" --cache-dir "${RUN}/kube-cache" "$@"; }
ctr_() { ctr --address "${RUN}/containerd/containerd.sock" --namespace k8s.io "$@"; }
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

# wait_for DESCRIPTION TIMEOUT_SECONDS COMMAND...: poll until COMMAND succeeds.
# With WATCH=NAME, give up as soon as daemon NAME is no longer running.
wait_for() {
  local what="$1" timeout="$2"
  shift 2
  local deadline=$(($(now_ms) + timeout * 1000))
  until "$@" >/dev/null 2>&1; do
    if [[ -n "${WATCH:-}" ]] && ! daemon_pid "${WATCH}" >/dev/null; then
      log "${WATCH} exited while waiting for ${what}; see ${LOGS}/${WATCH}.log"
      return 1
    fi
    if (($(now_ms) > deadline)); then
      log "timed out after ${timeout}s waiting for ${what}"
      return 1
    fi
    sleep 0.2
  done
}

# render TEMPLATE OUT: fill in @WORDS@ of a hack/cluster/ template.
render() {
  sed -e "s|@RUN@|${RUN}|g" -e "s|@NODE_IP@|${NODE_IP}|g" -e "s|@NODE_NAME@|${NODE_NAME}|g" \
    -e "s|@POD_CIDR@|${POD_CIDR}|g" -e "s|@PAUSE_IMAGE@|${PAUSE_IMAGE}|g" -e "s|@REGISTRY@|${REGISTRY}|g" \
    "${CONF}/$1" >"$2"
  if grep -q '@[A-Z_]*@' "$2"; then die "unfilled placeholder in $2"; fi
}

pg_bin() {
  local d
  d="$(printf '%s\n' /usr/lib/postgresql/*/bin | grep -v '\*' | sort -V | tail -1)"
  [[ -n "${d}" ]] || die "PostgreSQL server binaries not found under /usr/lib/postgresql"
  echo "${d}"
}

# k8s_bin_dir [--build]: set BIN_DIR; with --build, build what is missing first.
k8s_bin_dir() {
  if [[ "${1:-}" == --build ]]; then
    BIN_DIR="$("${ROOT}/hack/k8s-bins.sh" --print-dir "${K8S_COMPONENTS[@]}")"
  else
    BIN_DIR="$("${ROOT}/hack/k8s-bins.sh" --print-dir)"
  fi
}

# --- processes: started into DAEMON_CGROUP, recorded by PID ------------------------

# proc_start PID: the process start time (field 22 of /proc/PID/stat), recorded
# with the PID so a reused PID is never mistaken for ours; nothing if the
# process is gone or a zombie (daemons outlive this script, so whoever reaps
# them is not us and may take its time).
proc_start() { awk '{ sub(/^.*\) /, ""); if ($1 != "Z") print $20 }' "/proc/$1/stat" 2>/dev/null; }

# daemon_pid NAME: the recorded PID if that process is still the one we started.
daemon_pid() {
  local f="${PIDS}/$1.pid" pid start
  [[ -f "${f}" ]] || return 1
  read -r pid start <"${f}"
  [[ -n "${pid}" && "$(proc_start "${pid}")" == "${start}" ]] || return 1
  echo "${pid}"
}

# start_daemon NAME COMMAND...: run COMMAND in the cluster netns, in its own
# session, logging to .cluster/logs/NAME.log; record its PID.
start_daemon() {
  local name="$1"
  shift
  mkdir -p "${PIDS}" "${LOGS}"
  (
    exec 9>&- # the lock (see main) must not outlive this script
    echo "${BASHPID}" >"/sys/fs/cgroup/pids/${DAEMON_CGROUP}/cgroup.procs"
    # setsid and nsenter exec (this subshell is no process group leader, so
    # setsid does not fork): the PID stays the daemon's.
    exec setsid nsenter --net="/run/netns/${NETNS}" -- "$@"
  ) >>"${LOGS}/${name}.log" 2>&1 </dev/null &
  local pid=$!
  local start=""
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    start="$(proc_start "${pid}")"
    [[ -n "${start}" ]] && break
    sleep 0.05
  done
  [[ -n "${start}" ]] || die "${name} exited at once; see ${LOGS}/${name}.log"
  echo "${pid} ${start}" >"${PIDS}/${name}.pid"
}

# stop_daemon NAME [SIGNAL] [TIMEOUT]: signal the recorded PID, wait, then SIGKILL.
stop_daemon() {
  local name="$1" sig="${2:-TERM}" timeout="${3:-20}" pid
  if ! pid="$(daemon_pid "${name}")"; then
    rm -f "${PIDS}/${name}.pid"
    return 0
  fi
  kill -s "${sig}" "${pid}" 2>/dev/null || true
  local deadline=$(($(now_ms) + timeout * 1000))
  while [[ "$(proc_start "${pid}")" != "" ]]; do
    if (($(now_ms) > deadline)); then
      warn "${name} (pid ${pid}) did not stop after SIG${sig} in ${timeout}s; SIGKILL"
      kill -s KILL "${pid}" 2>/dev/null || true
      sleep 0.5
      break
    fi
    sleep 0.1
  done
  rm -f "${PIDS}/${name}.pid"
  step "stopped ${name} (pid ${pid})"
}

# The processes in DAEMON_CGROUP: daemons we started, and what they started
# outside any pod (containerd shims).
cgroup_pids() { cat "/sys/fs/cgroup/pids/${DAEMON_CGROUP}/cgroup.procs" 2>/dev/null || true; }

# --- host state: saved at `up`, restored at `down` ---------------------------------

save_host_state() {
  mkdir -p "${HOSTSAVE}"
  local k v
  : >"${HOSTSAVE}/sysctl"
  for k in "${SYSCTLS[@]}"; do
    if v="$(sysctl -n "${k}" 2>/dev/null)"; then
      printf '%s=%s\n' "${k}" "${v}" >>"${HOSTSAVE}/sysctl"
    fi
  done
  sysctl -a 2>/dev/null | sort >"${HOSTSAVE}/sysctl.all" || true
  iptables-save 2>/dev/null | grep -v '^#' >"${HOSTSAVE}/iptables" || true
  : >"${HOSTSAVE}/paths"
  local p
  for p in "${HOST_PATHS[@]}"; do
    if [[ ! -e "${p}" ]]; then echo "${p}" >>"${HOSTSAVE}/paths"; fi
  done
  if mountpoint -q /run/netns 2>/dev/null; then touch "${HOSTSAVE}/run-netns-mounted"; fi
  if [[ ! -e /run/netns ]]; then touch "${HOSTSAVE}/run-netns-absent"; fi
  (ls /run/netns 2>/dev/null || true) >"${HOSTSAVE}/netns"
}

restore_sysctls() {
  [[ -f "${HOSTSAVE}/sysctl" ]] || return 0
  local line k v cur
  while IFS= read -r line; do
    k="${line%%=*}"
    v="${line#*=}"
    cur="$(sysctl -n "${k}" 2>/dev/null)" || continue
    if [[ "${cur}" != "${v}" ]]; then
      if sysctl -q -w "${k}=${v}" >/dev/null; then
        step "restored ${k} = ${v} (was ${cur})"
      else
        warn "could not restore ${k} to ${v}"
      fi
    fi
  done <"${HOSTSAVE}/sysctl"
  # Anything else that changed while the cluster ran (values that move by
  # themselves are left out): report, do not touch, it may be someone else's.
  if [[ -f "${HOSTSAVE}/sysctl.all" ]]; then
    local diff
    diff="$(diff <(grep -Ev "$(volatile_sysctls)" "${HOSTSAVE}/sysctl.all") \
      <(sysctl -a 2>/dev/null | sort | grep -Ev "$(volatile_sysctls)") | grep '^[<>]' || true)"
    if [[ -n "${diff}" ]]; then warn "other host sysctls differ from before up (not restored):
${diff}"; fi
  fi
}

# Sysctls whose values change on their own (counters, random values).
volatile_sysctls() {
  echo '^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.)|kernel\.(ns_last_pid|random\.|pty\.nr)|net\.netfilter\.nf_conntrack_count|kernel\.sched_domain)'
}

# --- certificates and kubeconfigs --------------------------------------------------

# cert NAME SUBJECT [SANS] [EKU]: key and certificate signed by the cluster CA.
cert() {
  local name="$1" subj="$2" sans="${3:-}" eku="${4:-clientAuth}" pki="${RUN}/pki"
  openssl ecparam -name prime256v1 -genkey -noout -out "${pki}/${name}.key" 2>/dev/null
  openssl req -new -key "${pki}/${name}.key" -subj "${subj}" -out "${pki}/${name}.csr" 2>/dev/null
  {
    echo "basicConstraints = critical, CA:FALSE"
    echo "keyUsage = critical, digitalSignature, keyEncipherment"
    echo "extendedKeyUsage = ${eku}"
    if [[ -n "${sans}" ]]; then echo "subjectAltName = ${sans}"; fi
  } >"${pki}/${name}.ext"
  openssl x509 -req -in "${pki}/${name}.csr" -CA "${pki}/ca.crt" -CAkey "${pki}/ca.key" \
    -set_serial "0x$(openssl rand -hex 16)" -days 365 -sha256 -extfile "${pki}/${name}.ext" -out "${pki}/${name}.crt" 2>/dev/null
  rm -f "${pki}/${name}.csr" "${pki}/${name}.ext"
}

# kubeconfig NAME CERT: a kubeconfig for the client certificate CERT.
kubeconfig() {
  local pki="${RUN}/pki"
  cat >"${RUN}/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ${NODE_NAME}
  cluster:
    server: https://${NODE_IP}:6443
    certificate-authority-data: $(base64 -w0 "${pki}/ca.crt")
users:
- name: $2
  user:
    client-certificate-data: $(base64 -w0 "${pki}/$2.crt")
    client-key-data: $(base64 -w0 "${pki}/$2.key")
contexts:
- name: ${NODE_NAME}
  context:
    cluster: ${NODE_NAME}
    user: $2
current-context: ${NODE_NAME}
EOF
  chmod 600 "${RUN}/$1.kubeconfig"
}

make_pki() {
  local pki="${RUN}/pki"
  mkdir -p "${pki}"
  chmod 700 "${pki}"
  openssl ecparam -name prime256v1 -genkey -noout -out "${pki}/ca.key" 2>/dev/null
  openssl req -x509 -new -key "${pki}/ca.key" -subj "/CN=runledger-local-ca" -days 365 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "${pki}/ca.crt" 2>/dev/null
  # Signed in parallel (random serial numbers, no shared serial file).
  local jobs=()
  cert apiserver "/CN=kube-apiserver" \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:${SERVICE_IP},IP:${NODE_IP},IP:127.0.0.1" \
    serverAuth &
  jobs+=($!)
  cert kubelet "/CN=${NODE_NAME}" "DNS:${NODE_NAME},IP:${NODE_IP}" serverAuth & jobs+=($!)
  cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" & jobs+=($!)
  cert admin "/O=system:masters/CN=runledger-admin" & jobs+=($!)
  cert controller-manager "/CN=system:kube-controller-manager" & jobs+=($!)
  cert scheduler "/CN=system:kube-scheduler" & jobs+=($!)
  cert kube-proxy "/CN=system:kube-proxy" & jobs+=($!)
  cert kubelet-client "/O=system:nodes/CN=system:node:${NODE_NAME}" & jobs+=($!)
  # Service account tokens: RSA, as every client expects.
  openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "${pki}/sa.key" 2>/dev/null
  openssl pkey -in "${pki}/sa.key" -pubout -out "${pki}/sa.pub" 2>/dev/null
  local j
  for j in "${jobs[@]}"; do wait "${j}" || die "generating certificates failed"; done
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kube-proxy kube-proxy
  kubeconfig kubelet kubelet-client
}

# --- prerequisites -----------------------------------------------------------------

ensure_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] ||
    missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || missing+=(postgresql)
  command -v openssl >/dev/null || missing+=(openssl)
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

# build_tool NAME: build hack/tools/NAME (its own module) into bin/cluster-tools/NAME.
build_tool() {
  mkdir -p "${TOOLS}"
  (cd "${ROOT}/hack/tools/$1" && GOWORK=off CGO_ENABLED=0 go build -trimpath -o "${TOOLS}/$1" .) ||
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

# --- network namespace ---------------------------------------------------------------

setup_netns() {
  ip netns add "${NETNS}"
  ip link add "${HOST_IF}" type veth peer name "${NODE_IF}" netns "${NETNS}"
  ip addr add "${HOST_IP}/${NET_PREFIX}" dev "${HOST_IF}"
  ip link set "${HOST_IF}" up
  ip -n "${NETNS}" link set lo up
  ip -n "${NETNS}" addr add "${NODE_IP}/${NET_PREFIX}" dev "${NODE_IF}"
  ip -n "${NETNS}" link set "${NODE_IF}" up
  # For host-network processes in the netns, ClusterIPs need a route before
  # kube-proxy's DNAT applies; a packet no rule rewrites goes to the host,
  # which drops it (nothing is forwarded there). There is no default route:
  # pods reach the node (apiserver, PostgreSQL) and each other, nothing else.
  ip -n "${NETNS}" route add "${SERVICE_CIDR}" dev "${NODE_IF}"
}

# --- cgroups -------------------------------------------------------------------------

# v1_hierarchies [--unified]: the mounted cgroup v1 hierarchies (and, with
# --unified, the v2 one of a hybrid setup, where runc also creates cgroups).
v1_hierarchies() {
  local d
  for d in /sys/fs/cgroup/*/; do
    d="${d%/}"
    [[ -f "${d}/cgroup.procs" ]] || continue
    [[ "${d##*/}" == unified && "${1:-}" != --unified ]] && continue
    echo "${d}"
  done
}

setup_cgroups() {
  local h
  for h in $(v1_hierarchies); do
    mkdir -p "${h}/${CGROUP_ROOT}"
    if [[ -f "${h}/cpuset.cpus" ]]; then
      cat "${h}/cpuset.cpus" >"${h}/${CGROUP_ROOT}/cpuset.cpus"
      cat "${h}/cpuset.mems" >"${h}/${CGROUP_ROOT}/cpuset.mems"
    fi
  done
  mkdir -p "/sys/fs/cgroup/pids/${DAEMON_CGROUP}"
}

remove_cgroups() {
  local h d left=()
  for h in $(v1_hierarchies --unified); do
    for d in "${h}/${CGROUP_ROOT}" "${h}/${DAEMON_CGROUP}"; do
      [[ -d "${d}" ]] || continue
      # Deepest first; a cgroup directory goes with rmdir alone.
      find "${d}" -depth -type d -exec rmdir {} \; 2>/dev/null || true
      [[ -d "${d}" ]] && left+=("${d}")
    done
  done
  if ((${#left[@]} > 0)); then warn "cgroups still in use, not removed: ${left[*]}"; fi
}

# --- up --------------------------------------------------------------------------------

cluster_healthy() {
  local d
  for d in "${DAEMONS[@]}"; do
    daemon_pid "${d}" >/dev/null || return 1
  done
  kubectl_ get --raw /readyz >/dev/null 2>&1
}

cmd_up() {
  mkdir -p "${STATE}"
  if [[ -d "${RUN}" ]]; then
    k8s_bin_dir 2>/dev/null || true
    if [[ -n "${BIN_DIR:-}" ]] && cluster_healthy; then
      log "already up (hack/cluster.sh status; hack/cluster.sh down to stop)"
      print_usage_hint
      return 0
    fi
    die "${RUN} exists but the cluster is not healthy: run hack/cluster.sh down first"
  fi
  netns_exists && die "network namespace ${NETNS} exists but ${RUN} does not: remove it (ip netns delete ${NETNS}) or run hack/cluster.sh down"

  if [[ -d "${LOGS}" ]]; then
    rm -rf "${LOGS}.prev"
    mv "${LOGS}" "${LOGS}.prev"
  fi
  mkdir -p "${LOGS}"
  ensure_packages
  k8s_bin_dir
  local c missing=()
  for c in "${K8S_COMPONENTS[@]}"; do [[ -x "${BIN_DIR}/${c}" ]] || missing+=("${c}"); done
  if ((${#missing[@]} > 0)); then
    step "building ${missing[*]} from the Go module proxy (once; cached in ${BIN_DIR#"${ROOT}/"}; ~20 min on 2 cores from a cold Go cache)"
  else
    step "Kubernetes binaries: ${BIN_DIR#"${ROOT}/"} (cached)"
  fi
  k8s_bin_dir --build
  build_tool image
  build_tool pause
  build_tool registry

  # 0755 whatever the umask: user postgres must get through it.
  install -d -m 0755 "${RUN}"
  echo "${ROOT}" >"${RUN}/checkout"
  # From here on a failure (or Ctrl-C) tears down whatever was started.
  trap 'up_exit $?' EXIT
  trap 'exit 130' INT TERM
  save_host_state
  step "network namespace ${NETNS}: host ${HOST_IP} <-> node ${NODE_IP}"
  setup_netns
  setup_cgroups

  step "certificates and kubeconfigs"
  make_pki
  mkdir -p "${RUN}/cni/net.d" "${RUN}/pod-logs" "${RUN}/kubelet" "${RUN}/etcd" "${RUN}/apiserver"
  chmod 700 "${RUN}/etcd"
  : >"${RUN}/resolv.conf"
  render containerd.toml "${RUN}/containerd.toml"
  mkdir -p "${RUN}/containerd/certs.d/${REGISTRY}"
  render hosts.toml "${RUN}/containerd/certs.d/${REGISTRY}/hosts.toml"
  render cni.conflist "${RUN}/cni/net.d/10-runledger.conflist"
  render kubelet.yaml "${RUN}/kubelet.yaml"
  render kube-proxy.yaml "${RUN}/kube-proxy.yaml"

  # PostgreSQL (initdb is slow on a busy disk) comes up alongside the rest.
  start_postgres_fresh &
  PG_JOB=$!
  start_registry
  start_containerd
  start_control_plane
  start_node
  wait "${PG_JOB}" || die "PostgreSQL did not start; see ${LOGS}/postgres.log"
  PG_JOB=""

  local d
  for d in "${DAEMONS[@]}"; do
    daemon_pid "${d}" >/dev/null || die "${d} is not running; see ${LOGS}/${d}.log"
  done
  trap - EXIT INT TERM
  step "cluster up"
  print_usage_hint
}

up_exit() {
  trap - EXIT INT TERM
  [[ "$1" == 0 ]] && return 0
  if [[ -n "${PG_JOB:-}" ]]; then wait "${PG_JOB}" || true; fi
  log "up failed; last lines of the logs in ${LOGS}:"
  local f
  for f in "${LOGS}"/*.log; do
    [[ -f "${f}" ]] || continue
    echo "--- ${f##*/}" >&2
    tail -5 "${f}" >&2
  done
  if [[ "${KEEP_ON_FAILURE:-}" == 1 ]]; then
    log "KEEP_ON_FAILURE=1: left running; hack/cluster.sh down cleans up"
  else
    log "tearing down (set KEEP_ON_FAILURE=1 to keep it for debugging)"
    cmd_down || true
  fi
  exit "$1"
}

# The registry comes first: containerd pulls every image from it, the
# sandbox (pause) image too.
start_registry() {
  step "registry http://${REGISTRY}"
  start_daemon registry "${TOOLS}/registry" -addr "${REGISTRY}" -dir "${RUN}/registry"
  WATCH=registry wait_for "the registry" 30 curl -fsS "http://${REGISTRY}/v2/"
  local ref
  ref="$(push_image "${PAUSE_IMAGE#"${REGISTRY}/"}" "${TOOLS}/pause")"
  step "pause image ${ref}"
}

start_containerd() {
  step "containerd"
  start_daemon containerd containerd --config "${RUN}/containerd.toml"
  WATCH=containerd wait_for "containerd" 30 ctr_ version
}

start_control_plane() {
  local pki="${RUN}/pki"
  step "etcd"
  start_daemon etcd "${BIN_DIR}/etcd" --name "${NODE_NAME}" --data-dir "${RUN}/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster "${NODE_NAME}=http://127.0.0.1:2380" \
    --unsafe-no-fsync --log-level warn
  WATCH=etcd wait_for "etcd" 30 in_ns curl -fsS http://127.0.0.1:2379/health

  step "kube-apiserver https://${NODE_IP}:6443"
  start_daemon kube-apiserver "${BIN_DIR}/kube-apiserver" \
    --etcd-servers http://127.0.0.1:2379 \
    --advertise-address "${NODE_IP}" --bind-address 0.0.0.0 --secure-port 6443 \
    --cert-dir "${RUN}/apiserver" \
    --tls-cert-file "${pki}/apiserver.crt" --tls-private-key-file "${pki}/apiserver.key" \
    --client-ca-file "${pki}/ca.crt" \
    --kubelet-client-certificate "${pki}/apiserver-kubelet-client.crt" \
    --kubelet-client-key "${pki}/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "${pki}/sa.pub" --service-account-signing-key-file "${pki}/sa.key" \
    --service-cluster-ip-range "${SERVICE_CIDR}" \
    --authorization-mode Node,RBAC \
    --profiling=false
  WATCH=kube-apiserver wait_for "kube-apiserver /readyz" 120 kubectl_ get --raw /readyz

  step "kube-controller-manager, kube-scheduler"
  start_daemon kube-controller-manager "${BIN_DIR}/kube-controller-manager" \
    --kubeconfig "${RUN}/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --cert-dir "${RUN}/controller-manager" \
    --service-account-private-key-file "${pki}/sa.key" --root-ca-file "${pki}/ca.crt" \
    --use-service-account-credentials --service-cluster-ip-range "${SERVICE_CIDR}" \
    --flex-volume-plugin-dir "${RUN}/kcm-flexvolume" \
    --leader-elect=false --profiling=false
  start_daemon kube-scheduler "${BIN_DIR}/kube-scheduler" \
    --kubeconfig "${RUN}/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --cert-dir "${RUN}/scheduler" \
    --leader-elect=false --profiling=false
}

start_node() {
  step "kube-proxy (iptables mode, in the netns)"
  start_daemon kube-proxy "${BIN_DIR}/kube-proxy" --config "${RUN}/kube-proxy.yaml"
  step "kubelet"
  start_daemon kubelet "${BIN_DIR}/kubelet" --config "${RUN}/kubelet.yaml" \
    --kubeconfig "${RUN}/kubelet.kubeconfig" --root-dir "${RUN}/kubelet" \
    --hostname-override "${NODE_NAME}" --node-ip "${NODE_IP}"
  WATCH=kubelet wait_for "node ${NODE_NAME} to register" 60 kubectl_ get node "${NODE_NAME}"
  kubectl_ wait --for=condition=Ready "node/${NODE_NAME}" --timeout=90s >/dev/null
  step "node ${NODE_NAME} Ready"
  # What a pod needs before it can start: its namespace's default service
  # account, the CA bundle of its token volume, and the apiserver ClusterIP
  # programmed by kube-proxy.
  WATCH=kube-controller-manager wait_for "the default service account" 60 kubectl_ -n default get serviceaccount default
  WATCH=kube-controller-manager wait_for "the kube-root-ca.crt ConfigMap" 60 kubectl_ -n default get configmap kube-root-ca.crt
  WATCH=kube-proxy wait_for "kube-proxy rules for ${SERVICE_IP}" 60 \
    bash -c "nsenter --net=/run/netns/${NETNS} -- iptables -t nat -S KUBE-SERVICES | grep -q -- '-d ${SERVICE_IP}/32'"
  step "ready for pods"
}

# --- PostgreSQL --------------------------------------------------------------------------

start_postgres_fresh() {
  local pg pgdir="${RUN}/postgres"
  pg="$(pg_bin)"
  step "PostgreSQL $("${pg}/postgres" --version | awk '{print $3}') on ${NODE_IP}:${PG_PORT} (initdb; in the background)"
  mkdir -p "${pgdir}/data" "${pgdir}/run"
  chown -R postgres:postgres "${pgdir}"
  chmod 700 "${pgdir}/data"
  as_postgres test -w "${pgdir}/data" -a -w "${pgdir}/run" ||
    die "user postgres cannot reach ${pgdir}: every directory above it must be searchable by others"
  as_postgres "${pg}/initdb" -D "${pgdir}/data" -U postgres -E UTF8 --locale=C \
    --auth-local=peer --auth-host=reject --no-sync >>"${LOGS}/postgres.log" 2>&1
  # Password (scram) logins of the runledger role from pods and from the host,
  # over TCP to the node address only; local socket logins by peer.
  cat >>"${pgdir}/data/pg_hba.conf" <<EOF

# hack/cluster.sh: pods and the host (veth) log in as ${PG_USER} with a password.
host all ${PG_USER} ${POD_CIDR} scram-sha-256
host all ${PG_USER} ${HOST_IP}/32 scram-sha-256
host all ${PG_USER} ${NODE_IP}/32 scram-sha-256
EOF
  start_postgres
  local pw
  pw="$(head -c 18 /dev/urandom | base64 | tr '+/' 'xy')"
  as_postgres "${pg}/psql" -h "${pgdir}/run" -p "${PG_PORT}" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
    -v user="${PG_USER}" -v db="${PG_DB}" -v pw="${pw}" >>"${LOGS}/postgres.log" 2>&1 <<'EOF'
CREATE ROLE :"user" LOGIN CREATEDB PASSWORD :'pw';
CREATE DATABASE :"db" OWNER :"user";
EOF
  : >"${RUN}/postgres.dsn"
  chmod 600 "${RUN}/postgres.dsn"
  echo "postgres://${PG_USER}:${pw}@${NODE_IP}:${PG_PORT}/${PG_DB}?sslmode=disable" >"${RUN}/postgres.dsn"
  step "PostgreSQL ready: database ${PG_DB}, role ${PG_USER} (hack/cluster.sh dsn)"
}

start_postgres() {
  local pg pgdir="${RUN}/postgres"
  pg="$(pg_bin)"
  start_daemon postgres setpriv --reuid=postgres --regid=postgres --init-groups -- \
    "${pg}/postgres" -D "${pgdir}/data" -p "${PG_PORT}" \
    -c listen_addresses="${NODE_IP}" -c unix_socket_directories="${pgdir}/run" \
    -c max_connections=300 -c log_line_prefix='%m [%p] %q%u@%d ' -c logging_collector=off
  WATCH=postgres wait_for "PostgreSQL" 30 as_postgres "${pg}/pg_isready" -q -h "${pgdir}/run" -p "${PG_PORT}" -U postgres -d postgres
}

cmd_postgres() {
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  case "${1:-}" in
    stop) stop_daemon postgres INT 30 ;;
    start)
      daemon_pid postgres >/dev/null && die "PostgreSQL is running"
      start_postgres
      step "PostgreSQL started (pid $(daemon_pid postgres))"
      ;;
    restart)
      stop_daemon postgres INT 30
      start_postgres
      step "PostgreSQL started (pid $(daemon_pid postgres))"
      ;;
    *) usage ;;
  esac
}

# --- down --------------------------------------------------------------------------------

# Pods are stopped through the cluster while it still runs, so containerd
# tears down their sandboxes properly (network namespaces, veths, IPAM, mounts).
drain_pods() {
  daemon_pid kube-apiserver >/dev/null && daemon_pid kubelet >/dev/null && daemon_pid containerd >/dev/null ||
    return 0
  stop_daemon kube-controller-manager
  stop_daemon kube-scheduler
  kubectl_ delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  if wait_for "kubelet to stop every pod" 60 no_running_tasks; then
    step "all pods stopped"
  fi
}

no_running_tasks() { [[ -z "$(ctr_ tasks ls -q 2>/dev/null)" ]] && ! pod_netns_left; }

# pod_netns: the pod network namespaces containerd created (cni-*), not
# there before up.
pod_netns() {
  local f
  for f in /run/netns/cni-*; do
    [[ -e "${f}" ]] || continue
    grep -qx "${f##*/}" "${HOSTSAVE}/netns" 2>/dev/null && continue
    echo "${f##*/}"
  done
}
pod_netns_left() { [[ -n "$(pod_netns)" ]]; }

# Whatever kubelet did not stop: kill the tasks through containerd, delete
# the containers (and with them their sandboxes' state).
force_remove_containers() {
  daemon_pid containerd >/dev/null || return 0
  local ids id
  ids="$(ctr_ tasks ls -q 2>/dev/null || true)"
  for id in ${ids}; do
    ctr_ tasks kill -s SIGKILL "${id}" >/dev/null 2>&1 || true
  done
  for id in ${ids}; do
    ctr_ tasks delete -f "${id}" >/dev/null 2>&1 || true
  done
  if [[ -n "${ids}" ]]; then warn "killed $(wc -w <<<"${ids}") container tasks kubelet had not stopped"; fi
}

# umount_under DIR: every mount point below DIR, deepest first (lazily if busy).
umount_under() {
  local m
  awk -v d="$1" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | sort -r -u |
    while read -r m; do
      umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null || warn "cannot unmount ${m}"
    done
}

cmd_down() {
  mkdir -p "${STATE}"
  if [[ ! -d "${RUN}" ]] && ! netns_exists; then
    log "not up"
    return 0
  fi
  k8s_bin_dir
  step "stopping the cluster"
  drain_pods
  stop_daemon kube-controller-manager
  stop_daemon kube-scheduler
  stop_daemon kubelet
  force_remove_containers
  stop_daemon kube-proxy
  stop_daemon kube-apiserver
  stop_daemon etcd
  stop_daemon containerd
  stop_daemon registry
  stop_daemon postgres INT 30

  # Shims exit once their tasks are gone; whatever is still in our cgroup was
  # started by us (directly or by containerd): stop it by PID.
  local pid left
  for _ in $(seq 50); do
    [[ -z "$(cgroup_pids)" ]] && break
    sleep 0.1
  done
  left="$(cgroup_pids)"
  if [[ -n "${left}" ]]; then
    warn "processes left in our cgroup, stopping them: ${left//$'\n'/ }"
    for pid in ${left}; do
      echo "  ${pid}: $(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | cut -c1-120)" >&2
      kill -s TERM "${pid}" 2>/dev/null || true
    done
    sleep 2
    for pid in $(cgroup_pids); do kill -s KILL "${pid}" 2>/dev/null || true; done
    sleep 0.5
  fi

  step "unmounting and removing state"
  # Pod network namespaces kubelet did not get to tear down.
  local n
  for n in $(pod_netns); do
    warn "removing leftover pod network namespace ${n}"
    ip netns delete "${n}" 2>/dev/null || { umount -l "/run/netns/${n}" 2>/dev/null; rm -f "/run/netns/${n}"; } || true
  done
  umount_under "${RUN}"

  if netns_exists; then
    if ip netns delete "${NETNS}"; then
      step "deleted network namespace ${NETNS} (and the veth pair)"
    else
      warn "could not delete network namespace ${NETNS}"
    fi
  fi
  # Deleting the netns deletes the veth pair, asynchronously: maybe gone already.
  ip link delete "${HOST_IF}" >/dev/null 2>&1 || true

  remove_cgroups
  restore_sysctls

  # Host paths the cluster software created; only those absent before up.
  local p
  if [[ -f "${HOSTSAVE}/paths" ]]; then
    while read -r p; do
      [[ -n "${p}" && -e "${p}" ]] || continue
      rm -rf "${p}"
      step "removed ${p}"
    done <"${HOSTSAVE}/paths"
  fi
  # ip netns add bind-mounts /run/netns on itself (shared propagation); undo
  # that if it was not so before and no network namespace is left in it.
  if [[ -d /run/netns && -z "$(ls -A /run/netns)" ]]; then
    if [[ ! -e "${HOSTSAVE}/run-netns-mounted" ]]; then
      while mountpoint -q /run/netns; do umount /run/netns || break; done
    fi
    if [[ ! -s "${HOSTSAVE}/netns" && -e "${HOSTSAVE}/run-netns-absent" ]]; then
      rmdir /run/netns && step "removed /run/netns"
    fi
  fi

  # Every mount is gone, so this removes files only (never a filesystem below).
  if [[ -n "$(awk -v d="${RUN}" 'index($5, d) == 1' /proc/self/mountinfo)" ]]; then
    die "mounts remain under ${RUN}; not removing it"
  fi
  rm -rf --one-file-system "${RUN}"
  step "cluster down (logs kept in ${LOGS})"
}

# --- status, env, images, smoke -----------------------------------------------------------

cmd_status() {
  if [[ ! -d "${RUN}" ]]; then
    echo "not up"
    return 1
  fi
  k8s_bin_dir 2>/dev/null || true
  local d pid rc=0
  for d in "${DAEMONS[@]}"; do
    if pid="$(daemon_pid "${d}")"; then
      printf '  %-24s running  pid %s\n' "${d}" "${pid}"
    else
      printf '  %-24s STOPPED\n' "${d}"
      rc=1
    fi
  done
  echo "  state      ${RUN} (started from $(cat "${RUN}/checkout" 2>/dev/null || echo '?'))"
  echo "  apiserver  https://${NODE_IP}:6443   kubeconfig ${RUN}/admin.kubeconfig"
  echo "  postgres   ${NODE_IP}:${PG_PORT}   (hack/cluster.sh dsn)"
  echo "  registry   http://${REGISTRY}"
  if [[ -n "${BIN_DIR:-}" ]]; then
    kubectl_ get nodes -o wide 2>&1 | sed 's/^/  /' || rc=1
  fi
  return "${rc}"
}

print_usage_hint() {
  cat >&2 <<EOF

  export KUBECONFIG=${RUN}/admin.kubeconfig     # or: eval "\$(hack/cluster.sh env)"
  ${BIN_DIR}/kubectl get nodes
  PostgreSQL DSN (host and pods): hack/cluster.sh dsn
  Stop everything: hack/cluster.sh down
EOF
}

cmd_env() {
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  k8s_bin_dir 2>/dev/null
  echo "export KUBECONFIG='${RUN}/admin.kubeconfig'"
  # kubectl's discovery cache goes with the cluster, not into ~/.kube.
  echo "export KUBECACHEDIR='${RUN}/kube-cache'"
  echo "export RUNLEDGER_DATABASE_URL='$(cat "${RUN}/postgres.dsn")'"
  echo "export PATH='${BIN_DIR}':\"\${PATH}\""
}

cmd_push() {
  [[ $# -ge 2 ]] || usage
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  local ref="$1" bin="$2"
  shift 2
  [[ "${ref}" == *:* && "${ref}" != */* ]] || die "${ref}: want NAME:TAG (pushed to ${REGISTRY}/NAME:TAG)"
  [[ -f "${bin}" ]] || die "${bin}: no such file"
  if command -v file >/dev/null && file -b "${bin}" | grep -q 'dynamically linked'; then
    die "${bin} is dynamically linked; build it with CGO_ENABLED=0 (the image has no libc)"
  fi
  push_image "${ref}" "${bin}" "$@"
}

# apply-k DIR [--patch FILE]... [IMAGE=NEWIMAGE[:TAG|@DIGEST]]...: `kubectl
# apply -k` of DIR, the way users install, through a generated overlay that
# substitutes images (kustomize `images:`; the cluster pulls them from its
# registry) and adds the given kustomize patches (strategic merge patches).
cmd_apply_k() {
  [[ $# -ge 1 ]] || usage
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  k8s_bin_dir
  local dir="$1"
  shift
  local patches=() images=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --patch)
        [[ $# -ge 2 && -f "$2" ]] || die "--patch needs a file"
        patches+=("$2")
        shift 2
        ;;
      *=*) images+=("$1"); shift ;;
      *) die "bad argument ${1}: want --patch FILE or IMAGE=NEWIMAGE[:TAG|@DIGEST]" ;;
    esac
  done
  [[ -f "${dir}/kustomization.yaml" || -f "${dir}/kustomization.yml" || -f "${dir}/Kustomization" ]] ||
    die "${dir}: no kustomization"
  local overlay
  overlay="${RUN}/overlays/$(basename "$(realpath "${dir}")")"
  rm -rf "${overlay}"
  mkdir -p "${overlay}"
  local spec name new tag digest
  {
    echo "# Generated by hack/cluster.sh apply-k: ${dir} with the cluster's images."
    echo "apiVersion: kustomize.config.k8s.io/v1beta1"
    echo "kind: Kustomization"
    echo "resources:"
    echo "- $(realpath --relative-to="${overlay}" "${dir}")"
    if [[ ${#images[@]} -gt 0 ]]; then echo "images:"; fi
    for spec in ${images[@]+"${images[@]}"}; do
      name="${spec%%=*}"
      new="${spec#*=}"
      tag="" digest=""
      if [[ "${new}" == *@* ]]; then
        digest="${new#*@}"
        new="${new%%@*}"
      elif [[ "${new##*/}" == *:* ]]; then
        tag="${new##*:}"
        new="${new%:*}"
      fi
      echo "- name: ${name}"
      echo "  newName: ${new}"
      if [[ -n "${tag}" ]]; then echo "  newTag: \"${tag}\""; fi
      if [[ -n "${digest}" ]]; then echo "  digest: ${digest}"; fi
    done
    if [[ ${#patches[@]} -gt 0 ]]; then echo "patches:"; fi
    local i=0 p
    for p in ${patches[@]+"${patches[@]}"}; do
      i=$((i + 1))
      cp "${p}" "${overlay}/patch-${i}.yaml"
      echo "- path: patch-${i}.yaml"
    done
  } >"${overlay}/kustomization.yaml"
  step "kubectl apply -k ${overlay}"
  sed 's/^/    /' "${overlay}/kustomization.yaml" >&2
  kubectl_ apply -k "${overlay}"
}

# smoke: three pods from an image pushed to the registry: one prints and exits, one
# calls the apiserver through its ClusterIP with its service account token,
# one logs in to PostgreSQL with the DSN from a Secret. Each must reach
# Succeeded; their logs are shown.
cmd_smoke() {
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  k8s_bin_dir
  build_tool image
  build_tool smoke
  local ref
  ref="$(push_image "${SMOKE_IMAGE#"${REGISTRY}/"}" "${TOOLS}/smoke")"
  step "image ${ref}"
  local ns=runledger-smoke
  kubectl_ delete namespace "${ns}" --ignore-not-found --wait=true >/dev/null
  kubectl_ create namespace "${ns}" >/dev/null
  wait_for "the default service account in ${ns}" 30 kubectl_ -n "${ns}" get serviceaccount default
  kubectl_ -n "${ns}" create secret generic db --from-literal=url="$(cat "${RUN}/postgres.dsn")" >/dev/null
  local probe
  for probe in hello apiserver postgres; do
    kubectl_ -n "${ns}" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: ${probe}
spec:
  restartPolicy: Never
  containers:
  - name: probe
    image: ${SMOKE_IMAGE}
    imagePullPolicy: Always
    args: [${probe}]
    env:
    - name: DATABASE_URL
      valueFrom: {secretKeyRef: {name: db, key: url}}
    securityContext:
      runAsNonRoot: true
      readOnlyRootFilesystem: true
      allowPrivilegeEscalation: false
      capabilities: {drop: [ALL]}
      seccompProfile: {type: RuntimeDefault}
EOF
  done
  step "pods created"
  local ok=0
  for probe in hello apiserver postgres; do
    if kubectl_ -n "${ns}" wait --for=jsonpath='{.status.phase}'=Succeeded "pod/${probe}" --timeout=60s >/dev/null; then
      step "pod ${probe}: Succeeded"
    else
      step "pod ${probe}: $(kubectl_ -n "${ns}" get pod "${probe}" -o jsonpath='{.status.phase}')"
      kubectl_ -n "${ns}" describe pod "${probe}" | tail -15 >&2
      ok=1
    fi
    { kubectl_ -n "${ns}" logs "${probe}" 2>&1 || true; } | sed 's/^/    /' >&2
  done
  kubectl_ delete namespace "${ns}" --wait=false >/dev/null
  if ((ok != 0)); then die "smoke test failed"; fi
  step "smoke test passed"
}

# --- main ------------------------------------------------------------------------------------

main() {
  [[ $# -ge 1 ]] || usage
  local cmd="$1"
  shift
  case "${cmd}" in
    -h | --help | help) usage 0 ;;
    kubeconfig) echo "${RUN}/admin.kubeconfig"; return 0 ;;
    state-dir) echo "${RUN}"; return 0 ;;
    dsn) cat "${RUN}/postgres.dsn" 2>/dev/null || die "the cluster is not up"; return 0 ;;
    registry) echo "${REGISTRY}"; return 0 ;;
  esac
  [[ "$(id -u)" == 0 ]] || die "must run as root (network namespaces, mounts, cgroups)"
  mkdir -p "${STATE}"
  # One command at a time.
  exec 9>"${STATE}/lock"
  flock -n 9 || { log "another hack/cluster.sh is running; waiting"; flock 9; }
  case "${cmd}" in
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    status) cmd_status "$@" ;;
    env) cmd_env "$@" ;;
    push) cmd_push "$@" ;;
    postgres) cmd_postgres "$@" ;;
    smoke) cmd_smoke "$@" ;;
    apply-k) cmd_apply_k "$@" ;;
    *) log "unknown command: ${cmd}"; usage ;;
  esac
}

# Sourcing the script (for debugging: `source hack/cluster.sh`) defines the
# functions without running anything.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
