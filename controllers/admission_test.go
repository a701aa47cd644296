package controllers

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/internal/envtestutil"
)

// podCreates counts pod creates per reconcile pass.
type podCreates struct {
	client.Client
	mu       sync.Mutex
	perPass  map[types.UID]int
	rejected map[types.UID]int
}

func (c *podCreates) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	err := c.Client.Create(ctx, obj, opts...)
	if _, ok := obj.(*corev1.Pod); ok {
		id := controller.ReconcileIDFromContext(ctx)
		c.mu.Lock()
		c.perPass[id]++
		if apierrors.IsForbidden(err) || apierrors.IsInvalid(err) {
			c.rejected[id]++
		}
		c.mu.Unlock()
	}
	return err
}

// most is the largest number of creates, and of rejected creates, in one
// pass, and the number of passes that were rejected.
func (c *podCreates) most() (creates, rejected, rejectedPasses int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for id, n := range c.perPass {
		creates = max(creates, n)
		rejected = max(rejected, c.rejected[id])
		if c.rejected[id] > 0 {
			rejectedPasses++
		}
	}
	return creates, rejected, rejectedPasses
}

// setPodQuota plays the quota controller: a ResourceQuota of n pods whose
// status the admission plugin then keeps.
func setPodQuota(t *testing.T, env *envtestutil.Env, ns string, n int64) {
	t.Helper()
	ctx := context.Background()
	q := &corev1.ResourceQuota{}
	err := env.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: "pods"}, q)
	hard := corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(n, resource.DecimalSI)}
	if apierrors.IsNotFound(err) {
		q = &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "pods", Namespace: ns},
			Spec: corev1.ResourceQuotaSpec{Hard: hard}}
		require.NoError(t, env.Client.Create(ctx, q))
		q.Status.Used = corev1.ResourceList{corev1.ResourcePods: resource.MustParse("0")}
	} else {
		require.NoError(t, err)
		q.Spec.Hard = hard
		require.NoError(t, env.Client.Update(ctx, q))
	}
	q.Status.Hard = hard
	require.NoError(t, env.Client.Status().Update(ctx, q))
}

// A pod create that admission refuses (here a quota) stops the pass's other
// creates, as the Job controller does, and the status says why pods are
// missing; once the quota allows them, every shard gets its pod.
func TestRejectedPodCreateStopsThePass(t *testing.T) {
	t.Parallel()
	env, ns := setup(t)
	setPodQuota(t, env, ns, 1)
	counter := &podCreates{perPass: map[types.UID]int{}, rejected: map[types.UID]int{}}
	startManager(t, env, ns, managerConfig{wrapClient: func(c client.Client) client.Client {
		counter.Client = c
		return counter
	}})
	create(t, env, newRun(ns, "quota", 4, 8))

	r := waitRun(t, env, ns, "quota", "Stalled", conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonPodCreateFailed))
	msg := condition(r, v1alpha1.ConditionStalled).Message
	require.Contains(t, msg, "exceeded quota")
	waitEvent(t, env, ns, "quota", corev1.EventTypeWarning, ReasonPodCreateFailed, "exceeded quota")
	waitFor(t, "a few more passes", func() error {
		if _, _, passes := counter.most(); passes < 3 {
			return fmt.Errorf("%d rejected passes", passes)
		}
		return nil
	})
	creates, rejected, _ := counter.most()
	require.LessOrEqual(t, creates, 2, "one create admitted, then one refused, per pass")
	require.Equal(t, 1, rejected, "one refused create per pass")
	require.Contains(t, msg, "2 more pods wait", "the status says why pods are missing")
	stillPods(t, env, ns, "quota", 300*time.Millisecond, "quota-0-0")

	setPodQuota(t, env, ns, 4)
	waitPods(t, env, ns, "quota", "quota-0-0", "quota-1-0", "quota-2-0", "quota-3-0")
	waitRun(t, env, ns, "quota", "no longer Stalled", all(phaseIs(v1alpha1.RunRunning), noCondition(v1alpha1.ConditionStalled)))
}

// The manager's generated ClusterRole is enough on a cluster that enforces
// owner references (OwnerReferencesPermissionEnforcement, on in envtest):
// its pods' blockOwnerDeletion needs update on processingruns/finalizers.
// Without that rule the same pods are Forbidden.
func TestGeneratedRoleCreatesPodsThatBlockOwnerDeletion(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(envtestutil.RepoRoot(), "config", "rbac", "role.yaml"))
	require.NoError(t, err)
	var generated rbacv1.ClusterRole
	require.NoError(t, yaml.Unmarshal(b, &generated))
	require.Equal(t, "runledger-manager", generated.Name)
	for _, rule := range generated.Rules {
		require.NotContains(t, rule.Resources, "secrets", "the manager reads no Secret: a missing one shows on its pod")
	}

	for _, tc := range []struct {
		name      string
		finalizer bool
	}{{"generated role", true}, {"without finalizers update", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env, ns := setup(t)
			user := "system:serviceaccount:" + ns + ":runledger-manager"
			var rules []rbacv1.PolicyRule
			for _, rule := range generated.Rules {
				if !tc.finalizer && slices.Contains(rule.Resources, "processingruns/finalizers") {
					continue
				}
				rules = append(rules, rule)
			}
			bindClusterRole(t, env, ns, user, rules)
			cfg := rest.CopyConfig(env.Config)
			cfg.Impersonate = rest.ImpersonationConfig{UserName: user}
			startManager(t, env, ns, managerConfig{restConfig: cfg})
			create(t, env, newRun(ns, "owned", 1, 1))

			if !tc.finalizer {
				r := waitRun(t, env, ns, "owned", "Stalled", conditionIs(v1alpha1.ConditionStalled, metav1.ConditionTrue, ReasonPodCreateFailed))
				require.Contains(t, condition(r, v1alpha1.ConditionStalled).Message, "blockOwnerDeletion")
				stillPods(t, env, ns, "owned", 300*time.Millisecond)
				return
			}
			pods := waitPods(t, env, ns, "owned", "owned-0-0")
			ref := metav1.GetControllerOf(pods["owned-0-0"])
			require.NotNil(t, ref)
			require.True(t, *ref.BlockOwnerDeletion)
			waitRun(t, env, ns, "owned", "Running", all(phaseIs(v1alpha1.RunRunning), noCondition(v1alpha1.ConditionStalled)))
		})
	}
}

// bindClusterRole gives user a ClusterRole of the given rules, both removed
// when the test ends.
func bindClusterRole(t *testing.T, env *envtestutil.Env, ns, user string, rules []rbacv1.PolicyRule) {
	t.Helper()
	ctx := context.Background()
	role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "runledger-manager-" + ns}, Rules: rules}
	require.NoError(t, env.Client.Create(ctx, role))
	binding := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: role.Name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}},
	}
	require.NoError(t, env.Client.Create(ctx, binding))
	t.Cleanup(func() {
		_ = env.Client.Delete(context.Background(), binding)
		_ = env.Client.Delete(context.Background(), role)
	})
}
