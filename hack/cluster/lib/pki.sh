# shellcheck shell=bash
# Sourced by hack/cluster.sh: certificates and kubeconfigs, written by
# hack/tools/pki (Go: crypto/x509 reads better than openssl invocations).

# make_pki: the CA, every component's certificate and kubeconfig, the
# service account key, under ${RUN}/pki and ${RUN}/*.kubeconfig; PostgreSQL's
# own CA and serving certificate (${RUN}/pki/postgres-ca.crt, postgres.{crt,key});
# the S3 gateway's likewise (${RUN}/pki/s3-ca.crt, s3.{crt,key}).
make_pki() {
  local k nodes=()
  for k in $(seq "$(node_count)"); do nodes+=(-node "$(node_name "${k}")=$(node_ip "${k}")"); done
  "${TOOLS}/pki" -dir "${RUN}" -apiserver-ip "${CP_IP}" -service-ip "${SERVICE_IP}" "${nodes[@]}" \
    -postgres-ip "${CP_IP}" -s3-ip "${CP_IP}" ||
    die "generating certificates and kubeconfigs failed"
}
