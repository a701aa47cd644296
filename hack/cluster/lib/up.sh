# shellcheck shell=bash
# Sourced by hack/cluster.sh: up: the control plane, then the nodes; and
# node-start, which powers a node on again.

cluster_healthy() {
  local d
  for d in $(all_daemons); do
    daemon_pid "${d}" >/dev/null || return 1
  done
  kubectl_ get --raw /readyz >/dev/null 2>&1
}

# cmd_up [--nodes N]
cmd_up() {
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --nodes)
        [[ $# -ge 2 ]] || usage
        NODES="$2"
        shift 2
        ;;
      *) usage ;;
    esac
  done
  if ! [[ "${NODES}" =~ ^[1-9][0-9]*$ ]] || ((NODES > MAX_NODES)); then die "--nodes ${NODES}: want 1 to ${MAX_NODES}"; fi
  mkdir -p "${STATE}"
  if [[ -d "${RUN}" ]]; then
    k8s_bin_dir 2>/dev/null || true
    if [[ -n "${BIN_DIR:-}" ]] && cluster_healthy; then
      if [[ "$(node_count)" != "${NODES}" ]]; then
        die "up with $(node_count) nodes, not ${NODES}: run hack/cluster.sh down first"
      fi
      log "already up (hack/cluster.sh status; hack/cluster.sh down to stop)"
      print_usage_hint
      return 0
    fi
    die "${RUN} exists but the cluster is not healthy: run hack/cluster.sh down first"
  fi
  local ns
  for ns in "${CP_NETNS}" $(for k in $(seq "${MAX_NODES}"); do node_name "${k}"; done); do
    if netns_exists "${ns}"; then
      die "network namespace ${ns} exists but ${RUN} does not: remove it (ip netns delete ${ns}) or run hack/cluster.sh down"
    fi
  done

  if [[ -d "${LOGS}" ]]; then
    rm -rf "${LOGS}.prev"
    mv "${LOGS}" "${LOGS}.prev"
  fi
  mkdir -p "${LOGS}"
  ensure_packages
  k8s_bin_dir
  local c missing=()
  for c in "${K8S_COMPONENTS[@]}"; do [[ -x "${BIN_DIR}/${c}" ]] || missing+=("${c}"); done
  if ((${#missing[@]} > 0)); then
    step "building ${missing[*]} from the Go module proxy (once; cached in ${BIN_DIR#"${ROOT}/"}; ~20 min on 2 cores from a cold Go cache)"
  else
    step "Kubernetes binaries: ${BIN_DIR#"${ROOT}/"} (cached)"
  fi
  k8s_bin_dir --build
  build_tool image
  build_tool pause
  build_tool registry
  build_tool pki
  build_tool netpol sigs.k8s.io/kube-network-policies/cmd kube-network-policies
  ensure_weed

  # 0755 whatever the umask: user postgres must get through it.
  install -d -m 0755 "${RUN}"
  echo "${ROOT}" >"${RUN}/checkout"
  echo "${NODES}" >"${RUN}/node-count"
  # From here on a failure (or Ctrl-C) tears down whatever was started.
  trap 'up_exit $?' EXIT
  trap 'exit 130' INT TERM
  save_host_state
  step "network: host ${HOST_IP} <-> control plane ${CP_IP} (netns ${CP_NETNS}) <-> ${NODES} node(s)"
  setup_netns
  local k
  for k in $(seq "${NODES}"); do setup_node_netns "${k}"; done
  setup_cgroups

  step "certificates and kubeconfigs"
  make_pki
  mkdir -p "${RUN}/etcd" "${RUN}/apiserver"
  chmod 700 "${RUN}/etcd"
  : >"${RUN}/resolv.conf"
  for k in $(seq "${NODES}"); do render_node "${k}"; done

  # PostgreSQL (initdb is slow on a busy disk) comes up alongside the rest.
  start_postgres_fresh &
  PG_JOB=$!
  # SeaweedFS' filer waits about 10 s for peers before it serves: alongside too.
  start_s3_fresh &
  S3_JOB=$!
  start_registry
  start_control_plane
  setup_netpol_identity
  for k in $(seq "${NODES}"); do start_node "${k}"; done
  for k in $(seq "${NODES}"); do wait_node_ready "${k}"; done
  wait_ready_for_pods
  wait "${PG_JOB}" || die "PostgreSQL did not start; see ${LOGS}/postgres.log"
  PG_JOB=""
  wait "${S3_JOB}" || die "SeaweedFS did not start; see ${LOGS}/seaweedfs.log"
  S3_JOB=""

  local d
  for d in $(all_daemons); do
    daemon_pid "${d}" >/dev/null || die "${d} is not running; see ${LOGS}/${d}.log"
  done
  trap - EXIT INT TERM
  step "cluster up"
  print_usage_hint
}

up_exit() {
  trap - EXIT INT TERM
  [[ "$1" == 0 ]] && return 0
  if [[ -n "${PG_JOB:-}" ]]; then wait "${PG_JOB}" || true; fi
  if [[ -n "${S3_JOB:-}" ]]; then wait "${S3_JOB}" || true; fi
  log "up failed; last lines of the logs in ${LOGS}:"
  local f
  for f in "${LOGS}"/*.log; do
    [[ -f "${f}" ]] || continue
    echo "--- ${f##*/}" >&2
    tail -5 "${f}" >&2
  done
  if [[ "${KEEP_ON_FAILURE:-}" == 1 ]]; then
    log "KEEP_ON_FAILURE=1: left running; hack/cluster.sh down cleans up"
  else
    log "tearing down (set KEEP_ON_FAILURE=1 to keep it for debugging)"
    cmd_down || true
  fi
  exit "$1"
}

# render_node K: node K's configuration files, in its directory.
render_node() {
  local k="$1" dir
  dir="$(node_dir "${k}")"
  mkdir -p "${dir}/cni/net.d" "${dir}/pod-logs" "${dir}/kubelet" "${dir}/containerd/certs.d/${REGISTRY}"
  render containerd.toml "${dir}/containerd.toml" "${k}"
  render hosts.toml "${dir}/containerd/certs.d/${REGISTRY}/hosts.toml" "${k}"
  render cni.conflist "${dir}/cni/net.d/10-runledger.conflist" "${k}"
  render kubelet.yaml "${dir}/kubelet.yaml" "${k}"
  render kube-proxy.yaml "${dir}/kube-proxy.yaml" "${k}"
}

# The registry comes first: containerd pulls every image from it, the
# sandbox (pause) image too.
start_registry() {
  step "registry http://${REGISTRY}"
  start_daemon registry "${TOOLS}/registry" -addr "${REGISTRY}" -dir "${RUN}/registry"
  WATCH=registry wait_for "the registry" 30 curl -fsS "http://${REGISTRY}/v2/"
  local ref
  ref="$(push_image "${PAUSE_IMAGE#"${REGISTRY}/"}" "${TOOLS}/pause")"
  step "pause image ${ref}"
}

start_control_plane() {
  local pki="${RUN}/pki"
  step "etcd"
  start_daemon etcd "${BIN_DIR}/etcd" --name "${CP_NETNS}" --data-dir "${RUN}/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster "${CP_NETNS}=http://127.0.0.1:2380" \
    --unsafe-no-fsync --log-level warn
  WATCH=etcd wait_for "etcd" 30 in_ns "${CP_NETNS}" curl -fsS http://127.0.0.1:2379/health

  step "kube-apiserver https://${CP_IP}:6443"
  # --enable-aggregator-routing: the control plane's namespace has no
  # kube-proxy and cannot reach a Service's ClusterIP, so the API server calls
  # admission webhooks, CRD conversion webhooks and APIServices at the
  # Service's endpoint pod IPs, which it routes to (Kueue's webhooks, TestKueue).
  start_daemon kube-apiserver "${BIN_DIR}/kube-apiserver" \
    --etcd-servers http://127.0.0.1:2379 \
    --advertise-address "${CP_IP}" --bind-address 0.0.0.0 --secure-port 6443 \
    --cert-dir "${RUN}/apiserver" \
    --tls-cert-file "${pki}/apiserver.crt" --tls-private-key-file "${pki}/apiserver.key" \
    --client-ca-file "${pki}/ca.crt" \
    --kubelet-client-certificate "${pki}/apiserver-kubelet-client.crt" \
    --kubelet-client-key "${pki}/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "${pki}/sa.pub" --service-account-signing-key-file "${pki}/sa.key" \
    --service-cluster-ip-range "${SERVICE_CIDR}" \
    --authorization-mode Node,RBAC \
    --enable-aggregator-routing=true \
    --profiling=false
  WATCH=kube-apiserver wait_for "kube-apiserver /readyz" 120 kubectl_ get --raw /readyz

  # A node whose kubelet stops renewing its Lease is unreachable after 20 s,
  # not 50 s: tests of lost nodes take less time.
  step "kube-controller-manager, kube-scheduler"
  start_daemon kube-controller-manager "${BIN_DIR}/kube-controller-manager" \
    --kubeconfig "${RUN}/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --cert-dir "${RUN}/controller-manager" \
    --service-account-private-key-file "${pki}/sa.key" --root-ca-file "${pki}/ca.crt" \
    --use-service-account-credentials --service-cluster-ip-range "${SERVICE_CIDR}" \
    --flex-volume-plugin-dir "${RUN}/kcm-flexvolume" \
    --node-monitor-grace-period 20s --node-monitor-period 2s \
    --leader-elect=false --profiling=false
  start_daemon kube-scheduler "${BIN_DIR}/kube-scheduler" \
    --kubeconfig "${RUN}/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --cert-dir "${RUN}/scheduler" \
    --leader-elect=false --profiling=false
}

# start_node K: node K's containerd, kube-proxy, kube-network-policies
# (NetworkPolicy) and kubelet; waits until the node is registered.
start_node() {
  local k="$1" name dir
  name="$(node_name "${k}")" dir="$(node_dir "${k}")"
  step "node ${name} ($(node_ip "${k}"), pods $(node_pod_cidr "${k}")): containerd, kube-proxy, kube-network-policies, kubelet"
  start_node_daemon "${k}" containerd containerd --config "${dir}/containerd.toml"
  WATCH="containerd-${name}" wait_for "containerd of ${name}" 30 ctr_ "${k}" version
  start_node_daemon "${k}" kube-proxy "${BIN_DIR}/kube-proxy" --config "${dir}/kube-proxy.yaml"
  start_node_netpol "${k}"
  # The kubelet exits at once while containerd's CRI still recovers its state
  # after a power loss ("server is not initialized yet"; ctr version does not
  # wait for it), and a node that exists already looks registered: start it
  # until it stays up for 3 s.
  local try
  for try in 1 2 3 4 5; do
    start_node_daemon "${k}" kubelet "${BIN_DIR}/kubelet" --config "${dir}/kubelet.yaml" \
      --kubeconfig "${RUN}/kubelet-${name}.kubeconfig" --root-dir "${dir}/kubelet" \
      --hostname-override "${name}" --node-ip "$(node_ip "${k}")"
    sleep 3
    if daemon_pid "kubelet-${name}" >/dev/null; then break; fi
    log "the kubelet of ${name} exited at start (try ${try} of 5; see ${LOGS}/kubelet-${name}.log); starting it again"
  done
  WATCH="kubelet-${name}" wait_for "node ${name} to register" 60 kubectl_ get node "${name}"
}

# wait_node_ready K: node K is Ready and its kube-proxy has programmed the
# apiserver's ClusterIP.
wait_node_ready() {
  local k="$1" name
  name="$(node_name "${k}")"
  kubectl_ wait --for=condition=Ready "node/${name}" --timeout=90s >/dev/null
  WATCH="kube-proxy-${name}" wait_for "kube-proxy rules for ${SERVICE_IP} on ${name}" 60 \
    bash -c "nsenter --net=/run/netns/${name} -- iptables -t nat -S KUBE-SERVICES | grep -q -- '-d ${SERVICE_IP}/32'"
  step "node ${name} Ready"
}

# What a pod needs before it can start: its namespace's default service
# account and the CA bundle of its token volume.
wait_ready_for_pods() {
  WATCH=kube-controller-manager wait_for "the default service account" 60 kubectl_ -n default get serviceaccount default
  WATCH=kube-controller-manager wait_for "the kube-root-ca.crt ConfigMap" 60 kubectl_ -n default get configmap kube-root-ca.crt
  step "ready for pods"
}

# node-start NAME: power node NAME on again after a power loss (test/e2e's
# node helper kills its processes and cuts its link): the link back up, its
# daemons started on the state they left, like a machine that reboots;
# containerd and the kubelet clean up after the processes that died.
cmd_node_start() {
  [[ $# -eq 1 ]] || usage
  [[ -d "${RUN}" ]] || die "the cluster is not up"
  k8s_bin_dir
  local k name d
  k="$(node_index "$1")" || die "$1: no such node (runledger-1 to runledger-$(node_count))"
  name="$(node_name "${k}")"
  for d in "${NODE_DAEMONS[@]}"; do
    if daemon_pid "${d}-${name}" >/dev/null; then die "${d} of ${name} is running: the node is on"; fi
  done
  ip -n "${CP_NETNS}" link set "$(node_link "${k}")" up
  setup_node_routes "${k}"
  start_node "${k}"
  wait_node_ready "${k}"
}
