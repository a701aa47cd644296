package controllers

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	lua "github.com/yuin/gopher-lua"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/cli-utils/pkg/kstatus/status"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
	"github.com/runledger/runledger/internal/schedule"
)

// TestScheduleHealth: what Argo CD (the health script, as its Lua VM runs
// it) and kstatus (Flux, cli-utils) make of the statuses the schedule
// controller writes (built by its own code).
func TestScheduleHealth(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(envtestutil.RepoRoot(), "config", "argocd")
	script, err := os.ReadFile(filepath.Join(dir, "processing.runledger.dev", "ProcessingSchedule", "health.lua"))
	require.NoError(t, err)
	patch, err := os.ReadFile(filepath.Join(dir, "argocd-cm-patch.yaml"))
	require.NoError(t, err)
	var cm struct {
		Data map[string]string `json:"data"`
	}
	require.NoError(t, yaml.Unmarshal(patch, &cm))
	require.Equal(t, string(script), cm.Data["resource.customizations.health.processing.runledger.dev_ProcessingSchedule"])

	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	base := func(mutate func(*v1alpha1.ProcessingSchedule)) *v1alpha1.ProcessingSchedule {
		s := newSchedule("ns", "invoices", nil)
		s.Generation = 1
		s.CreationTimestamp = metav1.Time{Time: now.Add(-time.Hour)}
		if mutate != nil {
			mutate(s)
		}
		return s
	}
	pass := func(s *v1alpha1.ProcessingSchedule, edit func(*schedScope)) *v1alpha1.ProcessingSchedule {
		sc := &schedScope{sched: s, now: now}
		if p, err := schedule.Parse(s.Name, &s.Spec); err == nil {
			sc.parsed = p
			sc.decision = p.Decide(schedule.Input{Since: s.CreationTimestamp.Time, Now: now, Suspended: s.Spec.Suspend})
		} else {
			sc.stalled = &problem{reason: ReasonInvalidTimeZone, message: err.Error()}
		}
		if edit != nil {
			edit(sc)
		}
		s.Status = buildScheduleStatus(sc)
		return s
	}
	for _, tc := range []struct {
		name    string
		sched   *v1alpha1.ProcessingSchedule
		argo    string
		kstatus status.Status
	}{
		{"new", base(nil), "Progressing", status.InProgressStatus},
		{"scheduled", pass(base(nil), nil), "Healthy", status.CurrentStatus},
		{"suspended", pass(base(func(s *v1alpha1.ProcessingSchedule) { s.Spec.Suspend = true }), nil), "Suspended", status.CurrentStatus},
		{"stalled", pass(base(func(s *v1alpha1.ProcessingSchedule) { s.Spec.TimeZone = "Mars/Olympus" }), nil), "Degraded", status.FailedStatus},
		{"catching up", pass(base(nil), func(sc *schedScope) { sc.decision.More = true }), "Progressing", status.InProgressStatus},
		{"reconcile error", pass(base(nil), func(sc *schedScope) { sc.stepErr = errors.New("create run: forbidden") }), "Progressing", status.InProgressStatus},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.sched)
			require.NoError(t, err)
			var obj map[string]any
			require.NoError(t, json.Unmarshal(b, &obj))
			L := lua.NewState()
			defer L.Close()
			L.SetGlobal("obj", toLua(L, obj))
			require.NoError(t, L.DoString(string(script)))
			hs, ok := L.Get(-1).(*lua.LTable)
			require.True(t, ok)
			require.Equal(t, tc.argo, hs.RawGetString("status").String(), hs.RawGetString("message").String())
			u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(tc.sched)
			require.NoError(t, err)
			if tc.name == "new" {
				// As the CRD's default writes it on create.
				u["status"] = map[string]any{"observedGeneration": int64(0)}
			}
			res, err := status.Compute(&unstructured.Unstructured{Object: u})
			require.NoError(t, err)
			require.Equal(t, tc.kstatus, res.Status, res.Message)
		})
	}
}
