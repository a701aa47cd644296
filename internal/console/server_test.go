package console

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/controllers"
)

// fakeServer is a console on a fake API server holding one run, default/june,
// as if listening at 127.0.0.1:7480.
func fakeServer(t *testing.T) (*Server, *v1alpha1.ProcessingRun) {
	t.Helper()
	scheme := runtime.NewScheme()
	require.NoError(t, v1alpha1.AddToScheme(scheme))
	run := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "june", UID: "u-1"}}
	c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(run).Build()
	s, err := New(Options{Kube: c, Namespace: "default"}, &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7480})
	require.NoError(t, err)
	return s, run
}

func post(s *Server, host, origin, site, token string) *httptest.ResponseRecorder {
	return postAction(s, "suspend", host, origin, site, token)
}

func postAction(s *Server, action, host, origin, site, token string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, "/runs/default/june/"+action, strings.NewReader(url.Values{"token": {token}}.Encode()))
	r.Host = host
	r.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		r.Header.Set("Origin", origin)
	}
	if site != "" {
		r.Header.Set("Sec-Fetch-Site", site)
	}
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	return w
}

// TestStateChangesNeedTheConsolesOwnPage: a POST acts only with the
// process's token, from the console's own origin, at its own Host; the
// run stays unsuspended otherwise.
func TestStateChangesNeedTheConsolesOwnPage(t *testing.T) {
	s, run := fakeServer(t)
	const own = "http://127.0.0.1:7480"
	for _, tc := range []struct {
		name, host, origin, site, token string
		code                            int
		body                            string
	}{
		{"no token", "127.0.0.1:7480", own, "same-origin", "", http.StatusForbidden, "no valid token"},
		{"a wrong token", "127.0.0.1:7480", own, "same-origin", "x" + s.token, http.StatusForbidden, "no valid token"},
		{"another origin", "127.0.0.1:7480", "http://evil.example", "", s.token, http.StatusForbidden, "not the console's"},
		{"no origin", "127.0.0.1:7480", "", "", s.token, http.StatusForbidden, "no Origin"},
		{"cross-site", "127.0.0.1:7480", own, "cross-site", s.token, http.StatusForbidden, "cross-site"},
		{"DNS rebinding", "evil.example:7480", "http://evil.example:7480", "same-origin", s.token, http.StatusMisdirectedRequest, "own loopback address"},
		{"another port", "127.0.0.1:7481", "http://127.0.0.1:7481", "same-origin", s.token, http.StatusMisdirectedRequest, "own loopback address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := post(s, tc.host, tc.origin, tc.site, tc.token)
			require.Equal(t, tc.code, w.Code, w.Body.String())
			require.Contains(t, w.Body.String(), tc.body)
			got := &v1alpha1.ProcessingRun{}
			require.NoError(t, s.o.Kube.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "june"}, got))
			require.False(t, got.Spec.Suspend, "refused, the run is not suspended")
		})
	}
	w := post(s, "localhost:7480", "http://localhost:7480", "same-origin", s.token)
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	require.Equal(t, "/runs/default/june", w.Header().Get("Location"))
	got := &v1alpha1.ProcessingRun{}
	require.NoError(t, s.o.Kube.Get(context.Background(), types.NamespacedName{Namespace: run.Namespace, Name: run.Name}, got))
	require.True(t, got.Spec.Suspend, "from its own page, with its token, the run is suspended")
}

// TestPagesAreGuarded: every page carries a CSP that allows no other
// origin's script, and the page's token is the only way to it.
func TestPagesAreGuarded(t *testing.T) {
	s, _ := fakeServer(t)
	r := httptest.NewRequest(http.MethodGet, "/runs/default/june/confirm/suspend", nil)
	r.Host = "127.0.0.1:7480"
	w := httptest.NewRecorder()
	s.ServeHTTP(w, r)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.Contains(t, w.Header().Get("Content-Security-Policy"), "default-src 'self'")
	require.Contains(t, w.Header().Get("Content-Security-Policy"), "frame-ancestors 'none'")
	require.Contains(t, w.Body.String(), `name="token" value="`+s.token+`"`)
}

// TestDeleteOnlyAFinishedRun: deleting a run that has not finished is
// refused (409), with why; the run stays.
func TestDeleteOnlyAFinishedRun(t *testing.T) {
	s, _ := fakeServer(t)
	w := postAction(s, "delete", "127.0.0.1:7480", "http://127.0.0.1:7480", "same-origin", s.token)
	require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
	require.Contains(t, w.Body.String(), "the run has not finished")
	require.NoError(t, s.o.Kube.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: "june"}, &v1alpha1.ProcessingRun{}))
}

// TestRetryName: a run's retry has one name, made of the run's name and
// uid, at most 63 characters; another uid (a run of the same name made
// again) has another.
func TestRetryName(t *testing.T) {
	name := RetryName("june", "u-1")
	require.Regexp(t, `^june-retry-[0-9a-f]{6}$`, name)
	require.Equal(t, name, RetryName("june", "u-1"), "deterministic")
	require.NotEqual(t, name, RetryName("june", "u-2"))
	long := RetryName(strings.Repeat("a", 63), "u-1")
	require.Len(t, long, v1alpha1.MaxRunNameLength)
	require.Equal(t, strings.TrimPrefix(name, "june"), strings.TrimLeft(long, "a"), "the same suffix")
}

// TestRetryTwice: a second retry of a run (a double submit) creates no
// second run: it sends the browser to the first, with a note; a name
// taken by a run that is not the retry is refused (409).
func TestRetryTwice(t *testing.T) {
	s, run := fakeServer(t)
	w := postAction(s, "retry", "127.0.0.1:7480", "http://127.0.0.1:7480", "same-origin", s.token)
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	require.Equal(t, "/runs/default/"+RetryName("june", run.UID), w.Header().Get("Location"))
	w = postAction(s, "retry", "127.0.0.1:7480", "http://127.0.0.1:7480", "same-origin", s.token)
	require.Equal(t, http.StatusSeeOther, w.Code, w.Body.String())
	require.Equal(t, "/runs/default/"+RetryName("june", run.UID)+"?note="+noteRetryFound, w.Header().Get("Location"), "the first retry, with a note")
	list := &v1alpha1.ProcessingRunList{}
	require.NoError(t, s.o.Kube.List(context.Background(), list))
	require.Len(t, list.Items, 2, "june and one retry")

	// A name taken by a run that is not june's retry.
	require.NoError(t, s.o.Kube.Delete(context.Background(), &list.Items[0]))
	require.NoError(t, s.o.Kube.Delete(context.Background(), &list.Items[1]))
	require.NoError(t, s.o.Kube.Create(context.Background(), &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "june", UID: run.UID}}))
	require.NoError(t, s.o.Kube.Create(context.Background(), &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: RetryName("june", run.UID)}}))
	w = postAction(s, "retry", "127.0.0.1:7480", "http://127.0.0.1:7480", "same-origin", s.token)
	require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
	require.Contains(t, w.Body.String(), "does not retry this run")
}

func TestAge(t *testing.T) {
	for d, want := range map[string]string{"5s": "5s", "3m": "3m", "5h": "5h", "72h": "3d"} {
		dur, err := timeParse(d)
		require.NoError(t, err)
		require.Equal(t, want, age(dur))
	}
}

var timeParse = time.ParseDuration

// TestRetryRun: the retry of a run's failed items is its spec with the
// failed items as batch, not suspended, in the run's Kueue queue and
// without its other labels.
func TestRetryRun(t *testing.T) {
	t.Parallel()
	run := &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "june", Labels: map[string]string{
			controllers.LabelQueueName: "team-a", v1alpha1.LabelSchedule: "invoices",
		}},
		Spec: v1alpha1.ProcessingRunSpec{
			Suspend: true,
			Batch:   v1alpha1.BatchSpec{Query: "SELECT 1"},
			Effect:  &v1alpha1.EffectSpec{SQL: "INSERT INTO t SELECT 1"},
		},
	}
	next := retryRun(run)
	require.Equal(t, "billing", next.Namespace)
	require.Equal(t, RetryName("june", run.UID), next.Name)
	require.Equal(t, map[string]string{controllers.LabelQueueName: "team-a"}, next.Labels)
	require.Equal(t, v1alpha1.BatchSpec{FromRun: &v1alpha1.FromRunSource{Name: "june", Verdict: v1alpha1.FromRunFailed}}, next.Spec.Batch)
	require.False(t, next.Spec.Suspend)
	require.Equal(t, run.Spec.Effect, next.Spec.Effect)
	require.Equal(t, "SELECT 1", run.Spec.Batch.Query, "the run itself is left as it was")

	delete(run.Labels, controllers.LabelQueueName)
	require.Empty(t, retryRun(run).Labels)
}

// TestRowQueue: a run in a Kueue queue shows the queue and its Admitted
// condition's reason (the Admission column's value); another shows none.
func TestRowQueue(t *testing.T) {
	run := &v1alpha1.ProcessingRun{ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "june",
		Labels: map[string]string{controllers.LabelQueueName: "team-a"}}}
	run.Status.Conditions = []metav1.Condition{{Type: v1alpha1.ConditionAdmitted, Status: metav1.ConditionFalse, Reason: "Queued"}}
	row := rowOf(run, time.Now())
	require.Equal(t, "team-a", row.Queue)
	require.Equal(t, "Queued", row.Admission)
	row = rowOf(&v1alpha1.ProcessingRun{}, time.Now())
	require.Empty(t, row.Queue)
	require.Empty(t, row.Admission)
}
