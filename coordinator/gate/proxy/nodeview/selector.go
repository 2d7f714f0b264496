package nodeview

import (
	"fmt"
	"net/url"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// ViewSelector adds the view's requirements (platform=<value> and the
// domain's) to the labelSelector of a list or watch query and returns the new
// raw query. The result is the AND of the client's selector and the view's: a
// client asking for another platform or domain gets nothing, a client asking
// for nothing gets the domain's nodes.
//
// A selector the gate cannot parse is an error (400), never forwarded: the
// combined selector must mean exactly what the gate intends.
func ViewSelector(query url.Values, requirements labels.Requirements) (string, error) {
	q := url.Values{}
	for k, v := range query {
		q[k] = append([]string(nil), v...)
	}
	var client string
	switch v := q["labelSelector"]; len(v) {
	case 0:
	case 1:
		client = v[0]
	default:
		return "", fmt.Errorf("labelSelector given %d times", len(v))
	}
	sel, err := labels.Parse(client)
	if err != nil {
		return "", fmt.Errorf("labelSelector %q: %w", client, err)
	}
	q.Set("labelSelector", sel.Add(requirements...).String())
	return q.Encode(), nil
}

// ViewRequirements are label=platform and the requirements of the domain
// selector. The domain may only narrow the view: equality (=, ==) and set
// membership (in) on keys other than the platform label; a selector that
// could widen it or that the fence cannot enforce (!=, notin, exists, !key,
// gt, lt) is refused.
func ViewRequirements(label, platform, domain string) (labels.Requirements, error) {
	req, err := platformRequirement(label, platform)
	if err != nil {
		return nil, fmt.Errorf("platform %q: %w", platform, err)
	}
	reqs := labels.Requirements{req}
	if domain == "" {
		return reqs, nil
	}
	sel, err := labels.Parse(domain)
	if err != nil {
		return nil, fmt.Errorf("domain selector %q: %w", domain, err)
	}
	more, _ := sel.Requirements()
	for _, r := range more {
		switch {
		case r.Key() == label:
			return nil, fmt.Errorf("domain selector %q: %s is the platform label; the domain narrows the platform's nodes by other labels", domain, label)
		case r.Operator() != selection.Equals && r.Operator() != selection.DoubleEquals && r.Operator() != selection.In:
			return nil, fmt.Errorf("domain selector %q: requirement %q: only =, == and in narrow a view", domain, r.String())
		}
	}
	return append(reqs, more...), nil
}

// platformRequirement is label=platform.
func platformRequirement(label, platform string) (labels.Requirement, error) {
	r, err := labels.NewRequirement(label, selection.Equals, []string{platform})
	if err != nil {
		return labels.Requirement{}, err
	}
	return *r, nil
}
