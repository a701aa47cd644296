package ledger

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/jackc/pgx/v5/pgconn"
)

// Schema is the PostgreSQL schema that holds every runledger object.
const Schema = "runledger"

// BusinessKeyIndex is the name of THE rule: the filtered composite unique index
//
//	CREATE UNIQUE INDEX ledger_business_key_uq ON runledger.ledger (entity, occurrence)
//	    WHERE state = 'committed'
//
// created by migrations/00001_ledger.sql. A violation of this index, and of no
// other rule, proves that the logical occurrence was already committed.
// TestBusinessKeyIndexMatchesCatalog reads the migrated catalog back so that
// this constant and the migration cannot drift apart.
const BusinessKeyIndex = "ledger_business_key_uq"

// SQLSTATE codes the classifiers look at.
const (
	sqlstateUniqueViolation      = "23505"
	sqlstateSerializationFailure = "40001"
	sqlstateDeadlockDetected     = "40P01"
	sqlstateAdminShutdown        = "57P01"
	sqlstateCrashShutdown        = "57P02"
	sqlstateCannotConnectNow     = "57P03"
	sqlstateTooManyConnections   = "53300"
	// 42501: a missing privilege, or a row refused by a row-level security policy.
	sqlstateInsufficientPrivilege = "42501"
)

// IsExpectedBusinessKeyConflict reports whether err is, anywhere in its wrapped
// chain, a unique violation (SQLSTATE 23505) of the ledger's business-key index
// (BusinessKeyIndex in schema runledger).
//
// It is deliberately narrow: a different unique index (even on the same table),
// a foreign-key or check violation, a persistence error without a PostgreSQL
// cause, a cancelled context: all of these return false and must stay failures.
// The chain is walked through fmt.Errorf("%w"), errors.Join and any custom
// Unwrap() error / Unwrap() []error, so a PgError is found however deeply the
// layers above wrapped it.
func IsExpectedBusinessKeyConflict(err error) bool {
	return anyInChain(err, func(e error) bool {
		pgErr, ok := e.(*pgconn.PgError) //nolint:errorlint // anyInChain visits every node of the chain itself
		return ok && pgErr.Code == sqlstateUniqueViolation &&
			pgErr.ConstraintName == BusinessKeyIndex &&
			// PostgreSQL reports the schema of the violated table; an index of
			// the same name on a table in another schema is another rule.
			(pgErr.SchemaName == "" || pgErr.SchemaName == Schema)
	})
}

// IsRetryable reports whether err is a transient condition after which the same
// work may be tried again (with back-off): the connection was lost or never
// established, the server is shutting down or refusing connections for now,
// or the transaction lost a serialization or deadlock race. Everything else is
// permanent.
//
// Retrying a chunk whose COMMIT outcome is unknown is safe: the business-key
// index refuses a second committed row, and CommitChunk reports a row that this
// same run committed earlier as such (HolderSameRun), so counts stay exact.
//
// A cancelled or expired context is not retryable: the caller asked to stop.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	return anyInChain(err, func(e error) bool {
		switch e := e.(type) { //nolint:errorlint // anyInChain visits every node of the chain itself
		case *pgconn.PgError:
			switch e.Code {
			case sqlstateSerializationFailure, sqlstateDeadlockDetected,
				sqlstateAdminShutdown, sqlstateCrashShutdown, sqlstateCannotConnectNow,
				sqlstateTooManyConnections:
				return true
			}
			// Class 08: connection exception.
			return len(e.Code) == 5 && e.Code[:2] == "08"
		case *pgconn.ConnectError:
			return true
		case net.Error:
			return true
		}
		if errors.Is(e, io.EOF) || errors.Is(e, io.ErrUnexpectedEOF) || errors.Is(e, net.ErrClosed) {
			return true
		}
		// pgx's own verdict: the request never reached the server.
		return pgconn.SafeToRetry(e)
	})
}

// isStatementLevel reports whether err condemns a statement regardless of which
// items it carried (a syntax error in the effect, a missing table, a missing
// privilege): isolating items one by one cannot help, every item fails alike.
// A row refused by a row-level security policy is not: it depends on the row.
func isStatementLevel(err error) bool {
	return anyInChain(err, func(e error) bool {
		pgErr, ok := e.(*pgconn.PgError) //nolint:errorlint // anyInChain visits every node of the chain itself
		if !ok || len(pgErr.Code) != 5 || isRowSecurityCheck(pgErr) {
			return false
		}
		switch pgErr.Code[:2] {
		case "42", // syntax error or access rule violation
			"0A", // feature not supported
			"3F", // invalid schema name
			"25": // invalid transaction state
			return true
		}
		return false
	})
}

// isRowSecurityCheck reports whether pgErr is a row refused by a row-level
// security policy (its WITH CHECK, or USING on an upsert's update): SQLSTATE
// 42501 like a missing privilege, but it depends on the row.
//
// The server names no table or constraint for it, and its message is
// translated (lc_messages); the routine that raised it is neither, and no
// other 42501 comes from it.
func isRowSecurityCheck(pgErr *pgconn.PgError) bool {
	return pgErr.Code == sqlstateInsufficientPrivilege && pgErr.Routine == "ExecWithCheckOptions"
}

// anyInChain walks err's whole wrap tree, depth first, and reports whether
// match holds for any node.
func anyInChain(err error, match func(error) bool) bool {
	if err == nil {
		return false
	}
	if match(err) {
		return true
	}
	switch u := err.(type) { //nolint:errorlint // this is the chain walk: it unwraps by hand
	case interface{ Unwrap() error }:
		return anyInChain(u.Unwrap(), match)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if anyInChain(e, match) {
				return true
			}
		}
	}
	return false
}
