package proxy

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// The decision layer starts here: which Services a CCM sees
// (serviceView.shows), which of them a watch's client may hold
// (servicehistory.go), and what a watch sends for each event
// (servicewatch.go). It decides on the facts the object layer read, and
// writes nothing.

// serviceView says which Services a CCM sees: those of type LoadBalancer
// whose spec.loadBalancerClass is its class (or that have no class, when it is
// the default), and Services that are no longer of type LoadBalancer but
// still carry the load-balancer cleanup finalizer and no class (so that the
// load balancer's owner deletes it: the service controller of
// k8s.io/cloud-provider does that only for a Service it still sees). Without a
// class it sees no Service at all.
type serviceView struct {
	class       string
	defaultLBs  bool
	showsNone   bool
	description string
}

func newServiceView(class string, defaultLBs bool) (serviceView, error) {
	if class == "" {
		if defaultLBs {
			return serviceView{}, errors.New("the default for Services without a class needs a load-balancer class of its own")
		}
		return serviceView{showsNone: true, description: "none"}, nil
	}
	if errs := validation.IsQualifiedName(class); len(errs) > 0 {
		return serviceView{}, fmt.Errorf("load-balancer class %q: %s", class, strings.Join(errs, "; "))
	}
	d := "class " + class
	if defaultLBs {
		d += " and classless"
	}
	return serviceView{class: class, defaultLBs: defaultLBs, description: d}, nil
}

// shows reports whether a Service is in the view.
func (v serviceView) shows(f serviceFacts) bool {
	if v.showsNone {
		return false
	}
	if f.typ == serviceTypeLoadBalancer {
		if f.hasClass {
			return f.class == v.class
		}
		return v.defaultLBs
	}
	return !f.hasClass && f.cleanup
}
