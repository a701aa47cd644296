//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// podMonitor watches the worker pods of a namespace for a whole test and
// records every moment a shard had more than one live pod (a pod that
// exists and has not Succeeded or Failed: pending, running, or terminating).
type podMonitor struct {
	t      *testing.T
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	pods  map[string]*corev1.Pod // by name: the pods that exist now
	seen  map[string][]string    // shard key -> every pod name it ever had
	found []string               // violations
	// lost: nodes the test powered off or cut off; their pods do not count
	// as live (the controller replaces them without waiting for them).
	lost map[string]bool
	// stale: pods that were on a lost node when it came back (nodeBack);
	// they do not count as live either, the node's new pods do.
	stale map[string]bool
}

// nodeLost tells the monitor that the test takes a node away: its pods
// may overlap with their replacements from now on.
func (m *podMonitor) nodeLost(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.lost[node] = true
}

// nodeBack tells the monitor that a lost node is back: the pods it had
// still may overlap with their replacements, the pods it gets from now on
// may not.
func (m *podMonitor) nodeBack(node string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for name, p := range m.pods {
		if p.Spec.NodeName == node {
			m.stale[name] = true
		}
	}
	delete(m.lost, node)
}

func startPodMonitor(parent context.Context, t *testing.T, cs kubernetes.Interface, ns string) *podMonitor {
	ctx, cancel := context.WithCancel(parent)
	m := &podMonitor{t: t, cancel: cancel, done: make(chan struct{}), pods: map[string]*corev1.Pod{}, seen: map[string][]string{}, lost: map[string]bool{}, stale: map[string]bool{}}
	ready := make(chan struct{})
	go func() {
		defer close(m.done)
		m.loop(ctx, cs, ns, ready)
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatalf("pod monitor of %s did not start", ns)
	}
	return m
}

// loop lists and then watches; when the watch ends (timeout, a dropped
// connection) it lists again and goes on from there.
func (m *podMonitor) loop(ctx context.Context, cs kubernetes.Interface, ns string, ready chan struct{}) {
	sel := v1alpha1.LabelRunUID // worker pods only
	first := true
	for ctx.Err() == nil {
		list, err := cs.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			if ctx.Err() == nil {
				m.t.Logf("pod monitor: list: %v (retrying)", err)
				time.Sleep(time.Second)
			}
			continue
		}
		m.mu.Lock()
		m.pods = map[string]*corev1.Pod{}
		for i := range list.Items {
			m.apply(watch.Added, &list.Items[i])
		}
		m.mu.Unlock()
		if first {
			close(ready)
			first = false
		}
		w, err := cs.CoreV1().Pods(ns).Watch(ctx, metav1.ListOptions{LabelSelector: sel, ResourceVersion: list.ResourceVersion})
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			pod, ok := ev.Object.(*corev1.Pod)
			if !ok {
				break // an error (e.g. 410 Gone): list again
			}
			m.mu.Lock()
			m.apply(ev.Type, pod)
			m.mu.Unlock()
		}
		w.Stop()
	}
}

func shardKey(p *corev1.Pod) string {
	return p.Labels[v1alpha1.LabelRun] + "/shard-" + p.Labels[v1alpha1.LabelShard] + " (run uid " + p.Labels[v1alpha1.LabelRunUID] + ")"
}

func live(p *corev1.Pod) bool {
	return p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// apply updates the state with one event and checks the invariant; m.mu is held.
func (m *podMonitor) apply(t watch.EventType, pod *corev1.Pod) {
	key := shardKey(pod)
	if _, ok := m.pods[pod.Name]; !ok && t != watch.Deleted {
		names := m.seen[key]
		if len(names) == 0 || names[len(names)-1] != pod.Name {
			m.seen[key] = append(names, pod.Name)
		}
	}
	switch t {
	case watch.Deleted:
		delete(m.pods, pod.Name)
	default:
		m.pods[pod.Name] = pod.DeepCopy()
	}
	var liveNames []string
	for _, p := range m.pods {
		if shardKey(p) == key && live(p) && !m.lost[p.Spec.NodeName] && !m.stale[p.Name] {
			liveNames = append(liveNames, fmt.Sprintf("%s(%s)", p.Name, p.Status.Phase))
		}
	}
	if len(liveNames) > 1 {
		sort.Strings(liveNames)
		m.found = append(m.found, fmt.Sprintf("%s %s: live pods %v", time.Now().Format(time.RFC3339Nano), key, liveNames))
	}
}

func (m *podMonitor) stop() {
	m.cancel()
	<-m.done
}

func (m *podMonitor) violations() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.found...)
}

// podsOfShard is every pod a shard of the named run ever had, in order of
// appearance.
func (m *podMonitor) podsOfShard(run *v1alpha1.ProcessingRun, shard int) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	key := fmt.Sprintf("%s/shard-%d (run uid %s)", run.Name, shard, run.UID)
	return append([]string(nil), m.seen[key]...)
}

// countMonitor polls the runs of a namespace for a whole test and records
// every time a run's completed, alreadyHandled or total went down: a run's
// counts never go down (a restarted shard catches up from its floor), and
// only a finished run's failed may (a retry succeeded on items an earlier
// attempt failed).
type countMonitor struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu    sync.Mutex
	last  map[string]v1alpha1.ProcessingRunStatus // by run UID
	found []string
}

func startCountMonitor(parent context.Context, c client.Client, ns string) *countMonitor {
	ctx, cancel := context.WithCancel(parent)
	m := &countMonitor{cancel: cancel, done: make(chan struct{}), last: map[string]v1alpha1.ProcessingRunStatus{}}
	go func() {
		defer close(m.done)
		for ctx.Err() == nil {
			var runs v1alpha1.ProcessingRunList
			if err := c.List(ctx, &runs, client.InNamespace(ns)); err == nil {
				m.observe(runs.Items)
			}
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return m
}

func (m *countMonitor) observe(runs []v1alpha1.ProcessingRun) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range runs {
		uid := string(r.UID)
		prev, ok := m.last[uid]
		cur := r.Status
		if ok {
			for _, f := range []struct {
				name     string
				was, now int64
			}{
				{"total", prev.Total, cur.Total},
				{"completed", prev.Completed, cur.Completed},
				{"alreadyHandled", prev.AlreadyHandled, cur.AlreadyHandled},
			} {
				if f.now < f.was {
					m.found = append(m.found, fmt.Sprintf("%s %s: %s went down from %d to %d (phase %s -> %s)",
						time.Now().Format(time.RFC3339Nano), r.Name, f.name, f.was, f.now, prev.Phase, cur.Phase))
				}
			}
		}
		m.last[uid] = *cur.DeepCopy()
	}
}

func (m *countMonitor) stop() {
	m.cancel()
	<-m.done
}

func (m *countMonitor) violations() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.found...)
}
