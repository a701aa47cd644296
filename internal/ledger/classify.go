package ledger

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"reflect"
	"strings"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"
)

// Schema is the PostgreSQL schema that holds every runledger object.
const Schema = "runledger"

// BusinessKeyIndex is the name of THE rule: the filtered composite unique index
//
//	CREATE UNIQUE INDEX ledger_business_key_uq ON runledger.ledger (occurrence, entity)
//	    WHERE state = 'committed'
//
// created by migrations/00001_ledger.sql, its columns put occurrence first by
// 00005 (the same rule; a batch's new occurrence lands on adjacent leaves). A
// violation of this index, and of no other rule, proves that the logical occurrence was already committed.
// TestBusinessKeyIndexMatchesCatalog reads the migrated catalog back so that
// this constant and the migration cannot drift apart.
const BusinessKeyIndex = "ledger_business_key_uq"

// AppendOnlyRule names the refusal of migrations/00003_append_only.sql's
// trigger: a DELETE, TRUNCATE or UPDATE of a ledger row other than committed
// -> superseded. PostgreSQL reports it as a restrict_violation (23001) with
// this constraint name.
const AppendOnlyRule = "ledger_append_only"

// sqlstateShardLeaseLost is runledger.shard_lease_hold's (migrations/00018):
// an implementation-defined class (R), raised by the ledger's own function.
// Every other SQLSTATE the classifiers look at is PostgreSQL's, named by
// pgerrcode.
const sqlstateShardLeaseLost = "RL001"

// The SQLSTATE classes the classifiers look at: a class is the first two
// characters of its codes, and pgerrcode names each class by its own code
// (NN000).
var (
	// Class 08, connection exception: retryable (IsRetryable).
	classConnectionException = sqlstateClass(pgerrcode.ConnectionException)
	// Class 28, invalid authorization specification: wrong password, unknown
	// role, role without LOGIN, no pg_hba.conf entry.
	classInvalidAuthorization    = sqlstateClass(pgerrcode.InvalidAuthorizationSpecification)
	classSyntaxOrAccessRule      = sqlstateClass(pgerrcode.SyntaxErrorOrAccessRuleViolation)
	classFeatureNotSupported     = sqlstateClass(pgerrcode.FeatureNotSupported)
	classInvalidSchemaName       = sqlstateClass(pgerrcode.InvalidSchemaName)
	classInvalidTransactionState = sqlstateClass(pgerrcode.InvalidTransactionState)
	classDataException           = sqlstateClass(pgerrcode.DataException)
	classProgramLimitExceeded    = sqlstateClass(pgerrcode.ProgramLimitExceeded)
)

// IsFreshRangeRefusal reports whether err is the server refusing a value of
// a fresh range it was asked to claim (BatchReader.ClaimFresh): a data
// exception (a payload that is not JSON, a value out of range) or a value
// past a limit of the server (a jsonb too large). Nothing of the range
// committed, and its items are claimed one by one instead, where the same
// value fails its own item, or passes. It decides no verdict.
func IsFreshRangeRefusal(err error) bool {
	return anyPgError(err, func(pgErr *pgconn.PgError) bool {
		c := sqlstateClass(pgErr.Code)
		return c == classDataException || c == classProgramLimitExceeded
	})
}

// IsExpectedBusinessKeyConflict reports whether err is, anywhere in its wrapped
// chain, the engine's own unique check of the business-key index
// (BusinessKeyIndex on runledger.ledger) refusing a second committed row.
//
// It identifies the violation by what only that check produces. A PL/pgSQL
// RAISE can set the SQLSTATE and every field the classifier used to read
// (constraint, schema, table, column, detail, message), so those are
// necessary but not sufficient: the error must also come from the B-tree's
// own unique check (routine _bt_check_unique, file nbtinsert.c), which no
// user code can name as its source (a RAISE reports exec_stmt_raise in
// pl_exec.c; TestRuleViolationFieldsOnEngine pins both on the real server).
//
// An error raised while user code ran (a *UserCodeError: the effect, the
// triggers and deferred constraints it set off; a *ProcessorError) is never
// read through, whatever it carries: it is a failure of its items.
//
// It is deliberately narrow: a different unique index (even on the same table),
// a foreign-key or check violation, a persistence error without a PostgreSQL
// cause, a cancelled context: all of these return false and must stay failures.
// The chain is walked through fmt.Errorf("%w"), errors.Join and any custom
// Unwrap() error / Unwrap() []error, so a PgError is found however deeply the
// layers above wrapped it.
//
// It only ever selects a path (the chunk is claimed again with the rule as
// the arbiter); an item is AlreadyHandled only with the committed row that
// holds its key, read back (Result.HolderUID).
func IsExpectedBusinessKeyConflict(err error) bool {
	return anyPgErrorOutsideUserCode(err, isRuleCheck)
}

// The B-tree's unique check, as the server names it in every error it raises
// (the R and F fields of the protocol, never translated, never settable).
const (
	ruleCheckRoutine = "_bt_check_unique"
	ruleCheckFile    = "nbtinsert.c"
)

// isRuleCheck reports whether pgErr is the engine's unique check of
// runledger.ledger's business-key index.
func isRuleCheck(pgErr *pgconn.PgError) bool {
	return pgErr.Code == pgerrcode.UniqueViolation &&
		pgErr.Routine == ruleCheckRoutine && pgErr.File == ruleCheckFile &&
		pgErr.ConstraintName == BusinessKeyIndex &&
		pgErr.SchemaName == Schema && pgErr.TableName == "ledger"
}

// UserCodeError is an error raised while user code ran: the effect, the
// triggers and deferred constraints its writes set off (checked at the insert
// path's SET CONSTRAINTS ALL IMMEDIATE). Whatever it says, it is a failure
// of the items whose user code raised it, never "already handled"
// (IsExpectedBusinessKeyConflict does not look inside); the other
// classifiers do (a lock_timeout in the effect stays retryable, a syntax
// error statement-level).
type UserCodeError struct {
	// Doing says what the insert path was doing: "running effect".
	Doing string
	Err   error
}

func (e *UserCodeError) Error() string { return e.Doing + ": " + e.Err.Error() }
func (e *UserCodeError) Unwrap() error { return e.Err }

// raisedByUserCode reports whether e itself carries what user code raised
// (*UserCodeError, *ProcessorError): a walk that reads only the ledger's own
// errors stops there.
func raisedByUserCode(e error) bool {
	_, user := errorNode[*UserCodeError](e)
	_, processor := errorNode[*ProcessorError](e)
	return user || processor
}

// IsAppendOnlyViolation reports whether err is, anywhere in its chain, the
// ledger refusing to change or delete a row (AppendOnlyRule): an effect or a
// login tried what the protocol never does. It is a failure of the items
// whose statement tried it: not "already handled", not retryable, and not
// statement-level (which rows the statement touched may depend on the items).
func IsAppendOnlyViolation(err error) bool {
	return anyPgError(err, func(pgErr *pgconn.PgError) bool {
		return pgErr.Code == pgerrcode.RestrictViolation && pgErr.ConstraintName == AppendOnlyRule &&
			(pgErr.SchemaName == "" || pgErr.SchemaName == Schema)
	})
}

// IsRetryable reports whether err is a transient condition after which the same
// work may be tried again (with back-off): the connection was lost or never
// established (refused, or pgx's connect_timeout expired), the server is
// shutting down or refusing connections for now, the transaction lost a
// serialization or deadlock race, or it waited too long for a lock or for a
// statement (lock_timeout, statement_timeout), or a processor's call failed
// as a whole (*ProcessorError: nothing of it committed), or the session may
// not write (IsReadOnlySession: a standby, as after a failover). Everything
// else is permanent, including a connection the server rejected for good
// (ConnectionRejected).
//
// Retrying a chunk whose COMMIT outcome is unknown is safe: the business-key
// index refuses a second committed row, and CommitChunk reports a row that this
// same run committed earlier as such (HolderSameRun), so counts stay exact.
//
// A cancelled context is not retryable: only a caller cancels. An expired
// deadline may be pgx's own (connect_timeout), and a query cancelled because
// the caller's context ended comes back as 57014 like a statement_timeout, so
// whether the caller asked to stop is the caller's context's to say: every
// retry loop checks it before retrying (see worker.Backoff.Do).
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) {
		return false
	}
	if _, rejected := ConnectionRejected(err); rejected {
		return false
	}
	var processorErr *ProcessorError
	var connectErr *pgconn.ConnectError
	var netErr net.Error // also context.DeadlineExceeded, a timeout
	switch {
	case errors.As(err, &processorErr):
		// A processor's call failed as a whole and nothing committed:
		// retried with back-off, then its items are Failed.
		return true
	case anyPgError(err, isRetryableState), errors.As(err, &connectErr), errors.As(err, &netErr):
		return true
	case IsReadOnlySession(err):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, ErrSortedCopyLost), errors.Is(err, ErrLeaseTakenAgain):
		return true
	}
	// pgx's own verdict, asked of every node: the request never reached the server.
	return anyInChain(err, pgconn.SafeToRetry)
}

// isRetryableState reports whether pgErr is a transient condition of the
// server or of the transaction (IsRetryable).
func isRetryableState(pgErr *pgconn.PgError) bool {
	switch pgErr.Code {
	case pgerrcode.SerializationFailure, pgerrcode.DeadlockDetected,
		pgerrcode.AdminShutdown, pgerrcode.CrashShutdown, pgerrcode.CannotConnectNow,
		pgerrcode.TooManyConnections, pgerrcode.LockNotAvailable, pgerrcode.QueryCanceled:
		return true
	}
	return sqlstateClass(pgErr.Code) == classConnectionException
}

// IsReadOnlySession reports whether err is, in the ledger's own statements,
// the server refusing to write because the session may only read: 25006
// read_only_sql_transaction (a hot standby, a primary fenced with
// default_transaction_read_only), or a standby refusing the READ WRITE of a
// chunk's BEGIN (isReadWriteRefusedInRecovery). The session landed on the
// wrong server, as after a failover: retryable (IsRetryable), on a new
// session (Open closes one that met it), never a failure of the items.
//
// What user code raised is not read: an effect that made its own
// transaction read-only (SET TRANSACTION READ ONLY, after the ledger's
// insert wrote in it) fails its items, as any statement-level error.
func IsReadOnlySession(err error) bool {
	return anyPgErrorOutsideUserCode(err, isReadOnlySession)
}

// isReadOnlySession reports whether pgErr says the session may not write
// (IsReadOnlySession).
func isReadOnlySession(pgErr *pgconn.PgError) bool {
	return pgErr.Code == pgerrcode.ReadOnlySQLTransaction || isReadWriteRefusedInRecovery(pgErr)
}

// isReadWriteRefusedInRecovery reports whether pgErr is a standby refusing
// transaction_read_only = off (a BEGIN ... READ WRITE): "cannot set
// transaction read-write mode during recovery", SQLSTATE 0A000, raised by
// the bool setting's check (routine call_bool_check_hook, file guc.c; the
// message is translated, the routine is not). No setting the ledger makes
// has another check that refuses with 0A000.
func isReadWriteRefusedInRecovery(pgErr *pgconn.PgError) bool {
	return pgErr.Code == pgerrcode.FeatureNotSupported && pgErr.Routine == "call_bool_check_hook" && pgErr.File == "guc.c"
}

// IsTooManyConnections reports whether err is, anywhere in its chain, the
// server (or a pooler in front of it) refusing a connection because it has
// as many as it allows (53300 too_many_connections: max_connections, a
// role's or a database's CONNECTION LIMIT). Retryable (IsRetryable): the
// worker waits for a connection and says so in its shard's status.
func IsTooManyConnections(err error) bool {
	return hasSQLState(err, pgerrcode.TooManyConnections)
}

// isShardLeaseLost reports whether err is runledger.shard_lease_hold
// refusing to renew a lease that is no longer the caller's. Only the
// statements that call it, which run no user code, may be read with it.
func isShardLeaseLost(err error) bool {
	return hasSQLState(err, sqlstateShardLeaseLost)
}

// isLockNotAvailable reports whether err is, anywhere in its chain, a wait
// for a lock that outlived lock_timeout (55P03).
func isLockNotAvailable(err error) bool {
	return hasSQLState(err, pgerrcode.LockNotAvailable)
}

// IsDeadlock reports whether err is, anywhere in its chain, PostgreSQL
// aborting the statement to break a deadlock (40P01 deadlock_detected):
// nothing of the aborted transaction was kept, so it may run again.
func IsDeadlock(err error) bool {
	return hasSQLState(err, pgerrcode.DeadlockDetected)
}

// ConnectionRejected reports whether err is the server refusing the
// connection for a reason that waiting will not change, and says which in
// words for the user: the credentials (class 28: a wrong password, an unknown
// role, a role that may not log in, no pg_hba.conf entry), a database that
// does not exist (3D000), the same refusals from PgBouncer
// (pgbouncerRejection), or, on the client's side, a server TLS certificate
// that does not verify (a wrong CA in sslrootcert, another host's name). Retrying these only risks locking the account.
func ConnectionRejected(err error) (why string, rejected bool) {
	anyInChain(err, func(e error) bool {
		pgErr, ok := errorNode[*pgconn.PgError](e)
		switch {
		case !ok:
		case strings.HasPrefix(pgErr.Code, classInvalidAuthorization):
			why = "the database server rejected the connection string's credentials (its user or password)"
		case pgErr.Code == pgerrcode.InvalidCatalogName:
			why = "the database named in the connection string does not exist"
		default:
			why = pgbouncerRejection(pgErr)
		}
		if !ok && isCertificateVerification(e) {
			why = "the database server's TLS certificate did not verify (sslmode verify-ca or verify-full: check sslrootcert, the CA that signed the server's certificate, and the host name)"
		}
		return why != ""
	})
	return why, why != ""
}

// pgbouncerRejection says why, when e is PgBouncer refusing a login it
// checks itself: it answers the refusals PostgreSQL gives as 28P01 and 3D000
// with FATAL 08P01 (protocol_violation), the class of a lost connection
// (Debian's 1.18, for a wrong password or an unknown user: "password
// authentication failed" under auth_type md5, "SASL authentication failed"
// under scram-sha-256; for an unknown database: "no such database:
// <name>"). Only those whole messages count, so that no
// other 08P01 stops being retried; a pooler that uses PostgreSQL's codes is
// read as PostgreSQL.
func pgbouncerRejection(e *pgconn.PgError) string {
	if e.Code != pgerrcode.ProtocolViolation || e.Severity != "FATAL" {
		return ""
	}
	msg := strings.ToLower(e.Message)
	switch {
	case msg == "password authentication failed", msg == "sasl authentication failed":
		return "the connection pooler rejected the connection string's credentials (its user or password)"
	case strings.HasPrefix(msg, "no such database: "):
		return "the connection pooler knows no database of the name in the connection string"
	}
	return ""
}

// isCertificateVerification reports whether e itself is the client refusing
// the server's TLS certificate: a wrong or missing CA, or a certificate for
// another host. Waiting changes none of it.
func isCertificateVerification(e error) bool {
	_, verification := errorNode[*tls.CertificateVerificationError](e)
	_, authority := errorNode[x509.UnknownAuthorityError](e)
	_, hostname := errorNode[x509.HostnameError](e)
	_, invalid := errorNode[x509.CertificateInvalidError](e)
	return verification || authority || hostname || invalid
}

// IsConfigurationError reports whether err is PostgreSQL refusing a statement
// for what it says rather than for the data it met: a syntax error, a missing
// table, column or privilege (class 42, but not a row refused by a row-level
// security policy: that depends on the row), a missing schema (3F), a feature
// PostgreSQL lacks (0A, but not a standby refusing READ WRITE: that is the
// server, IsReadOnlySession), transaction control where none is allowed (2D000). Only changing the query, the effect or the role's
// grants helps, so it is bad input (exit code 2) and never retried.
func IsConfigurationError(err error) bool {
	return anyPgError(err, func(pgErr *pgconn.PgError) bool {
		if isRowSecurityCheck(pgErr) || isReadWriteRefusedInRecovery(pgErr) {
			return false
		}
		switch sqlstateClass(pgErr.Code) {
		case classSyntaxOrAccessRule, classFeatureNotSupported, classInvalidSchemaName:
			return true
		}
		return pgErr.Code == pgerrcode.InvalidTransactionTermination
	})
}

// RefusedStatement returns the PostgreSQL error in err's chain when the server
// refused the statement for good, and false when there is none or err is
// retryable or the end of a context: after those the statement may well be
// fine.
func RefusedStatement(err error) (*pgconn.PgError, bool) {
	if IsRetryable(err) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return nil, false
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return nil, false
	}
	return pgErr, true
}

// isStatementLevel reports whether err condemns a statement regardless of which
// items it carried (a syntax error in the effect, a missing table, a missing
// privilege, a write in a read-only transaction): isolating items one by one
// cannot help, every item fails alike.
func isStatementLevel(err error) bool {
	return IsConfigurationError(err) || anyPgError(err, func(pgErr *pgconn.PgError) bool {
		return sqlstateClass(pgErr.Code) == classInvalidTransactionState
	})
}

// IsTransactionControl reports whether err is the server refusing
// transaction control (COMMIT, ROLLBACK, SAVEPOINT) in the block that runs an
// effect (effectBlock): 2D000 for a procedure's COMMIT, or PL/pgSQL's EXECUTE
// refusing a transaction command (0A000, raised by its routine
// exec_stmt_dynexecute: the message is translated, the routine is not).
func IsTransactionControl(err error) bool {
	return anyPgError(err, func(pgErr *pgconn.PgError) bool {
		return pgErr.Code == pgerrcode.InvalidTransactionTermination ||
			sqlstateClass(pgErr.Code) == classFeatureNotSupported && pgErr.Routine == "exec_stmt_dynexecute"
	})
}

// sqlstateClass is the class of a SQLSTATE: its first two characters, or ""
// for anything that is not a SQLSTATE.
func sqlstateClass(code string) string {
	if len(code) != 5 {
		return ""
	}
	return code[:2]
}

// isRowSecurityCheck reports whether pgErr is a row refused by a row-level
// security policy (its WITH CHECK, or USING on an upsert's update): SQLSTATE
// 42501 like a missing privilege, but it depends on the row.
//
// The server names no table or constraint for it, and its message is
// translated (lc_messages); the routine that raised it is neither, and no
// other 42501 comes from it.
func isRowSecurityCheck(pgErr *pgconn.PgError) bool {
	return pgErr.Code == pgerrcode.InsufficientPrivilege && pgErr.Routine == "ExecWithCheckOptions"
}

// anyPgError reports whether match holds for any PostgreSQL error in err's
// wrap tree: every one counts, not only the first that errors.As would find
// (a rollback's error joined to the statement's, one host's refusal beside
// another's).
func anyPgError(err error, match func(*pgconn.PgError) bool) bool {
	return walkChain(err, nil, pgErrorMatch(match))
}

// anyPgErrorOutsideUserCode is anyPgError that does not descend into what
// user code raised (raisedByUserCode).
func anyPgErrorOutsideUserCode(err error, match func(*pgconn.PgError) bool) bool {
	return walkChain(err, raisedByUserCode, pgErrorMatch(match))
}

// hasSQLState reports whether err's wrap tree holds a PostgreSQL error with
// SQLSTATE code.
func hasSQLState(err error, code string) bool {
	return anyPgError(err, func(pgErr *pgconn.PgError) bool { return pgErr.Code == code })
}

// pgErrorMatch is match for the walk's nodes: a node that is a PostgreSQL
// error and that match selects.
func pgErrorMatch(match func(*pgconn.PgError) bool) func(error) bool {
	return func(e error) bool {
		pgErr, ok := errorNode[*pgconn.PgError](e)
		return ok && match(pgErr)
	}
}

// errorNode returns e as a T when e itself, not an error it wraps, is one
// (T a concrete type): errors.As alone answers for the first T anywhere
// below e, which a walk that prunes subtrees, or wants the first node of
// several kinds, cannot use.
func errorNode[T error](e error) (T, bool) {
	if e == nil || reflect.TypeOf(e) != reflect.TypeFor[T]() {
		var none T
		return none, false
	}
	return errors.AsType[T](e) // e itself: errors.As tries the node first
}

// anyInChain walks err's whole wrap tree, depth first, and reports whether
// match holds for any node.
func anyInChain(err error, match func(error) bool) bool {
	return walkChain(err, nil, match)
}

// walkChain walks err's wrap tree, depth first, in the order errors.As
// does (fmt.Errorf("%w"), errors.Join, any Unwrap() error or Unwrap()
// []error), skipping every subtree whose root prune (if set) selects, and
// reports whether match holds for any node visited.
func walkChain(err error, prune, match func(error) bool) bool {
	if err == nil || prune != nil && prune(err) {
		return false
	}
	if match(err) {
		return true
	}
	if u, ok := err.(interface{ Unwrap() error }); ok {
		return walkChain(u.Unwrap(), prune, match)
	}
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range u.Unwrap() {
			if walkChain(e, prune, match) {
				return true
			}
		}
	}
	return false
}

// The classes of a failed item that are not a SQLSTATE (FailureClass,
// runledger.item_failure.class).
const (
	// ClassInput: the source's row could not become an item (a NULL or
	// blank key part, a payload too large or not JSON); never committed.
	ClassInput = "input"
	// ClassProcessorRefused: the processor answered ok: false for the item.
	ClassProcessorRefused = "processor-refused"
	// ClassProcessorRetriesExhausted: the processor asked to retry the item
	// (retryable: true) until the retries were spent.
	ClassProcessorRetriesExhausted = "processor-retries-exhausted"
	// ClassProcessorUnavailable: every call for the item failed as a whole
	// (no answer, a status other than 200, a redirect, a malformed answer)
	// until the retries were spent.
	ClassProcessorUnavailable = "processor-unavailable"
	// ClassEffectSandbox: the effect tried to leave its sandbox
	// (ErrEffectSandbox); every item of its chunk failed.
	ClassEffectSandbox = "effect-sandbox"
	// ClassUnproven: a verdict the ledger could not prove with a committed
	// row read back (a holder that vanished); not committed.
	ClassUnproven = "unproven"
	// ClassPayloadChanged: already handled by another run whose committed
	// row has another payload, under spec.onPayloadChange: Fail; nothing
	// was written.
	ClassPayloadChanged = "payload-changed"
	// ClassError: any other error (no SQLSTATE in it).
	ClassError = "error"
)

// FailureClass is the class recorded for an item that failed with err: the
// SQLSTATE of the first PostgreSQL error in its chain (an effect's foreign
// key: 23503, a malformed payload: 22P02), or one of the Class constants.
// A sandbox escape is ClassEffectSandbox whatever error came with it, and a
// processor's verdict its processor class.
func FailureClass(err error) string {
	var refused *refusedError
	var perr *ProcessorError
	var pgErr *pgconn.PgError
	switch {
	case err == nil:
		return ClassError
	case errors.Is(err, ErrEffectSandbox):
		return ClassEffectSandbox
	case errors.As(err, &refused), errors.As(err, &perr):
		if errors.Is(err, ErrRetryItem) {
			return ClassProcessorRetriesExhausted
		}
		if refused != nil {
			return ClassProcessorRefused
		}
		return ClassProcessorUnavailable
	case errors.As(err, &pgErr) && len(pgErr.Code) == 5:
		return pgErr.Code
	case errors.Is(err, errHolderVanished), errors.Is(err, errUnproven):
		return ClassUnproven
	}
	return ClassError
}
