package clitest

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// commonWordRun is a run whose names hold the word "runledger", as the
// sample's do: a password that is that word must not mask them.
func commonWordRun(t *testing.T) string {
	t.Helper()
	m := strings.Replace(manifest("runledger-invoices", inlineItems([2]string{"acct-1", "2024-06"}, [2]string{"acct-2", "2024-06"})),
		"namespace: billing", "namespace: runledger-demo", 1)
	return writeFile(t, "run.yaml", m)
}

// requireNotMasked checks that output holds no mask token: with the DSN's
// password in no line, nothing may be masked.
func requireNotMasked(t *testing.T, output string) {
	t.Helper()
	require.NotContains(t, output, "xxxxx", "something was masked:\n%s", output)
	require.NotContains(t, output, "[redacted]", "something was masked:\n%s", output)
}

// TestCommonWordPasswordMasksNothingElse: a password that is a common word
// (here the project's own name, as the old sample's was) masks no other
// occurrence of that word: the run's names and runledger's own prefix stay
// readable, and the output does not tell the password by what is masked.
func TestCommonWordPasswordMasksNothingElse(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	file := commonWordRun(t)
	dsn := strings.Replace(d.dsn, "password="+password, "password=runledger", 1) // local connections are trusted: the password is not checked
	r := runCLI(t, "", "run", "-f", file, "--dsn", dsn)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, `"msg":"processing run","run":"runledger-demo/runledger-invoices"`)
	require.Contains(t, r.stdout, "total 2, completed 2")
	requireNotMasked(t, r.stderr+r.stdout)
	require.EqualValues(t, 2, d.committed(t))

	// The same once more, as JSON: what the first invocation committed
	// counts as completed, nothing is committed twice.
	r = runCLI(t, "", "run", "-f", file, "--dsn", dsn, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 2, Completed: 2}, r.summary(t).counts())
	requireNotMasked(t, r.stderr+r.stdout)
	require.EqualValues(t, 2, d.committed(t))
}

// TestWrongCommonWordPassword: the server rejects a password that is a
// common word ("password", "runledger"). The message says so, naming the
// user and database, with every other occurrence of the word intact; the
// password never appears as the DSN's secret; nothing is committed.
func TestWrongCommonWordPassword(t *testing.T) {
	t.Parallel()
	pgtest.DirectOnly(t, testBouncerTrusts)
	d := newDB(t)
	file := commonWordRun(t)
	for _, pw := range []string{"password", "runledger"} {
		t.Run(pw, func(t *testing.T) {
			dsn := pgtest.PasswordDSN(t, d.dsn, pw)
			r := runCLI(t, "", "run", "-f", file, "--dsn", dsn, "--output", "json", "--retry-timeout", "5s")
			require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
			s := r.summary(t)
			for _, out := range []string{r.stderr, s.Error} {
				require.Contains(t, out, "the database server rejected the connection string's credentials (its user or password)")
				require.Contains(t, out, "password authentication failed for user")
				require.Contains(t, out, pgtest.PasswordUser)
				require.NotContains(t, out, "password="+pw)
				requireNotMasked(t, out)
			}
			require.True(t, strings.HasPrefix(r.stderr, "runledger: "), "runledger's own prefix is not masked:\n%s", r.stderr)
			require.Equal(t, counts{}, s.counts())
			require.Zero(t, d.committed(t), "nothing committed")
		})
	}
}

// TestMalformedDSNEchoedMasked: pgx echoes a connection string it cannot
// parse. Its password is masked there with a fixed token, whatever its form
// (a quoted keyword/value with an escaped quote and a space, a URL), and the
// rest of the DSN stays readable, the common word included.
func TestMalformedDSNEchoedMasked(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	file := commonWordRun(t)
	tests := []struct {
		name, dsn string
		want      []string // in stderr and in the JSON error
		never     []string
	}{
		{
			name:  "keyword/value",
			dsn:   `host=127.0.0.1 port=notaport user=runledger password='open\' runledger sesame' dbname=runledger`,
			want:  []string{"invalid port", "host=127.0.0.1 port=notaport user=runledger password=xxxxx dbname=runledger"},
			never: []string{"sesame", `open\'`},
		},
		{
			name:  "URL",
			dsn:   "postgres://runledger:runledger@127.0.0.1:notaport/runledger?sslpassword=runledger&sslmode=disable",
			want:  []string{"postgres://runledger:xxxxx@127.0.0.1:notaport/runledger?sslpassword=xxxxx&sslmode=disable"},
			never: []string{":runledger@", "sslpassword=runledger"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCLI(t, "", "run", "-f", file, "--dsn", tt.dsn, "--output", "json")
			require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
			s := r.summary(t)
			for _, out := range []string{r.stderr, s.Error} {
				require.Contains(t, out, "parsing database URL: cannot parse")
				for _, w := range tt.want {
					require.Contains(t, out, w)
				}
				for _, n := range tt.never {
					require.NotContains(t, out, n)
				}
			}
			require.Zero(t, d.committed(t), "nothing committed")
		})
	}
}

// TestDSNFile: run and migrate read the DSN from --dsn-file (no password on
// the command line, hence no notice about ps); a file that cannot be used is
// bad input, exit 2, with nothing committed and its content never echoed.
func TestDSNFile(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	file := commonWordRun(t)
	dsnFile := writeFile(t, "dsn", d.dsn+"\n")

	r := runCLI(t, "", "migrate", "--dsn-file", dsnFile)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stdout, "migrations applied: ")

	r = runCLI(t, "", "run", "-f", file, "--dsn-file", dsnFile, "--output", "json")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 2, Completed: 2}, r.summary(t).counts())
	require.NotContains(t, r.stderr, "ps)", "no notice: the password is not on the command line")
	require.EqualValues(t, 2, d.committed(t))

	// The same DSN in --dsn: the notice.
	r = runCLI(t, "", "run", "-f", file, "--dsn", d.dsn)
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "runledger: note: --dsn holds a password, which other users of this machine can read (ps); prefer --dsn-file, $RUNLEDGER_DATABASE_URL or a .pgpass file")

	// A malformed DSN in the file is masked as one given in --dsn is.
	badDSN := writeFile(t, "bad", "host=127.0.0.1 port=notaport password='"+password+"'\n")
	missing := writeFile(t, "x", "") + ".missing"
	for _, tt := range []struct {
		name, file, want string
	}{
		{"missing", missing, "reading --dsn-file: open " + missing + ": no such file or directory"},
		{"empty", writeFile(t, "empty", "\n"), "is empty: want a connection string"},
		{"malformed", badDSN, "cannot parse `host=127.0.0.1 port=notaport password=xxxxx`: invalid port"},
	} {
		for _, args := range [][]string{{"run", "-f", file, "--output", "json"}, {"migrate"}} {
			r := runCLI(t, "", append(args, "--dsn-file", tt.file)...)
			require.Equal(t, 2, r.code, "%s %s: stderr:\n%s", tt.name, args[0], r.stderr)
			require.Contains(t, r.stderr, tt.want, "%s %s", tt.name, args[0])
			if args[0] == "run" {
				require.Contains(t, r.summary(t).Error, tt.want)
			}
		}
	}
	require.EqualValues(t, 2, d.committed(t), "nothing committed twice")
}
