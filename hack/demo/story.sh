# shellcheck shell=bash
# Sourced by hack/demo.sh: the demo's story, steps 6 and later, on the
# cluster steps 1-5 brought up. Each step prints the command a user types
# (from the checkout's root), then its output. The manifests and SQL it
# applies are in config/samples/demo/.
#
# From hack/demo.sh: ROOT, CLUSTER, NS, SYSTEM_NS, STEPS, BOLD, PLAIN, say,
# info, die, clock; KUBECONFIG and PATH (kubectl) from `hack/cluster.sh env`.

DEMO=config/samples/demo
# The pods' addresses (hack/cluster/lib/common.sh, CLUSTER_POD_CIDR): where
# the worker login logs in from.
POD_CIDR=10.244.0.0/16

# show COMMAND: print COMMAND as a user types it, run it in this shell
# (COMMAND is this file's own text; an assignment in it stays set), then
# print its output; a command that fails ends the demo.
show() {
  local rc=0
  printf '    %s$ %s%s\n' "${BOLD}" "$1" "${PLAIN}"
  eval "$1" >"${STORY_OUT}" 2>&1 || rc=$?
  sed -e '/^[[:space:]]*$/d' -e 's/^/      /' "${STORY_OUT}"
  ((rc == 0)) || die "the command above exited ${rc}"
}

# note TEXT: a line of the story that is not a command.
note() { printf '    # %s\n' "$*"; }

# as_dba PSQL_ARG...: psql as the cluster's superuser on the node's socket
# (peer authentication), what a database administrator does.
as_dba() {
  runuser -u postgres -- psql -h "${PG_SOCKET}" -X -q -v ON_ERROR_STOP=1 "$@"
}

# story_reset: a demo run before on this cluster left its namespace, database
# and roles: remove them, so that the story starts from nothing again.
story_reset() {
  if kubectl get namespace "${NS}" >/dev/null 2>&1; then
    info "an earlier demo's namespace ${NS}: kubectl delete namespace ${NS}"
    kubectl delete namespace "${NS}" --wait=true --timeout=180s >/dev/null
  fi
  as_dba -d postgres <<'SQL'
SET client_min_messages = warning;
DROP DATABASE IF EXISTS billing WITH (FORCE);
DROP ROLE IF EXISTS billing_worker;
DROP ROLE IF EXISTS billing_effect;
SQL
}

# story_ledger: the ledger as docs/migrations.md sets it up: the
# administrator creates the worker login and the effect role, the owner (the
# cluster's login runledger) creates the database's table and migrates, the
# runs' Secret holds the worker login's DSN.
story_ledger() {
  say "6/${STEPS} the ledger, as docs/migrations.md sets it up: an owner, a worker login that owns nothing, an effect role"
  story_reset
  show "make -s build    # bin/runledger, the CLI"
  note "the database administrator (here the cluster's superuser, postgres, on the node) creates the roles and the database:"
  # shellcheck disable=SC2016 # shown as typed, expanded by show's eval
  show 'WORKER_PASSWORD="$(head -c 18 /dev/urandom | base64 | tr "+/" "xy")"'
  show "grep -qxF 'host billing billing_worker ${POD_CIDR} scram-sha-256' ${PG_HBA} || echo 'host billing billing_worker ${POD_CIDR} scram-sha-256' >>${PG_HBA}"
  show "runuser -u postgres -- psql -h ${PG_SOCKET} -X -q -v ON_ERROR_STOP=1 -v worker_password=\"\${WORKER_PASSWORD}\" -f - <${DEMO}/roles.sql"
  note "the owner (login runledger, owner of database billing; its DSN, with a password, in ${OWNER_DSN_FILE}):"
  show "export RUNLEDGER_DATABASE_URL=\"\$(cat ${OWNER_DSN_FILE})\""
  show "psql \"\${RUNLEDGER_DATABASE_URL}\" -X -q -v ON_ERROR_STOP=1 -f ${DEMO}/billing.sql    # the table invoices; INSERT granted to billing_effect"
  show "bin/runledger migrate --grant-to billing_worker --effect-role billing_effect"
  note "the runs' namespace, the workers' ServiceAccount, and the Secret: the worker login's DSN"
  show "kubectl apply -f config/samples/namespace.yaml -f config/samples/worker_rbac.yaml"
  show "kubectl -n ${NS} create secret generic billing-db --from-literal=dsn=\"postgres://billing_worker:\${WORKER_PASSWORD}@${PG_HOST}/billing?sslmode=disable\""
}

# invoices PERIOD: the invoices of PERIOD, from the database.
invoices() {
  show "psql \"\${RUNLEDGER_DATABASE_URL}\" -X -c \"SELECT * FROM invoices WHERE period = '$1' ORDER BY account\""
}

# wait_run NAME: wait until run NAME Succeeded, and show it.
wait_run() {
  show "kubectl -n ${NS} wait prun/$1 --for=condition=Complete --timeout=180s"
  show "kubectl -n ${NS} get prun $1"
}

story_first_run() {
  say "7/${STEPS} a run whose SQL effect writes invoices, in the transaction that commits each key"
  show "grep -A3 '^  effect:' ${DEMO}/invoices-2026-01.yaml    # runs as billing_effect, with the items in table claimed"
  show "kubectl apply -f ${DEMO}/invoices-2026-01.yaml"
  wait_run invoices-2026-01
  note "one invoice per key:"
  invoices 2026-01
}

story_again() {
  say "8/${STEPS} the same keys again, under another run (and acct-1004, new): nothing written twice"
  show "kubectl apply -f ${DEMO}/invoices-2026-01-again.yaml"
  wait_run invoices-2026-01-again
  note "each item's verdict, and who holds each key (of inline items the ledger keeps a digest: -f gives it the run as applied, with its uid):"
  show "kubectl -n ${NS} get prun invoices-2026-01-again -o yaml | bin/runledger items invoices-2026-01-again -n ${NS} -f -"
  show "bin/runledger key acct-1002 2026-01"
  note "still one invoice per key; acct-1004's is the second run's:"
  invoices 2026-01
}

story_failure() {
  say "9/${STEPS} an item fails (the table refuses USD), is listed, the cause fixed, retried with batch.fromRun"
  show "kubectl apply -f ${DEMO}/invoices-2026-02.yaml"
  wait_run invoices-2026-02
  show "kubectl -n ${NS} get prun invoices-2026-02 -o jsonpath='{.status.failedItems}{\"\\n\"}'"
  show "bin/runledger items invoices-2026-02 -n ${NS} --failed"
  note "the cause, fixed by the owner: the table accepts USD"
  show "psql \"\${RUNLEDGER_DATABASE_URL}\" -X -c \"ALTER TABLE invoices DROP CONSTRAINT invoices_currency_check, ADD CONSTRAINT invoices_currency_check CHECK (currency IN ('EUR', 'GBP', 'USD'))\""
  note "a run whose batch is the failed items of invoices-2026-02 (batch: {fromRun: {name: invoices-2026-02}}):"
  show "kubectl apply -f ${DEMO}/invoices-2026-02-retry.yaml"
  wait_run invoices-2026-02-retry
  show "bin/runledger key acct-1002 2026-02"
  invoices 2026-02
}

story_schedule() {
  say "10/${STEPS} a schedule's occurrence triggered twice: one run"
  show "kubectl apply -f ${DEMO}/schedule.yaml"
  show "bin/runledger schedule trigger invoices -n ${NS} --occurrence 2026-03"
  show "bin/runledger schedule trigger invoices -n ${NS} --occurrence 2026-03"
  wait_run invoices-2026-03
  show "kubectl -n ${NS} get prun -l processing.runledger.dev/schedule=invoices"
  invoices 2026-03
}

story_processor() {
  say "11/${STEPS} a processor (examples/processor) charges each item through a payment service, the item's key its Idempotency-Key"
  note "the example processor's image (make image built it; make push-processor IMG=... pushes it to a registry of yours):"
  # shellcheck disable=SC2016 # shown as typed, expanded by show's eval
  show 'PROCESSOR="$(hack/cluster.sh push runledger-example-processor:dev bin/platforms/linux_$(go env GOARCH)/example-processor | tail -1)"'
  show "echo \"\${PROCESSOR}\""
  note "the example payment service: it charges each Idempotency-Key once, and counts every call"
  show "sed \"s|image: runledger-example-processor:dev|image: \${PROCESSOR}|\" examples/processor/payments.yaml | kubectl apply -f -"
  show "kubectl -n ${NS} rollout status deployment/payments --timeout=120s"
  note "this cluster has no DNS: the payment service by its ClusterIP; a policy lets the run's pods reach it"
  show "PAYMENTS=\"\$(kubectl -n ${NS} get service payments -o jsonpath='{.spec.clusterIP}'):8080\""
  show "kubectl apply -f ${DEMO}/charge-to-payments.yaml"
  show "sed -e \"s|runledger-example-processor:dev|\${PROCESSOR}|\" -e \"s|payments.runledger-demo.svc:8080|\${PAYMENTS}|\" ${DEMO}/charge-2026-04.yaml | kubectl apply -f -"
  note "the payment service has charged the three keys, the processor holds its ok 6 s (-delay-answer); the worker pod dies in that window:"
  show "timeout 60 sh -c 'until kubectl get --raw /api/v1/namespaces/${NS}/services/http:payments:8080/proxy/stats | grep -q calls.:3; do sleep 0.2; done'"
  show "kubectl -n ${NS} delete pod -l processing.runledger.dev/run=charge-2026-04 --grace-period=0 --force"
  note "its replacement sends the three items again, with the same keys:"
  wait_run charge-2026-04
  show "kubectl -n ${NS} logs deployment/payments | grep Idempotency-Key"
  note "three keys, each sent twice, charged once:"
  show "kubectl get --raw /api/v1/namespaces/${NS}/services/http:payments:8080/proxy/stats"
  [[ "$(kubectl get --raw "/api/v1/namespaces/${NS}/services/http:payments:8080/proxy/stats")" == *'"calls":6,"keys":3'* ]] ||
    die "the payment service did not see each key twice: the worker pod was deleted too late (after the commit)"
}

# next_commands: the commands to try next, one a line; story_next runs them
# first (in a shell of their own, as a user would), so that each one works.
next_commands() {
  cat <<EOF
source <(hack/cluster.sh env)    # KUBECONFIG, PATH (kubectl)
export RUNLEDGER_DATABASE_URL="\$(cat ${OWNER_DSN_FILE})"    # the ledger's owner, database billing
kubectl -n ${NS} get processingruns,processingschedules
kubectl -n ${NS} describe processingrun invoices-2026-02
bin/runledger items invoices-2026-02 -n ${NS} --failed
bin/runledger key acct-1002 2026-02
psql "\${RUNLEDGER_DATABASE_URL}" -c 'SELECT * FROM invoices ORDER BY period, account'
psql "\${RUNLEDGER_DATABASE_URL}" -c 'SELECT entity, occurrence, run_name, state FROM runledger.ledger ORDER BY occurrence, entity'
kubectl -n ${SYSTEM_NS} logs deployment/runledger-manager --tail=20
EOF
}

# console_works starts the web console as next_commands' shell would (its
# runs page on a free port), checks its runs page lists invoices-2026-02,
# and stops it by its PID.
console_works() {
  local out pid url i
  out="$(mktemp)"
  env -u KUBECONFIG -u RUNLEDGER_DATABASE_URL bash -c "set -euo pipefail
$(next_commands | head -n 2)
exec bin/runledger console -n ${NS} --address 127.0.0.1:0" >"${out}" 2>&1 &
  pid=$!
  url=""
  for ((i = 0; i < 100; i++)); do
    url="$(sed -n 's|^runledger console: \(http://[^ ]*\) .*|\1|p' "${out}")"
    [[ -n "${url}" ]] && break
    sleep 0.1
  done
  if [[ -z "${url}" ]] || ! curl -fsS --max-time 10 "${url}" | grep -q 'invoices-2026-02'; then
    kill "${pid}" 2>/dev/null || true
    cat "${out}" >&2
    rm -f "${out}"
    die "runledger console does not list the runs (its output above)"
  fi
  kill "${pid}"
  wait "${pid}" 2>/dev/null || true
  rm -f "${out}"
}

story_next() {
  local script
  script="set -euo pipefail"$'\n'"$(next_commands)"
  env -u KUBECONFIG -u RUNLEDGER_DATABASE_URL bash -c "${script}" >"${STORY_OUT}" 2>&1 ||
    { cat "${STORY_OUT}" >&2; die "a command to try next does not work (its output above)"; }
  console_works
  printf '\n%sThe story took %ds; the demo %s.%s The cluster keeps running. Try next (from %s):\n\n' \
    "${BOLD}" "$((SECONDS - STORY_T0))" "$(clock)" "${PLAIN}" "${ROOT}"
  next_commands | sed 's/^/    /'
  printf '\nLook at it in a browser: the web console (docs/console.md), as you, with the same two lines first:\n\n'
  printf '    bin/runledger console -n %s    # then open http://127.0.0.1:7480/\n' "${NS}"
  printf '\nStop it and leave the host as it was: make demo-down\n'
}

# story: steps 6 and later.
story() {
  cd "${ROOT}" || die "cannot enter ${ROOT}"
  local dsn run_dir
  run_dir="$("${CLUSTER}" state-dir)"
  dsn="$("${CLUSTER}" dsn)"
  PG_SOCKET="${run_dir}/postgres/run"
  PG_HBA="${run_dir}/postgres/data/pg_hba.conf"
  PG_HOST="${dsn#*@}" PG_HOST="${PG_HOST%%/*}"
  OWNER_DSN_FILE="${run_dir}/demo/owner.dsn"
  STORY_OUT="$(mktemp)"
  # shellcheck disable=SC2064 # expanded now: the file of this run
  trap "rm -f '${STORY_OUT}'" EXIT
  # The owner: the cluster's login runledger (which may create databases),
  # here in its database billing.
  mkdir -p "${run_dir}/demo"
  [[ "${dsn}" == */runledger\?* ]] || die "hack/cluster.sh dsn names no database runledger"
  (umask 077 && printf '%s\n' "${dsn%%/runledger\?*}/billing?${dsn#*/runledger\?}" >"${OWNER_DSN_FILE}")

  STORY_T0="${SECONDS}"
  story_ledger
  story_first_run
  story_again
  story_failure
  story_schedule
  story_processor
  story_next
}
