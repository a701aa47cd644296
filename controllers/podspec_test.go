package controllers

import (
	"encoding/json"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/runledger/runledger/api/v1alpha1"
)

func testRun() *v1alpha1.ProcessingRun {
	return &v1alpha1.ProcessingRun{
		ObjectMeta: metav1.ObjectMeta{Name: "invoices", Namespace: "billing", UID: "uid-1", Generation: 1},
		Spec: v1alpha1.ProcessingRunSpec{
			Database: v1alpha1.DatabaseSpec{SecretRef: v1alpha1.SecretKeyRef{Name: "ledger-db", Key: "dsn"}},
			Batch:    v1alpha1.BatchSpec{Query: "select 'a' as entity, '1' as occurrence"},
			Workers:  4,
		},
	}
}

func envMap(t *testing.T, c corev1.Container) map[string]corev1.EnvVar {
	t.Helper()
	m := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		_, dup := m[e.Name]
		require.False(t, dup, "env %s twice", e.Name)
		m[e.Name] = e
	}
	return m
}

func TestBuildWorkerPod(t *testing.T) {
	opts := PodOptions{Image: "registry.example/runledger:v1", ServiceAccountName: "runledger-worker"}
	tests := []struct {
		name    string
		mutate  func(*v1alpha1.ProcessingRun)
		shard   int32
		attempt int32
		floor   v1alpha1.ItemCounts
		runFile runFile
		place   *placement
		check   func(t *testing.T, pod *corev1.Pod)
	}{
		{
			name: "the run's file and the admitted placement: the whole pod in one call", shard: 2, attempt: 1,
			runFile: runFile{configMap: "runledger-invoices-0123456789", digest: "0123456789abcdef"},
			place: &placement{nodeSelector: map[string]string{"pool": "spot"},
				tolerations: []corev1.Toleration{{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}},
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{NodeSelector: map[string]string{"disk": "ssd"}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				require.Equal(t, "invoices-2-1", pod.Name)
				v := pod.Spec.Volumes[len(pod.Spec.Volumes)-1]
				require.Equal(t, v1alpha1.WorkerRunVolume, v.Name)
				require.Equal(t, "runledger-invoices-0123456789", v.ConfigMap.Name)
				env := envMap(t, pod.Spec.Containers[0])
				require.Equal(t, "0123456789abcdef", env[v1alpha1.EnvRunDigest].Value)
				require.Equal(t, map[string]string{"disk": "ssd", "pool": "spot"}, pod.Spec.NodeSelector)
				require.Contains(t, pod.Spec.Tolerations, corev1.Toleration{Key: "spot", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule})
			},
		},
		{
			name: "the Workload's template: no run's file, no placement",
			check: func(t *testing.T, pod *corev1.Pod) {
				require.NotContains(t, volumeNames(pod.Spec.Volumes), v1alpha1.WorkerRunVolume)
				require.NotContains(t, envMap(t, pod.Spec.Containers[0]), v1alpha1.EnvRunDigest)
				require.Empty(t, pod.Spec.NodeSelector)
			},
		},
		{
			name: "processor: a native sidecar with its port probed, the spec's fields copied",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{
					Image: "registry.example/mailer:1", Command: []string{"/mailer"}, Args: []string{"-v"},
					Env:       []corev1.EnvVar{{Name: "SMTP_HOST", Value: "smtp"}},
					Resources: &corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")}},
					Port:      9000, Path: "/v1/items",
				}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				require.Len(t, pod.Spec.InitContainers, 1)
				c := pod.Spec.InitContainers[0]
				require.Equal(t, v1alpha1.ProcessorContainerName, c.Name)
				require.Equal(t, "registry.example/mailer:1", c.Image)
				require.Equal(t, []string{"/mailer"}, c.Command)
				require.Equal(t, []string{"-v"}, c.Args)
				require.Equal(t, []corev1.EnvVar{{Name: "SMTP_HOST", Value: "smtp"}}, c.Env)
				require.Equal(t, resource.MustParse("64Mi"), c.Resources.Limits[corev1.ResourceMemory])
				require.Equal(t, corev1.ContainerRestartPolicyAlways, *c.RestartPolicy, "a native sidecar")
				require.Equal(t, int32(9000), c.Ports[0].ContainerPort)
				require.Equal(t, int32(9000), c.StartupProbe.TCPSocket.Port.IntVal, "the worker starts once the processor listens")
				require.Equal(t, int32(processorStartupSeconds), c.StartupProbe.FailureThreshold*c.StartupProbe.PeriodSeconds)
				require.Equal(t, int32(9000), c.ReadinessProbe.TCPSocket.Port.IntVal)
				require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
				require.Equal(t, []corev1.Capability{"ALL"}, c.SecurityContext.Capabilities.Drop)
				require.Len(t, pod.Spec.Containers, 1, "the worker stays the one regular container")
				require.Equal(t, corev1.RestartPolicyNever, pod.Spec.RestartPolicy)
			},
		},
		{
			name: "processor with defaults: port 8080",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{Image: "mailer"}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.InitContainers[0]
				require.Equal(t, int32(v1alpha1.DefaultProcessorPort), c.Ports[0].ContainerPort)
				require.Nil(t, c.Command)
				require.Equal(t, corev1.ResourceRequirements{
					Requests: corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("64Mi")},
					Limits:   corev1.ResourceList{corev1.ResourceEphemeralStorage: resource.MustParse("256Mi")},
				}, c.Resources, "ephemeral storage bounded, nothing else guessed")
				require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem, "read-only by default")
				require.Equal(t, []corev1.VolumeMount{{Name: v1alpha1.ProcessorTmpVolume, MountPath: "/tmp"}}, c.VolumeMounts,
					"its own /tmp, no ServiceAccount token")
				require.False(t, *pod.Spec.AutomountServiceAccountToken)
				require.Equal(t, []string{"tmp", v1alpha1.WorkerTokenVolume, v1alpha1.ProcessorTmpVolume}, volumeNames(pod.Spec.Volumes))
			},
		},
		{
			name: "processor that asks for the token and a writable root filesystem",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{Image: "mailer",
					AutomountServiceAccountToken: ptr.To(true), ReadOnlyRootFilesystem: ptr.To(false)}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.InitContainers[0]
				require.False(t, *c.SecurityContext.ReadOnlyRootFilesystem)
				require.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.WorkerTokenVolume,
					MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true})
				require.False(t, *pod.Spec.AutomountServiceAccountToken, "the pod still mounts nothing by itself")
			},
		},
		{
			name: "configMapRef batch: the key mounted as a file, no API read",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Batch = v1alpha1.BatchSpec{ConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "items", Key: "batch.jsonl"}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				require.Equal(t, "/var/run/runledger/batch/items.jsonl", envMap(t, c)[v1alpha1.EnvBatchFile].Value)
				require.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.WorkerBatchVolume, MountPath: "/var/run/runledger/batch", ReadOnly: true})
				v := pod.Spec.Volumes[len(pod.Spec.Volumes)-1]
				require.Equal(t, v1alpha1.WorkerBatchVolume, v.Name)
				require.Equal(t, "items", v.ConfigMap.Name)
				require.Equal(t, []corev1.KeyToPath{{Key: "batch.jsonl", Path: "items.jsonl"}}, v.ConfigMap.Items)
				require.True(t, *v.ConfigMap.Optional, "a ConfigMap deleted later fails the shard as bad input, never a pod stuck in ContainerCreating")
			},
		},
		{
			name: "object batch: the credentials and the CA to the worker container alone, never the processor",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Batch = v1alpha1.BatchSpec{Object: &v1alpha1.ObjectSource{Endpoint: "https://minio.storage:9000", Bucket: "exports", Prefix: "june/",
					Format: v1alpha1.ObjectCSV, CredentialsSecretRef: &v1alpha1.LocalSecretRef{Name: "exports-reader"},
					CAConfigMapRef: &v1alpha1.ConfigMapKeyRef{Name: "minio-ca", Key: "ca.pem"}}}
				r.Spec.Effect = &v1alpha1.EffectSpec{Processor: &v1alpha1.ProcessorSpec{Image: "registry.example/proc:v1"}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				env := envMap(t, c)
				for i, key := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} {
					ref := env[key].ValueFrom.SecretKeyRef
					require.NotNil(t, ref, key)
					require.Equal(t, "exports-reader", ref.Name)
					require.Equal(t, key, ref.Key)
					require.Equal(t, i == 2, *ref.Optional, "only the session token is optional")
				}
				require.Equal(t, "/var/run/runledger/object-ca/ca.crt", env[v1alpha1.EnvObjectCAFile].Value)
				require.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.WorkerObjectCAVolume, MountPath: "/var/run/runledger/object-ca", ReadOnly: true})
				i := slices.IndexFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == v1alpha1.WorkerObjectCAVolume })
				require.GreaterOrEqual(t, i, 0, "the CA's volume")
				v := pod.Spec.Volumes[i]
				require.Equal(t, "minio-ca", v.ConfigMap.Name)
				require.Equal(t, []corev1.KeyToPath{{Key: "ca.pem", Path: "ca.crt"}}, v.ConfigMap.Items)
				require.Len(t, pod.Spec.InitContainers, 1)
				proc := pod.Spec.InitContainers[0]
				for _, e := range proc.Env {
					require.NotContains(t, e.Name, "AWS_", "the processor gets no store credential")
				}
				require.Empty(t, proc.EnvFrom)
				for _, m := range proc.VolumeMounts {
					require.NotEqual(t, v1alpha1.WorkerObjectCAVolume, m.Name)
				}
			},
		},
		{
			name: "object batch with the pod's own identity: no credentials given",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Batch = v1alpha1.BatchSpec{Object: &v1alpha1.ObjectSource{Bucket: "exports", Key: "june.jsonl", Format: v1alpha1.ObjectJSONLines}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				env := envMap(t, pod.Spec.Containers[0])
				require.NotContains(t, env, "AWS_ACCESS_KEY_ID")
				require.NotContains(t, env, v1alpha1.EnvObjectCAFile)
			},
		},
		{
			name: "sql effect: no sidecar",
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.Effect = &v1alpha1.EffectSpec{SQL: "SELECT 1"}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				require.Empty(t, pod.Spec.InitContainers)
			},
		},
		{
			name: "defaults", shard: 2, attempt: 0,
			check: func(t *testing.T, pod *corev1.Pod) {
				require.Equal(t, "invoices-2-0", pod.Name)
				require.Equal(t, "billing", pod.Namespace)
				require.Equal(t, corev1.RestartPolicyNever, pod.Spec.RestartPolicy)
				require.Equal(t, "runledger-worker", pod.Spec.ServiceAccountName)
				require.Len(t, pod.Spec.Containers, 1)
				c := pod.Spec.Containers[0]
				require.Equal(t, "registry.example/runledger:v1", c.Image)
				require.Equal(t, []string{"/runledger-worker"}, c.Command, "the manager's image's worker binary")
				require.Empty(t, c.Args)
				require.Equal(t, corev1.TerminationMessageFallbackToLogsOnError, c.TerminationMessagePolicy)
				require.Equal(t, "/dev/termination-log", c.TerminationMessagePath)
				require.Equal(t, resource.MustParse("128Mi"), c.Resources.Requests[corev1.ResourceMemory])
				require.Equal(t, resource.MustParse("256Mi"), c.Resources.Limits[corev1.ResourceMemory])
				require.Equal(t, resource.MustParse("64Mi"), c.Resources.Requests[corev1.ResourceEphemeralStorage])
				require.Equal(t, resource.MustParse("256Mi"), c.Resources.Limits[corev1.ResourceEphemeralStorage])
				require.Nil(t, pod.Spec.NodeSelector)
				// Only the worker container has a token: projected, bound to
				// the pod, at the path in-cluster clients read.
				require.False(t, *pod.Spec.AutomountServiceAccountToken)
				require.Contains(t, c.VolumeMounts, corev1.VolumeMount{Name: v1alpha1.WorkerTokenVolume,
					MountPath: "/var/run/secrets/kubernetes.io/serviceaccount", ReadOnly: true})
				tok := pod.Spec.Volumes[1]
				require.Equal(t, v1alpha1.WorkerTokenVolume, tok.Name)
				require.Equal(t, "token", tok.Projected.Sources[0].ServiceAccountToken.Path)
				require.Equal(t, int64(v1alpha1.WorkerTokenExpirationSeconds), *tok.Projected.Sources[0].ServiceAccountToken.ExpirationSeconds)
				require.Equal(t, "kube-root-ca.crt", tok.Projected.Sources[1].ConfigMap.Name)
				require.Equal(t, "metadata.namespace", tok.Projected.Sources[2].DownwardAPI.Items[0].FieldRef.FieldPath)
				require.NotContains(t, envMap(t, c), v1alpha1.EnvBatchFile, "inline items: nothing mounted")
				require.Equal(t, []corev1.Toleration{
					{Key: corev1.TaintNodeNotReady, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](60)},
					{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](60)},
				}, pod.Spec.Tolerations, "a lost node's pods are evicted after nodeLostAfterSeconds (default), not 300 s")
			},
		},
		{
			name: "labels and owner", shard: 1, attempt: 3,
			check: func(t *testing.T, pod *corev1.Pod) {
				require.Equal(t, "invoices-1-3", pod.Name)
				require.Equal(t, map[string]string{
					"app.kubernetes.io/name":           "runledger",
					"app.kubernetes.io/component":      "worker",
					"app.kubernetes.io/instance":       "invoices",
					"app.kubernetes.io/managed-by":     "runledger-controller",
					"processing.runledger.dev/run":     "invoices",
					"processing.runledger.dev/run-uid": "uid-1",
					"processing.runledger.dev/shard":   "1",
					"processing.runledger.dev/attempt": "3",
				}, pod.Labels)
				require.Len(t, pod.OwnerReferences, 1)
				ref := pod.OwnerReferences[0]
				require.Equal(t, "processing.runledger.dev/v1alpha1", ref.APIVersion)
				require.Equal(t, "ProcessingRun", ref.Kind)
				require.Equal(t, "invoices", ref.Name)
				require.EqualValues(t, "uid-1", ref.UID)
				require.True(t, *ref.Controller)
				require.True(t, *ref.BlockOwnerDeletion)
			},
		},
		{
			name: "environment: identity, shard, attempt, DSN from the Secret only", shard: 3, attempt: 2,
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				env := envMap(t, c)
				require.Equal(t, "billing", env[v1alpha1.EnvRunNamespace].Value)
				require.Equal(t, "invoices", env[v1alpha1.EnvRunName].Value)
				require.Equal(t, "uid-1", env[v1alpha1.EnvRunUID].Value)
				require.Equal(t, "3", env[v1alpha1.EnvShard].Value)
				require.Equal(t, "4", env[v1alpha1.EnvShards].Value)
				require.Equal(t, "2", env[v1alpha1.EnvAttempt].Value)
				require.Equal(t, "metadata.name", env[v1alpha1.EnvPodName].ValueFrom.FieldRef.FieldPath)
				dsn := env[v1alpha1.EnvDatabaseURL]
				require.Empty(t, dsn.Value, "the DSN is never a literal")
				require.Equal(t, "ledger-db", dsn.ValueFrom.SecretKeyRef.Name)
				require.Equal(t, "dsn", dsn.ValueFrom.SecretKeyRef.Key)
				require.False(t, *dsn.ValueFrom.SecretKeyRef.Optional)
				for _, a := range append(append([]string{}, c.Command...), c.Args...) {
					require.NotContains(t, a, "ledger-db")
				}
			},
		},
		{
			name: "locked-down security context", shard: 0, attempt: 0,
			check: func(t *testing.T, pod *corev1.Pod) {
				psc := pod.Spec.SecurityContext
				require.True(t, *psc.RunAsNonRoot)
				require.Nil(t, psc.RunAsUser, "the image's numeric user, or the one the cluster assigns")
				require.Nil(t, psc.RunAsGroup)
				require.Nil(t, pod.Spec.Containers[0].SecurityContext.RunAsUser)
				require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, psc.SeccompProfile.Type)
				sc := pod.Spec.Containers[0].SecurityContext
				require.True(t, *sc.RunAsNonRoot)
				require.False(t, *sc.Privileged)
				require.False(t, *sc.AllowPrivilegeEscalation)
				require.True(t, *sc.ReadOnlyRootFilesystem)
				require.Equal(t, []corev1.Capability{"ALL"}, sc.Capabilities.Drop)
				require.Empty(t, sc.Capabilities.Add)
				require.Equal(t, corev1.SeccompProfileTypeRuntimeDefault, sc.SeccompProfile.Type)
				require.False(t, *pod.Spec.EnableServiceLinks)
				require.False(t, pod.Spec.HostNetwork)
				require.False(t, pod.Spec.HostPID)
			},
		},
		{
			name: "worker template overrides", shard: 0, attempt: 1,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{
					Image:              "other.example/runledger@sha256:" + sha,
					ServiceAccountName: "custom-sa",
					NodeSelector:       map[string]string{"pool": "batch"},
					Tolerations: []corev1.Toleration{{Key: "batch", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule},
						{Key: corev1.TaintNodeUnreachable, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
					Resources: &corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2")},
					},
				}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				require.Equal(t, "other.example/runledger@sha256:"+sha, c.Image)
				require.Empty(t, c.Command, "the image's own entrypoint: an earlier release's image has no worker binary")
				require.Equal(t, []string{"worker"}, c.Args)
				require.Equal(t, "custom-sa", pod.Spec.ServiceAccountName)
				require.Equal(t, map[string]string{"pool": "batch"}, pod.Spec.NodeSelector)
				require.Len(t, pod.Spec.Tolerations, 3, "the template's two, and not-ready for the run's nodeLostAfterSeconds")
				require.Equal(t, corev1.TaintNodeNotReady, pod.Spec.Tolerations[2].Key)
				require.Equal(t, ptr.To[int64](60), pod.Spec.Tolerations[2].TolerationSeconds)
				require.Equal(t, resource.MustParse("2"), c.Resources.Requests[corev1.ResourceCPU])
				require.NotContains(t, c.Resources.Limits, corev1.ResourceMemory, "the run's resources replace the defaults")
			},
		},
		{
			name: "worker template without an image: the manager's image, its worker binary", shard: 0, attempt: 0,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{ServiceAccountName: "custom-sa", NodeSelector: map[string]string{"pool": "batch"}}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				c := pod.Spec.Containers[0]
				require.Equal(t, "registry.example/runledger:v1", c.Image)
				require.Equal(t, []string{v1alpha1.WorkerBinary}, c.Command)
				require.Empty(t, c.Args)
			},
		},
		{
			name: "production fields of the Job pod template", shard: 0, attempt: 0,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{
					Metadata: &v1alpha1.WorkerPodMetadata{
						Labels:      map[string]string{"team": "billing"},
						Annotations: map[string]string{"sidecar.istio.io/inject": "false"},
					},
					ImagePullSecrets: []corev1.LocalObjectReference{{Name: "regcred"}},
					Env:              []corev1.EnvVar{{Name: "PGSSLROOTCERT", Value: "/etc/pg-ca/ca.crt"}},
					EnvFrom:          []corev1.EnvFromSource{{ConfigMapRef: &corev1.ConfigMapEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "pg-opts"}}}},
					Volumes: []corev1.Volume{{Name: "pg-ca", VolumeSource: corev1.VolumeSource{
						Secret: &corev1.SecretVolumeSource{SecretName: "pg-ca"}}}},
					VolumeMounts: []corev1.VolumeMount{{Name: "pg-ca", MountPath: "/etc/pg-ca", ReadOnly: true}},
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{
						RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
							MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "pool", Operator: corev1.NodeSelectorOpIn, Values: []string{"batch"}}},
						}}},
					}},
					TopologySpreadConstraints: []corev1.TopologySpreadConstraint{{
						MaxSkew: 1, TopologyKey: "topology.kubernetes.io/zone", WhenUnsatisfiable: corev1.ScheduleAnyway,
						LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{v1alpha1.LabelRun: "invoices"}},
					}},
					PriorityClassName: "batch-low",
					RuntimeClassName:  ptr.To("gvisor"),
				}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				require.Equal(t, "billing", pod.Labels["team"])
				require.Equal(t, "invoices", pod.Labels[v1alpha1.LabelRun], "the controller's labels stay")
				require.Equal(t, "false", pod.Annotations["sidecar.istio.io/inject"])
				require.Contains(t, pod.Annotations, annotationCountsFloor)
				require.Equal(t, []corev1.LocalObjectReference{{Name: "regcred"}}, pod.Spec.ImagePullSecrets)
				c := pod.Spec.Containers[0]
				env := envMap(t, c)
				require.Equal(t, "/etc/pg-ca/ca.crt", env["PGSSLROOTCERT"].Value)
				require.NotNil(t, env[v1alpha1.EnvDatabaseURL].ValueFrom.SecretKeyRef)
				require.Equal(t, v1alpha1.EnvRunNamespace, c.Env[0].Name, "runledger's variables come first: the run's may refer to them")
				require.Equal(t, "pg-opts", c.EnvFrom[0].ConfigMapRef.Name)
				require.Equal(t, []string{"tmp", v1alpha1.WorkerTokenVolume, "pg-ca"}, volumeNames(pod.Spec.Volumes))
				require.Equal(t, "pg-ca", pod.Spec.Volumes[2].Secret.SecretName)
				require.Equal(t, []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}, tokenMount(), {Name: "pg-ca", MountPath: "/etc/pg-ca", ReadOnly: true}}, c.VolumeMounts)
				require.Equal(t, "batch", pod.Spec.Affinity.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms[0].MatchExpressions[0].Values[0])
				require.Equal(t, "topology.kubernetes.io/zone", pod.Spec.TopologySpreadConstraints[0].TopologyKey)
				require.Equal(t, "batch-low", pod.Spec.PriorityClassName)
				require.Equal(t, "gvisor", *pod.Spec.RuntimeClassName)
				// The template adds nothing to the security context.
				require.True(t, *c.SecurityContext.ReadOnlyRootFilesystem)
				require.False(t, *c.SecurityContext.AllowPrivilegeEscalation)
				require.True(t, *pod.Spec.SecurityContext.RunAsNonRoot)
			},
		},
		{
			// The API refuses these (CEL); the builder never lets them through
			// either, e.g. for a run stored before the rules existed.
			name: "runledger's own names cannot be overridden", shard: 1, attempt: 2,
			mutate: func(r *v1alpha1.ProcessingRun) {
				r.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{
					Metadata: &v1alpha1.WorkerPodMetadata{
						Labels: map[string]string{
							v1alpha1.LabelRun: "other", v1alpha1.LabelShard: "9", labelAppManagedBy: "me",
							v1alpha1.ReservedMetadataPrefix + "extra": "x",
						},
						Annotations: map[string]string{annotationCountsFloor: `{"completed":999}`},
					},
					Env: []corev1.EnvVar{
						{Name: v1alpha1.EnvDatabaseURL, Value: "postgres://attacker@evil/db"},
						{Name: v1alpha1.EnvShard, Value: "0"},
						{Name: v1alpha1.EnvPodName, Value: "x"},
						{Name: "OK", Value: "1"},
					},
					Volumes: []corev1.Volume{{Name: "tmp", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}},
						{Name: v1alpha1.WorkerTokenVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}},
						{Name: v1alpha1.WorkerRunVolume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}},
					VolumeMounts: []corev1.VolumeMount{{Name: "tmp", MountPath: "/x"}, {Name: "other", MountPath: "/tmp"}, {Name: "other", MountPath: v1alpha1.TerminationMessagePath},
						{Name: "other", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}, {Name: "other", MountPath: "/var/run/runledger/x"}},
				}
			},
			check: func(t *testing.T, pod *corev1.Pod) {
				require.Equal(t, "invoices", pod.Labels[v1alpha1.LabelRun])
				require.Equal(t, "1", pod.Labels[v1alpha1.LabelShard])
				require.Equal(t, "runledger-controller", pod.Labels[labelAppManagedBy])
				require.NotContains(t, pod.Labels, v1alpha1.ReservedMetadataPrefix+"extra")
				require.Equal(t, v1alpha1.ItemCounts{}, parseFloor(pod.Annotations))
				c := pod.Spec.Containers[0]
				env := envMap(t, c) // fails on a name listed twice
				require.Empty(t, env[v1alpha1.EnvDatabaseURL].Value)
				require.Equal(t, "ledger-db", env[v1alpha1.EnvDatabaseURL].ValueFrom.SecretKeyRef.Name)
				require.Equal(t, "1", env[v1alpha1.EnvShard].Value)
				require.NotNil(t, env[v1alpha1.EnvPodName].ValueFrom)
				require.Equal(t, "1", env["OK"].Value)
				require.Equal(t, []string{"tmp", v1alpha1.WorkerTokenVolume}, volumeNames(pod.Spec.Volumes))
				require.NotNil(t, pod.Spec.Volumes[0].EmptyDir)
				require.NotNil(t, pod.Spec.Volumes[1].Projected)
				require.Equal(t, []corev1.VolumeMount{{Name: "tmp", MountPath: "/tmp"}, tokenMount()}, c.VolumeMounts)
			},
		},
		{
			name: "counts floor annotation", shard: 0, attempt: 1,
			floor: v1alpha1.ItemCounts{Total: 10, Completed: 4, AlreadyHandled: 1, Failed: 2},
			check: func(t *testing.T, pod *corev1.Pod) {
				var c v1alpha1.ItemCounts
				require.NoError(t, json.Unmarshal([]byte(pod.Annotations[annotationCountsFloor]), &c))
				require.Equal(t, v1alpha1.ItemCounts{Total: 10, Completed: 4, AlreadyHandled: 1, Failed: 2}, c)
				require.Equal(t, c, parseFloor(pod.Annotations))
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			run := testRun()
			if tt.mutate != nil {
				tt.mutate(run)
			}
			before := run.DeepCopy()
			pod, err := buildWorkerPod(run, workerPodParams{shard: tt.shard, attempt: tt.attempt, floor: tt.floor, runFile: tt.runFile, placement: tt.place}, opts)
			require.NoError(t, err)
			tt.check(t, pod)
			// The builder does not share memory with the run.
			if len(pod.Spec.Tolerations) > 0 {
				pod.Spec.Tolerations[0].Key = "changed"
			}
			for k := range pod.Spec.NodeSelector {
				pod.Spec.NodeSelector[k] = "changed"
			}
			for i := range pod.Spec.Volumes {
				pod.Spec.Volumes[i].Name = "changed"
			}
			for i := range pod.Spec.Containers[0].Env {
				pod.Spec.Containers[0].Env[i].Name = "changed"
			}
			for _, c := range pod.Spec.InitContainers {
				for i := range c.Env {
					c.Env[i].Name = "changed"
				}
				for i := range c.Command {
					c.Command[i] = "changed"
				}
				if c.Resources.Limits != nil {
					c.Resources.Limits[corev1.ResourceMemory] = resource.MustParse("1Gi")
				}
			}
			if a := pod.Spec.Affinity; a != nil && a.NodeAffinity != nil {
				a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution = nil
			}
			require.Equal(t, before, run)
		})
	}
}

func volumeNames(vols []corev1.Volume) []string {
	var out []string
	for _, v := range vols {
		out = append(out, v.Name)
	}
	return out
}

const sha = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

func TestValidateImage(t *testing.T) {
	for _, tt := range []struct {
		image string
		ok    bool
	}{
		{"runledger:dev", true},
		{"ghcr.io/runledger/runledger:v0.1.0", true},
		{"localhost:5000/runledger@sha256:" + sha, true},
		{"", false},
		{"Runledger:dev", false},
		{"runledger:dev latest", false},
		{"runledger::dev", false},
	} {
		err := validateImage(tt.image)
		require.Equal(t, tt.ok, err == nil, "image %q: %v", tt.image, err)
	}
}

func TestWorkerImageOverride(t *testing.T) {
	run := testRun()
	require.Equal(t, "a:1", workerImage(run, PodOptions{Image: "a:1"}))
	run.Spec.WorkerTemplate = &v1alpha1.WorkerTemplate{Image: "b:2"}
	require.Equal(t, "b:2", workerImage(run, PodOptions{Image: "a:1"}))
}
