//go:build e2e

package e2e

// The nemesis' schedule, without a cluster (`go test -tags e2e -run
// TestSoakSchedule`): a soak without failovers draws its faults as it did
// before they existed (kept seeds replay their schedule), one with them
// injects every kind, and the CI seed draws both failovers first.

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// planned is the first n faults of a plan, as "gap:kind".
func planned(seed uint64, failovers bool, n int) []string {
	p := newFaultPlan(seed, soakConfig{Failovers: failovers}.faultWeights())
	var out []string
	for range n {
		gap, kind := p.next()
		out = append(out, fmt.Sprintf("%d:%s", gap.Milliseconds(), kind))
	}
	return out
}

func TestSoakSchedule(t *testing.T) {
	t.Run("without failovers as before them", func(t *testing.T) {
		// Drawn by the nemesis before failovers were added (b0eb84b).
		require.Equal(t, []string{"2744:processor-slow", "3706:node-partition", "4021:leader-kill", "2763:pod-delete",
			"4296:node-power-off", "3744:pg-restart-immediate", "2574:pg-restart-fast", "3695:backend-terminate",
			"3031:lock-stall", "2967:processor-crash", "2326:pod-delete", "3393:processor-slow", "2369:pod-delete",
			"3483:backend-terminate"}, planned(20261202, false, 14))
		require.Equal(t, []string{"5183:pod-delete", "5806:processor-slow", "2266:pg-restart-fast", "3357:processor-crash",
			"5397:pg-restart-immediate", "4936:node-power-off", "3208:lock-stall", "3162:leader-kill", "4353:backend-terminate",
			"2390:node-partition", "5274:pod-delete", "4967:leader-kill", "4749:leader-kill", "5864:processor-crash"},
			planned(899605414, false, 14), "kept-899605414's schedule")
	})
	t.Run("with failovers every kind first", func(t *testing.T) {
		weights := soakConfig{Failovers: true}.faultWeights()
		require.Contains(t, weights, "pg-failover")
		require.Contains(t, weights, "pg-failover-async")
		for _, seed := range []uint64{ciSeed, 1, 899605414} {
			var kinds []string
			for _, f := range planned(seed, true, len(weights)) {
				kinds = append(kinds, f[slices.Index([]byte(f), ':')+1:])
			}
			slices.Sort(kinds)
			require.Equal(t, slices.Sorted(maps.Keys(weights)), kinds, "seed %d", seed)
		}
		require.NotContains(t, soakConfig{}.faultWeights(), "pg-failover")
	})
	t.Run("the CI seed draws both failovers first", func(t *testing.T) {
		// Before the first node fault (a minute or more each).
		var c soakConfig
		for _, s := range ciSoaks {
			if s.Failovers {
				c = s
			}
		}
		require.True(t, c.Failovers, "a CI soak has failovers")
		seen := map[string]bool{}
		for _, f := range planned(c.Seed, true, 12) {
			kind := f[slices.Index([]byte(f), ':')+1:]
			if kind == "node-power-off" || kind == "node-partition" {
				break
			}
			seen[kind] = true
		}
		require.True(t, seen["pg-failover"] && seen["pg-failover-async"], "seed %d: %v", c.Seed, planned(c.Seed, true, 12))
		d, err := time.ParseDuration(ciDuration)
		require.NoError(t, err)
		require.LessOrEqual(t, d, 2*time.Minute)
	})
}
