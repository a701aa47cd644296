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
	r := corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("100m"),
			corev1.ResourceMemory: resource.MustParse("128Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("256Mi"),
		},
	}
	withEphemeralStorage(&r)
	return r
}

// withEphemeralStorage sets the default ephemeral-storage request and limit
// of a runledger container (its logs and its /tmp, an emptyDir of at most
// 64Mi), unless r already has its own: a container without them may fill
// the node's disk, and the kubelet evicts pods over their limit rather than
// the node's other pods.
func withEphemeralStorage(r *corev1.ResourceRequirements) {
	if _, ok := r.Requests[corev1.ResourceEphemeralStorage]; !ok {
		if r.Requests == nil {
			r.Requests = corev1.ResourceList{}
		}
		r.Requests[corev1.ResourceEphemeralStorage] = resource.MustParse("64Mi")
	}
	if _, ok := r.Limits[corev1.ResourceEphemeralStorage]; !ok {
		if r.Limits == nil {
			r.Limits = corev1.ResourceList{}
		}
		r.Limits[corev1.ResourceEphemeralStorage] = resource.MustParse("256Mi")
	}
}

// workerImage is the image of a run's worker pods.
func workerImage(run *v1alpha1.ProcessingRun, opts PodOptions) string {
	if t := run.Spec.WorkerTemplate; t != nil && t.Image != "" {
		return t.Image
	}
	return opts.Image
}

// workerCommand is the worker container's command and arguments: the
// worker binary of the manager's image (v1alpha1.WorkerBinary, a shard's
// memory without the manager's libraries); for a run that names its own
// image, which may be an earlier release's without that binary, the
// image's entrypoint (the runledger binary) with the worker subcommand.
func workerCommand(tmpl *v1alpha1.WorkerTemplate) (command, args []string) {
	if tmpl.Image != "" {
		return nil, []string{v1alpha1.WorkerSubcommand}
	}
	return []string{v1alpha1.WorkerBinary}, nil
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

// reservedVolume reports whether a volume name is runledger's own.
func reservedVolume(name string) bool {
	switch name {
	case v1alpha1.WorkerTmpVolume, v1alpha1.ProcessorTmpVolume, v1alpha1.WorkerTokenVolume, v1alpha1.WorkerBatchVolume,
		v1alpha1.WorkerRunVolume:
		return true
	}
	return false
}

// reservedMountPath reports whether a mount path is runledger's own.
func reservedMountPath(path string) bool {
	return path == v1alpha1.WorkerTmpPath || path == v1alpha1.TerminationMessagePath ||
		strings.HasPrefix(path, "/var/run/runledger") || strings.HasPrefix(path, v1alpha1.WorkerTokenPath)
}

// userVolumes is workerTemplate.volumes without runledger's own names.
func userVolumes(vols []corev1.Volume) []corev1.Volume {
	var out []corev1.Volume
	for _, v := range vols {
		if !reservedVolume(v.Name) {
			out = append(out, v)
		}
	}
	return out
}

// userVolumeMounts is workerTemplate.volumeMounts without runledger's own
// volumes and paths.
func userVolumeMounts(mounts []corev1.VolumeMount) []corev1.VolumeMount {
	var out []corev1.VolumeMount
	for _, m := range mounts {
		if !reservedVolume(m.Name) && !reservedMountPath(m.MountPath) {
			out = append(out, m)
		}
	}
	return out
}

// tokenVolume is the worker's ServiceAccount token, projected: bound to the
// pod (the admission policy reads the pod's name and UID from it), renewed
// by the kubelet, with the cluster's CA and the namespace beside it, as the
// ServiceAccount admission plugin would mount it, but into the worker
// container alone.
func tokenVolume() corev1.Volume {
	return corev1.Volume{Name: v1alpha1.WorkerTokenVolume, VolumeSource: corev1.VolumeSource{
		Projected: &corev1.ProjectedVolumeSource{
			DefaultMode: ptr.To[int32](0o444),
			Sources: []corev1.VolumeProjection{
				{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
					Path: "token", ExpirationSeconds: ptr.To[int64](v1alpha1.WorkerTokenExpirationSeconds)}},
				{ConfigMap: &corev1.ConfigMapProjection{
					LocalObjectReference: corev1.LocalObjectReference{Name: "kube-root-ca.crt"},
					Items:                []corev1.KeyToPath{{Key: "ca.crt", Path: "ca.crt"}}}},
				{DownwardAPI: &corev1.DownwardAPIProjection{Items: []corev1.DownwardAPIVolumeFile{{
					Path: "namespace", FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: "metadata.namespace"}}}}},
			},
		},
	}}
}

func tokenMount() corev1.VolumeMount {
	return corev1.VolumeMount{Name: v1alpha1.WorkerTokenVolume, MountPath: v1alpha1.WorkerTokenPath, ReadOnly: true}
}

// batchVolume is spec.batch.configMapRef's key as one file: the kubelet
// reads the ConfigMap, so workers need no right to read ConfigMaps. The
// controller checked that it exists before creating pods; one deleted since
// leaves the file missing (optional), which the worker reports as bad input.
func batchVolume(ref *v1alpha1.ConfigMapKeyRef) corev1.Volume {
	return configMapKeyVolume(v1alpha1.WorkerBatchVolume, ref, v1alpha1.WorkerBatchFile)
}

// configMapKeyVolume is the key of ref as the file named file. Optional:
// a key deleted meanwhile is the worker's clear bad input, not a pod that
// never starts.
func configMapKeyVolume(name string, ref *v1alpha1.ConfigMapKeyRef, file string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
		ConfigMap: &corev1.ConfigMapVolumeSource{
			LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name},
			Items:                []corev1.KeyToPath{{Key: ref.Key, Path: file}},
			DefaultMode:          ptr.To[int32](0o444),
			Optional:             ptr.To(true),
		},
	}}
}

// withObjectSource gives the worker container alone (never the processor)
// what a spec.batch.object run reads the store with: the credentials
// Secret's keys as the AWS chain's environment variables (the session
// token optional), and the CA bundle's key as a file.
func withObjectSource(pod *corev1.Pod, obj *v1alpha1.ObjectSource) {
	c := &pod.Spec.Containers[0]
	if ref := obj.CredentialsSecretRef; ref != nil {
		for i, key := range v1alpha1.ObjectCredentialKeys {
			c.Env = append(c.Env, corev1.EnvVar{Name: key, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: ref.Name},
				Key:                  key,
				Optional:             ptr.To(i == len(v1alpha1.ObjectCredentialKeys)-1),
			}}})
		}
	}
	if ref := obj.CAConfigMapRef; ref != nil {
		pod.Spec.Volumes = append(pod.Spec.Volumes, configMapKeyVolume(v1alpha1.WorkerObjectCAVolume, ref, v1alpha1.WorkerObjectCAFile))
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.WorkerObjectCAVolume, MountPath: v1alpha1.WorkerObjectCAPath, ReadOnly: true})
		c.Env = append(c.Env, corev1.EnvVar{Name: v1alpha1.EnvObjectCAFile, Value: v1alpha1.WorkerObjectCAPath + "/" + v1alpha1.WorkerObjectCAFile})
	}
}

// workerPodParams tells one worker pod of a run from another.
type workerPodParams struct {
	shard, attempt int32
	// floor is the counts floor the pod starts from (its annotation).
	floor v1alpha1.ItemCounts
	// runFile is the run's file the pod mounts, written before the pass's
	// first create (ensureRunConfigMap). It is zero only for the template
	// of the run's Kueue Workload (buildWorkload), from which no pod is
	// created: that template mounts no run's file.
	runFile runFile
	// placement is what Kueue admitted the run onto, nil outside Kueue.
	placement *placement
}

// buildWorkerPod is the whole pod of one attempt of one shard of a run: its
// run's file (withRunFile) and admitted placement (applyPlacement) included.
// It is a pure function of its arguments.
func buildWorkerPod(run *v1alpha1.ProcessingRun, in workerPodParams, opts PodOptions) (*corev1.Pod, error) {
	shard, attempt := in.shard, in.attempt
	floorJSON, err := json.Marshal(in.floor)
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
		withEphemeralStorage(&resources)
	}
	serviceAccount := opts.ServiceAccountName
	if tmpl.ServiceAccountName != "" {
		serviceAccount = tmpl.ServiceAccountName
	}
	// Deep copies: the pod never shares memory with the run in the cache.
	tmpl = tmpl.DeepCopy()
	tmpl.Tolerations = append(tmpl.Tolerations, nodeLossTolerations(run, tmpl.Tolerations)...)
	ref := run.Spec.Database.SecretRef
	command, args := workerCommand(tmpl)
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
			RestartPolicy:      corev1.RestartPolicyNever,
			ServiceAccountName: serviceAccount,
			// The worker container alone mounts a token (tokenVolume).
			AutomountServiceAccountToken:  ptr.To(false),
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
				Command:                  command,
				Args:                     args,
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
				VolumeMounts: append([]corev1.VolumeMount{{Name: v1alpha1.WorkerTmpVolume, MountPath: v1alpha1.WorkerTmpPath}, tokenMount()},
					userVolumeMounts(tmpl.VolumeMounts)...),
			}},
			Volumes: append([]corev1.Volume{tmpVolume(v1alpha1.WorkerTmpVolume), tokenVolume()}, userVolumes(tmpl.Volumes)...),
		},
	}
	if ref := run.Spec.Batch.ConfigMapRef; ref != nil {
		pod.Spec.Volumes = append(pod.Spec.Volumes, batchVolume(ref))
		c := &pod.Spec.Containers[0]
		c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.WorkerBatchVolume, MountPath: v1alpha1.WorkerBatchPath, ReadOnly: true})
		c.Env = append(c.Env, corev1.EnvVar{Name: v1alpha1.EnvBatchFile, Value: v1alpha1.WorkerBatchPath + "/" + v1alpha1.WorkerBatchFile})
	}
	if obj := run.Spec.Batch.Object; obj != nil {
		withObjectSource(pod, obj)
	}
	if e := run.Spec.Effect; e != nil && e.Processor != nil {
		pod.Spec.InitContainers = []corev1.Container{processorContainer(e.Processor)}
		pod.Spec.Volumes = append(pod.Spec.Volumes, tmpVolume(v1alpha1.ProcessorTmpVolume))
	}
	if in.runFile != (runFile{}) {
		withRunFile(pod, in.runFile)
	}
	applyPlacement(pod, in.placement)
	return pod, nil
}

// tmpVolume is a container's /tmp: an emptyDir of at most 64Mi.
func tmpVolume(name string) corev1.Volume {
	return corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
		SizeLimit: ptr.To(resource.MustParse("64Mi")),
	}}}
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
// privileges, with a read-only root filesystem and a /tmp of its own unless
// the run says otherwise, and without a ServiceAccount token unless the run
// asks for one.
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
			ReadOnlyRootFilesystem:   ptr.To(p.ReadOnlyRoot()),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: v1alpha1.ProcessorTmpVolume, MountPath: v1alpha1.WorkerTmpPath}},
	}
	if p.MountsToken() {
		c.VolumeMounts = append(c.VolumeMounts, tokenMount())
	}
	for i := range p.Env {
		c.Env = append(c.Env, *p.Env[i].DeepCopy())
	}
	if p.Resources != nil {
		c.Resources = *p.Resources.DeepCopy()
	}
	withEphemeralStorage(&c.Resources)
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
