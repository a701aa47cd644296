package cli

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/pprof"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// pprofHandlers are net/http/pprof's endpoints, for the metrics listener
// (whose authentication and authorization wrap every handler).
func pprofHandlers() map[string]http.Handler {
	return map[string]http.Handler{
		"/debug/pprof/":        http.HandlerFunc(pprof.Index),
		"/debug/pprof/cmdline": http.HandlerFunc(pprof.Cmdline),
		"/debug/pprof/profile": http.HandlerFunc(pprof.Profile),
		"/debug/pprof/symbol":  http.HandlerFunc(pprof.Symbol),
		"/debug/pprof/trace":   http.HandlerFunc(pprof.Trace),
	}
}

// addReadyzChecks: /readyz answers ok once the manager's informers have
// synced ("informers") and, on the elected leader, once its controllers run
// ("leader"). A standby with synced informers is ready: it serves metrics and
// takes over at once; were it unready, a rolling update of a one-replica
// Deployment would wait forever for a pod that cannot lead yet.
func addReadyzChecks(mgr ctrl.Manager) error {
	synced := func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("informers not synced yet")
		}
		return nil
	}
	running := make(chan struct{})
	// A Runnable without NeedLeaderElection runs with the controllers, once
	// elected.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		close(running)
		<-ctx.Done()
		return nil
	})); err != nil {
		return fmt.Errorf("add leader runnable: %w", err)
	}
	leader := func(*http.Request) error {
		select {
		case <-mgr.Elected():
		default:
			return nil // a standby (or not yet elected)
		}
		select {
		case <-running:
			return nil
		default:
			return errors.New("elected leader, controllers not started yet")
		}
	}
	if err := mgr.AddReadyzCheck("informers", synced); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	if err := mgr.AddReadyzCheck("leader", leader); err != nil {
		return fmt.Errorf("add readiness check: %w", err)
	}
	return nil
}
