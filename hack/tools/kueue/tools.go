//go:build tools

// Package tools records the Kueue build dependency.
package tools

import _ "sigs.k8s.io/kueue/cmd/kueue"
