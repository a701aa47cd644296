// Package testtier splits the tests into two tiers: go test -short (make
// test-unit) runs only the pure tests; a test that needs a server or an
// external binary (PostgreSQL, PgBouncer, kube-apiserver, kubectl,
// promtool) calls Needs first, so that it skips under -short and, without
// -short, goes on to fail with what is missing and how to get it.
package testtier

import "testing"

// Needs skips t under -short; what names the server or binary it needs.
func Needs(t testing.TB, what string) {
	t.Helper()
	if testing.Short() {
		t.Skipf("needs %s: not under -short (make test runs it)", what)
	}
}
