//go:build tools

// Package tools records the promtool build dependency.
package tools

import _ "github.com/prometheus/prometheus/cmd/promtool"
