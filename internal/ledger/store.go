package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/api/v1alpha1"
)

// dbtx is what a statement of the ledger runs on: a pool, a connection or a
// transaction.
type dbtx interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

var (
	_ dbtx = (*pgxpool.Pool)(nil)
	_ dbtx = (*pgx.Conn)(nil)
	_ dbtx = pgx.Tx(nil)
)

// Key is the composite business key of one logical occurrence.
type Key struct {
	Entity     string `json:"entity"`
	Occurrence string `json:"occurrence"`
}

func (k Key) String() string { return k.Entity + "/" + k.Occurrence }

// Item is one unit of work: its key and an optional JSON payload, which the
// ledger stores and the effect reads.
type Item struct {
	Key
	Payload json.RawMessage `json:"payload,omitempty"`
}

// Run identifies the writer of a row: the ProcessingRun (namespace, name, UID)
// and the shard and attempt that committed it. UID decides "same run".
type Run struct {
	Namespace string
	Name      string
	UID       string
	Shard     int
	Attempt   int
}

// OnExisting says what to do with a key that another run already committed.
type OnExisting int

const (
	// Skip leaves the existing row alone: the item is AlreadyHandled.
	Skip OnExisting = iota
	// Supersede retires the existing row (state superseded) and commits the
	// new one in the same transaction: deliberate reprocessing.
	Supersede
)

// Outcome is what happened to one item.
type Outcome int

const (
	// Completed: this run holds the committed row, claimed by this call or,
	// see HolderSameRun, by an earlier attempt of this same run.
	Completed Outcome = iota + 1
	// AlreadyHandled: another committed row held the key; nothing was written.
	AlreadyHandled
	// Failed: the item was not committed; Err says why.
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Completed:
		return "Completed"
	case AlreadyHandled:
		return "AlreadyHandled"
	case Failed:
		return "Failed"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Holder says who holds the committed row of a key that this call did not
// claim.
type Holder int

const (
	// HolderNone: this call claimed the key (or it failed).
	HolderNone Holder = iota
	// HolderSameRun: a row committed by this same run (same UID), e.g. by an
	// earlier attempt of its shard that died after COMMIT. Callers counting a
	// run's work count such an item as completed, not already handled.
	HolderSameRun
	// HolderOtherRun: another run committed the key.
	HolderOtherRun
	// HolderSameChunk: the key was repeated within this chunk; its first copy
	// carries the real outcome.
	HolderSameChunk
)

// Result is one item's outcome, in the order of the items given.
type Result struct {
	Key     Key
	Outcome Outcome
	Holder  Holder
	// HolderUID is the run uid of the committed row holding the key, read back
	// in the claiming transaction: the proof of AlreadyHandled (another run's
	// uid) and of Completed by an earlier commit of this run (its own uid,
	// HolderSameRun). Empty for a key this call claimed, a Failed item and a
	// repeat within the chunk (HolderSameChunk: its first copy is the proof).
	HolderUID string
	// Superseded: claiming this item retired another run's committed row.
	Superseded bool
	// PayloadChanged (AlreadyHandled by another run only): the committed
	// row's payload differs from the item's, or from a later copy's of its
	// key in the chunk, as jsonb values (sql.go, sqlPayloadChanged).
	PayloadChanged bool
	// Err is set when Outcome is Failed.
	Err error
	// supersededRow is the id of the row this call superseded for the item,
	// restored if a processor refuses the item; generation the claim's
	// Claim.Generation.
	supersededRow int64
	generation    int64
}

// ChunkOptions tunes one CommitChunk call.
type ChunkOptions struct {
	// Effect is an optional SQL statement run in the chunk's transaction over
	// exactly the items newly claimed by it, which it reads from the temporary
	// table "claimed" (entity text, occurrence text, payload jsonb). If it
	// fails, nothing of the chunk commits; the failing items are isolated and
	// the others committed again, each with its own outcome.
	Effect string
	// OnExisting: Skip (default) or Supersede.
	OnExisting OnExisting
	// EffectTimeout and LockTimeout bound every statement of the chunk's
	// transactions, the ledger's own (claim, arbitrate, supersede, take-back,
	// the checks after the effect) and the effect: each runs at most
	// EffectTimeout (statement_timeout) and waits at most LockTimeout for any
	// lock (lock_timeout), such as a key another transaction claimed and
	// has not committed. 0 keeps the session's own value, or
	// DefaultStatementTimeout and DefaultLockTimeout where the session has
	// none. Either one expiring fails the chunk as retryable, with nothing
	// committed.
	EffectTimeout, LockTimeout time.Duration
	// NetworkTimeout, with EffectTimeout, bounds the wait for the effect's
	// answer on the client: none within EffectTimeout+NetworkTimeout (a hung
	// server) closes the connection, retryably (ErrNoAnswer).
	NetworkTimeout time.Duration
	// Processor, if set (instead of Effect), is called in the chunk's
	// transaction with exactly the items it newly claimed; the keys it
	// accepts commit, the others are taken back in the same transaction and
	// Failed (errors.Is(err, ErrRetryItem) when it asked for a retry). If the
	// call fails as a whole, nothing commits and CommitChunk returns a
	// *ProcessorError (retryable). The transaction stays open during the
	// calls: the Processor bounds each (its timeout).
	Processor Processor
	// ItemsPerCall bounds the items of one call of the Processor: the
	// chunk's newly claimed items go to it in calls of at most this many,
	// in order (0: one call for them all).
	ItemsPerCall int
	// CallsInFlight bounds how many of the chunk's calls are in flight at
	// once (0 or 1: one after the other). Each item's verdict is its own
	// call's answer; one call that fails as a whole fails the chunk as a
	// single call does, and the calls still in flight are cancelled.
	CallsInFlight int
	// ExpectFresh says the caller expects none of the keys committed (its
	// own lookup or preload found none held): the chunk is inserted without
	// looking its keys up first. A key held after all makes the rule reject
	// that insert, and the chunk is claimed again the usual way, so a wrong
	// guess costs a statement, never a verdict. Ignored by Supersede runs.
	ExpectFresh bool
	// Lease, if set, is the shard's: every transaction of the chunk renews
	// it first and row-locks it, and fails with ErrShardBusy, committing
	// nothing, when it is no longer this process's.
	Lease *ShardLease

	sandbox  *sandbox // set by CommitChunk for an effect
	pooled   bool     // set by CommitChunk: behind a transaction pooler
	userPath string   // set by CommitChunk: the user's search_path (sqlUserPath)
}

// sqlBounds is the chunk's bounds as SQL (sqlBounds).
func (o ChunkOptions) sqlBounds() string {
	return sqlBounds(o.EffectTimeout, o.LockTimeout, DefaultStatementTimeout, DefaultLockTimeout)
}

// lockTimeout is the chunk's lock timeout in force: its own, or the
// ledger's default.
func (o ChunkOptions) lockTimeout() time.Duration {
	if o.LockTimeout > 0 {
		return o.LockTimeout
	}
	return DefaultLockTimeout
}

// The bounds of the ledger's statements where the caller gives none and the
// session has none either (0, PostgreSQL's default: no bound): a wait for a
// lock that another transaction holds for ever (a stopped process whose
// connection stays up) must end. They are spec.timeouts' defaults
// (effectSeconds, querySeconds, lockSeconds).
const (
	DefaultStatementTimeout = v1alpha1.DefaultEffectSeconds * time.Second
	DefaultQueryTimeout     = v1alpha1.DefaultQuerySeconds * time.Second
	DefaultLockTimeout      = v1alpha1.DefaultLockSeconds * time.Second
)

// Store is the ledger on one PostgreSQL database.
type Store struct {
	pool *pgxpool.Pool
	// The bounds of its statements outside a chunk (WithBounds).
	readTimeout, lockTimeout time.Duration

	mu      sync.Mutex
	sandbox *sandbox // checked once, by the first effect
}

// sandbox is the effect's sandbox as the worker checked it: the function
// runledger.run_effect(text) and its owner, the effect role.
type sandbox struct {
	fn, owner uint32
	role      string // quoted
}

// ErrNoEffectSandbox: the ledger has no sandbox for an SQL effect, or one
// that would not keep the effect out of the ledger. The worker refuses to run
// the effect; `runledger migrate --effect-role` sets it up.
var ErrNoEffectSandbox = errors.New("the ledger has no sandbox for an SQL effect, which never runs with the worker's own privileges: run runledger migrate --grant-to WORKER --effect-role ROLE as the schema's owner, ROLE an unprivileged role that the effect's tables are granted to (docs/security.md)")

// effectSandbox checks the effect's sandbox (sqlEffectSandbox) the first
// time and returns it.
func (s *Store) effectSandbox(ctx context.Context) (*sandbox, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sandbox != nil {
		return s.sandbox, nil
	}
	var sb sandbox
	var name string
	var definer, super, owner, memberOfWorker, schemaPrivilege bool
	err := s.pinned(ctx, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, sqlEffectSandbox).Scan(&sb.fn, &sb.owner, &name, &definer, &super, &owner, &memberOfWorker, &schemaPrivilege)
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("%w (runledger.run_effect does not exist: the schema predates migration 00007)", ErrNoEffectSandbox)
	}
	if err != nil {
		return nil, fmt.Errorf("checking the effect's sandbox: %w", err)
	}
	var why string
	switch {
	case !definer:
		why = "runledger.run_effect is not SECURITY DEFINER, or has SET clauses"
	case owner:
		why = fmt.Sprintf("runledger.run_effect belongs to %s, the ledger's owner or a member of its role (no --effect-role given yet?)", name)
	case super:
		why = fmt.Sprintf("its owner %s is a superuser", name)
	case memberOfWorker:
		why = fmt.Sprintf("its owner %s is a member of the worker's login, whose privileges it would have", name)
	case schemaPrivilege:
		why = fmt.Sprintf("its owner %s has a privilege on schema runledger", name)
	}
	if why != "" {
		return nil, fmt.Errorf("%w (%s)", ErrNoEffectSandbox, why)
	}
	sb.role = pgx.Identifier{name}.Sanitize()
	s.sandbox = &sb
	return s.sandbox, nil
}

// NewStore returns a Store over pool. The schema must be migrated (Migrate).
func NewStore(pool *pgxpool.Pool) *Store { return &Store{pool: pool} }

// WithBounds returns a Store on the same pool whose statements outside a
// chunk's transaction (the preload, a shard's sort and fetches of its batch,
// a static batch's header) run at most statement each and wait at most lock for a lock (a
// run's querySeconds and lockSeconds); 0 keeps the session's own, or
// DefaultQueryTimeout and DefaultLockTimeout where the session has none, as
// for a Store that was never given any. A chunk's own bounds are its
// ChunkOptions'.
func (s *Store) WithBounds(statement, lock time.Duration) *Store {
	return &Store{pool: s.pool, readTimeout: statement, lockTimeout: lock}
}

// begin starts a pipeline with a transaction's BEGIN (sqlBeginWrite or
// sqlBeginReadOnly) and the Store's bounds, for its statements and COMMIT
// to follow in the same round trip.
func (s *Store) begin(begin string) *pgx.Batch {
	b := &pgx.Batch{}
	b.Queue(begin)
	for _, q := range sqlBoundList(s.readTimeout, s.lockTimeout, DefaultQueryTimeout, DefaultLockTimeout) {
		b.Queue(q)
	}
	return b
}

func (s *Store) sqlReadBounds() string {
	return sqlBounds(s.readTimeout, s.lockTimeout, DefaultQueryTimeout, DefaultLockTimeout)
}

// pinned runs fn in a transaction of its own, begun with the ledger's
// search_path (sqlBeginPinned, in the BEGIN's round trip), and commits it:
// every statement of the ledger outside a chunk or a pipeline goes through
// it, so that no name in it resolves through a schema user code can write.
func (s *Store) pinned(ctx context.Context, fn func(pgx.Tx) error) error {
	return pinnedTx(ctx, s.pool, sqlBeginPinned, fn)
}

// pinnedTx is pinned on any pool or connection, with begin (sqlBeginPinned
// or sqlBeginPinnedReadOnly, with more of the transaction's settings).
func pinnedTx(ctx context.Context, db interface {
	BeginTx(context.Context, pgx.TxOptions) (pgx.Tx, error)
}, begin string, fn func(pgx.Tx) error) error {
	return pgx.BeginTxFunc(ctx, db, pgx.TxOptions{BeginQuery: begin}, fn)
}

// Preload returns, for the given keys, those already committed and by whom
// (HolderSameRun or HolderOtherRun relative to runUID), in one set-based round
// trip. It is an optimisation only: the answer may be stale by the time the
// caller acts on it, and CommitChunk stays correct whatever it said.
//
// The lookup runs in a read-only transaction that disables sequential scans
// (sqlIndexProbesOnly, see there), under the Store's bounds (WithBounds); its
// statements (BEGIN, the settings, the lookup, COMMIT) travel as one
// pipeline. If the lookup fails, the pool
// discards the connection, whose transaction is then aborted.
func (s *Store) Preload(ctx context.Context, runUID string, keys []Key) (map[Key]Holder, error) {
	out := make(map[Key]Holder)
	if len(keys) == 0 {
		return out, nil
	}
	entities, occurrences := keyColumns(keys)
	err := s.preload(ctx, sqlHolders, []any{entities, occurrences, runUID}, func(rows pgx.Rows) error {
		var k Key
		var uid []byte
		_, err := pgx.ForEachRow(rows, []any{&k.Entity, &k.Occurrence, &uid}, func() error {
			out[k] = holderOf(uid, runUID)
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("preloading %d keys: %w", len(keys), err)
	}
	return out, nil
}

// PayloadMatch is what a lookup before the claim (PreloadItems, a fetch of a
// batch) could tell of an item's payload against the committed row of
// another run that holds its key.
type PayloadMatch int

const (
	// PayloadUnknown: not compared (no other run holds the key), or the
	// text alone cannot tell: the claim compares (Result.PayloadChanged).
	PayloadUnknown PayloadMatch = iota
	// PayloadSame: the same jsonb value.
	PayloadSame
	// PayloadDiffers: a different jsonb value.
	PayloadDiffers
)

// payloadMatch reads sqlPayloadSameText's column (NULL: unknown).
func payloadMatch(changed *bool) PayloadMatch {
	switch {
	case changed == nil:
		return PayloadUnknown
	case *changed:
		return PayloadDiffers
	}
	return PayloadSame
}

// MergeMatch is what two copies' matches say of their key: it differs if
// one does, is the same only if both are.
func MergeMatch(a, b PayloadMatch) PayloadMatch {
	switch {
	case a == PayloadDiffers || b == PayloadDiffers:
		return PayloadDiffers
	case a == PayloadUnknown || b == PayloadUnknown:
		return PayloadUnknown
	}
	return PayloadSame
}

// Held is what the preload found of an item's key: who holds its committed
// row and, for another run's row, what it could tell of the payload.
type Held struct {
	Holder  Holder
	Payload PayloadMatch
}

// PreloadItems is Preload for items, with what the text of each item's
// payload says of the committed row's of another run (PayloadMatch; never a
// cast: an item the database cannot read as jsonb is for the claim to
// fail). Same round trip, same cost per key. A key given more than once is
// answered for all its copies (MergeMatch).
func (s *Store) PreloadItems(ctx context.Context, runUID string, items []Item) (map[Key]Held, error) {
	out := make(map[Key]Held)
	if len(items) == 0 {
		return out, nil
	}
	entities, occurrences, payloads := columns(items)
	err := s.preload(ctx, sqlPreload, []any{entities, occurrences, payloads, runUID}, func(rows pgx.Rows) error {
		var k Key
		var uid []byte
		var match *bool
		_, err := pgx.ForEachRow(rows, []any{&k.Entity, &k.Occurrence, &uid, &match}, func() error {
			h := Held{Holder: holderOf(uid, runUID)}
			if h.Holder == HolderOtherRun {
				h.Payload = payloadMatch(match)
			}
			if prev, ok := out[k]; ok { // a copy: one statement, one snapshot, so the same holder
				h.Payload = MergeMatch(prev.Payload, h.Payload)
			}
			out[k] = h
			return nil
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("preloading %d keys: %w", len(items), err)
	}
	return out, nil
}

// preload runs a lookup in the preload's read-only transaction, in one
// pipeline (see Preload).
func (s *Store) preload(ctx context.Context, lookup string, args []any, read func(pgx.Rows) error) error {
	b := s.begin(sqlBeginReadOnly)
	b.Queue(sqlNoSeqScan)
	b.Queue(sqlNoBitmapScan)
	b.Queue(sqlNoJIT)
	b.Queue(sqlPinnedSearchPath)
	b.Queue(lookup, args...).Query(read)
	b.Queue(sqlCommit)
	return s.pool.SendBatch(ctx, b).Close()
}

// queryHolders runs holders (sqlHolders, with the run's uid in args) for keys: rows of (entity, occurrence, run_uid) for the
// keys a committed row holds.
func queryHolders(ctx context.Context, db dbtx, holders string, keys []Key, args ...any) (pgx.Rows, error) {
	entities, occurrences := keyColumns(keys)
	rows, err := db.Query(ctx, holders, append([]any{entities, occurrences}, args...)...)
	if err != nil {
		return nil, fmt.Errorf("looking up committed keys: %w", err)
	}
	return rows, nil
}

// keyColumns turns keys into the statements' array parameters.
func keyColumns(keys []Key) (entities, occurrences []string) {
	entities, occurrences = make([]string, len(keys)), make([]string, len(keys))
	for i, k := range keys {
		entities[i], occurrences[i] = k.Entity, k.Occurrence
	}
	return entities, occurrences
}

// holderOf says whose a committed row is, from its run_uid.
func holderOf(uid []byte, runUID string) Holder {
	if string(uid) == runUID {
		return HolderSameRun
	}
	return HolderOtherRun
}

// PruneSuperseded deletes the superseded ledger rows retired before cutoff
// and returns how many. The pool's login must be a member of the ledger's
// owner role: for anyone else the append-only trigger refuses (and a worker
// login has no DELETE privilege at all).
func (s *Store) PruneSuperseded(ctx context.Context, cutoff time.Time) (int64, error) {
	var tag pgconn.CommandTag
	err := s.pinned(ctx, func(tx pgx.Tx) (err error) {
		tag, err = tx.Exec(ctx, sqlPruneSuperseded, cutoff)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("pruning ledger rows superseded before %s: %w", cutoff.Format(time.RFC3339), err)
	}
	return tag.RowsAffected(), nil
}

// nilIfEmpty is s, or NULL for "".
func nilIfEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
