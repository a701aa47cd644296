#!/usr/bin/env bash
# Did the local cluster leave the host as it found it?
#
# Usage: hack/host-check.sh snapshot FILE    record the host's state in FILE
#        hack/host-check.sh compare FILE     compare the host now with FILE;
#                                            exit 1 if something was left behind
#        hack/host-check.sh show             print the state (for debugging)
#
# What is compared (each a section of FILE):
#   processes  cluster processes (containerd and its shims, runc, kubelet,
#              kube-proxy, kube-network-policies, kube-scheduler, kube-controller-manager,
#              etcd/kube-apiserver/postgres/registry of the cluster's state
#              directory) and
#              any process in a network namespace other than the host's
#              (pods, the cluster's daemons); only processes that did not
#              exist at the snapshot (PID and start time) count as left over,
#              so other people's work on this machine is never blamed
#   mounts     mount points, file system types and sources
#   netns      named network namespaces (/run/netns)
#   links      network interfaces, addresses and routes
#   iptables   iptables and ip6tables rules of every table (no counters)
#   sysctls    every sysctl except the ones that move on their own
#   cgroups    top-level cgroups of every hierarchy
#   paths      the host paths container software creates (/run/containerd,
#              /var/lib/kubelet, ...) and the cluster's state directory
#
# hack/e2e.sh takes a snapshot before `hack/cluster.sh up` and compares after
# `hack/cluster.sh down`. Read-only: it never changes anything.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)"

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit "${1:-2}"
}

# Sysctls whose values change by themselves (counters, random values).
VOLATILE_SYSCTLS='^(fs\.(dentry-state|file-nr|inode-nr|inode-state|aio-nr|quota\.)|kernel\.(ns_last_pid|random\.|pty\.nr)|net\.netfilter\.nf_conntrack_count|kernel\.sched_domain)'

# The cluster's state directory (/var/lib/runledger-cluster), which `down` removes.
CLUSTER_STATE="$("${ROOT}/hack/cluster.sh" state-dir)"

# Host paths that container software (containerd, kubelet, CNI plugins)
# creates; hack/cluster.sh must remove those it created.
HOST_PATHS=(/run/containerd /var/lib/containerd /run/runc /var/lib/kubelet /var/lib/cni /etc/cni /opt/cni
  /var/log/containers /var/log/pods /run/netns /run/flannel "${CLUSTER_STATE}")

# Names (comm, 15 characters at most) of processes that only the cluster
# runs; the cluster's registry (bin/cluster-tools/registry) is known by its
# -dir under the state directory and its network namespace. (Pods, the runledger manager and workers among them, run in network
# namespaces of their own; `runledger run` and envtest's kube-apiserver and
# etcd, which other work on this machine runs, are not the cluster's.)
CLUSTER_COMMS='^(containerd|containerd-shim.*|runc|runc:.*|kubelet|kube-proxy|kube-network-po|kube-scheduler|kube-controller)$'

host_netns="$(readlink /proc/1/ns/net 2>/dev/null || true)"

# processes: "PID START COMM CMDLINE" of the processes that belong to a
# cluster, one a line.
processes() {
  local d pid stat start comm cmd ns
  for d in /proc/[0-9]*; do
    pid="${d#/proc/}"
    [[ "${pid}" == "$$" || "${pid}" == "${BASHPID}" ]] && continue
    stat="$(cat "${d}/stat" 2>/dev/null)" || continue
    comm="${stat#*(}"
    comm="${comm%)*}"
    start="$(awk '{ sub(/^.*\) /, ""); print $20 }' <<<"${stat}")"
    cmd="$({ tr '\0' ' ' <"${d}/cmdline"; } 2>/dev/null | cut -c1-160)" || continue
    [[ -n "${cmd}" ]] || continue # kernel threads, and zombies (exited; their parent reaps them)
    ns="$(readlink "${d}/ns/net" 2>/dev/null || true)"
    if [[ "${comm}" =~ ${CLUSTER_COMMS} || "${cmd}" == *"${CLUSTER_STATE}/"* ||
      (-n "${ns}" && -n "${host_netns}" && "${ns}" != "${host_netns}") ]]; then
      printf '%s %s %s %s\n' "${pid}" "${start}" "${comm}" "${cmd}"
    fi
  done
}

state() {
  echo "## processes"
  processes
  echo "## mounts"
  # mount point, fs type, source (field 5, and the two after " - ").
  awk '{ for (i = 7; i <= NF; i++) if ($i == "-") break; print $5, $(i + 1), $(i + 2) }' /proc/self/mountinfo | sort
  echo "## netns"
  find /run/netns -mindepth 1 -maxdepth 1 -printf '%f\n' 2>/dev/null | sort || true
  echo "## links"
  ip -o link show 2>/dev/null | awk '{ sub(/@.*/, "", $2); print "link", $2 }' | sort
  ip -o addr show 2>/dev/null | awk '{ print "addr", $2, $3, $4 }' | sort
  ip route show table all 2>/dev/null | sed 's/^/route /' | sort
  echo "## iptables"
  local t
  for t in iptables-save ip6tables-save; do
    command -v "${t}" >/dev/null || continue
    "${t}" 2>/dev/null | grep -v '^#' | sed -E 's/ \[[0-9]+:[0-9]+\]$//; s/^(:[^ ]+ [^ ]+).*/\1/' | sed "s/^/${t%-save} /" || true
  done
  echo "## sysctls"
  sysctl -a 2>/dev/null | grep -Ev "${VOLATILE_SYSCTLS}" | sort || true
  echo "## cgroups"
  local h
  for h in /sys/fs/cgroup/*/; do
    find "${h}" -mindepth 1 -maxdepth 1 -type d 2>/dev/null | sort
  done
  echo "## paths"
  local p
  for p in "${HOST_PATHS[@]}"; do
    if [[ -e "${p}" ]]; then echo "present ${p}"; fi
  done
}

# section FILE NAME: the lines of one section.
section() { awk -v s="## $2" '/^## / { on = ($0 == s); next } on' "$1"; }

compare() {
  local before="$1"
  [[ -f "${before}" ]] || { echo "host-check: no snapshot ${before}" >&2; exit 2; }
  NOW="$(mktemp)"
  trap 'rm -f "${NOW}"' EXIT
  state >"${NOW}"
  local now="${NOW}" bad=0 s d
  # Processes: only new ones (PID and start time not in the snapshot).
  d="$(awk 'NR == FNR { seen[$1 " " $2] = 1; next } !(($1 " " $2) in seen)' \
    <(section "${before}" processes) <(section "${now}" processes))"
  if [[ -n "${d}" ]]; then
    echo "host-check: processes left behind (PID START COMM CMDLINE):" >&2
    printf '%s\n' "${d}" | sed 's/^/  /' >&2
    bad=1
  fi
  for s in mounts netns links iptables sysctls cgroups paths; do
    d="$(diff <(section "${before}" "${s}") <(section "${now}" "${s}") | grep '^[<>]' || true)"
    if [[ -n "${d}" ]]; then
      echo "host-check: ${s} differ (< before, > now):" >&2
      printf '%s\n' "${d}" | sed 's/^/  /' >&2
      bad=1
    fi
  done
  if ((bad)); then
    echo "host-check: FAILED: the host is not as it was found" >&2
    return 1
  fi
  echo "host-check: OK: no process, mount, network namespace, interface, iptables rule, sysctl, cgroup or path left behind" >&2
}

main() {
  [[ $# -ge 1 ]] || usage
  case "$1" in
    snapshot) [[ $# -eq 2 ]] || usage; state >"$2" ;;
    compare) [[ $# -eq 2 ]] || usage; compare "$2" ;;
    show) state ;;
    -h | --help | help) usage 0 ;;
    *) usage ;;
  esac
}

main "$@"
