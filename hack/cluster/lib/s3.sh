# shellcheck shell=bash
# Sourced by hack/cluster.sh: the cluster's S3-compatible object store, one
# SeaweedFS `weed server` (master, volume server, filer and S3 gateway in
# one process; make weed builds it pinned, as internal/s3test runs it).
#
# It runs in ${CP_NETNS} like PostgreSQL: the S3 gateway alone on
# ${CP_IP}:${S3_PORT}, HTTPS only, its certificate signed by a CA of its own
# (hack/tools/pki -s3-ip: ${RUN}/pki/s3-ca.crt), reachable from the host and
# every pod; master, volume server and filer on 127.0.0.1 of that netns,
# which nothing outside it reaches. One static identity, made at up (random
# keys, as PostgreSQL's password). weed makes its gRPC unix sockets under
# /tmp with no flag to move them: it gets a /tmp of its own (a tmpfs in a
# private mount namespace), so they neither land in the host's /tmp nor
# meet those of a test binary's SeaweedFS (internal/s3test) there.
# `hack/cluster.sh s3-env` prints what a client needs.

S3_DIR="${RUN}/s3"

# ensure_weed: build the pinned weed if missing (make weed); record its path.
ensure_weed() {
  local weed
  weed="$(make -s --no-print-directory -C "${ROOT}" weed-path)"
  if [[ ! -x "${weed}" ]]; then
    step "building SeaweedFS' weed (make weed; once, cached in bin/; minutes from a cold Go cache)"
  fi
  make -s --no-print-directory -C "${ROOT}" weed >/dev/null || die "make weed failed"
  [[ -x "${weed}" ]] || die "make weed did not build ${weed}"
  WEED="${weed}"
}

# start_s3_fresh: the store's configuration (identity, volume growth), then
# the store, ready for signed requests over verified TLS.
start_s3_fresh() {
  step "SeaweedFS S3 https://${CP_IP}:${S3_PORT} (in the background)"
  install -d -m 0700 "${S3_DIR}" "${S3_DIR}/config" "${S3_DIR}/data"
  # A copy in the state: its own /tmp (below) hides a checkout under /tmp,
  # as hack/e2e.sh's copy is.
  install -m 0755 "${WEED}" "${S3_DIR}/weed"
  local key secret
  key="RLS3$(head -c 10 /dev/urandom | base32)"
  secret="$(head -c 30 /dev/urandom | base64 | tr '+/' 'xy')"
  # umask: the secret is never readable by others, not even for a moment.
  (
    umask 077
    cat >"${S3_DIR}/config/s3.json" <<EOF
{"identities": [{"name": "runledger-e2e", "credentials": [{"accessKey": "${key}", "secretKey": "${secret}"}],
  "actions": ["Admin", "Read", "List", "Tagging", "Write"]}]}
EOF
    # Each bucket is a collection of its own, grown one volume at a time.
    printf '[master.volume_growth]\ncopy_1 = 1\n' >"${S3_DIR}/config/master.toml"
    printf 'user = "%s:%s"\n' "${key}" "${secret}" >"${S3_DIR}/curl.conf"
    {
      echo "S3_ENDPOINT=https://${CP_IP}:${S3_PORT}"
      echo "S3_REGION=${S3_REGION}"
      echo "S3_ACCESS_KEY_ID=${key}"
      echo "S3_SECRET_ACCESS_KEY=${secret}"
      echo "S3_CA_FILE=${RUN}/pki/s3-ca.crt"
    } >"${S3_DIR}/env"
  )
  start_s3
  step "SeaweedFS S3 ready (hack/cluster.sh s3-env)"
}

# start_s3: weed on the state it has; waits until the gateway answers a
# signed request (ListBuckets) over TLS verified against its CA.
start_s3() {
  # shellcheck disable=SC2016 # expanded by that bash, from its arguments
  local private_tmp='
    set -e
    mount -t tmpfs -o size=16m,mode=1777 weed-tmp /tmp
    exec "$@"'
  start_daemon seaweedfs env HOME="${S3_DIR}" TMPDIR=/tmp \
    unshare --mount --propagation private -- bash -c "${private_tmp}" weed \
    "${S3_DIR}/weed" -logtostderr -config_dir="${S3_DIR}/config" \
    server -dir="${S3_DIR}/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
    -master.telemetry=false -master.telemetry.url=http://127.0.0.1:1/ -master.volumeSizeLimitMB=1024 \
    -volume.max=100 -volume.preStopSeconds=0 \
    -filer -s3 -s3.ip.bind="${CP_IP}" -s3.port="${S3_PORT}" -s3.port.iceberg=0 -s3.port.lance=0 \
    -s3.cert.file="${RUN}/pki/s3.crt" -s3.key.file="${RUN}/pki/s3.key" \
    -s3.config="${S3_DIR}/config/s3.json" -s3.allowDeleteBucketNotEmpty
  WATCH=seaweedfs wait_for "SeaweedFS S3 on https://${CP_IP}:${S3_PORT}" 90 \
    curl -fsS -K "${S3_DIR}/curl.conf" --cacert "${RUN}/pki/s3-ca.crt" \
    --aws-sigv4 "aws:amz:${S3_REGION}:s3" "https://${CP_IP}:${S3_PORT}/"
}

# s3 stop|start: the store stopped (SIGKILL: its data is on disk, a
# graceful stop takes 15-25 s) and started again on its data (tests of
# outages).
cmd_s3() {
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  case "${1:-}" in
    stop) stop_daemon seaweedfs KILL 10 ;;
    start)
      daemon_pid seaweedfs >/dev/null && die "SeaweedFS is running"
      start_s3
      step "SeaweedFS started (pid $(daemon_pid seaweedfs))"
      ;;
    *) usage ;;
  esac
}
