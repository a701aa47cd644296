# shellcheck shell=bash
# Sourced by hack/cluster.sh: daemons started into DAEMON_CGROUP, recorded by PID; the cgroups.

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

# start_daemon NAME COMMAND...: a control plane daemon (start_daemon_in).
start_daemon() { start_daemon_in "${CP_NETNS}" "${DAEMON_CGROUP}" "$@"; }

# start_node_daemon K DAEMON COMMAND...: node K's DAEMON, named DAEMON-NODE,
# in the node's netns and its own cgroup (what its power loss kills).
start_node_daemon() {
  local k="$1" d="$2"
  shift 2
  start_daemon_in "$(node_name "${k}")" "${DAEMON_CGROUP}/$(node_name "${k}")" "${d}-$(node_name "${k}")" "$@"
}

# start_daemon_in NETNS CGROUP NAME COMMAND...: run COMMAND in network
# namespace NETNS and pids cgroup CGROUP, in its own session, logging to
# .cluster/logs/NAME.log; record its PID.
start_daemon_in() {
  local netns="$1" cgroup="$2" name="$3"
  shift 3
  mkdir -p "${PIDS}" "${LOGS}" "/sys/fs/cgroup/pids/${cgroup}"
  (
    exec 9>&- # the lock (see main) must not outlive this script
    echo "${BASHPID}" >"/sys/fs/cgroup/pids/${cgroup}/cgroup.procs"
    # setsid and nsenter exec (this subshell is no process group leader, so
    # setsid does not fork): the PID stays the daemon's.
    exec setsid nsenter --net="/run/netns/${netns}" -- "$@"
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

# The processes in DAEMON_CGROUP and below: daemons we started, and what they
# started outside any pod (containerd shims).
cgroup_pids() {
  find "/sys/fs/cgroup/pids/${DAEMON_CGROUP}" -name cgroup.procs -exec cat {} + 2>/dev/null || true
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

# setup_cgroups: CGROUP_ROOT and one child per node (each kubelet's
# cgroupRoot: a kubelet removes pod cgroups it does not know) in every v1
# hierarchy; DAEMON_CGROUP and one child per node in the pids hierarchy.
setup_cgroups() {
  local h k c
  for h in $(v1_hierarchies); do
    for c in "${h}/${CGROUP_ROOT}" $(for k in $(seq "$(node_count)"); do echo "${h}/${CGROUP_ROOT}/$(node_name "${k}")"; done); do
      mkdir -p "${c}"
      if [[ -f "${h}/cpuset.cpus" ]]; then
        cat "${h}/cpuset.cpus" >"${c}/cpuset.cpus"
        cat "${h}/cpuset.mems" >"${c}/cpuset.mems"
      fi
    done
  done
  for k in $(seq "$(node_count)"); do mkdir -p "/sys/fs/cgroup/pids/${DAEMON_CGROUP}/$(node_name "${k}")"; done
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

