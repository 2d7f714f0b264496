// Package fakeec2 is a loopback stand-in for the AWS APIs that the upstream AWS
// cloud controller manager (k8s.io/cloud-provider-aws) is pointed at through
// its cloud.conf [ServiceOverride] sections, for tests and the demo.
//
// It owns:
//   - EC2's Query API for what cloud-node-lifecycle asks: DescribeInstances by
//     instance IDs (InvalidInstanceID.NotFound when any is unknown, as EC2
//     answers) and by filters (private-dns-name, instance-state-name,
//     instance-id, tag-key, tag:<key>), instances running, stopped or
//     terminated;
//   - one path per service (/ec2, /elasticloadbalancing, /sts, /kms), so a call
//     to a service the CCM should not need is recorded under that service and
//     answered with an error;
//   - a record of every request, with the access key and region of its SigV4
//     Authorization header (the signature itself is not checked), and of every
//     request to the instance metadata service handler (IMDS), which answers
//     nothing but 404.
//
// It must not pretend to more of EC2 than that: any other action or filter is
// an error the CCM logs and the call log shows.
package fakeec2

import (
	"encoding/xml"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
)

// States of an instance, as EC2 names them.
const (
	Running    = "running"
	Stopped    = "stopped"
	Terminated = "terminated"
)

var stateCodes = map[string]int{"pending": 0, Running: 16, "shutting-down": 32, Terminated: 48, "stopping": 64, Stopped: 80}

// Instance is an EC2 instance the fake knows.
type Instance struct {
	ID             string
	State          string
	Zone           string
	PrivateDNSName string
	PrivateIP      string
	Type           string
	Tags           map[string]string
}

// Call is one request the fake received.
type Call struct {
	// Service is the path the request was sent to: ec2, elasticloadbalancing,
	// sts, kms, or imds for the metadata handler.
	Service string
	// Action is the Query API action (or the X-Amz-Target of a JSON API, or
	// METHOD path for IMDS).
	Action      string
	InstanceIDs []string
	// Filters are name=value[,value] in request order.
	Filters []string
	// AccessKey and Region are from the SigV4 Authorization header's
	// credential scope; empty when unsigned.
	AccessKey, Region string
	// Error is the error code the fake answered, if any.
	Error string
}

func (c Call) String() string {
	s := c.Service + " " + c.Action
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
	instances map[string]*Instance
	calls     []Call
	ownerID   string
}

// New returns a fake that knows the given instances.
func New(instances ...Instance) *Server {
	s := &Server{instances: map[string]*Instance{}, ownerID: "123456789012"}
	for _, i := range instances {
		s.Put(i)
	}
	return s
}

// Put adds or replaces an instance.
func (s *Server) Put(i Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := i
	c.Tags = map[string]string{}
	for k, v := range i.Tags {
		c.Tags[k] = v
	}
	s.instances[i.ID] = &c
}

// SetState changes an instance's state (e.g. Terminated); false if unknown.
func (s *Server) SetState(id, state string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.instances[id]
	if ok {
		i.State = state
	}
	return ok
}

// Remove forgets an instance: EC2 no longer lists it (absent).
func (s *Server) Remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.instances, id)
}

// Calls returns every request received so far.
func (s *Server) Calls() []Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
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

var credentialRE = regexp.MustCompile(`Credential=([^/,\s]+)/[0-9]{8}/([^/,\s]+)/`)

// ServeHTTP answers the AWS APIs under /ec2, /elasticloadbalancing, /sts and
// /kms.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	service := strings.Trim(r.URL.Path, "/")
	if i := strings.IndexByte(service, '/'); i >= 0 {
		service = service[:i]
	}
	c := Call{Service: service}
	if m := credentialRE.FindStringSubmatch(r.Header.Get("Authorization")); m != nil {
		c.AccessKey, c.Region = m[1], m[2]
	}
	if t := r.Header.Get("X-Amz-Target"); t != "" { // JSON protocols (KMS)
		c.Action = t
		c.Error = "UnsupportedOperation"
		s.record(c)
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		w.WriteHeader(http.StatusBadRequest)
		fmt.Fprintf(w, `{"__type":%q,"message":"fakeec2 answers no %s call"}`, c.Error, service)
		return
	}
	if err := r.ParseForm(); err != nil {
		c.Action, c.Error = r.Method+" "+r.URL.Path, "MalformedQueryString"
		s.record(c)
		queryError(w, c.Error, err.Error())
		return
	}
	c.Action = r.Form.Get("Action")
	if service != "ec2" || c.Action != "DescribeInstances" {
		c.Error = "InvalidAction"
		s.record(c)
		queryError(w, c.Error, fmt.Sprintf("fakeec2 answers no %s %s", service, c.Action))
		return
	}
	c.InstanceIDs = indexed(r.Form, "InstanceId.")
	filters := map[string][]string{}
	for n := 1; ; n++ {
		name := r.Form.Get("Filter." + strconv.Itoa(n) + ".Name")
		if name == "" {
			break
		}
		values := indexed(r.Form, "Filter."+strconv.Itoa(n)+".Value.")
		filters[name] = values
		c.Filters = append(c.Filters, name+"="+strings.Join(values, ","))
	}
	out, code, msg := s.describe(c.InstanceIDs, filters)
	c.Error = code
	s.record(c)
	if code != "" {
		queryError(w, code, msg)
		return
	}
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(out)
}

// indexed returns form values prefix1, prefix2, ... in order.
func indexed(form map[string][]string, prefix string) []string {
	var out []string
	for n := 1; ; n++ {
		v, ok := form[prefix+strconv.Itoa(n)]
		if !ok || len(v) == 0 {
			return out
		}
		out = append(out, v[0])
	}
}

func (s *Server) describe(ids []string, filters map[string][]string) (*describeInstancesResponse, string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var selected []*Instance
	if len(ids) > 0 {
		var missing []string
		for _, id := range ids {
			if i, ok := s.instances[id]; ok {
				selected = append(selected, i)
			} else {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return nil, "InvalidInstanceID.NotFound", fmt.Sprintf("The instance IDs '%s' do not exist", strings.Join(missing, ", "))
		}
	} else {
		for _, i := range s.instances {
			selected = append(selected, i)
		}
		sort.Slice(selected, func(a, b int) bool { return selected[a].ID < selected[b].ID })
	}
	var match []*Instance
	for _, i := range selected {
		ok, err := matches(i, filters)
		if err != "" {
			return nil, "InvalidParameterValue", err
		}
		if ok {
			match = append(match, i)
		}
	}
	out := &describeInstancesResponse{RequestID: "fakeec2"}
	for _, i := range match {
		x := instanceXML{ID: i.ID, ImageID: "ami-00000000", Type: i.Type, PrivateDNSName: i.PrivateDNSName, PrivateIP: i.PrivateIP,
			State: stateXML{Code: stateCodes[i.State], Name: i.State}, Placement: placementXML{Zone: i.Zone}}
		keys := make([]string, 0, len(i.Tags))
		for k := range i.Tags {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			x.Tags = append(x.Tags, tagXML{Key: k, Value: i.Tags[k]})
		}
		out.Reservations = append(out.Reservations, reservationXML{ID: "r-" + strings.TrimPrefix(i.ID, "i-"), OwnerID: s.ownerID, Instances: []instanceXML{x}})
	}
	return out, "", ""
}

func matches(i *Instance, filters map[string][]string) (bool, string) {
	for name, values := range filters {
		var v []string
		switch {
		case name == "private-dns-name":
			v = []string{i.PrivateDNSName}
		case name == "instance-state-name":
			v = []string{i.State}
		case name == "instance-id":
			v = []string{i.ID}
		case name == "tag-key":
			for k := range i.Tags {
				v = append(v, k)
			}
		case strings.HasPrefix(name, "tag:"):
			if t, ok := i.Tags[strings.TrimPrefix(name, "tag:")]; ok {
				v = []string{t}
			}
		default:
			return false, "fakeec2 knows no filter " + name
		}
		if !slices.ContainsFunc(values, func(want string) bool { return slices.Contains(v, want) }) {
			return false, ""
		}
	}
	return true, ""
}

func queryError(w http.ResponseWriter, code, msg string) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(http.StatusBadRequest)
	_, _ = w.Write([]byte(xml.Header))
	_ = xml.NewEncoder(w).Encode(errorResponse{Errors: []errorXML{{Code: code, Message: msg}}, RequestID: "fakeec2"})
}

// IMDS returns a handler for the instance metadata service's address that
// records every request (service "imds") and answers 404.
func (s *Server) IMDS() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.record(Call{Service: "imds", Action: r.Method + " " + r.URL.Path, Error: "NotFound"})
		http.NotFound(w, r)
	})
}

type describeInstancesResponse struct {
	XMLName      xml.Name         `xml:"http://ec2.amazonaws.com/doc/2016-11-15/ DescribeInstancesResponse"`
	RequestID    string           `xml:"requestId"`
	Reservations []reservationXML `xml:"reservationSet>item"`
}

type reservationXML struct {
	ID        string        `xml:"reservationId"`
	OwnerID   string        `xml:"ownerId"`
	Instances []instanceXML `xml:"instancesSet>item"`
}

type instanceXML struct {
	ID             string       `xml:"instanceId"`
	ImageID        string       `xml:"imageId"`
	State          stateXML     `xml:"instanceState"`
	PrivateDNSName string       `xml:"privateDnsName"`
	Type           string       `xml:"instanceType,omitempty"`
	Placement      placementXML `xml:"placement"`
	PrivateIP      string       `xml:"privateIpAddress,omitempty"`
	Tags           []tagXML     `xml:"tagSet>item"`
}

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type placementXML struct {
	Zone string `xml:"availabilityZone"`
}

type tagXML struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

type errorResponse struct {
	XMLName   xml.Name   `xml:"Response"`
	Errors    []errorXML `xml:"Errors>Error"`
	RequestID string     `xml:"RequestID"`
}

type errorXML struct {
	Code    string `xml:"Code"`
	Message string `xml:"Message"`
}
