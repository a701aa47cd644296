//go:build tools

// Package tools records the kube-network-policies build dependency.
package tools

import _ "sigs.k8s.io/kube-network-policies/cmd"
