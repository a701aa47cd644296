# shellcheck shell=bash
# Sourced by hack/cluster.sh: the network namespaces of the control plane and
# of the nodes, and the routes between them.
#
#   host ${HOST_IP} --- ${CP_IP} control plane (CP_NETNS) 10.250.K.1 --- 10.250.K.2 node K (pods 10.244.K.0/24)
#
# The control plane's netns routes between the nodes (their addresses and
# pod networks) and reaches the host; nothing is forwarded to the host, and
# there is no other way out.

setup_netns() {
  ip netns add "${CP_NETNS}"
  ip link add "${HOST_IF}" type veth peer name "${CP_IF}" netns "${CP_NETNS}"
  ip addr add "${HOST_IP}/${NET_PREFIX}" dev "${HOST_IF}"
  ip link set "${HOST_IF}" up
  ip -n "${CP_NETNS}" link set lo up
  ip -n "${CP_NETNS}" addr add "${CP_IP}/${NET_PREFIX}" dev "${CP_IF}"
  ip -n "${CP_NETNS}" link set "${CP_IF}" up
  # Per-netns settings: the host's own forwarding and firewall stay as they are.
  in_ns "${CP_NETNS}" sysctl -qw net.ipv4.ip_forward=1
  in_ns "${CP_NETNS}" iptables -w -A FORWARD -o "${CP_IF}" -j DROP
}

# setup_node_netns K: node K's netns, its veth pair to the control plane's,
# and the routes both ways.
setup_node_netns() {
  local k="$1" ns link ip gw
  ns="$(node_name "${k}")" link="$(node_link "${k}")" ip="$(node_ip "${k}")" gw="$(node_gateway "${k}")"
  ip netns add "${ns}"
  ip -n "${CP_NETNS}" link add "${link}" type veth peer name "${NODE_UPLINK}" netns "${ns}"
  ip -n "${CP_NETNS}" addr add "${gw}/${NET_PREFIX}" dev "${link}"
  ip -n "${CP_NETNS}" link set "${link}" up
  ip -n "${ns}" link set lo up
  ip -n "${ns}" addr add "${ip}/${NET_PREFIX}" dev "${NODE_UPLINK}"
  ip -n "${ns}" link set "${NODE_UPLINK}" up
  setup_node_routes "${k}"
  in_ns "${ns}" sysctl -qw net.ipv4.ip_forward=1
}

# setup_node_routes K: the routes between node K and the control plane's
# netns, again after its link was down (which removes them).
setup_node_routes() {
  local k="$1"
  # Everything else through the control plane's netns: the apiserver,
  # PostgreSQL, the registry, other nodes and their pods. ClusterIPs too,
  # for host-network processes, before kube-proxy's DNAT applies.
  ip -n "$(node_name "${k}")" route replace default via "$(node_gateway "${k}")"
  ip -n "${CP_NETNS}" route replace "$(node_pod_cidr "${k}")" via "$(node_ip "${k}")"
}
