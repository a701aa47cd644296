package ledger

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestForeignWrite(t *testing.T) {
	t.Parallel()
	src := ForeignWriteError{Table: "public.src", Deleted: 3}
	log := ForeignWriteError{Table: "public.audit", Inserted: 1}
	for _, tt := range []struct {
		name          string
		before, after map[int64]ForeignWriteError
		want          *ForeignWriteError
	}{
		{"nothing written", nil, nil, nil},
		{"written before only, unchanged", map[int64]ForeignWriteError{1: src}, map[int64]ForeignWriteError{1: src}, nil},
		{"a new table", nil, map[int64]ForeignWriteError{1: src}, &src},
		{"more rows of a table written before", map[int64]ForeignWriteError{1: src},
			map[int64]ForeignWriteError{1: {Table: "public.src", Deleted: 5, Updated: 1}}, &ForeignWriteError{Table: "public.src", Deleted: 2, Updated: 1}},
		{"the first by name", nil, map[int64]ForeignWriteError{1: src, 2: log}, &log},
	} {
		require.Equal(t, tt.want, foreignWrite(tt.before, tt.after), tt.name)
	}
}
