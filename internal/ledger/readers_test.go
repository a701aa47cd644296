package ledger_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/internal/ledger"
)

// TestResultReaders: the statements' answers are checked, not trusted. An
// answer about a key or position that was not sent is an error with a clear
// message, and nothing is attributed from it.
func TestResultReaders(t *testing.T) {
	t.Parallel()
	pool := newPool(t)
	ctx := context.Background()
	chunk := []ledger.Item{{Key: ledger.Key{Entity: "a", Occurrence: "1"}}, {Key: ledger.Key{Entity: "a", Occurrence: "2"}}, {Key: ledger.Key{Entity: "b", Occurrence: "1"}}}

	t.Run("skipped positions", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name    string
			sql     string
			want    map[int]string // index in chunk -> holder's run uid (and " changed")
			wantErr string
		}{
			{name: "none skipped", sql: `SELECT 'u'::text, ARRAY[1::bigint], NULL::bigint[] WHERE false`, want: map[int]string{}},
			{name: "first and last", sql: `VALUES ('run-a', ARRAY[1::bigint], NULL::bigint[]), ('run-b', ARRAY[3::bigint], NULL)`, want: map[int]string{0: "run-a", 2: "run-b"}},
			{name: "two of one holder", sql: `VALUES ('run-a', ARRAY[3::bigint, 1], NULL::bigint[])`, want: map[int]string{0: "run-a", 2: "run-a"}},
			{name: "one payload changed", sql: `VALUES ('run-a', ARRAY[3::bigint, 1], ARRAY[3::bigint])`, want: map[int]string{0: "run-a", 2: "run-a changed"}},
			{name: "changed position not held", sql: `VALUES ('run-a', ARRAY[1::bigint], ARRAY[2::bigint])`, wantErr: "reading skipped keys: position 2 has a changed payload but is not among its holder's"},
			{name: "position 0", sql: `SELECT 'u'::text, ARRAY[0::bigint], NULL::bigint[]`, wantErr: "reading skipped keys: position 0 is outside the chunk of 3"},
			{name: "past the end", sql: `SELECT 'u'::text, ARRAY[2::bigint, 4], NULL::bigint[]`, wantErr: "reading skipped keys: position 4 is outside the chunk of 3"},
			{name: "NULL holder", sql: `SELECT NULL::text, ARRAY[2::bigint], NULL::bigint[]`, wantErr: "NULL"},
			{name: "empty holder", sql: `SELECT ''::text, ARRAY[2::bigint], NULL::bigint[]`, wantErr: "has no run uid"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rows, err := pool.Query(ctx, tc.sql)
				require.NoError(t, err)
				got := map[int]string{}
				err = ledger.ForEachSkipped(rows, len(chunk), func(i int, holder string, changed bool) {
					if got[i] = holder; changed {
						got[i] += " changed"
					}
				})
				if tc.wantErr != "" {
					require.ErrorContains(t, err, tc.wantErr)
					require.ErrorContains(t, err, "reading skipped keys: ", "the error must say what was being read")
					require.Empty(t, got, "nothing may be attributed from a bad answer")
					return
				}
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
			})
		}
	})

	t.Run("keys", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			name    string
			sql     string
			want    []int
			wantErr string
		}{
			{name: "keys sent", sql: `VALUES ('b', '1'), ('a', '1')`, want: []int{2, 0}},
			{name: "a key not sent", sql: `VALUES ('a', '3')`, wantErr: "the server returned a/3, which was not sent"},
			{name: "NULL occurrence", sql: `SELECT 'a', NULL::text`, wantErr: "want a non-NULL entity and occurrence first"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				rows, err := pool.Query(ctx, tc.sql)
				require.NoError(t, err)
				var got []int
				err = ledger.ForEachKey(rows, chunk, func(i int, _ [][]byte) { got = append(got, i) })
				if tc.wantErr != "" {
					require.ErrorContains(t, err, tc.wantErr)
					require.Empty(t, got, "nothing may be attributed from a bad answer")
					return
				}
				require.NoError(t, err)
				require.Equal(t, tc.want, got)
			})
		}
	})
}
