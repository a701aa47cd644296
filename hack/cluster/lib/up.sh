# shellcheck shell=bash
# Sourced by hack/cluster.sh: up: the control plane and the node.

# --- up --------------------------------------------------------------------------------

cluster_healthy() {
  local d
  for d in "${DAEMONS[@]}"; do
    daemon_pid "${d}" >/dev/null || return 1
  done
  kubectl_ get --raw /readyz >/dev/null 2>&1
}

cmd_up() {
  mkdir -p "${STATE}"
  if [[ -d "${RUN}" ]]; then
    k8s_bin_dir 2>/dev/null || true
    if [[ -n "${BIN_DIR:-}" ]] && cluster_healthy; then
      log "already up (hack/cluster.sh status; hack/cluster.sh down to stop)"
      print_usage_hint
      return 0
    fi
    die "${RUN} exists but the cluster is not healthy: run hack/cluster.sh down first"
  fi
  netns_exists && die "network namespace ${NETNS} exists but ${RUN} does not: remove it (ip netns delete ${NETNS}) or run hack/cluster.sh down"

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

  # 0755 whatever the umask: user postgres must get through it.
  install -d -m 0755 "${RUN}"
  echo "${ROOT}" >"${RUN}/checkout"
  # From here on a failure (or Ctrl-C) tears down whatever was started.
  trap 'up_exit $?' EXIT
  trap 'exit 130' INT TERM
  save_host_state
  step "network namespace ${NETNS}: host ${HOST_IP} <-> node ${NODE_IP}"
  setup_netns
  setup_cgroups

  step "certificates and kubeconfigs"
  make_pki
  mkdir -p "${RUN}/cni/net.d" "${RUN}/pod-logs" "${RUN}/kubelet" "${RUN}/etcd" "${RUN}/apiserver"
  chmod 700 "${RUN}/etcd"
  : >"${RUN}/resolv.conf"
  render containerd.toml "${RUN}/containerd.toml"
  mkdir -p "${RUN}/containerd/certs.d/${REGISTRY}"
  render hosts.toml "${RUN}/containerd/certs.d/${REGISTRY}/hosts.toml"
  render cni.conflist "${RUN}/cni/net.d/10-runledger.conflist"
  render kubelet.yaml "${RUN}/kubelet.yaml"
  render kube-proxy.yaml "${RUN}/kube-proxy.yaml"

  # PostgreSQL (initdb is slow on a busy disk) comes up alongside the rest.
  start_postgres_fresh &
  PG_JOB=$!
  start_registry
  start_containerd
  start_control_plane
  start_node
  wait "${PG_JOB}" || die "PostgreSQL did not start; see ${LOGS}/postgres.log"
  PG_JOB=""

  local d
  for d in "${DAEMONS[@]}"; do
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

start_containerd() {
  step "containerd"
  start_daemon containerd containerd --config "${RUN}/containerd.toml"
  WATCH=containerd wait_for "containerd" 30 ctr_ version
}

start_control_plane() {
  local pki="${RUN}/pki"
  step "etcd"
  start_daemon etcd "${BIN_DIR}/etcd" --name "${NODE_NAME}" --data-dir "${RUN}/etcd" \
    --listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
    --listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
    --initial-cluster "${NODE_NAME}=http://127.0.0.1:2380" \
    --unsafe-no-fsync --log-level warn
  WATCH=etcd wait_for "etcd" 30 in_ns curl -fsS http://127.0.0.1:2379/health

  step "kube-apiserver https://${NODE_IP}:6443"
  start_daemon kube-apiserver "${BIN_DIR}/kube-apiserver" \
    --etcd-servers http://127.0.0.1:2379 \
    --advertise-address "${NODE_IP}" --bind-address 0.0.0.0 --secure-port 6443 \
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
    --profiling=false
  WATCH=kube-apiserver wait_for "kube-apiserver /readyz" 120 kubectl_ get --raw /readyz

  step "kube-controller-manager, kube-scheduler"
  start_daemon kube-controller-manager "${BIN_DIR}/kube-controller-manager" \
    --kubeconfig "${RUN}/controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --cert-dir "${RUN}/controller-manager" \
    --service-account-private-key-file "${pki}/sa.key" --root-ca-file "${pki}/ca.crt" \
    --use-service-account-credentials --service-cluster-ip-range "${SERVICE_CIDR}" \
    --flex-volume-plugin-dir "${RUN}/kcm-flexvolume" \
    --leader-elect=false --profiling=false
  start_daemon kube-scheduler "${BIN_DIR}/kube-scheduler" \
    --kubeconfig "${RUN}/scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --cert-dir "${RUN}/scheduler" \
    --leader-elect=false --profiling=false
}

start_node() {
  step "kube-proxy (iptables mode, in the netns)"
  start_daemon kube-proxy "${BIN_DIR}/kube-proxy" --config "${RUN}/kube-proxy.yaml"
  step "kubelet"
  start_daemon kubelet "${BIN_DIR}/kubelet" --config "${RUN}/kubelet.yaml" \
    --kubeconfig "${RUN}/kubelet-${NODE_NAME}.kubeconfig" --root-dir "${RUN}/kubelet" \
    --hostname-override "${NODE_NAME}" --node-ip "${NODE_IP}"
  WATCH=kubelet wait_for "node ${NODE_NAME} to register" 60 kubectl_ get node "${NODE_NAME}"
  kubectl_ wait --for=condition=Ready "node/${NODE_NAME}" --timeout=90s >/dev/null
  step "node ${NODE_NAME} Ready"
  # What a pod needs before it can start: its namespace's default service
  # account, the CA bundle of its token volume, and the apiserver ClusterIP
  # programmed by kube-proxy.
  WATCH=kube-controller-manager wait_for "the default service account" 60 kubectl_ -n default get serviceaccount default
  WATCH=kube-controller-manager wait_for "the kube-root-ca.crt ConfigMap" 60 kubectl_ -n default get configmap kube-root-ca.crt
  WATCH=kube-proxy wait_for "kube-proxy rules for ${SERVICE_IP}" 60 \
    bash -c "nsenter --net=/run/netns/${NETNS} -- iptables -t nat -S KUBE-SERVICES | grep -q -- '-d ${SERVICE_IP}/32'"
  step "ready for pods"
}

