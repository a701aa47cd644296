package cli

import (
	"fmt"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/runledger/runledger/internal/cli/exitcode"
)

// kubeConfig is the Kubernetes client configuration kubectl would use:
// kubeconfig (else $KUBECONFIG, else ~/.kube/config) and its context (else
// the current one).
func kubeConfig(kubeconfig, context string) clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = kubeconfig
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: context})
}

// namespaceOr is given, or else the namespace kubectl would use: the
// kubeconfig's current context's, "default" without one (the ledger's
// commands need no cluster, only its namespaces' names).
func namespaceOr(given string) (string, error) {
	if given != "" {
		return given, nil
	}
	ns, _, err := kubeConfig("", "").Namespace()
	if clientcmd.IsEmptyConfig(err) {
		return "default", nil
	}
	if err != nil {
		return "", exitcode.BadInput(fmt.Errorf("the kubeconfig's namespace (give --namespace): %w", err))
	}
	return ns, nil
}
