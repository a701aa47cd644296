package clitest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// startExample builds examples/processor once per test and starts it with
// args, returning once it listens on addr.
func startExample(t *testing.T, bin, addr string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, append([]string{"-listen", addr}, args...)...)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	require.Eventually(t, func() bool {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil
	}, 10*time.Second, 20*time.Millisecond)
}

// TestRunWithExampleProcessor: runledger run --processor-url with the
// example processor, which charges a payment service (the example's own,
// recording calls by Idempotency-Key): every key commits once, the service
// saw one key per completed item, and a rerun sends nothing. A run without
// spec.effect.processor refuses --processor-url (exit 2, nothing committed).
func TestRunWithExampleProcessor(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	bin := filepath.Join(t.TempDir(), "processor")
	build := exec.Command("go", "build", "-o", bin, "../../examples/processor")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	payments, proc := freeAddr(t), freeAddr(t)
	startExample(t, bin, payments, "-serve-payments")
	startExample(t, bin, proc, "-payments", "http://"+payments)
	stats := func() (calls, keys int) {
		resp, err := http.Get("http://" + payments + "/stats")
		require.NoError(t, err)
		defer func() { _ = resp.Body.Close() }()
		var s struct{ Calls, Keys int }
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
		return s.Calls, s.Keys
	}

	var keys [][2]string
	for i := range 40 {
		keys = append(keys, [2]string{fmt.Sprintf("acct-%d", i), "2026-01"})
	}
	run := writeFile(t, "run.yaml", manifest("charge", inlineItems(keys...), "workers: 3", "chunkSize: 7",
		"effect:\n    processor: {image: example-processor, maxItemsPerCall: 5}"))
	r := runCLI(t, "", "run", "-f", run, "--dsn", d.dsn, "--output", "json", "--processor-url", "http://"+proc+"/process")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 40, Completed: 40}, r.summary(t).counts())
	require.EqualValues(t, 40, d.committed(t))
	calls, distinct := stats()
	require.Equal(t, 40, distinct, "the service saw one key per completed item")
	require.GreaterOrEqual(t, calls, distinct)

	r = runCLI(t, "", "run", "-f", run, "--dsn", d.dsn, "--output", "json", "--processor-url", "http://"+proc+"/process")
	require.Equal(t, 0, r.code, "stderr:\n%s", r.stderr)
	require.Equal(t, counts{Total: 40, Completed: 40}, r.summary(t).counts())
	again, _ := stats()
	require.Equal(t, calls, again, "a rerun sends nothing")

	plain := writeFile(t, "plain.yaml", manifest("plain", inlineItems(keys...)))
	r = runCLI(t, "", "run", "-f", plain, "--dsn", d.dsn, "--output", "json", "--processor-url", "http://"+proc+"/process")
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "--processor-url is given but the run has no spec.effect.processor")
	require.EqualValues(t, 40, d.committed(t), "nothing more committed")

	// Not a URL the worker calls: refused without echoing it (a token).
	r = runCLI(t, "", "run", "-f", run, "--dsn", d.dsn, "--processor-url", "ftp://"+proc+"/process?token=tok-s3cret")
	require.Equal(t, 2, r.code, "stderr:\n%s", r.stderr)
	require.Contains(t, r.stderr, "--processor-url is not an http:// or https:// URL")
	require.NotContains(t, r.stdout+r.stderr, "s3cret")
	require.EqualValues(t, 40, d.committed(t), "nothing more committed")
}
