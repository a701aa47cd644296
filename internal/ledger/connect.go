package ledger

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Open parses dsn and opens a pool on it (maxConns 0 keeps pgx's default).
// Errors never contain the DSN or its password.
func Open(ctx context.Context, dsn string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", redact(err, dsn))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening database pool: %w", redact(err, dsn))
	}
	return pool, nil
}

// redact returns err with every occurrence of the DSN and of its password
// replaced, keeping the rest of the message; the result no longer wraps err
// (a wrapped cause could still print the secret).
func redact(err error, dsn string) error {
	msg := err.Error()
	for _, secret := range secretsOf(dsn) {
		msg = strings.ReplaceAll(msg, secret, "[redacted]")
	}
	return errors.New(msg)
}

// secretsOf lists the strings of dsn that must never be printed: the DSN
// itself and its password, in URL or keyword/value form.
func secretsOf(dsn string) []string {
	out := []string{dsn}
	if u, err := url.Parse(dsn); err == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			out = append(out, p, url.QueryEscape(p), u.User.String())
		}
	}
	for _, f := range strings.Fields(dsn) {
		if p, ok := strings.CutPrefix(f, "password="); ok && p != "" {
			out = append(out, strings.Trim(p, "'"))
		}
	}
	return out
}
