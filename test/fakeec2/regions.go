package fakeec2

import (
	"net/http"
	"regexp"
	"strings"
)

// Region returns the endpoint of one region (EC2's https://ec2.<region>.
// amazonaws.com and its siblings for the other services), serving the same
// paths as ServeHTTP: every request is answered for that region, whatever
// region it is signed for. A request signed for another region is refused
// (AuthFailure from EC2, SignatureDoesNotMatch from the other services, "Credential
// should be scoped to a valid region"), as AWS refuses it; the AWS SDK never
// sends one, since the AWS CCM signs for the region whose endpoint it
// resolved (cloud.conf [ServiceOverride] URL and SigningRegion for
// [Global] Region). Serve each region at its own address, as AWS does.
func (s *Server) Region(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.serve(w, r, name) })
}

// wrongScope is the error code a service answers a request signed for
// another region with.
func wrongScope(service string) string {
	if service == EC2 {
		return "AuthFailure"
	}
	return "SignatureDoesNotMatch"
}

// regionRE is a region at the start of an availability zone's name:
// eu-west-1 of eu-west-1a, us-gov-west-1 of us-gov-west-1a, us-west-2 of the
// Local Zone us-west-2-lax-1a.
var regionRE = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-[0-9]+`)

// RegionOf returns the region of an availability zone ("" for "").
func RegionOf(zone string) string {
	if m := regionRE.FindString(zone); m != "" {
		return m
	}
	return strings.TrimRight(zone, "abcdefghijklmnopqrstuvwxyz")
}

// region is the region the instance lives in: Region, else its zone's.
func (i *Instance) region() string {
	if i.Region != "" {
		return i.Region
	}
	return RegionOf(i.Zone)
}

// sees reports whether a request answered for r.region sees what lives in
// region (every region for a request of no region).
func (r *request) sees(region string) bool {
	return r.region == "" || r.region == region
}

// instance returns the instance id as the request's region sees it.
func (s *Server) instance(r *request, id string) (*Instance, bool) {
	i, ok := s.instances[id]
	if !ok || !r.sees(i.region()) {
		return nil, false
	}
	return i, true
}

// subnet returns the subnet id as the request's region sees it.
func (s *Server) subnet(r *request, id string) (*Subnet, bool) {
	n, ok := s.subnets[id]
	if !ok || !r.sees(RegionOf(n.Zone)) {
		return nil, false
	}
	return n, true
}
