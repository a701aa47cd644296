-- What the database's administrator does once for the demo's ledger
-- (docs/migrations.md, "Two roles"): hack/demo.sh runs it as the cluster's
-- superuser, postgres, on the node's socket:
--
--   runuser -u postgres -- psql -h /var/lib/runledger-cluster/postgres/run \
--     -v worker_password="${WORKER_PASSWORD}" -f - <config/samples/demo/roles.sql
--
-- The owner is the cluster's login runledger (hack/cluster.sh dsn): it owns
-- the database billing, applies the migrations and grants.

-- The runs' login (the Secret billing-db): it owns nothing.
CREATE ROLE billing_worker LOGIN PASSWORD :'worker_password';
-- The role SQL effects run as: owns nothing, never logs in; the owner is a
-- member, so that runledger migrate --effect-role can give it the sandbox.
CREATE ROLE billing_effect NOLOGIN;
GRANT billing_effect TO runledger;
CREATE DATABASE billing OWNER runledger;
-- pg_hba.conf now lets billing_worker in from the pods (hack/demo/story.sh).
SELECT pg_reload_conf() AS reloaded \gset
\echo created billing_worker (LOGIN), billing_effect (NOLOGIN, granted to runledger), database billing; pg_hba.conf reloaded
