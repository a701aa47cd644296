# shellcheck shell=bash
# Sourced by hack/cluster.sh: down: stop everything, leave the host as found.

# --- down --------------------------------------------------------------------------------

# Pods are stopped through the cluster while it still runs, so containerd
# tears down their sandboxes properly (network namespaces, veths, IPAM, mounts).
drain_pods() {
  daemon_pid kube-apiserver >/dev/null || return 0
  local k name up=()
  for k in $(seq "$(node_count)"); do
    name="$(node_name "${k}")"
    if daemon_pid "kubelet-${name}" >/dev/null && daemon_pid "containerd-${name}" >/dev/null; then up+=("${k}"); fi
  done
  ((${#up[@]} > 0)) || return 0
  stop_daemon kube-controller-manager
  stop_daemon kube-scheduler
  kubectl_ delete pods --all --all-namespaces --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
  # A node powered off (test/e2e) leaves its pods' network namespaces to
  # the cleanup below.
  if wait_for "the kubelets to stop every pod" 60 no_running_tasks "$((${#up[@]} == $(node_count)))" "${up[@]}"; then
    step "all pods stopped"
  fi
}

# no_running_tasks ALL K...: no container task runs on nodes K...; with ALL
# 1 (every node up), no pod network namespace is left either.
no_running_tasks() {
  local all="$1" k
  shift
  for k in "$@"; do
    [[ -z "$(ctr_ "${k}" tasks ls -q 2>/dev/null)" ]] || return 1
  done
  [[ "${all}" != 1 ]] || ! pod_netns_left
}

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
# force_remove_containers K: on node K.
force_remove_containers() {
  local k="$1"
  daemon_pid "containerd-$(node_name "${k}")" >/dev/null || return 0
  local ids id
  ids="$(ctr_ "${k}" tasks ls -q 2>/dev/null || true)"
  for id in ${ids}; do
    ctr_ "${k}" tasks kill -s SIGKILL "${id}" >/dev/null 2>&1 || true
  done
  for id in ${ids}; do
    ctr_ "${k}" tasks delete -f "${id}" >/dev/null 2>&1 || true
  done
  if [[ -n "${ids}" ]]; then warn "killed $(wc -w <<<"${ids}") container tasks the kubelet of $(node_name "${k}") had not stopped"; fi
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
  local k ns nss=()
  for ns in "${CP_NETNS}" $(for k in $(seq "${MAX_NODES}"); do node_name "${k}"; done); do
    if netns_exists "${ns}"; then nss+=("${ns}"); fi
  done
  if [[ ! -d "${RUN}" ]] && ((${#nss[@]} == 0)); then
    log "not up"
    return 0
  fi
  k8s_bin_dir
  step "stopping the cluster"
  drain_pods
  stop_daemon kube-controller-manager
  stop_daemon kube-scheduler
  for k in $(seq "$(node_count)"); do
    stop_daemon "kubelet-$(node_name "${k}")"
    force_remove_containers "${k}"
    stop_daemon "kube-proxy-$(node_name "${k}")"
    stop_daemon "kube-network-policies-$(node_name "${k}")"
  done
  stop_daemon kube-apiserver
  stop_daemon etcd
  for k in $(seq "$(node_count)"); do stop_daemon "containerd-$(node_name "${k}")"; done
  stop_daemon registry
  ha_down
  stop_daemon postgres INT 30
  # Its data goes with the state directory: no graceful stop (15-25 s).
  stop_daemon seaweedfs KILL 10

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

  for ns in "${nss[@]}"; do
    if ip netns delete "${ns}"; then
      step "deleted network namespace ${ns} (and its veth pairs)"
    else
      warn "could not delete network namespace ${ns}"
    fi
  done
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

