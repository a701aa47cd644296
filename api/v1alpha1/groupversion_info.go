// Package v1alpha1 contains the API of the processing.runledger.dev group,
// version v1alpha1: the ProcessingRun and ProcessingSchedule kinds, and the small contract between
// the controller and the worker pods it starts (contract.go).
//
// +kubebuilder:object:generate=true
// +kubebuilder:ac:generate=true
// +kubebuilder:ac:output:package="../applyconfiguration"
// +groupName=processing.runledger.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Group is the API group of runledger's kinds.
const Group = "processing.runledger.dev"

var (
	// GroupVersion is the group and version of this package's kinds.
	GroupVersion = schema.GroupVersion{Group: Group, Version: "v1alpha1"}

	// SchemeGroupVersion is GroupVersion under the name generated code uses.
	SchemeGroupVersion = GroupVersion

	// SchemeBuilder registers this package's kinds in a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds this package's kinds to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource returns the GroupResource of the given resource in this group
// (used to build API errors, e.g. apierrors.NewNotFound).
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, &ProcessingRun{}, &ProcessingRunList{}, &ProcessingSchedule{}, &ProcessingScheduleList{})
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}
