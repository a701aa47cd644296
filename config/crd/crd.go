// Package crd embeds the generated CustomResourceDefinitions, so that
// `runledger run` validates manifests with the very schema and CEL rules the
// apiserver is given (`make verify` keeps bases/ in step with the markers).
package crd

import _ "embed"

// ProcessingRun is the ProcessingRun CRD as `make manifests` generates it.
//
//go:embed bases/processing.runledger.dev_processingruns.yaml
var ProcessingRun []byte

// ProcessingSchedule is the ProcessingSchedule CRD as `make manifests`
// generates it.
//
//go:embed bases/processing.runledger.dev_processingschedules.yaml
var ProcessingSchedule []byte
