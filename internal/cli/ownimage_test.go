package cli

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runledger/runledger/internal/envtestutil"
)

const testDigest = "sha256:3b5a0b2e9b4c0d6a1f3e8c7d2b9a4f6e5c1d0b8a7e6f5d4c3b2a1908f7e6d5c4"

func podWith(image string, statuses ...corev1.ContainerStatus) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "runledger-manager-abc", Namespace: "runledger-system"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "istio-proxy", Image: "proxy:1"},
			{Name: "manager", Image: image},
		}},
		Status: corev1.PodStatus{ContainerStatuses: statuses},
	}
}

func TestOwnImage(t *testing.T) {
	status := func(name, imageID string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, ImageID: imageID}
	}
	tests := []struct {
		name    string
		pod     *corev1.Pod
		want    string
		done    bool
		wantErr string
	}{
		{name: "registry digest pins the tag", pod: podWith("registry.example:5000/runledger:v1",
			status("istio-proxy", "proxy@sha256:0000000000000000000000000000000000000000000000000000000000000000"),
			status("manager", "registry.example:5000/runledger@"+testDigest)),
			want: "registry.example:5000/runledger@" + testDigest, done: true},
		{name: "the runtime's normalized name keeps the user's spelling", pod: podWith("runledger:dev",
			status("manager", "docker.io/library/runledger@"+testDigest)),
			want: "runledger@" + testDigest, done: true},
		{name: "docker's imageID prefix", pod: podWith("ghcr.io/o/runledger:v2",
			status("manager", "docker-pullable://ghcr.io/o/runledger@"+testDigest)),
			want: "ghcr.io/o/runledger@" + testDigest, done: true},
		{name: "already by digest", pod: podWith("ghcr.io/o/runledger:v2@" + testDigest),
			want: "ghcr.io/o/runledger:v2@" + testDigest, done: true},
		{name: "an imported image has no registry digest: the tag", pod: podWith("runledger.local/runledger:abc",
			status("manager", "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")),
			want: "runledger.local/runledger:abc", done: true},
		{name: "status not reported yet", pod: podWith("runledger:dev"), want: "runledger:dev", done: false},
		{name: "imageID empty yet", pod: podWith("runledger:dev", status("manager", "")), want: "runledger:dev", done: false},
		{name: "a single container of another name", pod: &corev1.Pod{
			Spec:   corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "r.example/runledger:v1"}}},
			Status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{status("main", "r.example/runledger@"+testDigest)}}},
			want: "r.example/runledger@" + testDigest, done: true},
		{name: "no manager container among several", pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "a", Image: "a"}, {Name: "b", Image: "b"}}}},
			wantErr: `pod ns/p has no container "manager"`},
		{name: "unparsable image", pod: podWith("runledger::x"), wantErr: `own image "runledger::x"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, done, err := ownImage(tt.pod, managerContainer)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
			require.Equal(t, tt.done, done)
		})
	}
}

// The manager reads its own Pod from the apiserver: the workers' image is
// the manager's, by digest once the kubelet reports it; --worker-image wins.
func TestWorkerImageFor(t *testing.T) {
	env := envtestutil.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	pod := podWith("registry.example/runledger:v1")
	pod.Namespace = ns
	require.NoError(t, env.Client.Create(ctx, pod))
	t.Setenv(envPodName, pod.Name)
	t.Setenv(envPodNamespace, ns)

	got, err := workerImageFor(ctx, logr.Discard(), env.Client, "other.example/runledger:override")
	require.NoError(t, err)
	require.Equal(t, "other.example/runledger:override", got, "--worker-image overrides")

	// The kubelet reports the imageID a little after the container starts.
	go func() {
		time.Sleep(1500 * time.Millisecond)
		p := pod.DeepCopy()
		p.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "manager", Image: "registry.example/runledger:v1",
			ImageID: "registry.example/runledger@" + testDigest}}
		_ = env.Client.Status().Update(ctx, p)
	}()
	got, err = workerImageFor(ctx, logr.Discard(), env.Client, "")
	require.NoError(t, err)
	require.Equal(t, "registry.example/runledger@"+testDigest, got)

	// Never reported: the tag after the timeout, rather than no image.
	other := podWith("registry.example/runledger:v2")
	other.Name, other.Namespace = "no-status", ns
	require.NoError(t, env.Client.Create(ctx, other))
	t.Setenv(envPodName, other.Name)
	defer func(d time.Duration) { ownImageTimeout = d }(ownImageTimeout)
	ownImageTimeout = 2 * time.Second
	got, err = workerImageFor(ctx, logr.Discard(), env.Client, "")
	require.NoError(t, err)
	require.Equal(t, "registry.example/runledger:v2", got)

	// A pod that does not exist: a clear error naming the way out.
	t.Setenv(envPodName, "gone")
	_, err = workerImageFor(ctx, logr.Discard(), env.Client, "")
	require.ErrorContains(t, err, `worker image from own pod (pass --worker-image to set it): get own pod `+ns+`/gone: pods "gone" not found`)

	// Outside a pod: no image, no error (runs stall with a clear message).
	t.Setenv(envPodName, "")
	got, err = workerImageFor(ctx, logr.Discard(), env.Client, "")
	require.NoError(t, err)
	require.Empty(t, got)
}
