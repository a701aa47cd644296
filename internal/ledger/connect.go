package ledger

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/runledger/runledger/internal/redact"
)

// Open parses dsn and opens a pool on it (maxConns 0 keeps pgx's default),
// tuned by opts. Its first connection finds out whether it reaches
// PostgreSQL through a pooler (poolerProbe). Errors never contain the DSN's
// secrets.
func Open(ctx context.Context, dsn string, maxConns int32, opts ...Option) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, fmt.Errorf("parsing database URL: %w", parseError(err, dsn))
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	for _, o := range opts {
		o(cfg)
	}
	probe := &poolerProbe{}
	next := cfg.BeforeConnect
	cfg.BeforeConnect = func(ctx context.Context, cc *pgx.ConnConfig) error {
		if next != nil {
			if err := next(ctx, cc); err != nil {
				return err
			}
		}
		return probe.beforeConnect(ctx, cc)
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening database pool: %w", redact.New(dsn).Error(err))
	}
	rememberProbe(pool, probe)
	return pool, nil
}

// parseError returns pgx's error for a DSN it cannot parse with the DSN
// masked by redact.DSN instead of pgx's own best-effort mask, which shows the
// rest of a quoted password after an escaped quote (password='a\' b'). The
// result no longer wraps err: its chain prints pgx's form.
func parseError(err error, dsn string) error {
	r := redact.New(dsn)
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return r.Error(err)
	}
	// pgx's text is "cannot parse `DSN`: what (cause)"; its what and cause
	// never hold the DSN.
	msg := pe.Error()
	cause := errors.Unwrap(pe)
	if cause != nil {
		msg = strings.TrimSuffix(msg, " ("+cause.Error()+")")
	}
	what := "invalid connection string"
	if i := strings.LastIndex(msg, "`: "); i >= 0 {
		what = msg[i+len("`: "):]
	}
	out := fmt.Sprintf("cannot parse `%s`: %s", redact.DSN(pe.ConnString), what)
	if cause != nil {
		out += " (" + cause.Error() + ")"
	}
	return errors.New(r.String(out))
}
