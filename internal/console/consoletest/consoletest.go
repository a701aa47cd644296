// Package consoletest drives runledger console in a real browser for the
// tests: a headless Chromium (Debian's) through chromedp, a console started
// in the test's process as the command starts it, and the steps the tests
// take on its pages. The console's own tests (envtest) and the e2e tier's
// (a real cluster) share it.
package consoletest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/runledger/runledger/internal/cli"
	"github.com/runledger/runledger/internal/testtier"
)

// EnvScreenshots names a directory the browser tests save their screenshots
// into (docs/images/console for the docs); a temporary one without it.
const EnvScreenshots = "RUNLEDGER_CONSOLE_SCREENSHOTS"

// StepTimeout bounds each step in the browser.
const StepTimeout = 30 * time.Second

// Browser is a headless Chromium (Debian's) for at most timeout, closed
// when the test ends.
func Browser(t *testing.T, timeout time.Duration) context.Context {
	t.Helper()
	testtier.Needs(t, "Chromium (apt-get install -y chromium)")
	path := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatal("needs Chromium: apt-get install -y chromium (Debian's; .ci/run installs it)")
	}
	// Its own temporary files (the singleton socket's directory, left when
	// the browser is killed) go to the test's temporary directory, not /tmp.
	tmp := t.TempDir()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.WindowSize(1280, 860),
		chromedp.Env("TMPDIR="+tmp))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	ctx, cancelTimeout := context.WithTimeout(ctx, timeout)
	t.Cleanup(cancelTimeout)
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "starting %s", path)
	return ctx
}

// Start runs runledger console with args (after a free loopback address)
// in the test's process until the test ends, and returns its URL. At the
// end it checks that secret (a connection string) never reached its log.
func Start(t *testing.T, secret string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	root := cli.NewRootCommand()
	root.SetArgs(append([]string{"console", "--address", "127.0.0.1:0"}, args...))
	out, w := io.Pipe()
	root.SetOut(w)
	var logs strings.Builder
	root.SetErr(&logs)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx); _ = w.Close() }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NotContains(t, logs.String(), secret, "the DSN is not logged")
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err, "the console's first line")
	go func() { _, _ = io.Copy(io.Discard, out) }()
	fields := strings.Fields(line)
	require.GreaterOrEqual(t, len(fields), 3, line)
	return strings.TrimSuffix(fields[2], "/")
}

// Do takes steps in the browser, each within StepTimeout.
func Do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, StepTimeout)
	defer cancel()
	require.NoError(t, chromedp.Do(ctx, steps...), "on %s", Location(ctx))
}

// Get is what action a returns, within StepTimeout.
func Get[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, StepTimeout)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	require.NoError(t, err, "on %s", Location(ctx))
	return v
}

// Location is the page's URL and heading, for a failure's message.
func Location(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + " (" + (document.querySelector("h1") || {}).textContent + "): " + document.body.innerText.slice(0, 400)`))
	if err != nil {
		return err.Error()
	}
	return s
}

// Text is the text of the element sel selects, trimmed, once it is there,
// within StepTimeout. It is read in one step in the page: a node the
// driver looked up first may be gone when its text is asked for (a late
// DOM event of the page before a navigation: "No node with given id
// found"), where the page's own lookup finds the element it shows.
func Text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	read := chromedp.Evaluate[*string](fmt.Sprintf(`(e => e === null ? null : e.innerText)(document.querySelector(%q))`, sel))
	var text *string
	var last error
	err := wait.PollUntilContextTimeout(ctx, 50*time.Millisecond, StepTimeout, true, func(ctx context.Context) (bool, error) {
		text, last = chromedp.Run(ctx, read)
		return last == nil && text != nil, nil
	})
	require.NoError(t, err, "no %s on %s (%v)", sel, Location(ctx), last)
	return strings.TrimSpace(*text)
}

// Count is how many elements sel selects.
func Count(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	return Get(t, ctx, chromedp.Evaluate[int](fmt.Sprintf("document.querySelectorAll(%q).length", sel)))
}

// Shot saves a screenshot of the whole page as dir/name.
func Shot(t *testing.T, ctx context.Context, dir, name string) {
	t.Helper()
	b := Get(t, ctx, chromedp.FullScreenshot(100))
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
}

// Live waits, up to timeout, for the JavaScript condition cond to hold on
// the open page without a reload (MarkLoaded marked it).
func Live(t *testing.T, ctx context.Context, timeout time.Duration, cond, why string) {
	t.Helper()
	_, err := chromedp.Run(ctx, chromedp.Poll[bool](cond+` && window.notReloaded === true`, chromedp.WithPollingTimeout(timeout)))
	require.NoError(t, err, "%s, without a reload (on %s)", why, Location(ctx))
}

// MarkLoaded marks the open page, a mark a reload would lose (Live checks
// it).
func MarkLoaded() chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](`window.notReloaded = true`)
}
