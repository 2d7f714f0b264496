// Package v1alpha1 holds the NativeCCM API: which native cloud-controller-manager
// the coordinator runs for a platform, and what it observed while doing so.
//
// It owns the types, their condition vocabulary and their generated code; it must
// not contain reconcile logic.
//
// +kubebuilder:object:generate=true
// +groupName=hybridccm.io
package v1alpha1

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/scheme"
)

var (
	// GroupVersion is the API group and version of NativeCCM.
	GroupVersion = schema.GroupVersion{Group: "hybridccm.io", Version: "v1alpha1"}

	// SchemeBuilder adds the types of this group to a scheme.
	SchemeBuilder = &scheme.Builder{GroupVersion: GroupVersion}

	// AddToScheme adds the types of this group to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)
