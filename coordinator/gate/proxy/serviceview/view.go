package serviceview

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/service"
)

// The decision starts here: which Services a CCM sees (View.Shows), which
// of them a watch's client may hold (history.go), and what a watch sends for
// each event (watch.go). It decides on the facts the object layer (package
// service) read, and writes nothing.

// View says which Services a CCM sees: those of type LoadBalancer
// whose spec.loadBalancerClass is its class (or that have no class, when it is
// the default), and Services that are no longer of type LoadBalancer but
// still carry the load-balancer cleanup finalizer and no class (so that the
// load balancer's owner deletes it: the service controller of
// k8s.io/cloud-provider does that only for a Service it still sees). Without a
// class it sees no Service at all.
type View struct {
	// Class is the CCM's load-balancer class ("": none).
	Class      string
	defaultLBs bool
	// ShowsNone: the CCM has no class and sees no Service.
	ShowsNone bool
	// Description says what the view shows, for the gate's log.
	Description string
}

func NewView(class string, defaultLBs bool) (View, error) {
	if class == "" {
		if defaultLBs {
			return View{}, errors.New("the default for Services without a class needs a load-balancer class of its own")
		}
		return View{ShowsNone: true, Description: "none"}, nil
	}
	if errs := validation.IsQualifiedName(class); len(errs) > 0 {
		return View{}, fmt.Errorf("load-balancer class %q: %s", class, strings.Join(errs, "; "))
	}
	d := "class " + class
	if defaultLBs {
		d += " and classless"
	}
	return View{Class: class, defaultLBs: defaultLBs, Description: d}, nil
}

// Shows reports whether a Service is in the view.
func (v View) Shows(f service.Facts) bool {
	if v.ShowsNone {
		return false
	}
	if f.Type == service.TypeLoadBalancer {
		if f.HasClass {
			return f.Class == v.Class
		}
		return v.defaultLBs
	}
	return !f.HasClass && f.Cleanup
}
