package clitest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// password is in every DSN the tests pass; the server trusts local
// connections and ignores it, and no output may ever contain it.
const password = "Pw-9f3Kq-never-print-me"

// db is one test's database: the DSN given to runledger (with a password)
// and a pool for the test's own checks.
type db struct {
	dsn  string
	pool *pgxpool.Pool
}

// testBouncerTrusts is why the tests of rejected credentials and unknown
// databases run directly to PostgreSQL only: the test PgBouncer trusts its
// clients and serves any database name, so PostgreSQL's refusal reaches the
// client as PgBouncer's own failed login (08P01), not as 28P01 or 3D000.
const testBouncerTrusts = "the test PgBouncer trusts its clients and serves any database name: PostgreSQL's refusal reaches the client as PgBouncer's failed login (08P01)"

func newDB(t *testing.T) *db {
	t.Helper()
	raw := pgtest.NewDatabase(t)
	pool := pgtest.Pool(t, raw)
	d := &db{dsn: raw + " password=" + password, pool: pool}
	d.exec(t, `
CREATE TABLE ledger_writes (n bigint NOT NULL);
INSERT INTO ledger_writes VALUES (0);
CREATE FUNCTION count_ledger_write() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN UPDATE public.ledger_writes SET n = n + 1; RETURN NULL; END $$; -- qualified: ledger_take_back pins search_path
CREATE TRIGGER count_ledger_writes AFTER INSERT OR UPDATE OR DELETE ON runledger.ledger
  FOR EACH STATEMENT EXECUTE FUNCTION count_ledger_write();`)
	return d
}

// urlDSN returns the same database as a postgres:// URL with the password.
func (d *db) urlDSN(t *testing.T) string {
	t.Helper()
	kv := map[string]string{}
	for _, f := range strings.Fields(d.dsn) {
		k, v, _ := strings.Cut(f, "=")
		kv[k] = v
	}
	u := url.URL{Scheme: "postgres", User: url.UserPassword(kv["user"], password), Path: "/" + kv["dbname"],
		RawQuery: url.Values{"host": {kv["host"]}, "port": {kv["port"]}, "sslmode": {"disable"}}.Encode()}
	return u.String()
}

func (d *db) exec(t *testing.T, sql string, args ...any) {
	t.Helper()
	_, err := d.pool.Exec(context.Background(), sql, args...)
	require.NoError(t, err, "executing %s", sql)
}

func (d *db) int(t *testing.T, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	require.NoError(t, d.pool.QueryRow(context.Background(), sql, args...).Scan(&n), "querying %s", sql)
	return n
}

// committed returns the number of committed ledger rows, after checking that
// no business key has two.
func (d *db) committed(t *testing.T) int64 {
	t.Helper()
	require.Zero(t, d.int(t, `SELECT count(*) FROM (SELECT 1 FROM runledger.ledger WHERE state = 'committed' GROUP BY entity, occurrence HAVING count(*) > 1) d`),
		"a business key with two committed rows")
	return d.int(t, `SELECT count(*) FROM runledger.ledger WHERE state = 'committed'`)
}

func (d *db) ledgerWrites(t *testing.T) int64 { return d.int(t, `SELECT n FROM ledger_writes`) }

// summary is the JSON result of `runledger run --output json`.
type summary struct {
	Total          int64 `json:"total"`
	Completed      int64 `json:"completed"`
	AlreadyHandled int64 `json:"alreadyHandled"`
	Failed         int64 `json:"failed"`
	PayloadChanged int64 `json:"payloadChanged"`
	Failures       []struct {
		Entity     string `json:"entity"`
		Occurrence string `json:"occurrence"`
		Error      string `json:"error"`
		Class      string `json:"class"`
	} `json:"failures"`
	Interrupted bool   `json:"interrupted"`
	Error       string `json:"error"`
	Proven      bool   `json:"proven"`
	Reproven    int    `json:"reproven"`
	Replication *struct {
		Synchronous             bool   `json:"synchronous"`
		Standby                 string `json:"standby"`
		SynchronousCommit       string `json:"synchronousCommit"`
		SynchronousStandbyNames string `json:"synchronousStandbyNames"`
		InRecovery              bool   `json:"inRecovery"`
	} `json:"replication"`
}

type counts struct{ Total, Completed, AlreadyHandled, Failed int64 }

func (s summary) counts() counts {
	return counts{s.Total, s.Completed, s.AlreadyHandled, s.Failed}
}

type result struct {
	code           int
	stdout, stderr string
}

// summary decodes stdout, which must be exactly one JSON object.
func (r result) summary(t *testing.T) summary {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	var s summary
	require.NoError(t, dec.Decode(&s), "stdout is one JSON object:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	rest, _ := io.ReadAll(dec.Buffered())
	require.Empty(t, strings.TrimSpace(string(rest)), "nothing after the JSON object on stdout")
	require.NotNil(t, s.Failures, "failures is always a list")
	if r.code == 0 {
		require.True(t, s.Proven, "a run that exits 0 has its counts proven by the ledger (issue #44):\n%s", r.stdout)
	}
	return s
}

// command prepares `runledger ARGS...` (this test binary, see TestMain).
func command(ctx context.Context, stdin string, args ...string) (*exec.Cmd, *bytes.Buffer, *lockedWriter) {
	return commandOf(ctx, os.Args[0], stdin, args...)
}

// commandOf prepares `BIN ARGS...`, with stdin and the outputs command's has.
func commandOf(ctx context.Context, bin, stdin string, args ...string) (*exec.Cmd, *bytes.Buffer, *lockedWriter) {
	cmd := exec.CommandContext(ctx, bin, args...)
	// No kubeconfig of the machine's: the namespace the commands default to
	// (the kubeconfig context's) is "default" whoever runs the tests.
	cmd.Env = append(os.Environ(), envMain+"=1", "KUBECONFIG="+filepath.Join(os.TempDir(), "runledger-tests-no-kubeconfig"))
	cmd.Stdin = strings.NewReader(stdin)
	var stdout bytes.Buffer
	stderr := &lockedWriter{w: &bytes.Buffer{}}
	cmd.Stdout, cmd.Stderr = &stdout, stderr
	return cmd, &stdout, stderr
}

type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return fmt.Sprint(l.w)
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// runCLI runs runledger to the end and checks that its output holds no
// password.
func runCLI(t *testing.T, stdin string, args ...string) result {
	t.Helper()
	return runCLIEnv(t, nil, stdin, args...)
}

// runCLIEnv is runCLI with env added to the command's environment.
func runCLIEnv(t *testing.T, env []string, stdin string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd, stdout, stderr := command(ctx, stdin, args...)
	cmd.Env = append(cmd.Env, env...)
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	if err != nil {
		var exit *exec.ExitError
		require.ErrorAs(t, err, &exit, "running runledger %s", strings.Join(args, " "))
		r.code = exit.ExitCode()
	}
	noSecret(t, r)
	return r
}

func noSecret(t *testing.T, r result) {
	t.Helper()
	require.NotContains(t, r.stdout, password, "the password leaked to stdout")
	require.NotContains(t, r.stderr, password, "the password leaked to stderr")
	require.NotContains(t, r.stderr, url.QueryEscape(password), "the password leaked to stderr")
}

// writeFile writes content to a file in a temporary directory of the test.
func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o600))
	return p
}

// manifest returns a ProcessingRun manifest named name with the given spec
// lines (YAML, indented under spec:).
func manifest(name string, spec ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, `apiVersion: processing.runledger.dev/v1alpha1
kind: ProcessingRun
metadata:
  name: %s
  namespace: billing
spec:
  database:
    secretRef: {name: billing-db, key: dsn}
`, name)
	for _, l := range spec {
		b.WriteString("  " + l + "\n")
	}
	return b.String()
}

// inlineItems renders a YAML batch of inline items.
func inlineItems(keys ...[2]string) string {
	var b strings.Builder
	b.WriteString("batch:\n    items:\n")
	for i, k := range keys {
		fmt.Fprintf(&b, "    - {entity: %q, occurrence: %q, payload: {amount: %d}}\n", k[0], k[1], i+1)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

var osReadFile = os.ReadFile

func discard() logr.Logger { return logr.Discard() }
