package phrase

import "testing"

func TestCount(t *testing.T) {
	t.Parallel()
	for n, want := range map[int64]string{0: "0 items", 1: "1 item", 2: "2 items", -1: "-1 items", 1_000_000: "1000000 items"} {
		if got := Count(n, "item", "items"); got != want {
			t.Errorf("Count(%d) = %q, want %q", n, got, want)
		}
	}
}
