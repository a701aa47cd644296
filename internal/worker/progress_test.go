package worker

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/runledger/runledger/api/v1alpha1"
)

func TestProgressLine(t *testing.T) {
	t.Parallel()
	p := NewProgressPrinter(&bytes.Buffer{}, false, 2, time.Second)
	p.Update(Report{Shard: 0, ItemCounts: v1alpha1.ItemCounts{Total: 600000, Completed: 100000, AlreadyHandled: 20000, Failed: 3}, TotalKnown: true})
	p.Update(Report{Shard: 1, ItemCounts: v1alpha1.ItemCounts{Total: 400000, Completed: 80000}, TotalKnown: true, Done: false})
	require.Equal(t, "200,003/1,000,000 items (20%), 20,000 items/s, ETA 40s, completed 180,000, already handled 20,000, failed 3, shards done 0/2",
		p.line(10*time.Second))

	// A shard that has not reported yet: no total, no ETA.
	p = NewProgressPrinter(&bytes.Buffer{}, false, 2, time.Second)
	p.Update(Report{Shard: 0, ItemCounts: v1alpha1.ItemCounts{Total: 10, Completed: 10}, TotalKnown: true, Done: true})
	require.Equal(t, "10 items, 5 items/s, completed 10, already handled 0, failed 0, shards done 1/2", p.line(2*time.Second))

	// A proven shard waiting for its standby says so: nothing else moves.
	p.Update(Report{Shard: 1, ItemCounts: v1alpha1.ItemCounts{Total: 5, Completed: 5}, TotalKnown: true, WaitingForStandby: true})
	require.Equal(t, "15/15 items (100%), 5 items/s, completed 15, already handled 0, failed 0, shards done 1/2, 1 waiting for a standby of the ledger to have the shard's proof",
		p.line(3*time.Second))
}

func TestProgressPrinterOutput(t *testing.T) {
	t.Parallel()
	var logOut bytes.Buffer
	p := NewProgressPrinter(&logOut, false, 1, 10*time.Millisecond)
	p.Update(Report{ItemCounts: v1alpha1.ItemCounts{Total: 4, Completed: 2}, TotalKnown: true})
	p.Start(t.Context())
	time.Sleep(50 * time.Millisecond)
	p.Stop()
	require.Contains(t, logOut.String(), "progress: 2/4 items (50%)", "log lines when not a terminal")

	var tty bytes.Buffer
	p = NewProgressPrinter(&tty, true, 1, time.Hour)
	p.Update(Report{ItemCounts: v1alpha1.ItemCounts{Total: 4, Completed: 2}, TotalKnown: true})
	p.Start(t.Context())
	time.Sleep(300 * time.Millisecond)
	p.Stop()
	require.Contains(t, tty.String(), "\r\x1b[K2/4 items (50%)", "a line redrawn in place on a terminal")
	require.True(t, bytes.HasSuffix(tty.Bytes(), []byte("\r\x1b[K")), "and cleared at the end")
}

func TestThousands(t *testing.T) {
	t.Parallel()
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1234: "-1,234"} {
		require.Equal(t, want, thousands(in))
	}
}

func TestShardMessage(t *testing.T) {
	t.Parallel()
	f := []Failure{{Entity: "a", Occurrence: "b", Error: "boom"}}
	require.Equal(t, "done", ShardMessage(Report{Done: true, ItemCounts: v1alpha1.ItemCounts{Total: 1, Completed: 1}}, 0))
	require.Equal(t, "1 item failed; first: a/b: boom", ShardMessage(Report{Done: true, ItemCounts: v1alpha1.ItemCounts{Total: 1, Failed: 1}, Failures: f}, 5))
	require.Equal(t, "stopped: 3 items failed, more than maxFailedItems (2); first: a/b: boom",
		ShardMessage(Report{TooManyFailures: true, ItemCounts: v1alpha1.ItemCounts{Total: 9, Failed: 3}, Failures: f}, 2))
	require.Equal(t, "interrupted after 4 of 9 items", ShardMessage(Report{Interrupted: true, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 4}}, 0))
	require.True(t, strings.HasPrefix(ShardMessage(Report{WaitingForStandby: true, ItemCounts: v1alpha1.ItemCounts{Total: 9, Completed: 9}}, 0), v1alpha1.StandbyWaitMessage+": "))
}
