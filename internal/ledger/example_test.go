package ledger_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/runledger/runledger/internal/ledger"
)

// The ledger's public entry points in the order a worker uses them. The
// examples that talk to PostgreSQL have no Output comment: go test compiles
// them (so they cannot drift from the API) but does not run them; the
// package's tests run the same calls against a real server. The classifier
// examples need no database and run.

// Open a pool, apply the embedded migrations and build the store.
func ExampleMigrate() {
	ctx := context.Background()
	pool, err := ledger.Open(ctx, os.Getenv("RUNLEDGER_DATABASE_URL"), 4)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	applied, err := ledger.Migrate(ctx, pool)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("migrations applied:", applied)
	_ = ledger.NewStore(pool)
}

// Commit a chunk through the one insert path: the database's unique rule
// decides, per key, whether this call committed it or another run holds it.
func ExampleStore_CommitChunk() {
	ctx := context.Background()
	pool, err := ledger.Open(ctx, os.Getenv("RUNLEDGER_DATABASE_URL"), 4)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	store := ledger.NewStore(pool)
	run := ledger.Run{Namespace: "billing", Name: "june", UID: "8d0c5a52-4b8e-4a57-9c55-2f0f7b1c2d3e", Shard: 0, Attempt: 0}
	items := []ledger.Item{
		{Key: ledger.Key{Entity: "acct-1", Occurrence: "2026-06"}, Payload: []byte(`{"amount": 12.5}`)},
		{Key: ledger.Key{Entity: "acct-2", Occurrence: "2026-06"}},
	}
	results, err := store.CommitChunk(ctx, run, items, ledger.ChunkOptions{
		Effect: `INSERT INTO invoices (account, period) SELECT entity, occurrence FROM claimed`,
	})
	if err != nil {
		log.Fatal(err) // the chunk committed nothing; retry it if ledger.IsRetryable(err)
	}
	for _, r := range results {
		fmt.Println(r.Key, r.Outcome) // Completed, AlreadyHandled or Failed (r.Err says why)
	}
}

// Preload saves work, never decides: the keys already committed, and by
// whom, so that a chunk sends only the others to CommitChunk.
func ExampleStore_Preload() {
	ctx := context.Background()
	pool, err := ledger.Open(ctx, os.Getenv("RUNLEDGER_DATABASE_URL"), 4)
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	held, err := ledger.NewStore(pool).Preload(ctx, "8d0c5a52-4b8e-4a57-9c55-2f0f7b1c2d3e",
		[]ledger.Key{{Entity: "acct-1", Occurrence: "2026-06"}})
	if err != nil {
		log.Fatal(err)
	}
	for k, h := range held {
		fmt.Println(k, h) // HolderSameRun or HolderOtherRun
	}
}

// Only the engine's own unique check of the ledger's business-key rule
// (routine _bt_check_unique, in schema runledger, table ledger) says a
// concurrent writer got there first; the same fields raised by user code
// (PL/pgSQL's exec_stmt_raise), or another unique index, are failures.
func ExampleIsExpectedBusinessKeyConflict() {
	rule := &pgconn.PgError{Code: "23505", SchemaName: ledger.Schema, TableName: "ledger", ConstraintName: ledger.BusinessKeyIndex,
		Routine: "_bt_check_unique", File: "nbtinsert.c"}
	forged := &pgconn.PgError{Code: "23505", SchemaName: ledger.Schema, TableName: "ledger", ConstraintName: ledger.BusinessKeyIndex,
		Routine: "exec_stmt_raise", File: "pl_exec.c"}
	other := &pgconn.PgError{Code: "23505", SchemaName: ledger.Schema, ConstraintName: "invoices_number_key",
		Routine: "_bt_check_unique", File: "nbtinsert.c"}
	fmt.Println(ledger.IsExpectedBusinessKeyConflict(fmt.Errorf("committing chunk: %w", rule)))
	fmt.Println(ledger.IsExpectedBusinessKeyConflict(forged))
	fmt.Println(ledger.IsExpectedBusinessKeyConflict(other))
	fmt.Println(ledger.IsExpectedBusinessKeyConflict(errors.New("duplicate key value violates unique constraint")))
	// Output:
	// true
	// false
	// false
	// false
}

// A transient error is retried with back-off; a refused row is not.
func ExampleIsRetryable() {
	fmt.Println(ledger.IsRetryable(&pgconn.PgError{Code: "40001"})) // serialization failure
	fmt.Println(ledger.IsRetryable(&pgconn.PgError{Code: "23503"})) // foreign key violation
	// Output:
	// true
	// false
}
