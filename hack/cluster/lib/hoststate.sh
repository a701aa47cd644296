# shellcheck shell=bash
# Sourced by hack/cluster.sh: the host's state, saved at up and restored at down.

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

