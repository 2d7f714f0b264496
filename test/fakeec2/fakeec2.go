// Package fakeec2 is a loopback stand-in for the AWS APIs that the upstream AWS
// cloud controller manager (k8s.io/cloud-provider-aws) is pointed at through
// its cloud.conf [ServiceOverride] sections, for tests and the demo.
//
// It owns, with state kept between calls and answers in the XML the real Query
// APIs send:
//   - EC2 (2016-11-15) for what cloud-node-lifecycle asks: DescribeInstances by
//     instance IDs (InvalidInstanceID.NotFound when any is unknown, as EC2
//     answers) and by filters, instances running, stopped or terminated, and
//     for what cloud-node initializes a node from, as a CCM the cluster runs
//     on its own does: type, zone, private address on the primary network
//     interface, private DNS name (instances.go);
//   - EC2 for what the service controller needs around a Classic Load
//     Balancer: subnets, their route tables and availability zones, security
//     groups with their ingress rules, tags (network.go);
//   - Elastic Load Balancing (2012-06-01), the Classic Load Balancer API: load
//     balancers in a VPC with listeners, subnets, security groups, a health
//     check, attributes, registered instances and tags (elb.go); no policies
//     (proxy protocol, SSL negotiation), no changes of subnets or security
//     groups of an existing load balancer, no Network Load Balancers
//     (elasticloadbalancingv2);
//   - one path per service (/ec2, /elasticloadbalancing, /sts, /kms): an
//     action the fake does not know, on any of them, is answered with the
//     error InvalidAction and recorded (Unknown), so a test can fail naming
//     what the CCM asked for;
//   - regions as EC2 has them: every region has its own endpoint (Region), an
//     instance and a subnet live in the region of their availability zone,
//     and an endpoint answers for its region only — another region's
//     instance is not found there, as EC2 answers for an ID it does not know
//     (regions.go); security groups and load balancers belong to no region;
//   - a record of every request, with the region it was addressed to and the
//     access key and region of its SigV4 Authorization header (the signature
//     itself is not checked), and of every request to the instance metadata
//     service handler (IMDS), which answers nothing but 404.
//
// It must not pretend to more of AWS than that: any other action or filter is
// an error the CCM logs and the call log shows. Changes are immediate (a
// deleted load balancer is gone at once, where AWS keeps its network
// interfaces a while).
package fakeec2

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Services, as the paths the fake serves them under and Call.Service names
// them.
const (
	EC2  = "ec2"
	ELB  = "elasticloadbalancing"
	IMDS = "imds"
)

// InvalidAction is the error code of a call the fake does not answer.
const InvalidAction = "InvalidAction"

// Call is one request the fake received.
type Call struct {
	// Service is the path the request was sent to: ec2, elasticloadbalancing,
	// sts, kms, or imds for the metadata handler.
	Service string
	// Action is the Query API action (or the X-Amz-Target of a JSON API, or
	// METHOD path for IMDS).
	Action string
	// Resource is what the action names, when it names one thing: a load
	// balancer, a security group.
	Resource string
	// InstanceIDs are the instances the action names.
	InstanceIDs []string
	// Filters are name=value[,value] in request order.
	Filters []string
	// Region is the region the request was addressed to: the region of the
	// endpoint (Region), or for the fake's region-less handler (ServeHTTP)
	// the region it was signed for; empty: unsigned and region-less,
	// answered for every region.
	Region string
	// AccessKey and SignedRegion are from the SigV4 Authorization header's
	// credential scope; empty when unsigned.
	AccessKey, SignedRegion string
	// Error is the error code the fake answered, if any.
	Error string
}

func (c Call) String() string {
	s := c.Service
	if c.Region != "" {
		s += "@" + c.Region
	}
	s += " " + c.Action
	if c.Resource != "" {
		s += " " + c.Resource
	}
	if len(c.InstanceIDs) > 0 {
		s += " InstanceIds=" + strings.Join(c.InstanceIDs, ",")
	}
	if len(c.Filters) > 0 {
		s += " Filters=[" + strings.Join(c.Filters, " ") + "]"
	}
	if c.Error != "" {
		s += " -> " + c.Error
	}
	return s
}

// Server is the fake. Its zero value is not usable: New.
type Server struct {
	mu        sync.Mutex
	ownerID   string
	instances map[string]*Instance
	subnets   map[string]*Subnet
	groups    map[string]*SecurityGroup
	lbs       map[string]*LoadBalancer
	// ids counts the IDs the fake handed out.
	ids   int
	calls []Call
}

// New returns a fake that knows the given instances and nothing else.
func New(instances ...Instance) *Server {
	s := &Server{ownerID: "123456789012", instances: map[string]*Instance{}, subnets: map[string]*Subnet{},
		groups: map[string]*SecurityGroup{}, lbs: map[string]*LoadBalancer{}}
	for _, i := range instances {
		s.Put(i)
	}
	return s
}

// Calls returns every request received so far.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

// Unknown returns the calls the fake answered InvalidAction: what the CCM
// asked for and the fake cannot answer.
func (s *Server) Unknown() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Call
	for _, c := range s.calls {
		if c.Error == InvalidAction {
			out = append(out, c)
		}
	}
	return out
}

// Reset forgets the calls received so far.
func (s *Server) Reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = nil
}

func (s *Server) record(c Call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, c)
}

// newID returns prefix-<17 hex digits>, unique in this fake.
func (s *Server) newID(prefix string) string {
	s.ids++
	return fmt.Sprintf("%s-%017x", prefix, 0xfa4e0000+s.ids)
}

// apiError is an error answer: its code and message, as AWS sends them.
type apiError struct{ code, message string }

func (e *apiError) Error() string { return e.code + ": " + e.message }

func errorf(code, format string, args ...any) *apiError {
	return &apiError{code: code, message: fmt.Sprintf(format, args...)}
}

// request is one Query API call being answered.
type request struct {
	form url.Values
	call *Call
	// region is the region it is answered for; empty: every region.
	region string
}

// action answers one Query API action with the state locked; the result is
// the response's content (for EC2 the response element's children, for ELB
// the Result element's).
type action func(s *Server, r *request) (any, *apiError)

// actions are the Query API actions the fake answers, per service.
var actions = map[string]map[string]action{
	EC2: {
		"DescribeInstances":             (*Server).describeInstances,
		"DescribeAvailabilityZones":     (*Server).describeAvailabilityZones,
		"DescribeSubnets":               (*Server).describeSubnets,
		"DescribeRouteTables":           (*Server).describeRouteTables,
		"DescribeSecurityGroups":        (*Server).describeSecurityGroups,
		"CreateSecurityGroup":           (*Server).createSecurityGroup,
		"DeleteSecurityGroup":           (*Server).deleteSecurityGroup,
		"AuthorizeSecurityGroupIngress": (*Server).authorizeSecurityGroupIngress,
		"RevokeSecurityGroupIngress":    (*Server).revokeSecurityGroupIngress,
		"CreateTags":                    (*Server).createTags,
	},
	ELB: {
		"DescribeLoadBalancers":               (*Server).describeLoadBalancers,
		"CreateLoadBalancer":                  (*Server).createLoadBalancer,
		"DeleteLoadBalancer":                  (*Server).deleteLoadBalancer,
		"DescribeLoadBalancerAttributes":      (*Server).describeLoadBalancerAttributes,
		"ModifyLoadBalancerAttributes":        (*Server).modifyLoadBalancerAttributes,
		"ConfigureHealthCheck":                (*Server).configureHealthCheck,
		"RegisterInstancesWithLoadBalancer":   (*Server).registerInstances,
		"DeregisterInstancesFromLoadBalancer": (*Server).deregisterInstances,
		"CreateLoadBalancerListeners":         (*Server).createListeners,
		"DeleteLoadBalancerListeners":         (*Server).deleteListeners,
		"AddTags":                             (*Server).addTags,
	},
}

// XML namespaces of the APIs' responses.
const (
	ec2Namespace = "http://ec2.amazonaws.com/doc/2016-11-15/"
	elbNamespace = "http://elasticloadbalancing.amazonaws.com/doc/2012-06-01/"
)

var credentialRE = regexp.MustCompile(`Credential=([^/,\s]+)/[0-9]{8}/([^/,\s]+)/`)

// ServeHTTP answers the AWS APIs under /ec2, /elasticloadbalancing, /sts and
// /kms at no region's address: a signed request is answered for the region
// it is signed for (as if sent to that region's endpoint), an unsigned one
// for every region. Region is the endpoint of one region.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.serve(w, r, "")
}

// serve answers a request sent to the endpoint of region (empty: the
// region-less handler).
func (s *Server) serve(w http.ResponseWriter, r *http.Request, region string) {
	service := strings.Trim(r.URL.Path, "/")
	if i := strings.IndexByte(service, '/'); i >= 0 {
		service = service[:i]
	}
	c := Call{Service: service, Region: region}
	if m := credentialRE.FindStringSubmatch(r.Header.Get("Authorization")); m != nil {
		c.AccessKey, c.SignedRegion = m[1], m[2]
	}
	if c.Region == "" {
		c.Region = c.SignedRegion
	}
	if t := r.Header.Get("X-Amz-Target"); t != "" { // JSON protocols (KMS)
		c.Action = t
		c.Error = InvalidAction
		s.record(c)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"__type":%q,"message":"fakeec2 answers no %s call"}`, c.Error, service)
		return
	}
	if err := r.ParseForm(); err != nil {
		c.Action, c.Error = r.Method+" "+r.URL.Path, "MalformedQueryString"
		s.record(c)
		writeError(w, service, &apiError{code: c.Error, message: err.Error()})
		return
	}
	c.Action = r.Form.Get("Action")
	if c.SignedRegion != "" && c.SignedRegion != c.Region {
		// Sent to one region's endpoint, signed for another.
		c.Error = wrongScope(service)
		s.record(c)
		writeError(w, service, errorf(c.Error, "Credential should be scoped to a valid region, not '%s'.", c.SignedRegion))
		return
	}
	act, ok := actions[service][c.Action]
	if !ok {
		c.Error = InvalidAction
		s.record(c)
		writeError(w, service, errorf(InvalidAction, "fakeec2 answers no %s action %q", service, c.Action))
		return
	}
	req := &request{form: r.Form, call: &c, region: c.Region}
	s.mu.Lock()
	out, aerr := act(s, req)
	s.mu.Unlock()
	if aerr != nil {
		c.Error = aerr.code
	}
	s.record(c)
	if aerr != nil {
		writeError(w, service, aerr)
		return
	}
	writeResult(w, service, c.Action, out)
}

// writeResult writes the response of a successful action: for EC2 the
// content (with its requestId, ec2Meta) as <ActionResponse>, for ELB the
// content inside <ActionResult> followed by the ResponseMetadata.
func writeResult(w http.ResponseWriter, service, action string, out any) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = w.Write([]byte(xml.Header))
	enc := xml.NewEncoder(w)
	if service == ELB {
		start := xml.StartElement{Name: xml.Name{Space: elbNamespace, Local: action + "Response"}}
		_ = enc.EncodeToken(start)
		_ = enc.EncodeElement(out, xml.StartElement{Name: xml.Name{Local: action + "Result"}})
		_ = enc.EncodeElement(struct {
			RequestID string `xml:"RequestId"`
		}{"fakeec2"}, xml.StartElement{Name: xml.Name{Local: "ResponseMetadata"}})
		_ = enc.EncodeToken(start.End())
	} else {
		if m, ok := out.(interface{ setRequestID(string) }); ok {
			m.setRequestID("fakeec2")
		}
		_ = enc.EncodeElement(out, xml.StartElement{Name: xml.Name{Space: ec2Namespace, Local: action + "Response"}})
	}
	_ = enc.Flush()
}

// writeError answers an error as the service does: EC2 as
// <Response><Errors><Error>, the other Query APIs as <ErrorResponse><Error>.
func writeError(w http.ResponseWriter, service string, e *apiError) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write([]byte(xml.Header))
	enc := xml.NewEncoder(w)
	if service == EC2 {
		_ = enc.Encode(ec2ErrorResponse{Errors: []errorXML{{Code: e.code, Message: e.message}}, RequestID: "fakeec2"})
		return
	}
	_ = enc.Encode(queryErrorResponse{Error: queryErrorXML{Type: "Sender", Code: e.code, Message: e.message}, RequestID: "fakeec2"})
}

// IMDS returns a handler for the instance metadata service's address that
// records every request (service "imds") and answers 404.
func (s *Server) IMDS() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.record(Call{Service: IMDS, Action: r.Method + " " + r.URL.Path, Error: "NotFound"})
		http.NotFound(w, r)
	})
}

// indexed returns form values prefix1, prefix2, ... in order: EC2's lists
// (prefix "InstanceId.") and ELB's (prefix "Subnets.member.").
func indexed(form url.Values, prefix string) []string {
	var out []string
	for n := 1; ; n++ {
		v, ok := form[prefix+strconv.Itoa(n)]
		if !ok || len(v) == 0 {
			return out
		}
		out = append(out, v[0])
	}
}

// structs returns the prefixes prefix1., prefix2., ... of a list of
// structures (EC2 "IpPermissions.", ELB "Listeners.member.") for as long as
// the form has a field under them.
func structs(form url.Values, prefix string) []string {
	var out []string
	for n := 1; ; n++ {
		p := prefix + strconv.Itoa(n) + "."
		if !slices.ContainsFunc(mapKeys(form), func(k string) bool { return strings.HasPrefix(k, p) }) {
			return out
		}
		out = append(out, p)
	}
}

func mapKeys(form url.Values) []string {
	keys := make([]string, 0, len(form))
	for k := range form {
		keys = append(keys, k)
	}
	return keys
}

// int32Field parses an optional integer field; ok false when absent.
func int32Field(form url.Values, name string) (v int32, ok bool, err *apiError) {
	s := form.Get(name)
	if s == "" {
		return 0, false, nil
	}
	n, perr := strconv.ParseInt(s, 10, 32)
	if perr != nil {
		return 0, false, errorf("InvalidParameterValue", "%s: %q is not an integer", name, s)
	}
	return int32(n), true, nil
}

// filter is one EC2 Filter.N: a name and the values any of which matches.
type filter struct {
	name   string
	values []string
}

// filters reads Filter.N.Name / Filter.N.Value.M and records them on the
// call.
func (r *request) filters() []filter {
	var out []filter
	for n := 1; ; n++ {
		name := r.form.Get("Filter." + strconv.Itoa(n) + ".Name")
		if name == "" {
			return out
		}
		values := indexed(r.form, "Filter."+strconv.Itoa(n)+".Value.")
		out = append(out, filter{name, values})
		r.call.Filters = append(r.call.Filters, name+"="+strings.Join(values, ","))
	}
}

// fieldFunc returns the values of a resource that a filter name selects on;
// ok false for a name the fake does not know for that resource.
type fieldFunc func(name string) (values []string, ok bool)

// matches reports whether a resource passes every filter (any value of a
// filter matching any of its values).
func matches(filters []filter, field fieldFunc) (bool, *apiError) {
	for _, f := range filters {
		have, ok := field(f.name)
		if !ok {
			return false, errorf("InvalidParameterValue", "fakeec2 knows no filter %s here", f.name)
		}
		if !slices.ContainsFunc(f.values, func(want string) bool { return slices.Contains(have, want) }) {
			return false, nil
		}
	}
	return true, nil
}

// tagField answers the tag filters (tag-key, tag:<key>) on tags.
func tagField(tags map[string]string, name string) ([]string, bool) {
	switch {
	case name == "tag-key":
		var keys []string
		for k := range tags {
			keys = append(keys, k)
		}
		return keys, true
	case strings.HasPrefix(name, "tag:"):
		if v, ok := tags[strings.TrimPrefix(name, "tag:")]; ok {
			return []string{v}, true
		}
		return nil, true
	}
	return nil, false
}

// tags reads EC2 Tag.N.Key/Value under prefix ("Tag.", or
// "TagSpecification.1.Tag.").
func tagsFrom(form url.Values, prefix string) map[string]string {
	tags := map[string]string{}
	for _, p := range structs(form, prefix) {
		tags[form.Get(p+"Key")] = form.Get(p + "Value")
	}
	return tags
}

func copyTags(tags map[string]string) map[string]string {
	out := make(map[string]string, len(tags))
	for k, v := range tags {
		out[k] = v
	}
	return out
}

func tagSet(tags map[string]string) []tagXML {
	keys := make([]string, 0, len(tags))
	for k := range tags {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	out := make([]tagXML, 0, len(keys))
	for _, k := range keys {
		out = append(out, tagXML{Key: k, Value: tags[k]})
	}
	return out
}

// ec2Meta is embedded first in every EC2 response: its requestId.
type ec2Meta struct {
	RequestID string `xml:"requestId"`
}

func (m *ec2Meta) setRequestID(id string) { m.RequestID = id }

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type ec2ErrorResponse struct {
	XMLName   xml.Name   `xml:"Response"`
	Errors    []errorXML `xml:"Errors>Error"`
	RequestID string     `xml:"RequestID"`
}

type errorXML struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}

type queryErrorResponse struct {
	XMLName   xml.Name      `xml:"ErrorResponse"`
	Error     queryErrorXML `xml:"Error"`
	RequestID string        `xml:"RequestId"`
}

type queryErrorXML struct {
	Type    string `xml:"Type"`
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}
