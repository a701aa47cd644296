// Package controllers holds the ProcessingRun controller: it turns each run
// into worker pods, one per shard, and keeps the run's status exact.
//
// # Reconcile
//
// Reconcile fetches the run, lets a deleted run go (its pods follow through
// their owner references; the ledger is never touched), deletes a finished
// run whose ttlSecondsAfterFinished has passed, and otherwise runs a pass
// over a scope (pass.go, the schedule controller's shape too): two
// observations, three steps, and the status write:
//
//   - observeQueue: for a run in a Kueue queue (with the integration on),
//     its Workload from the cache, and whether Kueue holds the run, before
//     the pods are looked at.
//   - observe: the run's pods from the cache (field index on the
//     controlling run), grouped by shard; decideShard (pure) says what they
//     mean and what to do; decideRun (pure) says what that means for the run.
//   - syncQueue: for a queued run, carries out what the pass decided about
//     its Workload (applyQueueDecision: create it, (de)activate it, follow
//     the run's LocalQueue, finish it) now that the pods and the outcome
//     are known, and resolves the admitted placement when pods are about
//     to be created.
//   - checkDependencies: before creating a pod, the image must parse and the
//     ConfigMap key and the ServiceAccount must exist. Otherwise the run is
//     Stalled (condition and Event) and no pod is created, so nothing
//     crash-loops; it looks again every DependencyRetry. The Secret is not
//     looked at (the manager has no right on Secrets): a missing Secret or
//     key shows as the kubelet's CreateContainerConfigError on the pod,
//     which stalls the run the same way.
//   - syncPods: creates the decided pods and deletes the ones that must stop
//     (suspended or finished run). Before a pass's first create it writes
//     the run's ConfigMap (the run as its workers read it: they cannot read
//     runs) and NetworkPolicy, both owned by the run; a name taken by
//     another object stalls the run rather than start a pod without them.
//   - writeStatus, deferred so it runs on every path once the pods were
//     observed (as Cluster API's patch helper): a failing step still
//     publishes what the pass learnt, and its error as Reconciling's and
//     Ready's reason ReconcileError. It rebuilds the status (buildStatus,
//     pure), the workers' reports on their pods folded in (withProgress),
//     and writes it by server-side apply, only when it changed; changes of
//     progress alone (counts, the shards' messages and report times) at most
//     every StatusInterval, whatever the number of shards. The write lands on
//     the run as the pass read it or nowhere: the apply carries its
//     resourceVersion, and a Conflict waits for the next pass.
//
// # One live pod per shard
//
// A shard's pods are named <run>-<shard>-<attempt>. A new attempt is
// created only when the shard has no live pod (pending, running, or
// terminating) in the cache, no creation of this process is still
// unobserved (expectations), and the last pod recorded in the status is
// either in the cache or confirmed gone by a live read from the API server.
// Deterministic names make any create that slips through (a leader change,
// a forgotten expectation) fail with AlreadyExists instead of starting a
// second pod.
//
// The one exception: a pod on a lost node (NotReady or unreachable for
// spec.nodeLostAfterSeconds, or being deleted there; podOnLostNode) no
// longer counts as live, since no kubelet will ever confirm it gone. It is
// deleted and replaced; if it still runs (a partition), the shard's advisory
// lock makes the replacement wait for it, and the ledger's rule commits each
// item once.
//
// # Retries
//
// A failed attempt (exit 1, a crash, OOM, eviction) is replaced by attempt+1
// after base·2^(failures-1) (capped), until the shard has failed
// backoffLimit+1 times; then the run is Failed with a message naming the
// shard and its last error. Failures are counted in the status
// (shards[].failedAttempts, lastFailedAttempt), so deleting failed pods does
// not reset them. Exit 2 (bad input or configuration) fails the run at
// once. Exit 3 (the shard's lock stayed taken: an earlier pod still
// finishing) is retried after a back-off and not counted. Pods stopped by
// the controller (suspend) or deleted by someone before their failure was
// counted do not count. Failed pods are kept for their logs and
// termination messages until the run is deleted.
//
// A shard's attempt is over when its worker container terminated, whatever
// the pod phase: an injected sidecar (a service mesh) may keep the pod
// Running. Such a pod is deleted once the status holds its outcome and no
// later decision needs it.
//
// A pod create that admission refuses (Forbidden or Invalid: a quota, pod
// security) stalls the run with the reason and ends the pass's creates, as
// the Job controller does; the run tries again every DependencyRetry.
//
// A pod the scheduler cannot place (PodScheduled=False, reason
// Unschedulable) is not a stall: the scheduler keeps trying and an
// autoscaler may add a node. The run stays Reconciling with the reason
// Unschedulable and the scheduler's message, and a Warning Event names it.
//
// # Counts
//
// The protocol between the controller and its workers (who writes what,
// reports on the pods, termination messages, counts that never go down) is
// stated once, in api/v1alpha1/contract.go. What the controller adds: it
// folds the run reporter's RunReport (every shard's progress, on one pod)
// and any worker's own ShardReport into the shards' entries (foldRunReports,
// mergeReports), so a run of 256 shards costs the API server one pod patch
// per RunReportInterval and at most one write of the run per
// StatusInterval; when it creates
// attempt N+1 it records on the new pod (annotation
// processing.runledger.dev/counts-floor) the field-wise maximum of what the
// shard had reported so far (earlier floors, the last status report,
// attempt N's termination message), which is the floor that attempt's
// counts are shown against until it is finished.
//
// The run's total is the number of inline items declared (duplicates
// included), or the sum of the shards' totals for ConfigMap and query
// sources. The run Succeeds when every shard succeeded and the failed items
// of all shards are within maxFailedItems.
//
// # Conditions
//
// Complete, Failed and Suspended mean what they mean on a batch/v1 Job
// (kubectl wait --for=condition=Complete works). Ready is True once the run
// Succeeded. Reconciling (work in progress) and Stalled (someone has to act:
// a missing dependency, a worker that cannot start, a Failed run) are
// present only when True, as kstatus (Flux, kpt, cli-utils) reads them. A
// finished run's outcome never changes.
package controllers
