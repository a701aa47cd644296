package v1alpha1_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/config/crd"
)

// TestScheduleCRDSaysWhatTheConstantsSay: as TestCRDSaysWhatTheConstantsSay,
// for ProcessingSchedule.
func TestScheduleCRDSaysWhatTheConstantsSay(t *testing.T) {
	t.Parallel()
	var def apiextensionsv1.CustomResourceDefinition
	require.NoError(t, yaml.UnmarshalStrict(crd.ProcessingSchedule, &def))
	require.Len(t, def.Spec.Versions, 1)
	root := *def.Spec.Versions[0].Schema.OpenAPIV3Schema
	at := func(path ...string) apiextensionsv1.JSONSchemaProps {
		t.Helper()
		s := root
		for _, p := range path {
			next, ok := s.Properties[p]
			require.True(t, ok, "no %s in %v", p, path)
			s = next
		}
		return s
	}
	def64 := func(s apiextensionsv1.JSONSchemaProps) string {
		t.Helper()
		require.NotNil(t, s.Default)
		return string(s.Default.Raw)
	}
	var rootRules []string
	for _, r := range root.XValidations {
		rootRules = append(rootRules, r.Rule)
	}
	require.Contains(t, rootRules, fmt.Sprintf("size(self.metadata.name) <= %d", v1alpha1.MaxScheduleNameLength))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultTimeZone), def64(at("spec", "timeZone")))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultConcurrencyPolicy), def64(at("spec", "concurrencyPolicy")))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultCatchUp), def64(at("spec", "catchUp")))
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultSuccessfulRunsHistoryLimit), def64(at("spec", "successfulRunsHistoryLimit")))
	require.Equal(t, fmt.Sprint(v1alpha1.DefaultFailedRunsHistoryLimit), def64(at("spec", "failedRunsHistoryLimit")))
	require.Equal(t, fmt.Sprintf("%q", v1alpha1.DefaultOccurrenceFormat), def64(at("spec", "occurrence", "format")))
	require.Equal(t, int64(v1alpha1.MaxActiveListed), *at("status", "active").MaxItems)
	require.Equal(t, int64(v1alpha1.MaxMissedListed), *at("status", "missed").MaxItems)
	require.Equal(t, int64(v1alpha1.MaxKeyPartBytes), *at("status", "trigger", "occurrence").MaxLength)
	require.Equal(t, int64(v1alpha1.MaxTriggerMessageLength), *at("status", "trigger", "message").MaxLength)
	require.Equal(t, int64(v1alpha1.MaxRunNameLength), *at("status", "trigger", "run").MaxLength)
	// The run's name must fit: <schedule>-<occurrence> or its hashed form.
	require.Less(t, v1alpha1.MaxScheduleNameLength, v1alpha1.MaxRunNameLength-10)
}
