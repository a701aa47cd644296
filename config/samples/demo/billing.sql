-- The demo's own table, which the runs' SQL effect writes: one invoice per
-- account and month. Created by the owner (login runledger, database billing):
--
--   psql "$RUNLEDGER_DATABASE_URL" -f config/samples/demo/billing.sql
CREATE TABLE invoices (
  account  text NOT NULL,
  period   text NOT NULL,
  amount   numeric(12, 2) NOT NULL,
  currency text NOT NULL CONSTRAINT invoices_currency_check CHECK (currency IN ('EUR', 'GBP')),
  PRIMARY KEY (account, period)
);
-- What the effects write is granted to the effect role, not to the worker.
GRANT INSERT ON invoices TO billing_effect;
