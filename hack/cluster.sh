#!/usr/bin/env bash
# A real Kubernetes cluster of one or more nodes on this machine, for
# `make demo` (one node) and `make e2e` (two): no Docker, no systemd; images come from the cluster's own OCI
# registry, as they come from a registry in any cluster.
#
# Usage: hack/cluster.sh COMMAND [ARGS]
#
#   up [--nodes N]      start the cluster with N nodes (default 1, or
#                       RUNLEDGER_CLUSTER_NODES; idempotent: reuses a
#                       healthy one)
#   down                stop it and leave the host as it was found
#   status              what runs, node state, addresses
#   state-dir           print the directory of the cluster's state
#   kubeconfig          print the admin kubeconfig path:
#                         export KUBECONFIG="$(hack/cluster.sh kubeconfig)"
#   env                 print shell exports (KUBECONFIG, KUBECACHEDIR, PATH,
#                       RUNLEDGER_DATABASE_URL):
#                         eval "$(hack/cluster.sh env)"
#   dsn                 print the PostgreSQL DSN, valid from the host and pods
#                       (sslmode=disable; PostgreSQL also serves TLS)
#   pg-ca               print the path of the CA of PostgreSQL's TLS
#                       certificate (a CA of its own; the certificate names
#                       ${NODE_IP}): sslmode=verify-full&sslrootcert=...
#   s3-env              print what an S3 client of the cluster's object store
#                       (SeaweedFS, valid from the host and pods) needs, as
#                       KEY=VALUE lines: S3_ENDPOINT (https://${CP_IP}:8333,
#                       path-style), S3_REGION, S3_ACCESS_KEY_ID,
#                       S3_SECRET_ACCESS_KEY, S3_CA_FILE (the path of the CA
#                       of its certificate, a CA of its own)
#   s3 stop|start       stop (SIGKILL) / start the object store on its data
#                       (tests of outages)
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
#   postgres stop|start|restart [--immediate]
#                       stop/start the cluster's PostgreSQL (tests of outages;
#                       restart --immediate: an immediate shutdown, crash
#                       recovery on start)
#   ha up|down|state|diag|dsn|failover [--crash [--hold-wal MS]]|sync on|off|restart [--immediate]
#                       an HA PostgreSQL run by pg_auto_failover (installed
#                       from Debian if missing): a monitor and two nodes on
#                       ${CP_IP}:5433/5434 (hack/cluster/lib/ha.sh); state: each
#                       node's name, port, reported and assigned state;
#                       diag: each node's postmaster status, processes and
#                       what its server logged last of each;
#                       failover: `pg_autoctl perform failover`, or with
#                       --crash a crash of the primary's machine: its keeper
#                       frozen, its postmaster kill -9, back fenced from
#                       clients once the standby is promoted (after
#                       --hold-wal: the standby's WAL held MS milliseconds
#                       first, a network hiccup, until it is promoted), then
#                       waits until the old primary follows the new one and
#                       prints the new one; sync on|off: synchronous
#                       replication (the default) or asynchronous; restart:
#                       the primary's PostgreSQL shut down fast (or
#                       immediately), started again by its keeper or failed
#                       over, prints the primary ("-": none; after a
#                       failover once the old primary has demoted: a fast
#                       shutdown that has not ended in 30s is made immediate,
#                       and a second line says "stopped-immediately"); dsn:
#                       the DSN naming both nodes
#                       (target_session_attrs=read-write)
#   smoke               run pods that show the cluster works: a local image
#                       runs, pods reach the apiserver ClusterIP and PostgreSQL
#   node-env NAME       print what a test needs to power node NAME off or
#                       partition it (test/e2e's node helper)
#   node-start NAME     power node NAME on again: its daemons start on the
#                       state they left, as after a reboot
#
# Everything runs as root inside network namespaces this script creates. The
# control plane, PostgreSQL, the object store and the registry run in
# ${CP_NETNS}, joined to the host by a veth pair: the host is ${HOST_IP}, the
# control plane ${CP_IP}. The apiserver (https://${CP_IP}:6443), PostgreSQL
# (${CP_IP}:5432), the object store's S3 API (SeaweedFS, https://${CP_IP}:8333;
# hack/cluster/lib/s3.sh) and the registry (http://${REGISTRY}) listen there,
# reachable from the host and from every node and pod. Node K (runledger-K: its own netns, containerd, kubelet,
# kube-proxy and kube-network-policies) is 10.250.K.2, joined to ${CP_NETNS}
# by a veth pair; its pods get 10.244.K.0/24, routed through ${CP_NETNS} to
# every other node. NetworkPolicy is enforced (hack/cluster/lib/netpol.sh).
# Nothing listens on or targets the host's other interfaces. Services get
# ${SERVICE_CIDR}; there is no cluster DNS.
#
# State (etcd, containerd, kubelet, PostgreSQL, object store, registry, certificates) lives in
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
# Debian packages, installed if missing; SeaweedFS' weed is make weed's
# (bin/weed-VERSION); certificates and kubeconfigs come from hack/tools/pki.
#
# This file parses the command; the work is in hack/cluster/lib/*.sh, one
# concern each, sourced below; the config templates are in hack/cluster/.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' |
    sed -e "s|\${CP_NETNS}|${CP_NETNS}|g; s|\${HOST_IP}|${HOST_IP}|; s|\${CP_IP}|${CP_IP}|g" \
      -e "s|\${SERVICE_CIDR}|${SERVICE_CIDR}|; s|\${RUN}|${RUN}|" \
      -e "s|\${REGISTRY}|${REGISTRY}|g" >&2
  exit "${1:-2}"
}

LIB="${ROOT}/hack/cluster/lib"
# shellcheck source=hack/cluster/lib/common.sh
source "${LIB}/common.sh"
# shellcheck source=hack/cluster/lib/daemons.sh
source "${LIB}/daemons.sh"
# shellcheck source=hack/cluster/lib/hoststate.sh
source "${LIB}/hoststate.sh"
# shellcheck source=hack/cluster/lib/pki.sh
source "${LIB}/pki.sh"
# shellcheck source=hack/cluster/lib/tools.sh
source "${LIB}/tools.sh"
# shellcheck source=hack/cluster/lib/netns.sh
source "${LIB}/netns.sh"
# shellcheck source=hack/cluster/lib/postgres.sh
source "${LIB}/postgres.sh"
# shellcheck source=hack/cluster/lib/ha.sh
source "${LIB}/ha.sh"
# shellcheck source=hack/cluster/lib/s3.sh
source "${LIB}/s3.sh"
# shellcheck source=hack/cluster/lib/netpol.sh
source "${LIB}/netpol.sh"
# shellcheck source=hack/cluster/lib/up.sh
source "${LIB}/up.sh"
# shellcheck source=hack/cluster/lib/down.sh
source "${LIB}/down.sh"
# shellcheck source=hack/cluster/lib/commands.sh
source "${LIB}/commands.sh"

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
    pg-ca) [[ -f "${RUN}/pki/postgres-ca.crt" ]] || die "the cluster is not up"; echo "${RUN}/pki/postgres-ca.crt"; return 0 ;;
    s3-env) cat "${RUN}/s3/env" 2>/dev/null || die "the cluster is not up (or was started without the object store)"; return 0 ;;
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
    ha) cmd_ha "$@" ;;
    s3) cmd_s3 "$@" ;;
    smoke) cmd_smoke "$@" ;;
    apply-k) cmd_apply_k "$@" ;;
    node-env) cmd_node_env "$@" ;;
    node-start) cmd_node_start "$@" ;;
    *) log "unknown command: ${cmd}"; usage ;;
  esac
}

# Sourcing the script (for debugging: `source hack/cluster.sh`) defines the
# functions without running anything.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
