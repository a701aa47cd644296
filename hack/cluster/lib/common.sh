# shellcheck shell=bash
# shellcheck disable=SC2034 # settings read by the other parts
# Sourced by hack/cluster.sh: settings, output and small helpers shared by every part.

# ROOT: the checkout, set by hack/cluster.sh.
CONF="${ROOT}/hack/cluster"
STATE="${ROOT}/.cluster" # this checkout's: logs and the lock
RUN=/var/lib/runledger-cluster
LOGS="${RUNLEDGER_CLUSTER_LOGS:-${STATE}/logs}"
PIDS="${RUN}/pids"
HOSTSAVE="${RUN}/host" # what the host looked like before `up`

# The control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler), PostgreSQL and the registry run in network namespace
# CP_NETNS at CP_IP, joined to the host (HOST_IP) by a veth pair.
CP_NETNS=runledger
HOST_IF=rl-host
CP_IF=rl-cp
HOST_IP=10.250.0.1
CP_IP=10.250.0.2
NET_PREFIX=30
# Nodes: `up --nodes N` (or RUNLEDGER_CLUSTER_NODES=N); later commands read
# ${RUN}/node-count. Node K is named runledger-K and has a network namespace of
# that name, joined to the control plane's by a veth pair (node_* below), with
# its own containerd, kubelet, kube-proxy and kube-network-policies.
NODES="${RUNLEDGER_CLUSTER_NODES:-1}"
MAX_NODES=8
CLUSTER_POD_CIDR=10.244.0.0/16 # node K's pods: 10.244.K.0/24
NODE_UPLINK=rl-up              # a node's end of its veth pair, in its netns
SERVICE_CIDR=10.96.0.0/16
SERVICE_IP=10.96.0.1 # the apiserver's ClusterIP, first of SERVICE_CIDR
PG_PORT=5432
PG_USER=runledger
PG_DB=runledger
# The S3-compatible store (SeaweedFS, hack/cluster/lib/s3.sh): HTTPS on
# CP_IP:S3_PORT, SeaweedFS' usual S3 port.
S3_PORT=8333
S3_REGION=us-east-1

IMAGE_LAYOUTS="${ROOT}/bin/images" # OCI layouts of the images pushed by push_image
TOOLS="${ROOT}/bin/cluster-tools"
REGISTRY="${CP_IP}:5000"
PAUSE_IMAGE="${REGISTRY}/pause:dev"
SMOKE_IMAGE="${REGISTRY}/smoke:dev"

CGROUP_ROOT=runledger              # pods: node N's kubelet's cgroupRoot is /runledger/N, in every v1 hierarchy
DAEMON_CGROUP=runledger-daemons    # pids hierarchy: every daemon and shim (a node's in a child cgroup), to prove none is left
K8S_COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)
CP_DAEMONS=(registry postgres seaweedfs etcd kube-apiserver kube-controller-manager kube-scheduler)
NODE_DAEMONS=(containerd kube-proxy kube-network-policies kubelet) # each node's, named DAEMON-NODE

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

# --- small helpers ---------------------------------------------------------------

# in_ns NETNS COMMAND...: run COMMAND in a network namespace.
in_ns() {
  local ns="$1"
  shift
  nsenter --net="/run/netns/${ns}" -- "$@"
}
netns_exists() { [[ -e "/run/netns/$1" ]]; }
# The script's own kubectl calls keep their discovery cache in the state
# directory, not in ~/.kube.
kubectl_() { "${BIN_DIR}/kubectl" --kubeconfig "${RUN}/admin.kubeconfig" --cache-dir "${RUN}/kube-cache" "$@"; }
# ctr_ K ARGS...: ctr against node K's containerd.
ctr_() {
  local k="$1"
  shift
  ctr --address "$(node_dir "${k}")/containerd/containerd.sock" --namespace k8s.io "$@"
}
as_postgres() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }

# --- nodes -------------------------------------------------------------------------

# node_count: how many nodes the cluster has (or `up` is about to start).
node_count() {
  if [[ -f "${RUN}/node-count" ]]; then cat "${RUN}/node-count"; else echo "${NODES}"; fi
}
node_name() { echo "runledger-$1"; }
node_ip() { echo "10.250.$1.2"; }
node_gateway() { echo "10.250.$1.1"; } # the control plane's end of the node's veth pair
node_link() { echo "rl-n$1"; }          # ... and its name, in CP_NETNS
node_pod_cidr() { echo "10.244.$1.0/24"; }
node_dir() { echo "${RUN}/nodes/$(node_name "$1")"; }
# node_index NAME: K of node runledger-K, or fail.
node_index() {
  local k="${1#runledger-}"
  [[ "$1" == runledger-* && "${k}" =~ ^[1-9][0-9]*$ ]] && ((k <= $(node_count))) || return 1
  echo "${k}"
}
# all_daemons: the control plane's daemons, then every node's.
all_daemons() {
  local k d
  printf '%s\n' "${CP_DAEMONS[@]}"
  for k in $(seq "$(node_count)"); do
    for d in "${NODE_DAEMONS[@]}"; do echo "${d}-$(node_name "${k}")"; done
  done
}

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

# render TEMPLATE OUT [K]: fill in @WORDS@ of a hack/cluster/ template, with
# node K's values.
render() {
  local k="${3:-1}"
  sed -e "s|@RUN@|${RUN}|g" -e "s|@NODE_DIR@|$(node_dir "${k}")|g" \
    -e "s|@NODE_IP@|$(node_ip "${k}")|g" -e "s|@NODE_NAME@|$(node_name "${k}")|g" \
    -e "s|@POD_CIDR@|$(node_pod_cidr "${k}")|g" -e "s|@CLUSTER_POD_CIDR@|${CLUSTER_POD_CIDR}|g" \
    -e "s|@CGROUP_ROOT@|/${CGROUP_ROOT}/$(node_name "${k}")|g" \
    -e "s|@PAUSE_IMAGE@|${PAUSE_IMAGE}|g" -e "s|@REGISTRY@|${REGISTRY}|g" \
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

