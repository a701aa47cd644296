//go:build e2e

package e2e

import (
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestTLSVerifyFull: the cluster's PostgreSQL serves TLS with a CA of its
// own, as a managed database does. A run whose workers get that CA from a
// Secret through workerTemplate.volumes and connect with
// sslmode=verify-full succeeds; the same run with another CA (the
// Kubernetes cluster's) fails, and its condition says it is the
// certificate, without the DSN's password.
func TestTLSVerifyFull(t *testing.T) {
	t.Parallel()
	f := newFixture(t, "tls", 0)

	caPath, err := exec.CommandContext(f.ctx, f.clusterSh, "pg-ca").Output()
	require.NoError(t, err, "hack/cluster.sh pg-ca")
	pgCA, err := os.ReadFile(strings.TrimSpace(string(caPath)))
	require.NoError(t, err)
	// Another CA: the Kubernetes cluster's, next to it.
	otherCA, err := os.ReadFile(filepath.Join(filepath.Dir(strings.TrimSpace(string(caPath))), "ca.crt"))
	require.NoError(t, err)
	require.NotEqual(t, string(pgCA), string(otherCA))

	u, err := url.Parse(f.dsn)
	require.NoError(t, err)
	q := u.Query()
	q.Set("sslmode", "verify-full")
	q.Set("sslrootcert", "/etc/pg-ca/ca.crt")
	u.RawQuery = q.Encode()
	password, _ := u.User.Password()
	for name, data := range map[string]map[string][]byte{
		"ledger-db-tls": {secretKey: []byte(u.String())},
		"pg-ca":         {"ca.crt": pgCA},
		"wrong-ca":      {"ca.crt": otherCA},
	} {
		require.NoError(t, f.c.Create(f.ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name}, Data: data}))
	}
	withCA := func(run *v1alpha1.ProcessingRun, caSecret string) *v1alpha1.ProcessingRun {
		run.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{
			Volumes: []corev1.Volume{{Name: "pg-ca", VolumeSource: corev1.VolumeSource{
				Secret: &corev1.SecretVolumeSource{SecretName: caSecret}}}},
			VolumeMounts: []corev1.VolumeMount{{Name: "pg-ca", MountPath: "/etc/pg-ca", ReadOnly: true}},
		}
		return run
	}

	t.Run("its own CA: verify-full succeeds", func(t *testing.T) {
		f := f.with(t)
		run := withCA(f.newRun("tls-ok", runSpec{workers: 2, batch: inlineItems(1, 20), secret: "ledger-db-tls"}), "pg-ca")
		require.NoError(t, f.c.Create(f.ctx, run))
		run = f.waitComplete(run.Name, runTimeout)
		require.Equal(t, counts{Total: 20, Completed: 20}, countsOf(run))
		f.requireExactlyOnce(20)
	})

	t.Run("another CA: a clear error", func(t *testing.T) {
		f := f.with(t)
		run := withCA(f.newRun("tls-wrong-ca", runSpec{batch: inlineItems(101, 105), secret: "ledger-db-tls"}), "wrong-ca")
		run.Spec.BackoffLimit = ptr.To[int32](0)
		require.NoError(t, f.c.Create(f.ctx, run))
		run = f.waitFinished(run.Name, 3*time.Minute)
		require.True(t, isTrue(run, v1alpha1.ConditionFailed), "Failed; conditions: %s", conditionsLine(run))
		c := findCondition(run, v1alpha1.ConditionFailed)
		t.Logf("Failed: %s: %s", c.Reason, c.Message)
		require.Contains(t, c.Message, "certificate", "the condition says it is the server's certificate")
		require.NotContains(t, c.Message, password, "no password in the condition")
		for _, ev := range f.events(run.Name) {
			require.NotContains(t, ev.Message, password, "no password in the Events")
		}
		require.True(t, f.ledgerExists(), "the first subtest migrated the ledger")
		require.EqualValues(t, 0, f.int("SELECT count(*) FROM runledger.ledger WHERE run_name = 'tls-wrong-ca'"), "nothing committed")
	})
}
