//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/stretchr/testify/require"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// readmeCommandLangs are the fenced blocks of README.md that hold commands:
// each is run by a test, as written.
var readmeCommandLangs = map[string]bool{"sh": true, "console": true, "bash": true, "shell": true}

// readmeRunElsewhere are the README's marked sections whose blocks other
// tests run word for word (with the settings they name replaced).
var readmeRunElsewhere = map[string]string{
	"readme-install":    "TestReadmeInstall",
	"readme-helm":       "TestHelmInstall",
	"readme-helm-adopt": "TestUpgradeWithRunInFlight",
}

// readmeNotRun are the README's commands TestReadmeExamples does not run,
// each with the reason: every other command of a command block is run.
var readmeNotRun = map[string]string{
	"kubectl krew install --manifest=runledger.yaml": "needs krew and a release's runledger.yaml and archives " +
		"(hack/tools/release's tests check the manifest and its checksums)",
}

// mdBlock is a fenced block of Markdown.
type mdBlock struct {
	lang    string
	line    int    // of the opening fence, 1-based
	section string // the marked section it is in (<!-- NAME:begin -->), if any
	body    string
}

var mdMarker = regexp.MustCompile(`^<!-- ([a-z0-9-]+):(begin|end) -->$`)

// markdownBlocks are the fenced blocks of a Markdown document, in order.
func markdownBlocks(doc string) []mdBlock {
	var (
		blocks  []mdBlock
		cur     *mdBlock
		body    strings.Builder
		section string
	)
	for i, line := range strings.Split(doc, "\n") {
		if cur != nil {
			if line == "```" {
				cur.body = body.String()
				blocks = append(blocks, *cur)
				cur = nil
				continue
			}
			body.WriteString(line + "\n")
			continue
		}
		if m := mdMarker.FindStringSubmatch(line); m != nil {
			if m[2] == "begin" {
				section = m[1]
			} else {
				section = ""
			}
			continue
		}
		if lang, ok := strings.CutPrefix(line, "```"); ok {
			cur = &mdBlock{lang: strings.TrimSpace(lang), line: i + 1, section: section}
			body.Reset()
		}
	}
	return blocks
}

// example is one command of a README block and the output the README shows
// for it (none: not checked).
type example struct {
	line int // in README.md
	cmd  string
	want []string
}

var heredoc = regexp.MustCompile(`<<-?\s*'?"?([A-Za-z_][A-Za-z0-9_]*)'?"?`)

// blockExamples splits a block into its commands: in a console block each
// `$ ` line (with its here-document or continuation lines) and the output
// lines after it; in an sh block each line (likewise), without output.
func blockExamples(b mdBlock) []example {
	lines := strings.Split(strings.TrimRight(b.body, "\n"), "\n")
	var out []example
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if b.lang == "console" {
			if !strings.HasPrefix(l, "$ ") {
				if len(out) > 0 {
					out[len(out)-1].want = append(out[len(out)-1].want, l)
				}
				continue
			}
			l = strings.TrimPrefix(l, "$ ")
		}
		if strings.TrimSpace(l) == "" || strings.HasPrefix(strings.TrimSpace(l), "#") {
			continue
		}
		ex := example{line: b.line + 1 + i, cmd: l}
		for strings.HasSuffix(ex.cmd, `\`) && i+1 < len(lines) {
			i++
			ex.cmd += "\n" + lines[i]
		}
		if m := heredoc.FindStringSubmatch(ex.cmd); m != nil {
			for i+1 < len(lines) {
				i++
				ex.cmd += "\n" + lines[i]
				if lines[i] == m[1] {
					break
				}
			}
		}
		out = append(out, ex)
	}
	return out
}

// What differs from one run of an example to the next, and is not compared.
var (
	rfc3339   = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	uuid      = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)
	kubeAge   = regexp.MustCompile(`(^|\s)\d+(d|h|m|s|ms)(\d+(h|m|s))?(\s|$)`)
	blankRuns = regexp.MustCompile(`\s+`)
)

// normalized is an output line with its times, uids and kubectl's ages
// replaced and its runs of white space (a table's alignment) made one.
func normalized(l string) string {
	l = rfc3339.ReplaceAllString(l, "<time>")
	l = uuid.ReplaceAllString(l, "<uid>")
	l = blankRuns.ReplaceAllString(strings.TrimSpace(l), " ")
	for kubeAge.MatchString(l) {
		l = kubeAge.ReplaceAllString(l, "$1<age>$5")
	}
	return l
}

// sameOutput reports whether got is the output shown (shown), line by line,
// normalized; "..." in a shown line stands for any text. It returns both
// normalized.
func sameOutput(shown []string, got string) (want, have []string, same bool) {
	gotLines := strings.Split(strings.TrimRight(got, "\n"), "\n")
	want = make([]string, len(shown))
	for i, w := range shown {
		want[i] = normalized(w)
	}
	have = make([]string, len(gotLines))
	for i, g := range gotLines {
		have[i] = normalized(g)
	}
	same = len(want) == len(have)
	for i := 0; same && i < len(want); i++ {
		parts := strings.Split(want[i], "...")
		for j := range parts {
			parts[j] = regexp.QuoteMeta(parts[j])
		}
		same = regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(have[i])
	}
	return want, have, same
}

// requireOutput: the command's output is the one file shows (sameOutput).
func requireOutput(t *testing.T, file string, ex example, got string) {
	t.Helper()
	if want, have, same := sameOutput(ex.want, got); !same {
		t.Errorf("%s:%d: $ %s\nits output is not the one shown (normalized: times, uids, ages and alignment aside)\nshown:\n  %s\ngot:\n  %s",
			file, ex.line, ex.cmd, strings.Join(want, "\n  "), strings.Join(have, "\n  "))
	}
}

// billingWorld is the world README.md's examples assume (see its section
// "The CLI"): a ledger database set up as docs/migrations.md says (an
// owner, the worker login runledger_worker in the runs' Secret billing-db,
// the effect role runledger_effect), config/samples/billing/billing.sql's
// tables, namespace billing with the workers' ServiceAccount, and the run
// june-invoices applied and finished; a HOME whose ~/.config/billing.dsn
// and $RUNLEDGER_DATABASE_URL are the owner's DSN; the bucket
// billing-exports of the cluster's object store with the sample export
// (billingExports).
type billingWorld struct {
	env []string // HOME, PATH, RUNLEDGER_DATABASE_URL, S3_* (KUBECONFIG is the harness's)
	dsn string   // the owner's
	mon *podMonitor
}

const (
	billingNS     = "billing"
	billingWorker = "runledger_worker"
	// podCIDR is the cluster's pods' addresses (hack/cluster/lib/common.sh,
	// CLUSTER_POD_CIDR): where the worker login logs in from.
	podCIDR = "10.244.0.0/16"
)

// asDBA runs psql as the cluster's superuser on the node's socket (peer
// authentication), as a database administrator does; the SQL goes on stdin
// (it may hold a password).
func (e *env) asDBA(ctx context.Context, t *testing.T, stateDir, sql string) {
	t.Helper()
	cmd := exec.CommandContext(ctx, "runuser", "-u", "postgres", "--", "psql", "-h", filepath.Join(stateDir, "postgres", "run"),
		"-d", "postgres", "-X", "-q", "-v", "ON_ERROR_STOP=1")
	cmd.Stdin = strings.NewReader(sql)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "psql as postgres: %s", out)
}

// ownerLedger creates database db and does what its owner does for the
// README's examples: config/samples/billing/billing.sql's tables, then
// runledger migrate with the two roles (the worker login must exist). The
// caller drops db.
func ownerLedger(ctx context.Context, t *testing.T, e *env, root, db string) string {
	t.Helper()
	dsn := e.createDatabase(t, db)
	schema, err := os.ReadFile(filepath.Join(root, "config", "samples", "billing", "billing.sql"))
	require.NoError(t, err)
	_, err = e.sql(ctx, dsn, string(schema))
	require.NoError(t, err, "config/samples/billing/billing.sql")
	shell(ctx, t, root, "bin/runledger migrate --grant-to "+billingWorker+" --effect-role "+effectRole+" >&2", "RUNLEDGER_DATABASE_URL="+dsn)
	return dsn
}

// newBillingWorld sets the README's world up; it is taken down when the
// test ends (the namespace billing deleted: TestReadmeInstall creates it).
func newBillingWorld(ctx context.Context, t *testing.T, e *env, root string) *billingWorld {
	t.Helper()
	shell(ctx, t, root, "make -s build >&2")
	out, err := exec.CommandContext(ctx, e.clusterSh, "state-dir").Output()
	require.NoError(t, err, "hack/cluster.sh state-dir")
	stateDir := strings.TrimSpace(string(out))

	// The administrator: the worker login, allowed in from the pods (the
	// effect role, runledger_effect, is the cluster's).
	db := "e2e_billing_" + randSuffix()
	password := randSuffix() + randSuffix() + randSuffix()
	e.asDBA(ctx, t, stateDir, fmt.Sprintf(`SET client_min_messages = warning;
DROP ROLE IF EXISTS %[1]s;
CREATE ROLE %[1]s LOGIN PASSWORD '%[2]s';`, billingWorker, password))
	hbaPath := filepath.Join(stateDir, "postgres", "data", "pg_hba.conf")
	hbaLine := fmt.Sprintf("host %s %s %s scram-sha-256 # %s\n", db, billingWorker, podCIDR, t.Name())
	hba, err := os.ReadFile(hbaPath)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(hbaPath, append(hba, hbaLine...), 0o600))
	e.asDBA(ctx, t, stateDir, "SELECT pg_reload_conf();")
	dsn := ownerLedger(ctx, t, e, root, db)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if t.Failed() {
			(&fixture{env: e, t: t, ctx: ctx, ns: billingNS}).dump()
		}
		out, err := e.kubectlRun(ctx, "delete", "namespace", billingNS, "--ignore-not-found", "--wait=true")
		require.NoError(t, err, out)
		if err := e.dropDatabase(db); err != nil {
			t.Errorf("drop database %s: %v", db, err)
		}
		if hba, err := os.ReadFile(hbaPath); err == nil {
			require.NoError(t, os.WriteFile(hbaPath, bytes.ReplaceAll(hba, []byte(hbaLine), nil), 0o600))
		}
		e.asDBA(ctx, t, stateDir, "SELECT pg_reload_conf(); DROP ROLE IF EXISTS "+billingWorker+";")
	})

	// The namespace, the workers' ServiceAccount, the Secret: the worker's DSN.
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.UserPassword(billingWorker, password)
	out2, err := e.kubectlRun(ctx, "delete", "namespace", billingNS, "--ignore-not-found", "--wait=true")
	require.NoError(t, err, out2)
	for _, args := range [][]string{
		{"create", "namespace", billingNS},
		{"label", "namespace", billingNS, "pod-security.kubernetes.io/enforce=restricted"},
		{"-n", billingNS, "create", "serviceaccount", workerSA},
		{"-n", billingNS, "create", "rolebinding", workerSA, "--clusterrole=runledger-worker", "--serviceaccount=" + billingNS + ":" + workerSA},
		{"-n", billingNS, "create", "secret", "generic", "billing-db", "--from-literal=dsn=" + u.String()},
	} {
		out, err := e.kubectlRun(ctx, args...)
		require.NoError(t, err, "kubectl %s: %s", args[:3], out)
	}
	mon := startPodMonitor(ctx, t, e.cs, billingNS)

	w := &billingWorld{dsn: dsn, mon: mon, env: append(userEnv(t, e, root, dsn), billingExports(ctx, t, e, root)...)}

	// The run the examples name, finished.
	out2, err = e.kubectlRun(ctx, "apply", "-f", filepath.Join(root, "config", "samples", "billing", "june-invoices.yaml"))
	require.NoError(t, err, out2)
	out2, err = e.kubectlRun(ctx, "-n", billingNS, "wait", "processingrun/june-invoices", "--for=condition=Complete", "--timeout=300s")
	require.NoError(t, err, "june-invoices: %s", out2)
	return w
}

// The README's batch from object storage ("Batches from object storage"):
// the bucket, the object the export is, and the run that reads it.
const (
	billingExportsBucket = "billing-exports"
	billingExportsKey    = "credits/2026-06-30.csv"
	billingExportsSample = "credits-2026-06-30.csv" // of config/samples/billing
	billingExportsRun    = "credits-2026-06-30"
)

// billingExports sets up the README's object store as a user's would be:
// the bucket billing-exports of the cluster's store holding the sample
// export, and a NetworkPolicy of namespace billing letting the run
// credits-2026-06-30's pods reach the store (the run's own policy opens
// port 443 only; the cluster's store listens on 8333). It returns the
// environment the README names the store by (S3_ENDPOINT, S3_ACCESS_KEY_ID,
// S3_SECRET_ACCESS_KEY, S3_CA_FILE, as hack/cluster.sh s3-env prints them);
// the bucket is deleted when the test ends, the policy with the namespace.
func billingExports(ctx context.Context, t *testing.T, e *env, root string) []string {
	t.Helper()
	store := e.objectStore(t)
	c := store.client()
	if _, err := c.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(billingExportsBucket)}); err != nil {
		_, err = c.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(billingExportsBucket)})
		require.NoError(t, err, "creating bucket %s", billingExportsBucket)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := c.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: aws.String(billingExportsBucket)}); err != nil {
			t.Errorf("deleting bucket %s: %v", billingExportsBucket, err)
		}
	})
	sample, err := os.ReadFile(filepath.Join(root, "config", "samples", "billing", billingExportsSample))
	require.NoError(t, err)
	_, err = c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(billingExportsBucket), Key: aws.String(billingExportsKey), Body: bytes.NewReader(sample)})
	require.NoError(t, err, "putting s3://%s/%s", billingExportsBucket, billingExportsKey)
	(&fixture{env: e, t: t, ctx: ctx, ns: billingNS}).allowObjectStore(billingExportsRun+"-to-s3", map[string]string{v1alpha1.LabelRun: billingExportsRun})
	return []string{
		"S3_ENDPOINT=" + store.Endpoint,
		"S3_ACCESS_KEY_ID=" + store.AccessKey,
		"S3_SECRET_ACCESS_KEY=" + store.SecretKey,
		"S3_CA_FILE=" + store.CAFile,
	}
}

// userEnv is a user's environment: a HOME whose ~/.config/billing.dsn and
// $RUNLEDGER_DATABASE_URL are dsn, with a ~/.local/bin on PATH, and
// runledger (this checkout's bin/runledger) and kubectl on PATH.
func userEnv(t *testing.T, e *env, root, dsn string) []string {
	t.Helper()
	home := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".config"), 0o700))
	require.NoError(t, os.MkdirAll(filepath.Join(home, ".local", "bin"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(home, ".config", "billing.dsn"), []byte(dsn+"\n"), 0o600))
	bin := t.TempDir()
	require.NoError(t, os.Symlink(filepath.Join(root, "bin", "runledger"), filepath.Join(bin, "runledger")))
	return []string{
		"HOME=" + home,
		"PATH=" + strings.Join([]string{filepath.Join(home, ".local", "bin"), bin, filepath.Dir(e.kubectl), os.Getenv("PATH")}, ":"),
		"RUNLEDGER_DATABASE_URL=" + dsn,
	}
}

// runExample runs one example as written in dir with env added to the
// test's environment, and returns its stdout and stderr; the test fails if
// it exits non-zero.
func runExample(ctx context.Context, t *testing.T, file, dir string, env []string, ex example) (stdout, stderr string) {
	t.Helper()
	t0 := time.Now()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -euo pipefail\n"+ex.cmd) // no -x: no DSN is shown
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	t.Logf("%s:%d ($ %s) in %s:\n%s%s", file, ex.line, ex.cmd, time.Since(t0).Round(time.Millisecond), out.String(), errOut.String())
	if err != nil {
		t.Fatalf("%s:%d: $ %s\n%v\nstdout:\n%s\nstderr:\n%s", file, ex.line, ex.cmd, err, out.String(), errOut.String())
	}
	return out.String(), errOut.String()
}

// TestReadmeExamples runs every command of README.md's command blocks (sh
// and console) as written, but for those the install and Helm tests run
// (readmeRunElsewhere) and the few readmeNotRun names with the reason, in
// the world they assume (billingWorld), in the README's order; where the
// README shows a command's output, its output must be that (times, uids,
// ages and alignment aside). A new block is run unless it is named here.
// Only the environment differs from a user's shell: HOME, PATH,
// KUBECONFIG, RUNLEDGER_DATABASE_URL and the object store's S3_ENDPOINT,
// S3_ACCESS_KEY_ID, S3_SECRET_ACCESS_KEY and S3_CA_FILE (billingExports). It runs alone (namespace billing,
// the role runledger_worker: no t.Parallel).
func TestReadmeExamples(t *testing.T) {
	e := setup(t)
	root := repoRoot(t)
	raw, err := os.ReadFile(filepath.Join(root, "README.md"))
	require.NoError(t, err)
	var examples []example
	notRun := map[string]bool{}
	for _, b := range markdownBlocks(string(raw)) {
		if !readmeCommandLangs[b.lang] {
			continue
		}
		if by, ok := readmeRunElsewhere[b.section]; ok {
			t.Logf("README.md:%d: run by %s", b.line, by)
			continue
		}
		for _, ex := range blockExamples(b) {
			bare, _, _ := strings.Cut(ex.cmd, " #")
			bare = strings.TrimSpace(bare)
			if why, ok := readmeNotRun[bare]; ok {
				t.Logf("README.md:%d: not run: $ %s\n  (%s)", ex.line, ex.cmd, why)
				notRun[bare] = true
				continue
			}
			examples = append(examples, ex)
		}
	}
	for cmd := range readmeNotRun {
		require.True(t, notRun[cmd], "readmeNotRun names %q, which README.md no longer holds: remove it", cmd)
	}
	require.GreaterOrEqual(t, len(examples), 15, "README.md's examples")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	w := newBillingWorld(ctx, t, e, root)
	for _, ex := range examples {
		stdout, _ := runExample(ctx, t, "README.md", root, w.env, ex)
		if len(ex.want) > 0 {
			requireOutput(t, "README.md", ex, stdout)
		}
	}

	runCLIDocExamples(ctx, t, e, root)

	// What the examples promised happened, in the ledger's own tables.
	f := &fixture{env: e, t: t, ctx: ctx, dsn: w.dsn}
	require.EqualValues(t, 3, f.int(`SELECT count(*) FROM invoices WHERE period = '2026-05'`), "may-invoices wrote three invoices, once")
	require.EqualValues(t, 50, f.int(`SELECT count(*) FROM invoices WHERE period = '2026-06'`), "june-invoices and its retry: one invoice per account")
	require.EqualValues(t, 49, f.int(`SELECT count(*) FROM invoices WHERE period = '2026-07'`), "the schedule's run of 2026-07")
	require.EqualValues(t, 3, f.int(`SELECT count(*) FROM credits`), "credits-2026-06-30 wrote three credit notes, cn-1002 once")
	require.Zero(t, f.int(`SELECT count(*) FROM (SELECT 1 FROM runledger.ledger WHERE state = 'committed' GROUP BY entity, occurrence HAVING count(*) > 1) d`),
		"no business key has two committed ledger rows")
	var runs v1alpha1.ProcessingRunList
	require.NoError(t, e.c.List(ctx, &runs, client.InNamespace(billingNS)))
	for _, r := range runs.Items {
		t.Logf("run %s: %s", r.Name, statusLine(&r))
	}
	w.mon.stop()
	require.Empty(t, w.mon.violations(), "a shard had two live pods at once")
}

// TestReadmeExamplesParse: how TestReadmeExamples reads README.md (no
// cluster needed: go test -tags e2e -run TestReadmeExamplesParse ./test/e2e):
// a console block's commands with their here-documents and the output lines
// after them, an sh block's lines, the marked sections; and what its
// comparison leaves aside.
func TestReadmeExamplesParse(t *testing.T) {
	doc := "intro\n<!-- readme-install:begin -->\n```sh\nmake push\n```\n<!-- readme-install:end -->\n" +
		"```console\n$ kubectl apply -f - <<'YAML'\nkind: X\n$ not a command\nYAML\nx created\n$ runledger key a b   # a comment\nkey  a / b\n  more\n```\n" +
		"```sh\nfirst \\\n  --flag\n# a comment\n\nsecond\n```\n```text\n$ not run\n```\n"
	blocks := markdownBlocks(doc)
	require.Len(t, blocks, 4)
	require.Equal(t, "readme-install", blocks[0].section)
	require.Equal(t, mdBlock{lang: "console", line: 7, body: blocks[1].body}, blocks[1])
	require.Equal(t, []example{
		{line: 8, cmd: "kubectl apply -f - <<'YAML'\nkind: X\n$ not a command\nYAML", want: []string{"x created"}},
		{line: 13, cmd: "runledger key a b   # a comment", want: []string{"key  a / b", "  more"}},
	}, blockExamples(blocks[1]))
	require.Equal(t, []example{{line: 18, cmd: "first \\\n  --flag"}, {line: 22, cmd: "second"}}, blockExamples(blocks[2]))
	require.Equal(t, "text", blocks[3].lang)

	for in, want := range map[string]string{
		"june-invoices-retry   Succeeded   1    0     1s         3m5s":                   "june-invoices-retry Succeeded 1 0 <age> <age>",
		"Failed   acct-37  2026-06     1      0        2026-07-01T02:14:09Z  23503: x":   "Failed acct-37 2026-06 1 0 <time> 23503: x",
		"committed by  billing/june-invoices (uid 2e118509-7867-4709-8c1d-ee5045670b75)": "committed by billing/june-invoices (uid <uid>)",
		`{"total":4,"completed":3}`: `{"total":4,"completed":3}`,
	} {
		require.Equal(t, want, normalized(in), in)
	}
	m, err := logfmt(`time=2026-06-30T09:12:01.198Z level=INFO msg="a \"b\": c" run=billing/x synchronousStandbyNames="" total=3`)
	require.NoError(t, err)
	require.Equal(t, map[string]string{"time": "2026-06-30T09:12:01.198Z", "level": "INFO", "msg": `a "b": c`, "run": "billing/x", "synchronousStandbyNames": "", "total": "3"}, m)

	logged := `{"time":"2026-12-06T15:36:49.34Z","level":"INFO","msg":"shard finished","run":"billing/x","shard":0,"failed":0,"proven":true,"elapsed":"62ms"}` + "\n"
	missing, err := notLogged([]string{`time=2026-06-30T09:12:01.251Z level=INFO msg="shard finished" run=billing/x shard=0 failed=0 proven=true elapsed=31ms`}, logged)
	require.NoError(t, err)
	require.Empty(t, missing, "the same line, time and duration aside")
	missing, err = notLogged([]string{`time=2026-06-30T09:12:01.251Z level=INFO msg="shard finished" run=billing/x shard=0 failed=0 elapsed=31ms`}, logged)
	require.NoError(t, err)
	require.Len(t, missing, 1, "a key logged is not shown")

	_, _, same := sameOutput([]string{"a ... c", "VERDICT  ENTITY"}, "a b c\nVERDICT ENTITY\n")
	require.True(t, same, "... stands for any text, alignment aside")
	_, _, same = sameOutput([]string{"VERDICT  ENTITY", "Failed  acct-37"}, "VERDICT ENTITY\n")
	require.False(t, same, "a line shown and not printed")
	_, _, same = sameOutput([]string{`{"total":4,"completed":3}`}, `{"total":4,"completed":2}`)
	require.False(t, same, "another count")
}

// runCLIDocExamples runs docs/cli.md's first examples (its section
// <!-- cli-run-examples -->) as written: runledger run of the manifest it
// shows, june-invoices.yaml, and of its copy under another name, in a
// directory holding both, against a ledger of their own (their run
// june-invoices runs on this machine; the README's is the cluster's). The
// output must be the one shown; the log lines shown (text, as on a
// terminal) must be among the JSON lines it logs on stderr (times and
// durations aside).
func runCLIDocExamples(ctx context.Context, t *testing.T, e *env, root string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(root, "docs", "cli.md"))
	require.NoError(t, err)
	var manifest string
	var examples []example
	for _, b := range markdownBlocks(string(raw)) {
		switch {
		case b.section != "cli-run-examples":
		case b.lang == "yaml":
			manifest = b.body
		case b.lang == "console":
			examples = append(examples, blockExamples(b)...)
		}
	}
	require.Len(t, examples, 2, "docs/cli.md's run examples")
	name, ok := strings.CutPrefix(strings.SplitN(manifest, "\n", 2)[0], "# ")
	require.True(t, ok, "docs/cli.md's manifest names its file on its first line: %q", manifest)
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(manifest), 0o644))
	again := strings.Replace(manifest, "\n  name: june-invoices\n", "\n  name: june-invoices-again\n", 1)
	require.NotEqual(t, manifest, again, "the manifest is run june-invoices")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "june-invoices-again.yaml"), []byte(again), 0o644))

	db := "e2e_clidoc_" + randSuffix()
	dsn := ownerLedger(ctx, t, e, root, db)
	t.Cleanup(func() {
		if err := e.dropDatabase(db); err != nil {
			t.Errorf("drop database %s: %v", db, err)
		}
	})
	env := userEnv(t, e, root, dsn)
	for _, ex := range examples {
		stdout, stderr := runExample(ctx, t, "docs/cli.md", dir, env, ex)
		var logs, out []string
		for _, l := range ex.want {
			if strings.HasPrefix(l, "time=") {
				logs = append(logs, l)
			} else {
				out = append(out, l)
			}
		}
		requireOutput(t, "docs/cli.md", example{line: ex.line, cmd: ex.cmd, want: out}, stdout)
		requireLogged(t, ex, logs, stderr)
	}
}

// requireLogged: each log line shown (slog's text form) is one of the JSON
// lines logged (notLogged).
func requireLogged(t *testing.T, ex example, shown []string, logged string) {
	t.Helper()
	missing, err := notLogged(shown, logged)
	require.NoError(t, err, "docs/cli.md:%d", ex.line)
	require.Empty(t, missing, "docs/cli.md:%d: $ %s\nthe log lines shown are not logged (as JSON on stderr):\n%s", ex.line, ex.cmd, logged)
}

// notLogged are the log lines of shown (slog's text form) that are none of
// the JSON lines logged, their keys and values the same but for the time
// and durations.
func notLogged(shown []string, logged string) ([]string, error) {
	var got []map[string]string
	for _, l := range strings.Split(strings.TrimSpace(logged), "\n") {
		var rec map[string]any
		dec := json.NewDecoder(strings.NewReader(l))
		dec.UseNumber()
		if dec.Decode(&rec) != nil {
			continue
		}
		m := map[string]string{}
		for k, v := range rec {
			m[k] = fmt.Sprint(v)
		}
		got = append(got, withoutClock(m))
	}
	var missing []string
	for _, l := range shown {
		want, err := logfmt(l)
		if err != nil {
			return nil, fmt.Errorf("log line %q: %w", l, err)
		}
		if !slices.ContainsFunc(got, func(g map[string]string) bool { return maps.Equal(g, withoutClock(want)) }) {
			missing = append(missing, l)
		}
	}
	return missing, nil
}

func withoutClock(m map[string]string) map[string]string {
	delete(m, "time")
	delete(m, "elapsed")
	return m
}

// logfmt reads a line of slog's text handler: key=value pairs, a value
// quoted (Go syntax) when it must be.
func logfmt(l string) (map[string]string, error) {
	m := map[string]string{}
	for l = strings.TrimSpace(l); l != ""; l = strings.TrimSpace(l) {
		key, rest, ok := strings.Cut(l, "=")
		if !ok {
			return nil, fmt.Errorf("no = after %q", l)
		}
		if strings.HasPrefix(rest, `"`) {
			end := 1
			for end < len(rest) && rest[end] != '"' {
				if rest[end] == '\\' {
					end++
				}
				end++
			}
			if end >= len(rest) {
				return nil, fmt.Errorf("unterminated quote in %q", rest)
			}
			v, err := strconv.Unquote(rest[:end+1])
			if err != nil {
				return nil, err
			}
			m[key], l = v, rest[end+1:]
			continue
		}
		v, next, _ := strings.Cut(rest, " ")
		m[key], l = v, next
	}
	return m, nil
}
