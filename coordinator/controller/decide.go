package controller

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/fluxcd/pkg/apis/meta"
	"github.com/fluxcd/pkg/runtime/conditions"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1 "github.com/hybrid-ccm/hybrid-ccm/coordinator/api/v1alpha1"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

// decision is what the install policy says about the release.
type decision struct {
	// want: the release should exist.
	want bool
	// reason says why it should not (Ready and Installed carry it), or
	// UninstallPendingReason while Auto keeps it through the grace period.
	reason string
	// requeue > 0 asks for a look again then (when the grace period ends).
	requeue time.Duration
}

// decide applies the install policy to what observeNodes found.
func (r *NativeCCMReconciler) decide(obj *v1.NativeCCM) decision {
	switch obj.InstallPolicy() {
	case v1.InstallNever:
		return decision{reason: v1.InstallDisabledReason}
	case v1.InstallAlways:
		return decision{want: true}
	}
	if obj.Status.Nodes > 0 {
		return decision{want: true}
	}
	if obj.Status.Release == nil {
		return decision{reason: v1.NoNodesReason}
	}
	grace := r.UninstallGracePeriod
	if obj.Spec.UninstallGracePeriod != nil {
		grace = obj.Spec.UninstallGracePeriod.Duration
	}
	left := obj.Status.NoNodesSince.Add(grace).Sub(r.now())
	if left > 0 {
		return decision{want: true, reason: v1.UninstallPendingReason, requeue: left}
	}
	return decision{reason: v1.NoNodesReason}
}

// checkCredentials waits until the credentials Secret has every key the
// profile needs (a wanted release is not installed without them).
func (r *NativeCCMReconciler) checkCredentials(ctx context.Context, obj *v1.NativeCCM, p *profile.Profile) error {
	if !p.NeedsSecret() {
		return nil
	}
	name := r.secretName(obj, p)
	var s corev1.Secret
	err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, &s)
	var missing []string
	switch {
	case apierrors.IsNotFound(err):
		missing = []string{"Secret " + r.Namespace + "/" + name}
	case err != nil:
		return err
	default:
		for _, k := range p.SecretKeys() {
			if _, ok := s.Data[k]; !ok {
				missing = append(missing, "key "+k)
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return r.waitFor(obj, v1.CredentialsNotFoundReason, fmt.Errorf("waiting for credentials: missing %s", strings.Join(missing, ", ")))
}

// waitFor records a wait for something a wanted release needs (Ready=False
// with reason, a Warning event when the reason is new) and returns it as a
// wait: looked at again after RetryInterval, or when a Secret changes.
func (r *NativeCCMReconciler) waitFor(obj *v1.NativeCCM, reason string, err error) error {
	if !conditions.HasAnyReason(obj, meta.ReadyCondition, reason) {
		r.event(obj, corev1.EventTypeWarning, reason, err.Error())
	}
	conditions.MarkFalse(obj, meta.ReadyCondition, reason, "%s", err)
	return &waitError{reason: reason, after: r.RetryInterval, err: err}
}

func (r *NativeCCMReconciler) secretName(obj *v1.NativeCCM, p *profile.Profile) string {
	if c := obj.Spec.Credentials; c != nil && c.SecretRef.Name != "" {
		return c.SecretRef.Name
	}
	if p == nil {
		return ""
	}
	return p.Credentials.SecretName
}

// imagePullSecrets are the names of the Secrets the NativeCCM's pods pull
// their images with: the coordinator's, then its own, each once.
func (r *NativeCCMReconciler) imagePullSecrets(obj *v1.NativeCCM) []string {
	var out []string
	add := func(name string) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	for _, n := range r.ImagePullSecrets {
		add(n)
	}
	for _, s := range obj.Spec.ImagePullSecrets {
		add(s.Name)
	}
	return out
}

// checkImagePullSecrets waits until every image pull Secret of the release
// exists in the release namespace with a type the kubelet reads: without
// one, the kubelet pulls without its credentials, and a private image (the
// ccm-gate's, from the product's registry) is never pulled. Only names and
// types are looked at, in the namespace the coordinator already reads
// Secrets of; nothing is copied.
func (r *NativeCCMReconciler) checkImagePullSecrets(ctx context.Context, obj *v1.NativeCCM, names []string) error {
	var problems []string
	for _, name := range names {
		var s corev1.Secret
		err := r.Get(ctx, client.ObjectKey{Namespace: r.Namespace, Name: name}, &s)
		switch {
		case apierrors.IsNotFound(err):
			problems = append(problems, "Secret "+r.Namespace+"/"+name+" is missing")
		case err != nil:
			return err
		case s.Type != corev1.SecretTypeDockerConfigJson && s.Type != corev1.SecretTypeDockercfg:
			problems = append(problems, fmt.Sprintf("Secret %s/%s is of type %q, not %s", r.Namespace, name, s.Type, corev1.SecretTypeDockerConfigJson))
		}
	}
	if len(problems) == 0 {
		return nil
	}
	return r.waitFor(obj, v1.ImagePullSecretNotFoundReason, fmt.Errorf("waiting for image pull Secrets: %s", strings.Join(problems, "; ")))
}
