//go:build tools

// Package tools records the SeaweedFS build dependency.
package tools

import _ "github.com/seaweedfs/seaweedfs/weed"
