// Package migrations embeds runledger's SQL schema migrations.
//
// The files are goose migrations (-- +goose Up / Down). They are applied by
// internal/ledger.Migrate, which `runledger migrate` and the worker call; the
// schema `runledger` itself is created there, under the migration lock, before
// goose's version table is touched.
package migrations

import "embed"

// FS holds every *.sql migration, in lexical (= version) order.
//
//go:embed *.sql
var FS embed.FS
