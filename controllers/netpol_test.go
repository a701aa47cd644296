package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// TestWorkerNetworkPolicy: a run's worker pods come with the run's
// NetworkPolicy, owned by the run, selecting exactly its pods: no ingress,
// egress only to the API server's ports, the database's addresses and
// ports and DNS. A policy of that name that is not the run's (an earlier
// run's still being deleted, or someone else's) keeps every pod of the run
// from starting, visibly, until it is gone.
func TestWorkerNetworkPolicy(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	ctx := context.Background()
	wn := &WorkerNetwork{APIServerPorts: []int32{443, 6443}, DatabaseCIDRs: []string{"10.1.2.3/32"}, DatabasePorts: []int32{5432, 6432}}

	// A policy by the name the run "taken" would get, not the run's.
	foreign := &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: "runledger-taken", Namespace: ns},
		Spec:       networkingv1.NetworkPolicySpec{PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "other"}}},
	}
	require.NoError(t, env.Client.Create(ctx, foreign))
	// A pod of another run, which the policy must not select.
	otherRun := newRun(ns, "other", 1, 1)
	otherRun.UID = "0b4f1d7e-0000-4000-8000-000000000000"
	otherPod, err := buildWorkerPod(otherRun, workerPodParams{}, PodOptions{Image: "runledger:test", ServiceAccountName: "runledger-worker"})
	require.NoError(t, err)

	startManager(t, env, ns, managerConfig{workerNetwork: wn})
	run := create(t, env, newRun(ns, "net", 2, 4))
	pods := waitPods(t, env, ns, "net", "net-0-0", "net-1-0")

	var np networkingv1.NetworkPolicy
	require.NoError(t, env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "runledger-net"}, &np))
	ref := metav1.GetControllerOf(&np)
	require.NotNil(t, ref, "owned by the run: deleted with it")
	require.Equal(t, run.UID, ref.UID)
	sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
	require.NoError(t, err)
	for name, pod := range pods {
		require.True(t, sel.Matches(labels.Set(pod.Labels)), "the policy selects %s", name)
	}
	require.False(t, sel.Matches(labels.Set(otherPod.Labels)), "the policy selects no pod of another run")
	require.ElementsMatch(t, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress}, np.Spec.PolicyTypes)
	require.Empty(t, np.Spec.Ingress, "nothing may connect to a worker pod")
	tcp, udp := ptr.To(corev1.ProtocolTCP), ptr.To(corev1.ProtocolUDP)
	port := func(proto *corev1.Protocol, p int32) networkingv1.NetworkPolicyPort {
		return networkingv1.NetworkPolicyPort{Protocol: proto, Port: ptr.To(intstr.FromInt32(p))}
	}
	require.Equal(t, []networkingv1.NetworkPolicyEgressRule{
		{Ports: []networkingv1.NetworkPolicyPort{port(tcp, 443), port(tcp, 6443)}},
		{To: []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.1.2.3/32"}}},
			Ports: []networkingv1.NetworkPolicyPort{port(tcp, 5432), port(tcp, 6432)}},
		{Ports: []networkingv1.NetworkPolicyPort{port(udp, 53), port(tcp, 53)}},
	}, np.Spec.Egress)

	// The name is taken: no pod, a Stalled condition that says why.
	create(t, env, newRun(ns, "taken", 1, 1))
	r := waitRun(t, env, ns, "taken", "Stalled", conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonPodCreateFailed))
	require.Contains(t, condition(r, v1alpha1.ConditionStalled).Message, "NetworkPolicy runledger-taken exists and is not this run's")
	stillPods(t, env, ns, "taken", 500*time.Millisecond)
	// Once it is gone, the run gets its own and its pod.
	require.NoError(t, env.Client.Delete(ctx, foreign))
	waitPods(t, env, ns, "taken", "taken-0-0")
	waitFor(t, "the run's own policy", func() error {
		var got networkingv1.NetworkPolicy
		if err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "runledger-taken"}, &got); err != nil {
			return err
		}
		if ref := metav1.GetControllerOf(&got); ref == nil || ref.Name != "taken" {
			return fmt.Errorf("not the run's: %v", got.OwnerReferences)
		}
		return nil
	})
}

// TestWorkerNetworkPolicy_ObjectStore: a run that reads a spec.batch.object
// may also reach the object stores' addresses and ports; any other run may
// not.
func TestWorkerNetworkPolicy_ObjectStore(t *testing.T) {
	t.Parallel()
	wn := WorkerNetwork{APIServerPorts: []int32{443}, DatabaseCIDRs: []string{"10.1.2.3/32"}, DatabasePorts: []int32{5432},
		ObjectStoreCIDRs: []string{"10.9.0.0/16"}, ObjectStorePorts: []int32{443, 9000}}
	run := testRun()
	require.Len(t, buildWorkerNetworkPolicy(run, wn).Spec.Egress, 3, "a query batch: the API server, the database, DNS")

	run.Spec.Batch = v1alpha1.BatchSpec{Object: &v1alpha1.ObjectSource{Bucket: "exports", Key: "a.csv", Format: v1alpha1.ObjectCSV}}
	egress := buildWorkerNetworkPolicy(run, wn).Spec.Egress
	require.Len(t, egress, 4)
	store := egress[3]
	require.Equal(t, []networkingv1.NetworkPolicyPeer{{IPBlock: &networkingv1.IPBlock{CIDR: "10.9.0.0/16"}}}, store.To)
	var ports []int32
	for _, p := range store.Ports {
		require.Equal(t, corev1.ProtocolTCP, *p.Protocol)
		ports = append(ports, p.Port.IntVal)
	}
	require.Equal(t, []int32{443, 9000}, ports)
}
