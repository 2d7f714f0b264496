package proxy

import (
	"fmt"
	"net/url"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
)

// viewSelector adds the platform requirement to the labelSelector of a list or
// watch query and returns the new raw query. The result is the AND of the
// client's selector and platform=<value>: a client asking for another platform
// gets nothing, a client asking for nothing gets the platform's nodes.
//
// A selector the gate cannot parse is an error (400), never forwarded: the
// combined selector must mean exactly what the gate intends.
func viewSelector(query url.Values, requirement labels.Requirement) (string, error) {
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
	q.Set("labelSelector", sel.Add(requirement).String())
	return q.Encode(), nil
}

// platformRequirement is label=platform.
func platformRequirement(label, platform string) (labels.Requirement, error) {
	r, err := labels.NewRequirement(label, selection.Equals, []string{platform})
	if err != nil {
		return labels.Requirement{}, err
	}
	return *r, nil
}
