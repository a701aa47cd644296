package controllers

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/distribution/reference"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

const (
	// annotationCountsFloor records, on the pod of attempt N+1, the counts
	// its shard had reached before it (the maximum of what earlier attempts
	// reported). The run's totals never show less for the shard while the new
	// attempt catches up.
	annotationCountsFloor = v1alpha1.Group + "/counts-floor"

	// Well-known labels on worker pods, besides the v1alpha1.Label* ones.
	labelAppName      = "app.kubernetes.io/name"
	labelAppComponent = "app.kubernetes.io/component"
	labelAppInstance  = "app.kubernetes.io/instance"
	labelAppManagedBy = "app.kubernetes.io/managed-by"

	workerGracePeriodSeconds = 30
)

// PodOptions are the manager-wide defaults of worker pods.
type PodOptions struct {
	// Image is the worker image unless the run overrides it.
	Image string
	// ServiceAccountName is the worker service account unless the run
	// overrides it.
	ServiceAccountName string
	// ImagePullPolicy of the worker container; empty means the Kubernetes
	// default for the image's tag.
	ImagePullPolicy corev1.PullPolicy
}

// defaultWorkerResources apply when the run sets no resources: the worker
// streams its shard chunk by chunk, so its memory stays small.
func defaultWorkerResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("100m"),
			corev1.ResourceMemory: resource.MustParse("128Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("256Mi"),
		},
	}
}

// workerImage is the image of a run's worker pods.
func workerImage(run *v1alpha1.ProcessingRun, opts PodOptions) string {
	if t := run.Spec.WorkerTemplate; t != nil && t.Image != "" {
		return t.Image
	}
	return opts.Image
}

// validateImage says why the kubelet would refuse image (InvalidImageName),
// before any pod is created for it.
func validateImage(image string) error {
	if image == "" {
		return fmt.Errorf("no worker image: set spec.workerTemplate.image or the manager's --worker-image")
	}
	if _, err := reference.ParseNormalizedNamed(image); err != nil {
		return fmt.Errorf("invalid worker image %q: %w", image, err)
	}
	return nil
}

// podLabels are the labels of a shard's pod; selectorLabels are the subset
// that selects all pods of a run.
func podLabels(run *v1alpha1.ProcessingRun, shard, attempt int32) map[string]string {
	return map[string]string{
		labelAppName:          "runledger",
		labelAppComponent:     "worker",
		labelAppInstance:      run.Name,
		labelAppManagedBy:     "runledger-controller",
		v1alpha1.LabelRun:     run.Name,
		v1alpha1.LabelRunUID:  string(run.UID),
		v1alpha1.LabelShard:   strconv.Itoa(int(shard)),
		v1alpha1.LabelAttempt: strconv.Itoa(int(attempt)),
	}
}

// podMetadata is the labels and annotations of a shard's pod: the run's
// workerTemplate.metadata, then the controller's own, which the API refuses
// in the template and which win here too.
func podMetadata(run *v1alpha1.ProcessingRun, shard, attempt int32, m *v1alpha1.WorkerPodMetadata) (labels, annotations map[string]string) {
	labels, annotations = map[string]string{}, map[string]string{}
	if m != nil {
		for k, v := range m.Labels {
			if !strings.HasPrefix(k, v1alpha1.ReservedMetadataPrefix) {
				labels[k] = v
			}
		}
		for k, v := range m.Annotations {
			if !strings.HasPrefix(k, v1alpha1.ReservedMetadataPrefix) {
				annotations[k] = v
			}
		}
	}
	for k, v := range podLabels(run, shard, attempt) {
		labels[k] = v
	}
	return labels, annotations
}

// reservedEnv reports whether an environment variable is runledger's own.
func reservedEnv(name string) bool {
	return strings.HasPrefix(name, v1alpha1.ReservedEnvPrefix) || name == v1alpha1.EnvPodName
}

// userEnv is workerTemplate.env without runledger's own names (the API
// refuses them; a variable listed twice would take the last value).
func userEnv(env []corev1.EnvVar) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, e := range env {
		if !reservedEnv(e.Name) {
			out = append(out, e)
		}
	}
	return out
}

// userVolumes is workerTemplate.volumes without runledger's own name.
func userVolumes(vols []corev1.Volume) []corev1.Volume {
	var out []corev1.Volume
	for _, v := range vols {
		if v.Name != v1alpha1.WorkerTmpVolume {
			out = append(out, v)
		}
	}
	return out
}

// userVolumeMounts is workerTemplate.volumeMounts without runledger's own
// volume and paths.
func userVolumeMounts(mounts []corev1.VolumeMount) []corev1.VolumeMount {
	var out []corev1.VolumeMount
	for _, m := range mounts {
		if m.Name != v1alpha1.WorkerTmpVolume && m.MountPath != v1alpha1.WorkerTmpPath && m.MountPath != v1alpha1.TerminationMessagePath {
			out = append(out, m)
		}
	}
	return out
}

// buildWorkerPod is the pod of one attempt of one shard of a run. It is a
// pure function of its arguments.
func buildWorkerPod(run *v1alpha1.ProcessingRun, shard, attempt int32, floor v1alpha1.ItemCounts, opts PodOptions) (*corev1.Pod, error) {
	floorJSON, err := json.Marshal(floor)
	if err != nil {
		return nil, fmt.Errorf("encode counts floor: %w", err)
	}
	tmpl := run.Spec.WorkerTemplate
	if tmpl == nil {
		tmpl = &v1alpha1.WorkerTemplate{}
	}
	resources := defaultWorkerResources()
	if tmpl.Resources != nil {
		resources = *tmpl.Resources.DeepCopy()
	}
	serviceAccount := opts.ServiceAccountName
	if tmpl.ServiceAccountName != "" {
		serviceAccount = tmpl.ServiceAccountName
	}
	// Deep copies: the pod never shares memory with the run in the cache.
	tmpl = tmpl.DeepCopy()
	tmpl.Tolerations = append(tmpl.Tolerations, nodeLossTolerations(run, tmpl.Tolerations)...)
	ref := run.Spec.Database.SecretRef
	labels, annotations := podMetadata(run, shard, attempt, tmpl.Metadata)
	annotations[annotationCountsFloor] = string(floorJSON)

	pod := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			Name:        v1alpha1.PodName(run.Name, shard, attempt),
			Namespace:   run.Namespace,
			Labels:      labels,
			Annotations: annotations,
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(run, v1alpha1.GroupVersion.WithKind("ProcessingRun")),
			},
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			ServiceAccountName:            serviceAccount,
			AutomountServiceAccountToken:  ptr.To(true), // the worker reports through the API
			EnableServiceLinks:            ptr.To(false),
			TerminationGracePeriodSeconds: ptr.To[int64](workerGracePeriodSeconds),
			NodeSelector:                  tmpl.NodeSelector,
			Tolerations:                   tmpl.Tolerations,
			Affinity:                      tmpl.Affinity,
			TopologySpreadConstraints:     tmpl.TopologySpreadConstraints,
			PriorityClassName:             tmpl.PriorityClassName,
			RuntimeClassName:              tmpl.RuntimeClassName,
			ImagePullSecrets:              tmpl.ImagePullSecrets,
			SecurityContext: &corev1.PodSecurityContext{
				// No runAsUser/runAsGroup: the image's numeric user satisfies
				// runAsNonRoot, and clusters that assign user ids (OpenShift's
				// restricted SCC) refuse a fixed one.
				RunAsNonRoot:   ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{{
				Name:                     v1alpha1.WorkerContainerName,
				Image:                    workerImage(run, opts),
				ImagePullPolicy:          opts.ImagePullPolicy,
				Args:                     []string{v1alpha1.WorkerSubcommand},
				Env:                      append(workerEnv(run, shard, attempt, ref), userEnv(tmpl.Env)...),
				EnvFrom:                  tmpl.EnvFrom,
				Resources:                resources,
				TerminationMessagePath:   v1alpha1.TerminationMessagePath,
				TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
				SecurityContext: &corev1.SecurityContext{
					RunAsNonRoot:             ptr.To(true),
					Privileged:               ptr.To(false),
					AllowPrivilegeEscalation: ptr.To(false),
					ReadOnlyRootFilesystem:   ptr.To(true),
					Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
					SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
				},
				VolumeMounts: append([]corev1.VolumeMount{{Name: v1alpha1.WorkerTmpVolume, MountPath: v1alpha1.WorkerTmpPath}},
					userVolumeMounts(tmpl.VolumeMounts)...),
			}},
			Volumes: append([]corev1.Volume{{
				Name: v1alpha1.WorkerTmpVolume,
				VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
					SizeLimit: ptr.To(resource.MustParse("64Mi")),
				}},
			}}, userVolumes(tmpl.Volumes)...),
		},
	}
	if e := run.Spec.Effect; e != nil && e.Processor != nil {
		pod.Spec.InitContainers = []corev1.Container{processorContainer(e.Processor)}
	}
	return pod, nil
}

const (
	// processorStartupSeconds is how long a processor may take to listen
	// on its port (the startup probe's budget) before the kubelet restarts
	// it; processorMaxRestarts restarts before its worker ever started fail
	// the attempt (processorProblem).
	processorStartupSeconds = 60
	processorMaxRestarts    = 3
)

// processorContainer is the processor of spec.effect.processor as a native
// sidecar (an init container with restartPolicy Always): the kubelet starts
// the worker once its startup probe (a TCP connect to its port) passes, keeps
// it running, restarting it if it crashes, while the worker runs, and stops
// it when the worker exits. It runs as the pod's non-root user, without
// privileges; its root filesystem is its own (user code often writes to it).
func processorContainer(p *v1alpha1.ProcessorSpec) corev1.Container {
	port := p.ListenPort()
	tcp := corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(port)}}
	c := corev1.Container{
		Name:          v1alpha1.ProcessorContainerName,
		Image:         p.Image,
		Command:       slices.Clone(p.Command),
		Args:          slices.Clone(p.Args),
		RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		Ports:         []corev1.ContainerPort{{Name: "processor", ContainerPort: port, Protocol: corev1.ProtocolTCP}},
		StartupProbe: &corev1.Probe{ProbeHandler: tcp, PeriodSeconds: 1, TimeoutSeconds: 1,
			FailureThreshold: processorStartupSeconds},
		ReadinessProbe:           &corev1.Probe{ProbeHandler: tcp, PeriodSeconds: 5, TimeoutSeconds: 1, FailureThreshold: 3},
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			Privileged:               ptr.To(false),
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
	for i := range p.Env {
		c.Env = append(c.Env, *p.Env[i].DeepCopy())
	}
	if p.Resources != nil {
		c.Resources = *p.Resources.DeepCopy()
	}
	return c
}

// nodeLossTolerations: a worker pod tolerates a NotReady or unreachable
// node for nodeLostAfterSeconds, not the cluster's default 300 s, so the
// node controller evicts it when the controller replaces it (podOnLostNode).
// A toleration of the template for the same taint wins.
func nodeLossTolerations(run *v1alpha1.ProcessingRun, have []corev1.Toleration) []corev1.Toleration {
	seconds := int64(run.Spec.NodeLostAfter().Seconds())
	var out []corev1.Toleration
	for _, key := range []string{corev1.TaintNodeNotReady, corev1.TaintNodeUnreachable} {
		if slices.ContainsFunc(have, func(t corev1.Toleration) bool { return t.Key == key }) {
			continue
		}
		out = append(out, corev1.Toleration{Key: key, Operator: corev1.TolerationOpExists,
			Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To(seconds)})
	}
	return out
}

// workerEnv is the worker's environment: the run's identity, its shard and
// attempt, and the DSN straight from the Secret (never an argument).
func workerEnv(run *v1alpha1.ProcessingRun, shard, attempt int32, ref v1alpha1.SecretKeyRef) []corev1.EnvVar {
	return []corev1.EnvVar{
		{Name: v1alpha1.EnvRunNamespace, Value: run.Namespace},
		{Name: v1alpha1.EnvRunName, Value: run.Name},
		{Name: v1alpha1.EnvRunUID, Value: string(run.UID)},
		{Name: v1alpha1.EnvShard, Value: strconv.Itoa(int(shard))},
		{Name: v1alpha1.EnvShards, Value: strconv.Itoa(int(run.Spec.ShardCount()))},
		{Name: v1alpha1.EnvAttempt, Value: strconv.Itoa(int(attempt))},
		{Name: v1alpha1.EnvPodName, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.name"},
		}},
		{Name: v1alpha1.EnvPodUID, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.uid"},
		}},
		{Name: v1alpha1.EnvDatabaseURL, ValueFrom: &corev1.EnvVarSource{
			SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name},
				Key:                  ref.Key,
				Optional:             ptr.To(false),
			},
		}},
	}
}
