package pgtest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/pgtest"
)

// TestPoolKeepsTheDSNsBound: a test that says pool_max_conns=1 gets one
// session for every statement (the sandbox tests rely on it; a pool of 16
// once made them pass on another session, or fail by chance).
func TestPoolKeepsTheDSNsBound(t *testing.T) {
	t.Parallel()
	dsn := pgtest.NewDatabase(t)
	require.EqualValues(t, 16, pgtest.Pool(t, dsn).Config().MaxConns)
	require.EqualValues(t, 1, pgtest.Pool(t, dsn+" pool_max_conns=1").Config().MaxConns)
}
