-- The README's examples (namespace billing): the tables the runs read and
-- write, created by the ledger's owner in the ledger's database, after the
-- administrator created the worker login runledger_worker and the effect
-- role runledger_effect, and before
--
--   runledger migrate --grant-to runledger_worker --effect-role runledger_effect
--
-- (docs/migrations.md, "Two roles"). test/e2e/readme_examples_test.go sets
-- the README's world up this way, then runs its examples.
CREATE TABLE accounts (
  id   text PRIMARY KEY,
  name text NOT NULL
);
-- What the meter recorded, per account and month. acct-37's usage came in
-- before its account was created.
CREATE TABLE usage (
  account text NOT NULL,
  period  text NOT NULL,
  amount  numeric(12, 2) NOT NULL
);
-- One invoice per account and month, of an account that exists.
CREATE TABLE invoices (
  account text NOT NULL REFERENCES accounts,
  period  text NOT NULL,
  amount  numeric(12, 2) NOT NULL,
  PRIMARY KEY (account, period)
);
-- Credit notes, one per note, as the support team's exports list them
-- (config/samples/billing/credits-2026-06-30.csv, read from a bucket).
CREATE TABLE credits (
  note    text PRIMARY KEY,
  account text NOT NULL REFERENCES accounts,
  amount  numeric(12, 2) NOT NULL
);
INSERT INTO accounts (id, name) SELECT 'acct-' || i, 'Customer ' || i FROM generate_series(1, 50) i WHERE i <> 37;
INSERT INTO usage (account, period, amount)
SELECT 'acct-' || i, p.period, 10 + i * p.factor
FROM generate_series(1, 50) i, (VALUES ('2026-06', 1.25), ('2026-07', 1.5)) p (period, factor)
WHERE p.period = '2026-06' OR i <> 37;
-- The runs' queries read as the worker login; their SQL effects write as the
-- effect role.
GRANT SELECT ON usage TO runledger_worker;
GRANT INSERT ON invoices, credits TO runledger_effect;
