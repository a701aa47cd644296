# shellcheck shell=bash
# Sourced by hack/cluster.sh: the cluster's PostgreSQL.

# --- PostgreSQL --------------------------------------------------------------------------

start_postgres_fresh() {
  local pg pgdir="${RUN}/postgres"
  pg="$(pg_bin)"
  step "PostgreSQL $("${pg}/postgres" --version | awk '{print $3}') on ${CP_IP}:${PG_PORT} (initdb; in the background)"
  mkdir -p "${pgdir}/data" "${pgdir}/run" "${pgdir}/tls"
  # TLS with a CA of its own (hack/cluster.sh pg-ca), as a managed database.
  install -m 0644 "${RUN}/pki/postgres.crt" "${pgdir}/tls/server.crt"
  install -m 0600 "${RUN}/pki/postgres.key" "${pgdir}/tls/server.key"
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
host all ${PG_USER} ${CLUSTER_POD_CIDR} scram-sha-256
host all ${PG_USER} ${HOST_IP}/32 scram-sha-256
host all ${PG_USER} ${CP_IP}/32 scram-sha-256
EOF
  start_postgres
  local pw
  pw="$(head -c 18 /dev/urandom | base64 | tr '+/' 'xy')"
  as_postgres "${pg}/psql" -h "${pgdir}/run" -p "${PG_PORT}" -U postgres -d postgres -v ON_ERROR_STOP=1 -q \
    -v user="${PG_USER}" -v db="${PG_DB}" -v pw="${pw}" >>"${LOGS}/postgres.log" 2>&1 <<'EOF'
CREATE ROLE :"user" LOGIN CREATEDB PASSWORD :'pw';
CREATE DATABASE :"db" OWNER :"user";
-- The role SQL effects run as (runledger migrate --effect-role): it owns
-- nothing, may not log in; the login may give it the effect's sandbox.
CREATE ROLE runledger_effect NOLOGIN;
GRANT runledger_effect TO :"user";
EOF
  : >"${RUN}/postgres.dsn"
  chmod 600 "${RUN}/postgres.dsn"
  echo "postgres://${PG_USER}:${pw}@${CP_IP}:${PG_PORT}/${PG_DB}?sslmode=disable" >"${RUN}/postgres.dsn"
  step "PostgreSQL ready: database ${PG_DB}, role ${PG_USER} (hack/cluster.sh dsn), effect role runledger_effect"
}

start_postgres() {
  local pg pgdir="${RUN}/postgres"
  pg="$(pg_bin)"
  start_daemon postgres setpriv --reuid=postgres --regid=postgres --init-groups -- \
    "${pg}/postgres" -D "${pgdir}/data" -p "${PG_PORT}" \
    -c listen_addresses="${CP_IP}" -c unix_socket_directories="${pgdir}/run" \
    -c max_connections=300 -c log_line_prefix='%m [%p] %q%u@%d ' -c logging_collector=off \
    -c ssl=on -c ssl_cert_file="${pgdir}/tls/server.crt" -c ssl_key_file="${pgdir}/tls/server.key"
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
      # --immediate: SIGQUIT, no checkpoint, crash recovery on start (as after
      # a crash); the default is a fast shutdown (SIGINT).
      local sig=INT
      case "${2:-}" in
        "") ;;
        --immediate) sig=QUIT ;;
        *) usage ;;
      esac
      stop_daemon postgres "${sig}" 30
      start_postgres
      step "PostgreSQL started (pid $(daemon_pid postgres))"
      ;;
    *) usage ;;
  esac
}

