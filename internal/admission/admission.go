// Package admission checks a ProcessingRun the way the apiserver checks one
// it is asked to create: the CRD's own OpenAPI schema, CEL rules and
// defaults (from the embedded CRD that is installed in clusters) and the
// apiserver's rules for metadata. `runledger run` uses it so that a manifest
// it accepts is one a cluster accepts, and the other way round.
package admission

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"

	"k8s.io/apiextensions-apiserver/pkg/apis/apiextensions"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	structuralschema "k8s.io/apiextensions-apiserver/pkg/apiserver/schema"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/cel"
	structuraldefaulting "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/defaulting"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/listtype"
	schemaobjectmeta "k8s.io/apiextensions-apiserver/pkg/apiserver/schema/objectmeta"
	"k8s.io/apiextensions-apiserver/pkg/apiserver/schema/pruning"
	apiservervalidation "k8s.io/apiextensions-apiserver/pkg/apiserver/validation"
	metavalidation "k8s.io/apimachinery/pkg/api/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"sigs.k8s.io/yaml"

	"github.com/runledger/runledger/api/v1alpha1"
	"github.com/runledger/runledger/config/crd"
)

// Validator holds one CRD version's compiled schema and rules.
type Validator struct {
	structural *structuralschema.Structural
	schema     apiservervalidation.SchemaValidator
	cel        *cel.Validator
}

// ProcessingRun returns the validator of the embedded ProcessingRun CRD at
// v1alpha1, built once (compiling the CEL rules takes a while).
var ProcessingRun = sync.OnceValues(func() (*Validator, error) {
	return New(crd.ProcessingRun, v1alpha1.GroupVersion.Version)
})

// New builds the validator of version of the CRD in crdYAML, as the
// apiserver builds it when it serves the CRD.
func New(crdYAML []byte, version string) (*Validator, error) {
	var def apiextensionsv1.CustomResourceDefinition
	if err := yaml.UnmarshalStrict(crdYAML, &def); err != nil {
		return nil, fmt.Errorf("decode CRD: %w", err)
	}
	var schema *apiextensionsv1.CustomResourceValidation
	for _, v := range def.Spec.Versions {
		if v.Name == version {
			schema = v.Schema
		}
	}
	if schema == nil || schema.OpenAPIV3Schema == nil {
		return nil, fmt.Errorf("CRD %s has no schema for version %s", def.Name, version)
	}
	internal := &apiextensions.CustomResourceValidation{}
	if err := apiextensionsv1.Convert_v1_CustomResourceValidation_To_apiextensions_CustomResourceValidation(schema, internal, nil); err != nil {
		return nil, fmt.Errorf("convert CRD %s schema: %w", def.Name, err)
	}
	s, err := structuralschema.NewStructural(internal.OpenAPIV3Schema)
	if err != nil {
		return nil, fmt.Errorf("CRD %s schema is not structural: %w", def.Name, err)
	}
	s = s.DeepCopy() // PruneDefaults changes it; internal still shares parts
	if err := structuraldefaulting.PruneDefaults(s); err != nil {
		return nil, fmt.Errorf("CRD %s defaults: %w", def.Name, err)
	}
	sv, _, err := apiservervalidation.NewSchemaValidator(internal.OpenAPIV3Schema)
	if err != nil {
		return nil, fmt.Errorf("CRD %s schema validator: %w", def.Name, err)
	}
	return &Validator{structural: s, schema: sv, cel: cel.NewValidator(s, true, celconfig.PerCallLimit)}, nil
}

// Errors is every problem the apiserver would report for a manifest.
type Errors struct {
	// Unknown lists fields the schema does not have, as kubectl's strict
	// field validation reports them ("spec.wrokers").
	Unknown []string
	Fields  field.ErrorList
}

func (e *Errors) Error() string {
	var lines []string
	for _, u := range e.Unknown {
		lines = append(lines, fmt.Sprintf("unknown field %q", u))
	}
	for _, f := range e.Fields {
		if f.Field == "" || f.Field == "<nil>" { // a rule on the whole object: its message says it all
			lines = append(lines, f.Detail)
			continue
		}
		lines = append(lines, f.Error())
	}
	if len(lines) == 1 {
		return lines[0]
	}
	return fmt.Sprintf("%d problems:\n  %s", len(lines), strings.Join(lines, "\n  "))
}

// Create does to obj (a namespaced custom resource, as decoded from JSON)
// what the apiserver does to an object it is asked to create, minus storing
// it: it drops status (the status subresource's owner writes it) and nulls,
// applies the schema's defaults, and validates metadata, the schema, list
// types and the CEL rules. obj is changed in place; the error is an
// *Errors.
func (v *Validator) Create(ctx context.Context, obj map[string]any) error {
	errs := &Errors{}
	_, _, metaUnknown, err := schemaobjectmeta.GetObjectMetaWithOptions(obj, schemaobjectmeta.ObjectMetaOptions{ReturnUnknownFieldPaths: true})
	if err != nil {
		errs.Fields = append(errs.Fields, field.Invalid(field.NewPath("metadata"), nil, err.Error()))
		return errs
	}
	delete(obj, "status")
	errs.Unknown = append(metaUnknown, pruning.PruneWithOptions(obj, v.structural, true, structuralschema.UnknownFieldPathOptions{TrackUnknownFieldPaths: true})...)
	structuraldefaulting.PruneNonNullableNullsWithoutDefaults(obj, v.structural)
	structuraldefaulting.Default(obj, v.structural)
	// The schema defaults status ({observedGeneration: 0}, what a read shows
	// until the controller writes); on create the apiserver drops it again.
	delete(obj, "status")

	meta, _, err := schemaobjectmeta.GetObjectMeta(obj, false)
	if err != nil {
		errs.Fields = append(errs.Fields, field.Invalid(field.NewPath("metadata"), nil, err.Error()))
		return errs
	}
	errs.Fields = append(errs.Fields, metavalidation.ValidateObjectMetaAccessor(meta, true, metavalidation.NameIsDNSSubdomain, field.NewPath("metadata"))...)
	errs.Fields = append(errs.Fields, byField(apiservervalidation.ValidateCustomResource(nil, obj, v.schema))...)
	errs.Fields = append(errs.Fields, schemaobjectmeta.Validate(ctx, nil, obj, v.structural, false)...)
	errs.Fields = append(errs.Fields, listtype.ValidateListSetsAndMaps(nil, v.structural, obj)...)
	if blocking(errs.Fields) {
		// As the apiserver: CEL rules would see values of the wrong shape.
		errs.Fields = append(errs.Fields, field.Invalid(nil, nil, "some validation rules were not checked because the object was invalid; correct the existing errors to complete validation"))
	} else {
		celErrs, _ := v.cel.Validate(ctx, nil, v.structural, obj, nil, celconfig.RuntimeCELCostBudget)
		errs.Fields = append(errs.Fields, byField(celErrs)...)
	}
	if len(errs.Unknown) == 0 && len(errs.Fields) == 0 {
		return nil
	}
	return errs
}

// byField sorts errors by their field, for the same message every time: the
// validators walk maps in random order.
func byField(errs field.ErrorList) field.ErrorList {
	slices.SortStableFunc(errs, func(a, b *field.Error) int { return strings.Compare(a.Field, b.Field) })
	return errs
}

// blocking is the apiserver's test (customresource.hasBlockingErr) for
// errors after which it does not evaluate the CEL rules.
func blocking(errs field.ErrorList) bool {
	for _, err := range errs {
		switch err.Type {
		case field.ErrorTypeNotSupported, field.ErrorTypeRequired, field.ErrorTypeTooLong, field.ErrorTypeTooMany, field.ErrorTypeTypeInvalid:
			return true
		}
	}
	return false
}
