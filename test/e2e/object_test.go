//go:build e2e

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/s3test"
)

// objectJSONLines is accounts lo..hi of occurrence 2026-06 as JSON Lines,
// each with amount i*factor.
func objectJSONLines(lo, hi, factor int) []byte {
	var b bytes.Buffer
	for i := lo; i <= hi; i++ {
		fmt.Fprintf(&b, `{"entity":"acct-%d","occurrence":"2026-06","payload":{"amount":%d}}`+"\n", i, i*factor)
	}
	return b.Bytes()
}

// The user's side of a run reading the cluster's object store.
const (
	objectCredentials = "exports-s3"    // Secret: the store's keys
	objectCAConfigMap = "exports-s3-ca" // ConfigMap: its CA, as ca.crt
)

// objectBatch is the batch of every JSON Lines object under prefix of
// bucket, read with the store's keys from Secret objectCredentials and its
// CA from ConfigMap objectCAConfigMap (both created the first time), at
// the endpoint pods reach the store at; it lets run's pods reach the store
// (a NetworkPolicy of the user's: the run's own opens port 443 only).
func (f *fixture) objectBatch(run, bucket, prefix string) v1alpha1.BatchSpec {
	f.t.Helper()
	store := f.objectStore(f.t)
	var existing corev1.Secret
	if err := f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: objectCredentials}, &existing); err != nil {
		require.True(f.t, apierrors.IsNotFound(err), "%v", err)
		require.NoError(f.t, f.c.Create(f.ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: objectCredentials},
			StringData: map[string]string{"AWS_ACCESS_KEY_ID": store.AccessKey, "AWS_SECRET_ACCESS_KEY": store.SecretKey},
		}))
		require.NoError(f.t, f.c.Create(f.ctx, &corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: objectCAConfigMap},
			Data:       map[string]string{objectStoreCAKey: string(store.CAPEM)},
		}))
	}
	f.allowObjectStore(run+"-to-s3", map[string]string{v1alpha1.LabelRun: run})
	return v1alpha1.BatchSpec{Object: &v1alpha1.ObjectSource{
		Endpoint: store.Endpoint, Region: store.Region, Bucket: bucket, Prefix: prefix, Format: v1alpha1.ObjectJSONLines,
		CredentialsSecretRef: &v1alpha1.LocalSecretRef{Name: objectCredentials},
		CAConfigMapRef:       &v1alpha1.ConfigMapKeyRef{Name: objectCAConfigMap, Key: objectStoreCAKey},
	}}
}

// TestObjectBatchOnTheCluster (issue #47, e2e tier): a run whose batch is
// every object under a prefix of the cluster's object store (JSON Lines,
// one object gzip-compressed, the last one repeating 200 keys of the
// first), read with the store's keys from a Secret (the worker container's
// alone) over TLS verified against the store's CA from a ConfigMap, its
// pods let through to the store by the user's own NetworkPolicy. Three
// workers, small chunks; shard 0's pod is deleted with --grace-period=0
// --force once it has committed some items, and its replacement reads the
// batch the run fixed (after checking the objects are unchanged). The run
// Succeeds with exact counts: completed == its ledger rows == the effect's
// rows, one per key, the repeats already handled; the batch header records
// each object read (key, size, ETag, digest of its bytes) in key order, and
// the object outside the prefix is not read.
func TestObjectBatchOnTheCluster(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "object", 0.3)
	store := f.objectStore(t)
	bucket := f.newBucket()

	const prefix = "exports/2026-06-30/"
	type object struct {
		key  string
		body []byte
		etag string
	}
	objects := []*object{
		{key: prefix + "part-000.jsonl", body: objectJSONLines(1, 1500, 1)},
		{key: prefix + "part-001.jsonl.gz", body: s3test.Gzip(t, objectJSONLines(1501, 3000, 1))},
		// 200 keys of part-000 again (another amount: still the same
		// business keys, already handled), then 100 new ones.
		{key: prefix + "part-002.jsonl", body: append(objectJSONLines(1, 200, 2), objectJSONLines(3001, 3100, 1)...)},
	}
	const total, distinct, repeats = 3300, 3100, 200
	for _, o := range objects {
		o.etag = f.putObject(bucket, o.key, o.body)
	}
	// Beside the prefix, not under it: never read.
	f.putObject(bucket, "exports/2026-07-01/part-000.jsonl", objectJSONLines(5001, 5010, 1))

	const name = "exports"
	run := f.createRun(name, runSpec{workers: 3, chunk: 50, batch: f.objectBatch(name, bucket, prefix)})

	before := f.waitRowsOfShard(run, 0, 100)
	victim := v1alpha1.PodName(run.Name, 0, 0)
	var killed corev1.Pod
	require.NoError(t, f.c.Get(f.ctx, client.ObjectKey{Namespace: f.ns, Name: victim}, &killed))
	out, err := f.kubectl("delete", "pod", victim, "--grace-period=0", "--force")
	require.NoError(t, err, out)
	t.Logf("shard 0 had committed %d rows; $ kubectl delete pod %s --grace-period=0 --force\n%s", before, victim, out)

	run = f.waitComplete(run.Name, runTimeout)
	require.Equal(t, counts{Total: total, Completed: distinct, AlreadyHandled: repeats}, countsOf(run),
		"every item of the three objects; the repeats inside the batch already handled")
	f.requireShardsAddUp(run)
	seen := f.mon.podsOfShard(run, 0)
	t.Logf("shard 0's pods: %v", seen)
	require.GreaterOrEqual(t, len(seen), 2, "the killed pod was replaced")
	require.Equal(t, victim, seen[0])
	require.NotEqual(t, victim, run.Status.Shards[0].Pod, "the status names the replacement")
	require.Positive(t, f.int(`SELECT count(*) FROM runledger.ledger WHERE run_uid = $1 AND shard = 0 AND attempt > 0`, string(run.UID)),
		"the replacement committed the rest of the shard (the pod was killed mid-run)")
	require.EqualValues(t, distinct, f.committedRows(string(run.UID)), "completed == the run's ledger rows")
	f.requireExactlyOnce(distinct)
	require.EqualValues(t, distinct, f.int(`SELECT count(*) FROM sink WHERE occurrence = '2026-06' AND entity ~ '^acct-([1-9][0-9]{0,2}|[12][0-9]{3}|30[0-9][0-9]|3100)$'`),
		"the effect's rows are the keys of the objects under the prefix: acct-1..acct-3100, none of the object beside it")

	// The batch header: one entry per object read, in key order, as put.
	type recorded struct{ Key, ETag, SHA256 string }
	var got []recorded
	var sizes []int64
	f.rows(func() { got, sizes = nil, nil }, func(r pgx.Rows) error {
		var o recorded
		var size int64
		if err := r.Scan(&o.Key, &size, &o.ETag, &o.SHA256); err != nil {
			return err
		}
		got, sizes = append(got, o), append(sizes, size)
		return nil
	}, `SELECT o->>'key', (o->>'size')::bigint, o->>'etag', o->>'sha256'
		FROM runledger.batch_run, jsonb_array_elements(objects) WITH ORDINALITY AS e(o, i)
		WHERE run_uid = $1 AND source = 'object' ORDER BY i`, string(run.UID))
	var want []recorded
	var wantSizes []int64
	for _, o := range objects {
		sum := sha256.Sum256(o.body)
		want = append(want, recorded{Key: o.key, ETag: strings.Trim(o.etag, `"`), SHA256: "sha256:" + hex.EncodeToString(sum[:])})
		wantSizes = append(wantSizes, int64(len(o.body)))
	}
	for i := range got {
		got[i].ETag = strings.Trim(got[i].ETag, `"`)
	}
	require.Equal(t, want, got, "runledger.batch_run.objects: each object's key, ETag and the digest of its bytes as stored")
	require.Equal(t, wantSizes, sizes, "each object's size as stored (the gzip-compressed one's compressed)")
	require.EqualValues(t, total, f.int(`SELECT items FROM runledger.batch_run WHERE run_uid = $1`, string(run.UID)), "the fixed batch's items")

	// The store's keys are the worker container's alone, from the Secret
	// (never a value in the pod's spec); the CA is mounted there alone.
	pods := f.waitPodsFinished(run, runTimeout)
	require.Len(t, pods, 3, "a pod per shard, the killed one's replacement among them")
	for _, p := range pods {
		require.Equal(t, corev1.PodSucceeded, p.Status.Phase, "pod %s", p.Name)
	}
	for _, p := range append(pods, killed) {
		var worker *corev1.Container
		var others []corev1.Container
		for i, c := range p.Spec.Containers {
			if c.Name == v1alpha1.WorkerContainerName {
				worker = &p.Spec.Containers[i]
			} else {
				others = append(others, c)
			}
		}
		others = append(others, p.Spec.InitContainers...)
		require.NotNil(t, worker, "pod %s has the worker container", p.Name)
		fromSecret := map[string]string{}
		for _, e := range worker.Env {
			require.NotContains(t, e.Value, store.SecretKey, "pod %s: no key as a value", p.Name)
			require.NotContains(t, e.Value, store.AccessKey, "pod %s: no key as a value", p.Name)
			if strings.HasPrefix(e.Name, "AWS_") {
				require.NotNil(t, e.ValueFrom, "pod %s: %s from a Secret", p.Name, e.Name)
				require.NotNil(t, e.ValueFrom.SecretKeyRef, "pod %s: %s from a Secret", p.Name, e.Name)
				fromSecret[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			}
		}
		require.Equal(t, objectCredentials+"/AWS_ACCESS_KEY_ID", fromSecret["AWS_ACCESS_KEY_ID"], "pod %s", p.Name)
		require.Equal(t, objectCredentials+"/AWS_SECRET_ACCESS_KEY", fromSecret["AWS_SECRET_ACCESS_KEY"], "pod %s", p.Name)
		require.True(t, hasMount(*worker, v1alpha1.WorkerObjectCAVolume), "pod %s: the worker mounts the CA", p.Name)
		for _, c := range others {
			for _, e := range c.Env {
				require.False(t, strings.HasPrefix(e.Name, "AWS_"), "pod %s: container %s gets no store credential (%s)", p.Name, c.Name, e.Name)
			}
			require.Empty(t, c.EnvFrom, "pod %s: container %s gets no environment from a Secret", p.Name, c.Name)
			require.False(t, hasMount(c, v1alpha1.WorkerObjectCAVolume), "pod %s: container %s", p.Name, c.Name)
		}
	}
}

func hasMount(c corev1.Container, volume string) bool {
	for _, m := range c.VolumeMounts {
		if m.Name == volume {
			return true
		}
	}
	return false
}

// TestObjectBatchReplacedObject: an object replaced after the run's first
// shard fixed the batch. Shard 1's pod is deleted (--grace-period=0
// --force) once it has committed some items; its replacement lists the
// objects again, finds one replaced and fails the run as bad input, naming
// it, not retried. What was committed is the batch as fixed: no item of the
// new object's content is, and each key at most once.
func TestObjectBatchReplacedObject(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "objreplaced", 0.3)
	bucket := f.newBucket()
	const prefix = "exports/2026-07-01/"
	f.putObject(bucket, prefix+"part-000.jsonl", objectJSONLines(1, 1000, 1))
	f.putObject(bucket, prefix+"part-001.jsonl", objectJSONLines(1001, 2000, 1))
	const name = "replaced"
	run := f.createRun(name, runSpec{workers: 2, chunk: 50, batch: f.objectBatch(name, bucket, prefix)})

	before := f.waitRowsOfShard(run, 1, 100)
	etag := f.putObject(bucket, prefix+"part-001.jsonl", objectJSONLines(9001, 9500, 1))
	victim := v1alpha1.PodName(run.Name, 1, 0)
	out, err := f.kubectl("delete", "pod", victim, "--grace-period=0", "--force")
	require.NoError(t, err, out)
	t.Logf("shard 1 had committed %d rows; %spart-001.jsonl replaced (ETag %s); $ kubectl delete pod %s --grace-period=0 --force\n%s", before, prefix, etag, victim, out)

	run = f.waitFinished(run.Name, runTimeout)
	require.True(t, isTrue(run, v1alpha1.ConditionFailed), "Failed: %s", statusLine(run))
	c := findCondition(run, v1alpha1.ConditionFailed)
	require.Equal(t, "BadInput", c.Reason)
	require.Contains(t, c.Message, fmt.Sprintf("s3://%s/%spart-001.jsonl was replaced", bucket, prefix), "the condition names the object")
	require.Contains(t, c.Message, "give the run a new name")
	require.Contains(t, c.Message, "not retried")
	seen := f.mon.podsOfShard(run, 1)
	t.Logf("shard 1's pods: %v", seen)
	require.Len(t, seen, 2, "the deleted pod's replacement, not retried after it")

	// The Failed run's counts are what the ledger holds: the deleted pod
	// never reported its last chunks, and its replacement failed before
	// reading anything (it reports the shard's rows and its fixed batch).
	run = f.waitRun(run.Name, time.Minute, "its counts to be the ledger's", func(r *v1alpha1.ProcessingRun) bool {
		return r.Status.Completed == f.committedRows(string(run.UID)) && r.Status.Total == 2000
	})
	committed := f.committedRows(string(run.UID))
	t.Logf("the Failed run's status: %s; the ledger holds %d rows of it", statusLine(run), committed)
	require.GreaterOrEqual(t, committed, before)
	require.Less(t, committed, int64(2000), "the run did not complete")
	require.Zero(t, f.int(`SELECT count(*) FROM sink WHERE substr(entity, 6)::int > 2000`), "no item of the replaced object's new content")
	require.EqualValues(t, committed, f.int(`SELECT count(*) FROM sink`), "one effect row per committed item")
	f.requireExactlyOnce(committed)
}
