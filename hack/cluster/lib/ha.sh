# shellcheck shell=bash
# Sourced by hack/cluster.sh: an HA PostgreSQL next to the cluster's own, run
# by a real failover manager, pg_auto_failover (Debian's
# postgresql-NN-auto-failover and pg-auto-failover-cli): a monitor (itself a
# PostgreSQL) and two data nodes, a primary and its streaming standby, each
# kept by `pg_autoctl run`. Everything listens on ${CP_IP} in ${CP_NETNS},
# reachable from the host and pods like the cluster's PostgreSQL; the state
# lives in ${RUN}/ha (removed by `ha down` and by `down`).
#
# Why pg_auto_failover rather than Patroni: one Debian package, no etcd to
# run beside it (its monitor is a PostgreSQL), and `pg_autoctl perform
# failover` for a planned failover.

HA_DIR="${RUN}/ha"
HA_MONITOR_PORT=5435
HA_NODES=(node1 node2)
declare -A HA_PORT=([node1]=5433 [node2]=5434)

# What pg_autoctl reads from its environment: its config, state and runtime
# files, and the sockets, under HA_DIR (never the postgres user's home, /tmp
# or /run/postgresql: the host is left as found).
HA_ENV=(env "HOME=${HA_DIR}" "XDG_CONFIG_HOME=${HA_DIR}/config" "XDG_DATA_HOME=${HA_DIR}/share"
  "XDG_RUNTIME_DIR=${HA_DIR}/rt" "PG_REGRESS_SOCK_DIR=${HA_DIR}/sock" "PGHOST=${HA_DIR}/sock")
AS_POSTGRES=(setpriv --reuid=postgres --regid=postgres --init-groups --)

# as_ha COMMAND...: COMMAND as user postgres in CP_NETNS, with HA_ENV.
as_ha() { in_ns "${CP_NETNS}" "${AS_POSTGRES[@]}" "${HA_ENV[@]}" "$@"; }

# ha_sql PORT SQL [DB]: one statement as postgres on a server of the HA set
# (by its socket), unaligned output.
ha_sql() {
  as_ha "$(pg_bin)/psql" -X -q -At -v ON_ERROR_STOP=1 -p "$1" -d "${3:-postgres}" -c "$2"
}
ha_monitor_sql() { ha_sql "${HA_MONITOR_PORT}" "$1" pg_auto_failover; }

# ha_install: pg_auto_failover for the installed PostgreSQL, from Debian.
ha_install() {
  local major
  major="$("$(pg_bin)/postgres" --version | awk '{print $3}' | cut -d. -f1)"
  if command -v pg_autoctl >/dev/null && [[ -f "/usr/share/postgresql/${major}/extension/pgautofailover.control" ]]; then
    return 0
  fi
  step "installing pg_auto_failover (postgresql-${major}-auto-failover, pg-auto-failover-cli) with apt-get"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "postgresql-${major}-auto-failover" pg-auto-failover-cli >/dev/null
}

# ha_states: "NAME PORT REPORTED GOAL" of each data node, from the monitor.
ha_states() {
  ha_monitor_sql "SELECT nodename, nodeport, reportedstate, goalstate FROM pgautofailover.node ORDER BY nodeid" | tr '|' ' '
}

# ha_in_state NAME STATE: node NAME reports STATE and the monitor wants it there.
ha_in_state() { ha_states | grep -qx "$1 [0-9]* $2 $2"; }

# ha_primary: the name of the node that takes writes (reported and assigned
# primary, or wait_primary: promoted, its standby not back yet).
ha_primary() { ha_states | awk '$3 == $4 && ($3 == "primary" || $3 == "wait_primary") { print $1 }'; }

# ha_whole: one node is primary, the other its secondary.
ha_whole() {
  [[ -n "$(ha_primary)" && "$(ha_states | awk '$3 == "secondary" && $4 == "secondary"' | wc -l)" == 1 ]]
}

ha_start_node() {
  local name="$1"
  start_daemon "ha-${name}" "${AS_POSTGRES[@]}" "${HA_ENV[@]}" \
    pg_autoctl create postgres --pgdata "${HA_DIR}/${name}" --pgport "${HA_PORT[${name}]}" --pgctl "$(pg_bin)/pg_ctl" \
    --hostname "${CP_IP}" --listen "${CP_IP}" --name "${name}" --dbname "${PG_DB}" --auth trust --no-ssl \
    --monitor "postgres://autoctl_node@${CP_IP}:${HA_MONITOR_PORT}/pg_auto_failover?sslmode=disable" --run
}

ha_up() {
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  if daemon_pid ha-monitor >/dev/null; then
    log "the HA PostgreSQL is up"
    return 0
  fi
  ha_install
  step "pg_auto_failover $(pg_autoctl version 2>/dev/null | awk 'NR == 1 {print $NF}'): monitor on ${CP_IP}:${HA_MONITOR_PORT}, nodes on ${HA_PORT[node1]} and ${HA_PORT[node2]}"
  rm -rf "${HA_DIR}"
  mkdir -p "${HA_DIR}"/{config,share,rt,sock}
  chown -R postgres:postgres "${HA_DIR}"
  # The monitor admits the keepers (which connect from CP_IP) and nobody else.
  start_daemon ha-monitor "${AS_POSTGRES[@]}" "${HA_ENV[@]}" \
    pg_autoctl create monitor --pgdata "${HA_DIR}/monitor" --pgport "${HA_MONITOR_PORT}" --pgctl "$(pg_bin)/pg_ctl" \
    --hostname "${CP_IP}" --skip-pg-hba --no-ssl --run
  WATCH=ha-monitor wait_for "the pg_auto_failover monitor" 60 ha_monitor_sql "SELECT 1 FROM pgautofailover.formation"
  printf '\n# hack/cluster.sh ha: the keepers\nhost pg_auto_failover autoctl_node %s/32 trust\n' "${CP_IP}" >>"${HA_DIR}/monitor/pg_hba.conf"
  ha_monitor_sql "SELECT pg_reload_conf()" >/dev/null

  ha_start_node node1
  WATCH=ha-node1 wait_for "node1 to be the single primary" 60 ha_in_state node1 single
  ha_roles
  ha_max_connections
  # node2's base backup waits for a checkpoint, spread over minutes unless
  # one is asked for: ask until it is a secondary.
  ha_start_node node2
  local deadline=$(($(now_ms) + 120000))
  until ha_in_state node2 secondary; do
    daemon_pid ha-node2 >/dev/null || die "ha-node2 exited; see ${LOGS}/ha-node2.log"
    (($(now_ms) < deadline)) || die "node2 is not a secondary after 120s; see ${LOGS}/ha-node2.log"
    ha_sql "${HA_PORT[node1]}" CHECKPOINT >/dev/null 2>&1 || true
    sleep 1
  done
  WATCH=ha-node1 wait_for "node1 to be primary" 60 ha_in_state node1 primary
  step "HA PostgreSQL ready: primary node1, secondary node2 (hack/cluster.sh ha dsn)"
}

# ha_roles: on the primary (node1, before node2 copies it): the runledger
# login (a password; from pods, the host and CP_IP, as on the cluster's
# PostgreSQL), its database and the effect role; the DSN that names both
# nodes.
ha_roles() {
  local pw
  pw="$(head -c 18 /dev/urandom | base64 | tr '+/' 'xy')"
  as_ha "$(pg_bin)/psql" -X -q -p "${HA_PORT[node1]}" -d postgres -v ON_ERROR_STOP=1 \
    -v user="${PG_USER}" -v db="${PG_DB}" -v pw="${pw}" >>"${LOGS}/ha-node1.log" 2>&1 <<'EOF'
CREATE ROLE :"user" LOGIN CREATEDB PASSWORD :'pw';
ALTER DATABASE :"db" OWNER TO :"user";
CREATE ROLE runledger_effect NOLOGIN;
GRANT runledger_effect TO :"user";
EOF
  cat >>"${HA_DIR}/node1/pg_hba.conf" <<EOF

# hack/cluster.sh ha: pods and the host (veth) log in as ${PG_USER} with a password.
host all ${PG_USER} ${CLUSTER_POD_CIDR} scram-sha-256
host all ${PG_USER} ${HOST_IP}/32 scram-sha-256
host all ${PG_USER} ${CP_IP}/32 scram-sha-256
# An old primary's pg_rewind reads the new one through database postgres
# (pg_auto_failover admits its replicator to ${PG_DB} only: without this
# the rewind fails and the old primary takes a full base backup, which
# waits minutes for a checkpoint).
host postgres pgautofailover_replicator ${CP_IP}/32 trust
EOF
  ha_sql "${HA_PORT[node1]}" "SELECT pg_reload_conf()" >/dev/null
  : >"${HA_DIR}/dsn"
  chmod 600 "${HA_DIR}/dsn"
  echo "postgres://${PG_USER}:${pw}@${CP_IP}:${HA_PORT[node1]},${CP_IP}:${HA_PORT[node2]}/${PG_DB}?sslmode=disable&target_session_attrs=read-write" >"${HA_DIR}/dsn"
}

# ha_max_connections: node1 (single: no failover) takes max_connections
# 300, as the cluster's PostgreSQL has (the soak's runs, workers and
# processors at once): ALTER SYSTEM, then a fast shutdown its keeper
# starts again from; node2's base backup copies the setting (a standby
# needs at least its primary's).
ha_max_connections() {
  local pid
  ha_sql "${HA_PORT[node1]}" "ALTER SYSTEM SET max_connections = 300" >/dev/null
  read -r pid <"${HA_DIR}/node1/postmaster.pid"
  kill -s INT "${pid}"
  WATCH=ha-node1 wait_for "node1 to restart with max_connections 300" 60 ha_setting_is "${HA_PORT[node1]}" max_connections 300 ||
    die "node1 did not come back with max_connections 300; see ${LOGS}/ha-node1.log"
}

# ha_setting_is PORT NAME VALUE: the server on PORT answers and has NAME = VALUE.
ha_setting_is() { [[ "$(ha_sql "$1" "SHOW $2" 2>/dev/null)" == "$3" ]]; }

ha_down() {
  local name
  for name in "${HA_NODES[@]}" monitor; do
    # pg_autoctl stops its PostgreSQL (fast) on SIGTERM, then exits.
    stop_daemon "ha-${name}" TERM 30
  done
  # The servers' own logs (logging_collector) outlive HA_DIR, beside the keepers'.
  for name in "${HA_NODES[@]}" monitor; do
    if compgen -G "${HA_DIR}/${name}/log/*.log" >/dev/null; then
      cat "${HA_DIR}/${name}/log/"*.log >"${LOGS}/ha-${name}-postgres.log"
    fi
  done
  rm -rf "${HA_DIR}"
}

# ha_diag: what each data node's PostgreSQL is doing: its postmaster's
# status (postmaster.pid), its processes (state, kernel wait channel,
# title) and the last lines its server logged of each. For a demotion that
# does not end.
ha_diag() {
  local name pm p pidfile=()
  ha_states | sed 's/^/monitor: /'
  for name in "${HA_NODES[@]}"; do
    pidfile=()
    [[ -f "${HA_DIR}/${name}/postmaster.pid" ]] && mapfile -t pidfile <"${HA_DIR}/${name}/postmaster.pid"
    pm="${pidfile[0]:-}"
    if ! [[ "${pm}" =~ ^[0-9]+$ ]]; then
      echo "${name}: no postmaster.pid"
      continue
    fi
    echo "${name}: postmaster ${pm}, status ${pidfile[7]:-?}"
    ps -o pid=,stat=,etimes=,wchan:28=,args= -p "${pm}" --ppid "${pm}" | sed "s/^/${name}: /"
    # What the server logged last of each of its processes.
    for p in "${pm}" $(pgrep -P "${pm}" || true); do
      { grep -hs "\[${p}\]" "${HA_DIR}/${name}/log/"*.log || true; } | tail -n 4 | cut -c1-400 | sed "s/^/${name} log: /"
    done
  done
  return 0
}

# ha_failover [--crash [--hold-wal MS]]: fail the primary over, wait for the
# new primary and (for up to a minute) until the old one follows it.
# --hold-wal MS: first a network hiccup between the two, MS milliseconds
# long: the standby stops receiving WAL (ha_hold_wal), then the crash, the
# WAL held until the standby is promoted. On an asynchronous primary (ha
# sync off) the commits of the hiccup are acknowledged and lost with it;
# on a synchronous one they wait, unacknowledged.
HA_FROZEN=""
ha_failover() {
  wait_for "a primary and its secondary" 120 ha_whole ||
    die "the HA PostgreSQL is not a primary and a secondary: $(ha_states | tr '\n' ';')"
  local old new pid hold=""
  old="$(ha_primary)"
  case "${1:-}" in
    --crash)
      case "${2:-}" in
        "") ;;
        --hold-wal) [[ "${3:-}" =~ ^[0-9]+$ ]] || usage; hold="$3" ;;
        *) usage ;;
      esac
      if [[ -n "${hold}" ]]; then
        ha_hold_wal "${old}"
        sleep "$(printf '%d.%03d' $((hold / 1000)) $((hold % 1000)))"
      fi
      # A crash of the primary's machine: its keeper frozen (SIGSTOP: else
      # it restarts the server within a second, often before the monitor
      # hears of it, and nothing fails over; frozen, its service that
      # starts the server alone, it goes on reporting the server running),
      # its postmaster SIGKILLed; the monitor finds the node silent and
      # unhealthy and promotes the secondary (in 30-50 s). The keeper
      # resumes (the machine is back) behind a fence (ha_fence) until the
      # node has demoted its server.
      read -r pid <"${HA_DIR}/${old}/postmaster.pid"
      [[ "$(cat "/proc/${pid}/comm" 2>/dev/null)" == postgres ]] || die "${old}'s postmaster (pid ${pid}) is not running"
      ha_keeper_signal "${old}" STOP
      HA_FROZEN="${old}"
      trap 'ha_release_wal; ha_keeper_signal "${HA_FROZEN}" CONT' EXIT
      kill -s KILL "${pid}"
      step "froze ${old}'s keeper, killed its postmaster (pid ${pid}, SIGKILL)"
      ;;
    "")
      as_ha pg_autoctl perform failover --pgdata "${HA_DIR}/monitor" >>"${LOGS}/ha-failover.log" 2>&1 ||
        die "pg_autoctl perform failover failed; see ${LOGS}/ha-failover.log"
      ;;
    *) usage ;;
  esac
  wait_for "a new primary" 120 ha_new_primary "${old}" || die "no new primary: $(ha_states | tr '\n' ';')"
  new="$(ha_primary)"
  step "${new} is primary"
  ha_release_wal
  if [[ "${1:-}" == --crash ]]; then
    ha_fence "${old}" on
    trap 'ha_fence "${HA_FROZEN}" off' EXIT
    ha_keeper_signal "${old}" CONT
    step "${old}'s keeper resumed, its port fenced from clients until it no longer takes writes"
    wait_for "${old} to demote its server" 120 ha_demoted "${old}" || die "${old} did not demote: $(ha_states | tr '\n' ';')"
    ha_fence "${old}" off
    trap - EXIT
  fi
  # The old primary's rejoin can take minutes (its keeper's fast stop of
  # the restarted server under load): waited for, not required.
  if wait_for "${old} to follow ${new}" 60 ha_whole; then
    step "${old} is its secondary"
  else
    warn "${old} does not follow ${new} yet: $(ha_states | tr '\n' ';')"
  fi
  echo "${new}"
}

ha_new_primary() { local p; p="$(ha_primary)"; [[ -n "${p}" && "${p}" != "$1" ]]; }

# ha_hold_wal PRIMARY: drop, in CP_NETNS, what PRIMARY sends its standby's
# walreceiver (its replication connection's port, from pg_stat_replication):
# the standby stops receiving WAL, its connection looks alive (a network
# hiccup; SIGSTOP of the walreceiver would read what the kernel buffered
# when it resumes). ha_release_wal removes the rule; so does the script's
# exit.
HA_HOLD_RULE=()
ha_hold_wal() {
  local port
  port="$(ha_sql "${HA_PORT[$1]}" "SELECT client_port FROM pg_stat_replication WHERE application_name LIKE 'pgautofailover_standby_%' AND client_port > 0 LIMIT 1")"
  [[ "${port}" =~ ^[0-9]+$ ]] || die "$1 has no standby streaming from it"
  HA_HOLD_RULE=(OUTPUT -p tcp -s "${CP_IP}" --sport "${HA_PORT[$1]}" -d "${CP_IP}" --dport "${port}" -j DROP)
  trap ha_release_wal EXIT
  in_ns "${CP_NETNS}" iptables -w -I "${HA_HOLD_RULE[@]}"
  step "holding $1's WAL to its standby (dropping ${CP_IP}:${HA_PORT[$1]} -> port ${port})"
}

ha_release_wal() {
  ((${#HA_HOLD_RULE[@]} > 0)) || return 0
  in_ns "${CP_NETNS}" iptables -w -D "${HA_HOLD_RULE[@]}" || warn "could not remove the WAL hold rule"
  HA_HOLD_RULE=()
  step "released the WAL hold"
}

# ha_keeper_signal NODE SIGNAL: signal NODE's keeper, pg_autoctl and its
# services (not its PostgreSQL).
ha_keeper_signal() {
  local top p
  top="$(daemon_pid "ha-$1")" || die "ha-$1 is not running"
  for p in "${top}" $(pgrep -P "${top}" -x pg_autoctl || true); do
    kill -s "$2" "${p}" 2>/dev/null || true
  done
}

# ha_fence NODE on|off: refuse (TCP reset), in CP_NETNS, connections to
# NODE's port from anywhere but CP_IP (the monitor, keepers and the
# standby): clients, whose DSN names every node, reach the others.
ha_fence() {
  local rule=(INPUT -p tcp --dport "${HA_PORT[$1]}" ! -s "${CP_IP}" -j REJECT --reject-with tcp-reset)
  if [[ "$2" == on ]]; then
    in_ns "${CP_NETNS}" iptables -w -I "${rule[@]}"
  else
    in_ns "${CP_NETNS}" iptables -w -D "${rule[@]}" 2>/dev/null || true
  fi
}

# ha_demoted NODE: the monitor has NODE reporting a state that takes no writes.
ha_demoted() {
  ha_states | awk -v n="$1" '$1 == n && $3 !~ /^(primary|wait_primary|single|draining|demote_timeout|apply_settings|join_primary|prepare_maintenance|stop_replication)$/ { ok = 1 } END { exit !ok }'
}

# ha_sync on|off: the nodes' replication-quorum (pg_autoctl set node):
# on, pg_auto_failover's default, the primary acknowledges a commit once
# its standby has it (synchronous_standby_names 'ANY 1 (...)'); off, at
# once (asynchronous: a failover can lose the latest commits). Waits, when
# the formation is whole, until the primary's setting says so.
ha_sync() {
  local quorum name primary
  case "${1:-}" in
    on) quorum=true ;;
    off) quorum=false ;;
    *) usage ;;
  esac
  primary="$(ha_primary)" # before the first change sends it through apply_settings
  for name in "${HA_NODES[@]}"; do
    # Off: the standby's only (with the primary's too the monitor finds no
    # secondary in the quorum, and fails over to none).
    [[ "${quorum}" == false && "${name}" == "${primary}" ]] && continue
    # (pg_autoctl 2.0 logs a failed get_nodes() here, and sets it all the same.)
    as_ha pg_autoctl set node replication-quorum "${quorum}" --pgdata "${HA_DIR}/${name}" >>"${LOGS}/ha-sync.log" 2>&1 ||
      die "pg_autoctl set node replication-quorum ${quorum} for ${name} failed; see ${LOGS}/ha-sync.log"
  done
  if ! wait_for "a primary and its secondary" 30 ha_whole; then
    step "replication-quorum ${quorum} (the formation is not whole: the primary has no standby yet)"
    return 0
  fi
  primary="$(ha_primary)"
  if [[ "${quorum}" == true ]]; then
    wait_for "${primary} to be synchronous" 60 ha_synchronous "${HA_PORT[${primary}]}" || die "${primary} is not synchronous"
  else
    wait_for "${primary} to be asynchronous" 60 ha_setting_is "${HA_PORT[${primary}]}" synchronous_standby_names "" ||
      die "${primary} is not asynchronous"
  fi
  # The primary passes through apply_settings: back to primary and secondary.
  wait_for "the formation to settle" 60 ha_whole || die "the formation did not settle: $(ha_states | tr '\n' ';')"
  step "${primary}: synchronous_standby_names '$(ha_sql "${HA_PORT[${primary}]}" "SHOW synchronous_standby_names")'"
}

ha_synchronous() { [[ -n "$(ha_sql "$1" "SHOW synchronous_standby_names" 2>/dev/null)" ]]; }

# ha_restart [--immediate]: the primary's PostgreSQL shut down fast (SIGINT)
# or immediately (SIGQUIT: no checkpoint, crash recovery); its keeper starts
# it again, or the monitor fails over to the standby meanwhile. Waits until
# a primary answers again and the formation settles (or fails over), and
# prints the primary's name ("-" when none is); after a failover, also
# waits until the old primary has demoted (ha_demote_or_stop, which may
# print "stopped-immediately" on a second line).
ha_restart() {
  local sig=INT old pid
  case "${1:-}" in
    "") ;;
    --immediate) sig=QUIT ;;
    *) usage ;;
  esac
  old="$(ha_primary)"
  [[ -n "${old}" ]] || die "the HA PostgreSQL has no primary: $(ha_states | tr '\n' ';')"
  read -r pid <"${HA_DIR}/${old}/postmaster.pid"
  kill -s "${sig}" "${pid}"
  step "SIG${sig} to ${old}'s postmaster (pid ${pid})"
  wait_for "a primary that answers" 120 ha_restarted "${old}" "${pid}" || die "no primary answers: $(ha_states | tr '\n' ';')"
  # The monitor may fail the restarted server over still (it saw it down,
  # and decides seconds later): watched for 10s, then until the formation
  # is whole again or the old primary is told to demote; then until the
  # new primary takes writes.
  local i
  for ((i = 0; i < 20; i++)); do
    ha_demoting "${old}" && break
    sleep 0.5
  done
  wait_for "the formation to settle" 60 ha_settled "${old}" || true
  if ha_demoting "${old}"; then
    wait_for "a new primary" 120 ha_new_primary "${old}" || die "no new primary: $(ha_states | tr '\n' ';')"
  fi
  local new=""
  wait_for "a primary" 30 ha_primary_is_known || true
  new="$(ha_primary)"
  step "${new:-no node} is primary"
  echo "${new:--}"
  # Failed over: the old primary demotes (a fast shutdown).
  if [[ -n "${new}" && "${new}" != "${old}" ]]; then ha_demote_or_stop "${old}"; fi
}

# ha_demoting NODE: the monitor has told NODE to stop taking writes.
ha_demoting() {
  ha_states | awk -v n="$1" '$1 == n && $4 ~ /^(draining|demote_timeout|demoted)$/ { ok = 1 } END { exit !ok }'
}
ha_settled() { ha_whole || ha_demoting "$1"; }
# ha_primary_is_known: some node is primary (reported and assigned; a
# state change shows none for a moment).
ha_primary_is_known() { [[ -n "$(ha_primary)" ]]; }

# ha_demote_or_stop NODE: wait until NODE, an old primary, has demoted its
# server. Its keeper's fast shutdown of a server that restarted as a
# synchronous primary, its standby since promoted, may never end: a session
# it terminates whose exit commits (the drop of its temporary tables) waits
# for the lost standby for ever, and so does the shutdown
# (pg_auto_failover has no bound on it, unlike Patroni's
# primary_stop_timeout). After HA_STOP_TIMEOUT seconds of a shutdown the
# node is stopped immediately (SIGQUIT to its postmaster, what was hung
# logged first), and prints "stopped-immediately"; its keeper then demotes
# it and it rejoins as the standby.
HA_STOP_TIMEOUT=30
ha_demote_or_stop() {
  local pidfile=()
  wait_for "$1 to demote its server" "${HA_STOP_TIMEOUT}" ha_demoted "$1" && return 0
  [[ -f "${HA_DIR}/$1/postmaster.pid" ]] && mapfile -t pidfile <"${HA_DIR}/$1/postmaster.pid"
  if [[ "${pidfile[7]:-}" == stopping && "${pidfile[0]:-}" =~ ^[0-9]+$ ]]; then
    warn "$1's fast shutdown has not ended in ${HA_STOP_TIMEOUT}s; what it waits for:"
    ha_diag | grep -E "^(monitor|$1)(:| log:)" >&2
    kill -s QUIT "${pidfile[0]}" 2>/dev/null || true
    step "stopped $1's server immediately (SIGQUIT to its postmaster, pid ${pidfile[0]})"
    echo stopped-immediately
  fi
  wait_for "$1 to demote its server" 120 ha_demoted "$1" || warn "$1 did not demote: $(ha_states | tr '\n' ';')"
}

# ha_restarted OLD PID: a primary answers, and it is not OLD's server of PID.
ha_restarted() {
  local p now=""
  p="$(ha_primary)"
  [[ -n "${p}" ]] || return 1
  read -r now 2>/dev/null <"${HA_DIR}/${p}/postmaster.pid" || return 1
  [[ "${p}" != "$1" || "${now}" != "$2" ]] && ha_sql "${HA_PORT[${p}]}" "SELECT 1" >/dev/null 2>&1
}

cmd_ha() {
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  # User postgres runs everything here: from a directory it may enter (a
  # checkout under a 0700 home is not one).
  cd "${RUN}" || die "cannot enter ${RUN}"
  case "${1:-}" in
    up) ha_up ;;
    down) ha_down ;;
    failover) ha_failover "${@:2}" ;;
    sync) ha_sync "${@:2}" ;;
    restart) ha_restart "${@:2}" ;;
    state) ha_states ;;
    diag) ha_diag ;;
    dsn) cat "${HA_DIR}/dsn" 2>/dev/null || die "the HA PostgreSQL is not up (hack/cluster.sh ha up)" ;;
    *) usage ;;
  esac
}
