# shellcheck shell=bash
# Sourced by hack/cluster.sh: the network namespace of the node.

# --- network namespace ---------------------------------------------------------------

setup_netns() {
  ip netns add "${NETNS}"
  ip link add "${HOST_IF}" type veth peer name "${NODE_IF}" netns "${NETNS}"
  ip addr add "${HOST_IP}/${NET_PREFIX}" dev "${HOST_IF}"
  ip link set "${HOST_IF}" up
  ip -n "${NETNS}" link set lo up
  ip -n "${NETNS}" addr add "${NODE_IP}/${NET_PREFIX}" dev "${NODE_IF}"
  ip -n "${NETNS}" link set "${NODE_IF}" up
  # For host-network processes in the netns, ClusterIPs need a route before
  # kube-proxy's DNAT applies; a packet no rule rewrites goes to the host,
  # which drops it (nothing is forwarded there). There is no default route:
  # pods reach the node (apiserver, PostgreSQL) and each other, nothing else.
  ip -n "${NETNS}" route add "${SERVICE_CIDR}" dev "${NODE_IF}"
}

