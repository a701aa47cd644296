package controllers

import (
	"encoding/json"
	"fmt"

	acv1alpha1 "github.com/runledger/runledger/api/applyconfiguration/api/v1alpha1"
	"github.com/runledger/runledger/api/v1alpha1"
)

// applyConfigurationOf is a status as its generated apply configuration
// (AC), field for field, through the API's own encoding (JSON): what the
// API server would store of the status is what the controller applies, a
// field added to the status included (TestStatusApplyRoundTrip holds the
// generated apply configurations to the types). Both controllers write
// their status this way.
func applyConfigurationOf[AC any](status any) (*AC, error) {
	raw, err := json.Marshal(status)
	if err != nil {
		return nil, fmt.Errorf("encode status: %w", err)
	}
	ac := new(AC)
	if err := json.Unmarshal(raw, ac); err != nil {
		return nil, fmt.Errorf("decode status: %w", err)
	}
	return ac, nil
}

// runStatusApply is the controller's server-side apply of a run's status:
// every field, the shards' reports included (folded in from their pods'
// annotations, or restored from the final report when the worker's last
// write was lost). applyStatus pins it to the run it was built for.
func runStatusApply(run *v1alpha1.ProcessingRun, st *v1alpha1.ProcessingRunStatus) (*acv1alpha1.ProcessingRunApplyConfiguration, error) {
	status, err := applyConfigurationOf[acv1alpha1.ProcessingRunStatusApplyConfiguration](st)
	if err != nil {
		return nil, err
	}
	return acv1alpha1.ProcessingRun(run.Name, run.Namespace).WithUID(run.UID).WithStatus(status), nil
}
