package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/cli/exitcode"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/schedule"
)

// runSchedule runs `runledger schedule ARGS` against env in namespace ns.
func runSchedule(t *testing.T, env *envtestutil.Env, ns string, args ...string) (string, error) {
	t.Helper()
	cmd := newScheduleCommandWith(func(*scheduleOptions) (client.Client, string, error) { return env.Client, ns, nil })
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// TestScheduleTriggerAndBackfill: trigger and backfill create the
// occurrences' runs as the controller names them, print what they created,
// and find (not duplicate) the runs that exist.
func TestScheduleTriggerAndBackfill(t *testing.T) {
	t.Parallel()
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	sched := &v1alpha1.ProcessingSchedule{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "invoices"},
		Spec: v1alpha1.ProcessingScheduleSpec{
			Schedule: "@monthly", TimeZone: "Europe/Paris",
			Occurrence: &v1alpha1.OccurrenceSpec{Format: "2006-01", Shift: &v1alpha1.OccurrenceShift{Months: -1}},
			RunTemplate: v1alpha1.RunTemplate{Spec: v1alpha1.ProcessingRunSpec{
				Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: "db", Key: "dsn"}},
				Batch:    v1alpha1.BatchSpec{Items: []v1alpha1.Item{{Entity: "acct-1", Occurrence: v1alpha1.OccurrencePlaceholder}}},
			}},
		},
	}
	require.NoError(t, env.Client.Create(ctx, sched))

	out, err := runSchedule(t, env, ns, "trigger", "invoices", "--occurrence", "2026-03")
	require.NoError(t, err)
	require.Equal(t, "created processingrun/invoices-2026-03 (occurrence 2026-03)\n", out)

	out, err = runSchedule(t, env, ns, "backfill", "invoices", "--from", "2026-02", "--to", "2026-05")
	require.NoError(t, err)
	require.Equal(t, strings.Join([]string{
		"created processingrun/invoices-2026-01 (occurrence 2026-01)",
		"created processingrun/invoices-2026-02 (occurrence 2026-02)",
		"exists processingrun/invoices-2026-03 (occurrence 2026-03)",
		"created processingrun/invoices-2026-04 (occurrence 2026-04)",
	}, "\n")+"\n", out, "ticks of 1 Feb to 1 May bill January to April; March was triggered")

	run := &v1alpha1.ProcessingRun{}
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "invoices-2026-02"}, run))
	require.Equal(t, "2026-02", run.Spec.Occurrence)
	require.Equal(t, "invoices", run.Labels[v1alpha1.LabelSchedule])
	require.Equal(t, schedule.CreatedByBackfill, run.Annotations[v1alpha1.AnnotationCreatedBy])
	require.Equal(t, "2026-02-28T23:00:00Z", run.Annotations[v1alpha1.AnnotationScheduledTime], "1 March 00:00 in Paris")
	require.True(t, schedule.IsRunOf(run, sched, "2026-02"))

	// Without --occurrence: the current minute's (last month, here).
	out, err = runSchedule(t, env, ns, "trigger", "invoices")
	require.NoError(t, err)
	p, err := schedule.Parse(sched.Name, &sched.Spec)
	require.NoError(t, err)
	want := p.OccurrenceOf(p.WallOf(time.Now()))
	require.Contains(t, out, "(occurrence "+want+")")

	// Bad input: nothing is created.
	var before v1alpha1.ProcessingRunList
	require.NoError(t, env.Client.List(ctx, &before, client.InNamespace(ns)))
	for _, args := range [][]string{
		{"backfill", "invoices", "--from", "2026-06", "--to", "2026-05"},
		{"backfill", "invoices", "--from", "June", "--to", "2026-05"},
		{"backfill", "invoices", "--from", "1900-01", "--to", "2026-05"}, // more than 1000
		{"trigger", "invoices", "--occurrence", " "},
		{"trigger", "nosuch"},
	} {
		_, err := runSchedule(t, env, ns, args...)
		require.Error(t, err, "%v", args)
		require.Equal(t, v1alpha1.ExitBadInput, exitcode.OrElse(err, 1), "%v: %v", args, err)
	}
	var after v1alpha1.ProcessingRunList
	require.NoError(t, env.Client.List(ctx, &after, client.InNamespace(ns)))
	require.Len(t, after.Items, len(before.Items))

	// A name taken by a run that is not the schedule's: refused, not claimed.
	foreign := schedule.NewRun(sched, "2026-07", time.Time{}, "test")
	foreign.OwnerReferences = nil
	require.NoError(t, env.Client.Create(ctx, foreign))
	_, err = runSchedule(t, env, ns, "trigger", "invoices", "--occurrence", "2026-07")
	require.ErrorContains(t, err, "is taken by a ProcessingRun that is not this schedule's")
}
