package controllers

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runledger/runledger/api/v1alpha1"
)

// +kubebuilder:rbac:groups=networking.k8s.io,resources=networkpolicies,verbs=get;create

// WorkerNetwork is what a run's worker pods may reach: the controller gives
// each run a NetworkPolicy (named runledger-<run>, owned by the run) before
// its first pod, which denies every connection to the pods and allows only
// these from them. The processor sidecar shares the pod's network, so it
// needs no rule; another NetworkPolicy of yours selecting the run's pods
// adds to what they may reach.
type WorkerNetwork struct {
	// APIServerPorts are the API server's ports as a pod's connection
	// reaches them: NetworkPolicy sees the port after the kubernetes
	// Service's translation (443 to the endpoints' port, often 6443).
	APIServerPorts []int32
	// DatabaseCIDRs and DatabasePorts are where the ledger's database (or
	// its pooler) listens.
	DatabaseCIDRs []string
	DatabasePorts []int32
	// ObjectStoreCIDRs and ObjectStorePorts are where the S3-compatible
	// stores of spec.batch.object listen: the policy of a run with such a
	// batch lets its pods reach them.
	ObjectStoreCIDRs []string
	ObjectStorePorts []int32
}

// workerNetworkPolicyName is the name of a run's NetworkPolicy.
func workerNetworkPolicyName(run *v1alpha1.ProcessingRun) string {
	return "runledger-" + run.Name
}

// buildWorkerNetworkPolicy is a run's NetworkPolicy: it selects every pod
// of that run (its name and UID), whatever the shard or attempt.
func buildWorkerNetworkPolicy(run *v1alpha1.ProcessingRun, n WorkerNetwork) *networkingv1.NetworkPolicy {
	tcp, udp := ptr.To(corev1.ProtocolTCP), ptr.To(corev1.ProtocolUDP)
	ports := func(proto *corev1.Protocol, nums []int32) []networkingv1.NetworkPolicyPort {
		var out []networkingv1.NetworkPolicyPort
		for _, p := range nums {
			out = append(out, networkingv1.NetworkPolicyPort{Protocol: proto, Port: ptr.To(intstr.FromInt32(p))})
		}
		return out
	}
	peers := func(cidrs []string) []networkingv1.NetworkPolicyPeer {
		var out []networkingv1.NetworkPolicyPeer
		for _, c := range cidrs {
			out = append(out, networkingv1.NetworkPolicyPeer{IPBlock: &networkingv1.IPBlock{CIDR: c}})
		}
		return out
	}
	egress := []networkingv1.NetworkPolicyEgressRule{
		{Ports: ports(tcp, n.APIServerPorts)},
		{To: peers(n.DatabaseCIDRs), Ports: ports(tcp, n.DatabasePorts)},
		// A database named by host name needs the cluster's DNS.
		{Ports: append(ports(udp, []int32{53}), ports(tcp, []int32{53})...)},
	}
	if run.Spec.Batch.Object != nil && len(n.ObjectStorePorts) > 0 {
		egress = append(egress, networkingv1.NetworkPolicyEgressRule{To: peers(n.ObjectStoreCIDRs), Ports: ports(tcp, n.ObjectStorePorts)})
	}
	return &networkingv1.NetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{
			Name:      workerNetworkPolicyName(run),
			Namespace: run.Namespace,
			Labels: map[string]string{
				labelAppName: "runledger", labelAppComponent: "worker", labelAppInstance: run.Name,
				labelAppManagedBy: "runledger-controller", v1alpha1.LabelRun: run.Name,
			},
			OwnerReferences: []metav1.OwnerReference{
				*metav1.NewControllerRef(run, v1alpha1.GroupVersion.WithKind("ProcessingRun")),
			},
		},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{
				v1alpha1.LabelRun: run.Name, v1alpha1.LabelRunUID: string(run.UID),
			}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress, networkingv1.PolicyTypeEgress},
			Egress:      egress,
		},
	}
}

// ensureWorkerNetworkPolicy creates the run's NetworkPolicy unless it
// exists; it returns a problem when the name is taken by another object
// (an earlier run of that name still being deleted, or not runledger's):
// no pod of the run starts unrestricted.
func (r *Reconciler) ensureWorkerNetworkPolicy(ctx context.Context, run *v1alpha1.ProcessingRun) (*problem, error) {
	np := buildWorkerNetworkPolicy(run, *r.WorkerNetwork)
	err := r.Client.Create(ctx, np)
	if err == nil {
		return nil, nil
	}
	if !apierrors.IsAlreadyExists(err) {
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) || apierrors.IsNotFound(err) {
			return &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf("cannot create NetworkPolicy %s for the worker pods: %v", np.Name, err)}, nil
		}
		return nil, fmt.Errorf("create NetworkPolicy %s: %w", np.Name, err)
	}
	var have networkingv1.NetworkPolicy
	if err := r.APIReader.Get(ctx, client.ObjectKeyFromObject(np), &have); err != nil {
		return nil, fmt.Errorf("read NetworkPolicy %s: %w", np.Name, err)
	}
	if ref := metav1.GetControllerOf(&have); ref == nil || ref.UID != run.UID {
		return &problem{reason: ReasonPodCreateFailed, message: fmt.Sprintf(
			"NetworkPolicy %s exists and is not this run's (an earlier run of this name still being deleted?): no worker pod starts until it is gone", np.Name)}, nil
	}
	return nil, nil
}
