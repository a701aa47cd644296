# shellcheck shell=bash
# Sourced by hack/cluster.sh: NetworkPolicy enforcement on every node, SIG
# Network's kube-network-policies (hack/tools/netpol pins it), run like
# kube-proxy: a daemon in the node's netns, not a pod.
#
# It decides in user space, on the first packet of each connection, which
# the kernel hands it through NFQUEUE queue NETPOL_QUEUE. It programs that
# hand-over itself with nftables' queue statement, which needs the kernel's
# nft_queue (CONFIG_NFT_QUEUE); a kernel without it refuses the whole table
# (its log says so, and it goes on deciding), so the same hand-over is
# installed here with iptables' NFQUEUE target (xt compat) instead, in the
# same place and order as its own rules: POSTROUTING before source NAT,
# root's own sockets (the kubelet's probes) and established connections
# pass, a new connection from or to one of the node's pods is queued. No
# listener on the queue drops the packet (its default, --fail-open=false).
# It learns pod addresses from the API server only (NRI needs containerd 1.7,
# Debian's is 1.6), so a new pod's very first connections can come before it
# knows the pod, and pass as a non-pod's (kubernetes#85966).

NETPOL_QUEUE=100
NETPOL_CHAIN=RUNLEDGER-NETPOL

# setup_netpol_identity: its ServiceAccount, rules and a token, once the API
# server is up; a daemon outside any pod reads them where client-go's
# in-cluster configuration looks (start_node_netpol).
setup_netpol_identity() {
  kubectl_ apply -f "${CONF}/kube-network-policies.yaml" >/dev/null
  install -d -m 0700 "${RUN}/netpol"
  kubectl_ -n kube-system create token kube-network-policies --duration 8760h >"${RUN}/netpol/token"
  cp "${RUN}/pki/ca.crt" "${RUN}/netpol/ca.crt"
}

# start_node_netpol K: node K's kube-network-policies, then the hand-over
# to it. A mount namespace of its own puts the token at
# /var/run/secrets/kubernetes.io/serviceaccount on a tmpfs only it sees
# (it needs nothing else of /run: NRI, the containerd socket, is off).
start_node_netpol() {
  local k="$1" name
  name="$(node_name "${k}")"
  # shellcheck disable=SC2016 # expanded by that bash, from its arguments
  local with_token='
    set -e
    mount -t tmpfs -o size=1m,mode=0755 netpol /run
    mkdir -p /run/secrets/kubernetes.io/serviceaccount
    cp "$1/token" "$1/ca.crt" /run/secrets/kubernetes.io/serviceaccount/
    shift
    exec "$@"'
  start_node_daemon "${k}" kube-network-policies env KUBERNETES_SERVICE_HOST="${CP_IP}" KUBERNETES_SERVICE_PORT=6443 \
    unshare --mount --propagation private -- bash -c "${with_token}" netpol "${RUN}/netpol" \
    "${TOOLS}/kube-network-policies" --hostname-override "${name}" --nfqueue-id "${NETPOL_QUEUE}" \
    --disable-nri --netfilter-bug-1766-fix=false --metrics-bind-address 127.0.0.1:9080
  # shellcheck disable=SC2016 # awk's
  WATCH="kube-network-policies-${name}" wait_for "kube-network-policies on ${name} to listen on queue ${NETPOL_QUEUE}" 60 \
    in_ns "${name}" awk -v q="${NETPOL_QUEUE}" '$1 == q { found = 1 } END { exit !found }' /proc/net/netfilter/nfnetlink_queue
  netpol_handover "${k}"
}

# netpol_handover K: the iptables rules that queue node K's new pod
# connections (again after a power loss: the chain is rebuilt, not doubled).
netpol_handover() {
  local k="$1" ns cidr
  ns="$(node_name "${k}")" cidr="$(node_pod_cidr "${k}")"
  in_ns "${ns}" iptables -w -t mangle -N "${NETPOL_CHAIN}" 2>/dev/null || in_ns "${ns}" iptables -w -t mangle -F "${NETPOL_CHAIN}"
  in_ns "${ns}" iptables -w -t mangle -A "${NETPOL_CHAIN}" -m owner --uid-owner 0 -j RETURN
  in_ns "${ns}" iptables -w -t mangle -A "${NETPOL_CHAIN}" -m conntrack --ctstate ESTABLISHED,RELATED -j RETURN
  in_ns "${ns}" iptables -w -t mangle -A "${NETPOL_CHAIN}" -s "${cidr}" -j NFQUEUE --queue-num "${NETPOL_QUEUE}"
  in_ns "${ns}" iptables -w -t mangle -A "${NETPOL_CHAIN}" -d "${cidr}" -j NFQUEUE --queue-num "${NETPOL_QUEUE}"
  in_ns "${ns}" iptables -w -t mangle -C POSTROUTING -j "${NETPOL_CHAIN}" 2>/dev/null ||
    in_ns "${ns}" iptables -w -t mangle -A POSTROUTING -j "${NETPOL_CHAIN}"
}
