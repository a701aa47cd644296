package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/distribution/reference"
	"github.com/go-logr/logr"
	"github.com/opencontainers/go-digest"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The manager's Deployment gives it its own Pod's name and namespace
// through the downward API (config/manager/manager.yaml).
const (
	envPodName       = "POD_NAME"
	envPodNamespace  = "POD_NAMESPACE"
	managerContainer = "manager"
)

// ownImageTimeout bounds the wait for the kubelet to report the manager's
// own container status (imageID), which lags the container's start a little.
var ownImageTimeout = 30 * time.Second

// workerImageFor decides the workers' default image: --worker-image when
// set, else the manager's own image (its digest when the runtime reports
// one, so workers run the very bytes the manager runs even if the tag moves).
func workerImageFor(ctx context.Context, log logr.Logger, c client.Reader, flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	name, ns := os.Getenv(envPodName), os.Getenv(envPodNamespace)
	if name == "" || ns == "" {
		log.Info("no --worker-image and not in a pod (" + envPodName + ", " + envPodNamespace + " unset): runs without spec.workerTemplate.image will stall until one is set")
		return "", nil
	}
	var image string
	var lastErr error
	err := wait.PollUntilContextTimeout(ctx, time.Second, ownImageTimeout, true, func(ctx context.Context) (bool, error) {
		var pod corev1.Pod
		if err := c.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, &pod); err != nil {
			lastErr = fmt.Errorf("get own pod %s/%s: %w", ns, name, err)
			if apierrors.IsNotFound(err) || apierrors.IsForbidden(err) || apierrors.IsUnauthorized(err) {
				return false, lastErr
			}
			return false, nil // the apiserver may be briefly unreachable: retry
		}
		img, ok, err := ownImage(&pod, managerContainer)
		image = img
		return ok, err
	})
	switch {
	case err == nil:
		return image, nil
	case wait.Interrupted(err) && image != "":
		// The kubelet has not reported the digest yet: the tag is still the manager's image.
		log.Info("own container's imageID not reported in time: workers get the tag, not the digest", "image", image)
		return image, nil
	case wait.Interrupted(err) && lastErr != nil:
		err = lastErr
	}
	return "", fmt.Errorf("worker image from own pod (pass --worker-image to set it): %w", err)
}

// ownImage returns the image of pod's container (the one named container,
// or the only one), pinned to the digest in its status when the runtime
// reports a registry digest; done is false while the status has no imageID yet.
func ownImage(pod *corev1.Pod, container string) (image string, done bool, err error) {
	var spec *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container || len(pod.Spec.Containers) == 1 {
			spec = &pod.Spec.Containers[i]
			break
		}
	}
	if spec == nil {
		return "", false, fmt.Errorf("pod %s/%s has no container %q", pod.Namespace, pod.Name, container)
	}
	named, err := reference.ParseNormalizedNamed(spec.Image)
	if err != nil {
		return "", false, fmt.Errorf("own image %q: %w", spec.Image, err)
	}
	if _, ok := named.(reference.Canonical); ok {
		return spec.Image, true, nil
	}
	for _, st := range pod.Status.ContainerStatuses {
		if st.Name != spec.Name {
			continue
		}
		if st.ImageID == "" {
			return spec.Image, false, nil
		}
		d, ok := repoDigest(st.ImageID)
		if !ok {
			// An image ID without a registry (an imported image): only the tag names it.
			return spec.Image, true, nil
		}
		pinned, err := reference.WithDigest(reference.TrimNamed(named), d)
		if err != nil {
			return "", false, fmt.Errorf("own image %q with digest %s: %w", spec.Image, d, err)
		}
		return reference.FamiliarString(pinned), true, nil
	}
	return spec.Image, false, nil
}

// repoDigest is the digest of an imageID of the form [docker-pullable://]repo@sha256:...
func repoDigest(imageID string) (d digest.Digest, ok bool) {
	ref, err := reference.ParseNormalizedNamed(strings.TrimPrefix(imageID, "docker-pullable://"))
	if err != nil {
		return "", false
	}
	c, ok := ref.(reference.Canonical)
	if !ok {
		return "", false
	}
	return c.Digest(), true
}
