package redact_test

import (
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/redact"
)

// The sample DSN of config/samples before issue #12: its password is a word
// that every log line of runledger holds anyway.
const commonWordURL = "postgres://runledger:runledger@postgres.runledger-demo.svc:5432/runledger?sslmode=disable"

// TestRedactorMasksTheDSNsSecretsOnly: the password is masked where it is
// the DSN's password (userinfo, password=, a query parameter), with a fixed
// token; the same word anywhere else in the line is left alone, so that
// nothing can be inferred from what is masked.
func TestRedactorMasksTheDSNsSecretsOnly(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, dsn, line, want string
	}{
		{
			name: "common word elsewhere in a line is not masked",
			dsn:  commonWordURL,
			line: `runledger: processing run run=runledger-demo/invoices group=processing.runledger.dev`,
			want: `runledger: processing run run=runledger-demo/invoices group=processing.runledger.dev`,
		},
		{
			name: "the DSN in a line keeps everything but its password",
			dsn:  commonWordURL,
			line: "runledger: dialing " + commonWordURL + ": refused",
			want: "runledger: dialing postgres://runledger:xxxxx@postgres.runledger-demo.svc:5432/runledger?sslmode=disable: refused",
		},
		{
			name: "the DSN quoted by a logger",
			dsn:  commonWordURL,
			line: `runledger: retrying error="dial \"` + commonWordURL + `\" refused"`,
			want: `runledger: retrying error="dial \"postgres://runledger:xxxxx@postgres.runledger-demo.svc:5432/runledger?sslmode=disable\" refused"`,
		},
		{
			name: "a JSON log line keeps its structure",
			dsn:  commonWordURL,
			line: `{"msg":"retrying","run":"runledger-demo/invoices","error":"dial ` + commonWordURL + `"}`,
			want: `{"msg":"retrying","run":"runledger-demo/invoices","error":"dial postgres://runledger:xxxxx@postgres.runledger-demo.svc:5432/runledger?sslmode=disable"}`,
		},
		{
			name: "pgx's own masked form is left as it is",
			dsn:  "postgres://runledger:runledger@db:notaport/runledger",
			line: "runledger: parsing database URL: cannot parse `postgres://runledger:xxxxx@db:notaport/runledger`: invalid port",
			want: "runledger: parsing database URL: cannot parse `postgres://runledger:xxxxx@db:notaport/runledger`: invalid port",
		},
		{
			name: "keyword/value, the password a common word",
			dsn:  "host=db user=postgres password=postgres dbname=postgres",
			line: `role "postgres" of database postgres: host=db user=postgres password=postgres dbname=postgres`,
			want: `role "postgres" of database postgres: host=db user=postgres password=xxxxx dbname=postgres`,
		},
		{
			name: "keyword/value, quoted with an escaped quote and a space",
			dsn:  `host=db user=app password='open\' sesame' dbname=ledger`,
			line: `open sesame: connecting with host=db user=app password='open\' sesame' dbname=ledger`,
			want: `open sesame: connecting with host=db user=app password=xxxxx dbname=ledger`,
		},
		{
			name: "keyword/value, spaces around the equals sign",
			dsn:  `host=db password = 'two words' dbname=ledger`,
			line: `using host=db password = 'two words' dbname=ledger: two words`,
			want: `using host=db password = xxxxx dbname=ledger: two words`,
		},
		{
			name: "keyword/value, an unterminated quote masks to the end",
			dsn:  `host=db password='never closed dbname=ledger`,
			line: `cannot parse host=db password='never closed dbname=ledger`,
			want: `cannot parse host=db password=xxxxx`,
		},
		{
			name: "URL-encoded password",
			dsn:  "postgres://app:p%40ss%20word%3Arunledger@db/ledger",
			line: "runledger: postgres://app:p%40ss%20word%3Arunledger@db/ledger is down",
			want: "runledger: postgres://app:xxxxx@db/ledger is down",
		},
		{
			name: "passwords in query parameters",
			dsn:  "postgres://app@db/ledger?password=runledger&sslpassword=keypass&sslmode=require",
			line: "runledger: postgres://app@db/ledger?password=runledger&sslpassword=keypass&sslmode=require",
			want: "runledger: postgres://app@db/ledger?password=xxxxx&sslpassword=xxxxx&sslmode=require",
		},
		{
			name: "the token does not tell the password's length",
			dsn:  "host=db password=a",
			line: "host=db password=a and host=db2 password=averyveryverylongpassword",
			want: "host=db password=xxxxx and host=db2 password=xxxxx",
		},
		{
			name: "another connection string's password is masked too",
			dsn:  commonWordURL,
			line: "copying to postgres://copy:hunter2@backup/runledger and host=b password='x y'",
			want: "copying to postgres://copy:xxxxx@backup/runledger and host=b password=xxxxx",
		},
		{
			name: "no DSN: words and e-mail addresses are not masked",
			dsn:  "",
			line: "runledger: mail ops@example.com about postgres at db:5432 (user: app)",
			want: "runledger: mail ops@example.com about postgres at db:5432 (user: app)",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := redact.New(tt.dsn).String(tt.line)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestRedactorError(t *testing.T) {
	t.Parallel()
	r := redact.New(commonWordURL)
	require.NoError(t, r.Error(nil))

	plain := errors.New("runledger: the database runledger is in recovery")
	require.Same(t, plain, r.Error(plain), "an error without a secret is returned as it is")

	err := r.Error(errors.New("dialing " + commonWordURL))
	require.Equal(t, "dialing postgres://runledger:xxxxx@postgres.runledger-demo.svc:5432/runledger?sslmode=disable", err.Error())
	require.NotContains(t, strings.ReplaceAll(err.Error(), "postgres://runledger:", ""), ":runledger@")
}

// TestDSN: a whole connection string keeps everything but its secrets,
// including strings the parser cannot read, where a password can stand
// where the parser expects something else.
func TestDSN(t *testing.T) {
	t.Parallel()
	tests := []struct{ dsn, want string }{
		{"postgres://app:pw@db:5432/ledger?sslmode=disable", "postgres://app:xxxxx@db:5432/ledger?sslmode=disable"},
		{"postgresql://app@db/ledger", "postgresql://app@db/ledger"},
		{"postgres://app:@db/ledger", "postgres://app:xxxxx@db/ledger"},
		{"postgres://db:5432/x?application_name=me@home", "postgres://db:5432/x?application_name=me@home"},
		{"postgres://app:pw@[::1]:5432,h2:5433/x?pass%77ord=pw&sslmode=disable", "postgres://app:xxxxx@[::1]:5432,h2:5433/x?pass%77ord=xxxxx&sslmode=disable"},
		// An unencoded '/' in the password strands its '@'.
		{"postgres://app:pass/word?x=y@db/ledger", "postgres://app:xxxxx@db/ledger"},
		// An unencoded ':' and '@' in the password: the parser reads a port.
		{"postgres://a@u:sec:ret@h/db", "postgres://a@u:xxxxx@h/db"},
		{"postgres://app:p@ss:w@db/ledger", "postgres://app:xxxxx@db/ledger"},
		{"host=db port=5432 user=app dbname=ledger", "host=db port=5432 user=app dbname=ledger"},
		{"host=db password=pw sslpassword='k p' dbname=ledger", "host=db password=xxxxx sslpassword=xxxxx dbname=ledger"},
		{`password=a\ b host=db`, "password=xxxxx host=db"},
		// libpq skips the spaces after the '=': the password is "host=db".
		{"password= host=db", "password= xxxxx"},
		// Unquoted, the space splits the password: the rest is masked.
		{"host=db password=open sesame dbname=ledger", "host=db password=xxxxx xxxxx"},
		// Not a DSN at all: nothing to mask.
		{"ledger", "ledger"},
	}
	for _, tt := range tests {
		require.Equal(t, tt.want, redact.DSN(tt.dsn), "DSN(%q)", tt.dsn)
	}
}

// TestDSNMasksWhatTheParserReads: for passwords made of the characters that
// quoting and encoding are about, the password pgx reads from the DSN is
// never in the masked DSN, in keyword/value form or URL form.
func TestDSNMasksWhatTheParserReads(t *testing.T) {
	t.Parallel()
	for _, pw := range []string{"runledger", "two words", `it's`, `back\slash`, `q'"uote`, "p@ss:w/rd?#&=", "ümlaut€", " lead", "=eq"} {
		kvQuoted := strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(pw)
		for _, dsn := range []string{
			"host=db user=app password='" + kvQuoted + "' dbname=ledger",
			"postgres://app:" + uriEscape(pw) + "@db/ledger",
			"postgres://app@db/ledger?password=" + uriEscape(pw),
		} {
			cfg, err := pgconn.ParseConfig(dsn)
			require.NoError(t, err, dsn)
			require.Equal(t, pw, cfg.Password, "the test's DSN %q", dsn)
			masked := redact.DSN(dsn)
			require.NotContains(t, masked, pw, "DSN(%q)", dsn)
			require.NotContains(t, masked, kvQuoted)
			require.Contains(t, masked, redact.Mask)
			require.Contains(t, masked, "ledger", "the rest stays readable")
			line := "runledger: dial " + dsn + ": refused"
			require.Equal(t, "runledger: dial "+masked+": refused", redact.New(dsn).String(line))
		}
	}
}

func TestWriter(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	w := redact.New(commonWordURL).Writer(&b)
	n, err := w.Write([]byte("runledger: dial " + commonWordURL + "\n"))
	require.NoError(t, err)
	require.Equal(t, len("runledger: dial "+commonWordURL+"\n"), n, "the caller's byte count")
	require.Equal(t, "runledger: dial postgres://runledger:xxxxx@postgres.runledger-demo.svc:5432/runledger?sslmode=disable\n", b.String())
}

// uriEscape percent-encodes s for a connection URI (libpq reads no '+' as a
// space).
func uriEscape(s string) string { return strings.ReplaceAll(url.QueryEscape(s), "+", "%20") }
