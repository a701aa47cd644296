package controllers

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// expectationTTL bounds how long a shard waits for the cache to show a pod
// the controller created (the Job controller uses the same 5 minutes): after
// that the cache is considered wrong and a live read decides.
const expectationTTL = 5 * time.Minute

// expectations remember, per run and shard, the pod this controller created
// and the cache does not show yet. Until the cache shows it, nothing is
// decided for that shard: a stale cache never makes the controller think a
// shard has no pod. (Pod names are deterministic too, so even a forgotten
// expectation, e.g. after a leader change, can at worst retry a create that
// fails with AlreadyExists.)
type expectations struct {
	mu  sync.Mutex
	m   map[types.NamespacedName]runExpectations
	now func() time.Time
}

// runExpectations are the pending creations of one run (its UID: a run
// created again under the same name starts afresh).
type runExpectations struct {
	uid    types.UID
	shards map[int32]expectedPod
}

type expectedPod struct {
	attempt int32
	at      time.Time
}

func newExpectations(now func() time.Time) *expectations {
	return &expectations{m: map[types.NamespacedName]runExpectations{}, now: now}
}

// expectCreate records that the pod of the given attempt is being created.
func (e *expectations) expectCreate(run types.NamespacedName, uid types.UID, shard, attempt int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	re := e.m[run]
	if re.uid != uid || re.shards == nil {
		re = runExpectations{uid: uid, shards: map[int32]expectedPod{}}
		e.m[run] = re
	}
	re.shards[shard] = expectedPod{attempt: attempt, at: e.now()}
}

// cancel forgets an expectation whose create failed.
func (e *expectations) cancel(run types.NamespacedName, shard int32) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m[run].shards, shard)
}

// pending returns the attempt being created for the shard while the cache
// (whose highest attempt for the shard is cachedAttempt) does not show it
// yet. An observed or expired expectation is dropped.
func (e *expectations) pending(run types.NamespacedName, uid types.UID, shard, cachedAttempt int32) (int32, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	re, ok := e.m[run]
	if !ok {
		return 0, false
	}
	if re.uid != uid {
		delete(e.m, run)
		return 0, false
	}
	exp, ok := re.shards[shard]
	if !ok {
		return 0, false
	}
	if cachedAttempt >= exp.attempt || e.now().Sub(exp.at) > expectationTTL {
		delete(re.shards, shard)
		return 0, false
	}
	return exp.attempt, true
}

// forget drops everything about a run (it is gone).
func (e *expectations) forget(run types.NamespacedName) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.m, run)
}
