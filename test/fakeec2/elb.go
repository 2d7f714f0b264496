package fakeec2

import (
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// LoadBalancer is a Classic Load Balancer.
type LoadBalancer struct {
	Name string
	// DNSName is <name>-<number>.<region>.elb.amazonaws.com
	// (internal-<name>-... for an internal one).
	DNSName string
	// Scheme is internet-facing or internal.
	Scheme         string
	VPC            string
	Subnets, Zones []string
	SecurityGroups []string
	Listeners      []Listener
	HealthCheck    HealthCheck
	Attributes     Attributes
	Tags           map[string]string
	Created        time.Time
	// Instances are the registered instances' IDs, sorted.
	Instances []string
}

// Listener forwards a load balancer port to an instance port.
type Listener struct {
	Protocol         string
	Port             int32
	InstanceProtocol string
	InstancePort     int32
	SSLCertificateID string
}

// HealthCheck is how the load balancer probes its instances.
type HealthCheck struct {
	// Target is PROTOCOL:port[/path].
	Target                               string
	Interval, Timeout                    int32
	UnhealthyThreshold, HealthyThreshold int32
}

// Attributes are a load balancer's attributes, with the defaults of one the
// API creates.
type Attributes struct {
	CrossZone                 bool
	AccessLog                 bool
	AccessLogBucket           string
	AccessLogPrefix           string
	AccessLogInterval         int32
	ConnectionDraining        bool
	ConnectionDrainingTimeout int32
	IdleTimeout               int32
}

// LoadBalancers returns the load balancers, by name.
func (s *Server) LoadBalancers() []LoadBalancer {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.lbs))
	for n := range s.lbs {
		names = append(names, n)
	}
	slices.Sort(names)
	out := make([]LoadBalancer, 0, len(names))
	for _, n := range names {
		out = append(out, cloneLB(s.lbs[n]))
	}
	return out
}

func cloneLB(lb *LoadBalancer) LoadBalancer {
	c := *lb
	c.Subnets, c.Zones, c.SecurityGroups = slices.Clone(lb.Subnets), slices.Clone(lb.Zones), slices.Clone(lb.SecurityGroups)
	c.Listeners, c.Instances = slices.Clone(lb.Listeners), slices.Clone(lb.Instances)
	c.Tags = copyTags(lb.Tags)
	return c
}

var lbNameRE = regexp.MustCompile(`^[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,30}[a-zA-Z0-9])?$`)

// loadBalancer returns the load balancer LoadBalancerName names.
func (s *Server) loadBalancer(r *request) (*LoadBalancer, *apiError) {
	name := r.form.Get("LoadBalancerName")
	r.call.Resource = name
	lb, ok := s.lbs[name]
	if !ok {
		return nil, notFound(name)
	}
	return lb, nil
}

func notFound(name string) *apiError {
	return errorf("LoadBalancerNotFound", "There is no ACTIVE Load Balancer named '%s'", name)
}

// describeLoadBalancers answers DescribeLoadBalancers by
// LoadBalancerNames.member.N (every one must exist), or all, in one page.
func (s *Server) describeLoadBalancers(r *request) (any, *apiError) {
	names := indexed(r.form, "LoadBalancerNames.member.")
	if len(names) == 1 {
		r.call.Resource = names[0]
	}
	if len(names) == 0 {
		for n := range s.lbs {
			names = append(names, n)
		}
		slices.Sort(names)
	}
	out := &describeLoadBalancersResult{}
	for _, n := range names {
		lb, ok := s.lbs[n]
		if !ok {
			return nil, notFound(n)
		}
		out.LoadBalancers = append(out.LoadBalancers, s.lbXML(lb))
	}
	return out, nil
}

func (s *Server) lbXML(lb *LoadBalancer) loadBalancerXML {
	x := loadBalancerXML{Name: lb.Name, DNSName: lb.DNSName, Scheme: lb.Scheme, VPC: lb.VPC,
		CanonicalHostedZoneName: lb.DNSName, CanonicalHostedZoneNameID: "ZFAKEELB0000",
		Zones: slices.Clone(lb.Zones), Subnets: slices.Clone(lb.Subnets), SecurityGroups: slices.Clone(lb.SecurityGroups),
		Created:     lb.Created.UTC().Format("2006-01-02T15:04:05.000Z"),
		HealthCheck: healthCheckXML(lb.HealthCheck),
	}
	if lb.Scheme == "internal" {
		x.CanonicalHostedZoneName = ""
	}
	if len(lb.SecurityGroups) > 0 {
		if g, ok := s.groups[lb.SecurityGroups[0]]; ok {
			x.SourceSecurityGroup = &sourceSecurityGroupXML{Owner: s.ownerID, Name: g.Name}
		}
	}
	for _, l := range lb.Listeners {
		x.Listeners = append(x.Listeners, listenerDescriptionXML{Listener: listenerXML(l)})
	}
	for _, id := range lb.Instances {
		x.Instances = append(x.Instances, instanceIDXML{ID: id})
	}
	return x
}

// listeners reads Listeners.member.N.
func listeners(r *request) ([]Listener, *apiError) {
	var out []Listener
	for _, p := range structs(r.form, "Listeners.member.") {
		l := Listener{Protocol: strings.ToUpper(r.form.Get(p + "Protocol")), InstanceProtocol: strings.ToUpper(r.form.Get(p + "InstanceProtocol")),
			SSLCertificateID: r.form.Get(p + "SSLCertificateId")}
		port, ok, err := int32Field(r.form, p+"LoadBalancerPort")
		if err != nil {
			return nil, err
		}
		iport, iok, err := int32Field(r.form, p+"InstancePort")
		if err != nil {
			return nil, err
		}
		if !ok || !iok || l.Protocol == "" {
			return nil, errorf("ValidationError", "a listener needs Protocol, LoadBalancerPort and InstancePort")
		}
		switch l.Protocol {
		case "HTTP", "HTTPS", "TCP", "SSL":
		default:
			return nil, errorf("ValidationError", "Invalid protocol %s", l.Protocol)
		}
		if l.InstanceProtocol == "" {
			l.InstanceProtocol = l.Protocol
		}
		if (l.Protocol == "HTTPS" || l.Protocol == "SSL") && l.SSLCertificateID == "" {
			return nil, errorf("ValidationError", "listener %s:%d needs an SSLCertificateId", l.Protocol, port)
		}
		l.Port, l.InstancePort = port, iport
		out = append(out, l)
	}
	return out, nil
}

// createListeners adds Listeners.member.N to LoadBalancerName; a port that
// already has a listener is a DuplicateListener and nothing changes.
func (s *Server) createListeners(r *request) (any, *apiError) {
	lb, err := s.loadBalancer(r)
	if err != nil {
		return nil, err
	}
	ls, err := listeners(r)
	if err != nil {
		return nil, err
	}
	for _, l := range ls {
		if slices.ContainsFunc(lb.Listeners, func(o Listener) bool { return o.Port == l.Port }) {
			return nil, errorf("DuplicateListener", "a listener already exists for %s on port %d", lb.Name, l.Port)
		}
	}
	lb.Listeners = append(lb.Listeners, ls...)
	return &struct{}{}, nil
}

// deleteListeners removes the listeners of LoadBalancerPorts.member.N from
// LoadBalancerName (a port without one is no error).
func (s *Server) deleteListeners(r *request) (any, *apiError) {
	lb, err := s.loadBalancer(r)
	if err != nil {
		return nil, err
	}
	ports := indexed(r.form, "LoadBalancerPorts.member.")
	lb.Listeners = slices.DeleteFunc(lb.Listeners, func(l Listener) bool { return slices.Contains(ports, itoa(l.Port)) })
	return &struct{}{}, nil
}

// createLoadBalancer answers CreateLoadBalancer in a VPC: Listeners,
// Subnets (existing, one per availability zone), SecurityGroups (existing,
// in the subnets' VPC), Scheme, Tags.
func (s *Server) createLoadBalancer(r *request) (any, *apiError) {
	name := r.form.Get("LoadBalancerName")
	r.call.Resource = name
	if !lbNameRE.MatchString(name) {
		return nil, errorf("ValidationError", "LoadBalancerName %q: at most 32 letters, digits and hyphens", name)
	}
	if _, ok := s.lbs[name]; ok {
		return nil, errorf("DuplicateLoadBalancerName", "Load Balancer named '%s' already exists", name)
	}
	ls, err := listeners(r)
	if err != nil {
		return nil, err
	}
	if len(ls) == 0 {
		return nil, errorf("ValidationError", "Listeners are required")
	}
	lb := &LoadBalancer{Name: name, Scheme: r.form.Get("Scheme"), Listeners: ls, Created: time.Now(), Tags: map[string]string{},
		Attributes: Attributes{ConnectionDrainingTimeout: 300, IdleTimeout: 60}}
	if lb.Scheme == "" {
		lb.Scheme = "internet-facing"
	}
	if lb.Scheme != "internet-facing" && lb.Scheme != "internal" {
		return nil, errorf("ValidationError", "Scheme %q", lb.Scheme)
	}
	if len(indexed(r.form, "AvailabilityZones.member.")) > 0 {
		return nil, errorf("ValidationError", "fakeec2 creates load balancers in subnets of a VPC only")
	}
	lb.Subnets = indexed(r.form, "Subnets.member.")
	if len(lb.Subnets) == 0 {
		return nil, errorf("ValidationError", "Subnets are required")
	}
	for _, id := range lb.Subnets {
		n, ok := s.subnet(r, id)
		if !ok {
			return nil, errorf("SubnetNotFound", "The subnet %s does not exist", id)
		}
		if lb.VPC == "" {
			lb.VPC = n.VPC
		}
		if n.VPC != lb.VPC {
			return nil, errorf("InvalidConfigurationRequest", "subnets %s are in different VPCs", strings.Join(lb.Subnets, ", "))
		}
		if slices.Contains(lb.Zones, n.Zone) {
			return nil, errorf("InvalidConfigurationRequest", "more than one subnet in availability zone %s", n.Zone)
		}
		lb.Zones = append(lb.Zones, n.Zone)
	}
	slices.Sort(lb.Zones)
	lb.SecurityGroups = indexed(r.form, "SecurityGroups.member.")
	if len(lb.SecurityGroups) == 0 {
		return nil, errorf("ValidationError", "fakeec2 needs SecurityGroups (it has no default security group)")
	}
	for _, id := range lb.SecurityGroups {
		g, ok := s.groups[id]
		if !ok || g.VPC != lb.VPC {
			return nil, errorf("InvalidSecurityGroup", "security group %s does not exist in VPC %s", id, lb.VPC)
		}
	}
	for _, p := range structs(r.form, "Tags.member.") {
		lb.Tags[r.form.Get(p+"Key")] = r.form.Get(p + "Value")
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	region := r.call.Region
	if region == "" {
		region = "us-east-1"
	}
	lb.DNSName = name + "-" + strconv.FormatUint(uint64(h.Sum32()), 10) + "." + region + ".elb.amazonaws.com"
	if lb.Scheme == "internal" {
		lb.DNSName = "internal-" + lb.DNSName
	}
	lb.HealthCheck = HealthCheck{Target: "TCP:" + itoa(ls[0].InstancePort), Interval: 30, Timeout: 5, UnhealthyThreshold: 2, HealthyThreshold: 10}
	s.lbs[name] = lb
	return &createLoadBalancerResult{DNSName: lb.DNSName}, nil
}

// deleteLoadBalancer answers DeleteLoadBalancer; deleting one that does not
// exist succeeds, as in AWS.
func (s *Server) deleteLoadBalancer(r *request) (any, *apiError) {
	name := r.form.Get("LoadBalancerName")
	r.call.Resource = name
	delete(s.lbs, name)
	return &struct{}{}, nil
}

func (s *Server) describeLoadBalancerAttributes(r *request) (any, *apiError) {
	lb, err := s.loadBalancer(r)
	if err != nil {
		return nil, err
	}
	return &loadBalancerAttributesResult{Attributes: attributesXML(lb.Attributes)}, nil
}

// modifyLoadBalancerAttributes changes the attributes the request names and
// keeps the others.
func (s *Server) modifyLoadBalancerAttributes(r *request) (any, *apiError) {
	lb, err := s.loadBalancer(r)
	if err != nil {
		return nil, err
	}
	a := lb.Attributes
	const p = "LoadBalancerAttributes."
	boolField := func(name string, v *bool) *apiError {
		switch v2 := r.form.Get(p + name); v2 {
		case "":
		case "true", "false":
			*v = v2 == "true"
		default:
			return errorf("ValidationError", "%s: %q is not a boolean", name, v2)
		}
		return nil
	}
	intField := func(name string, v *int32) *apiError {
		n, ok, err := int32Field(r.form, p+name)
		if ok {
			*v = n
		}
		return err
	}
	for _, e := range []*apiError{
		boolField("CrossZoneLoadBalancing.Enabled", &a.CrossZone),
		boolField("AccessLog.Enabled", &a.AccessLog),
		intField("AccessLog.EmitInterval", &a.AccessLogInterval),
		boolField("ConnectionDraining.Enabled", &a.ConnectionDraining),
		intField("ConnectionDraining.Timeout", &a.ConnectionDrainingTimeout),
		intField("ConnectionSettings.IdleTimeout", &a.IdleTimeout),
	} {
		if e != nil {
			return nil, e
		}
	}
	if v, ok := r.form[p+"AccessLog.S3BucketName"]; ok {
		a.AccessLogBucket = v[0]
	}
	if v, ok := r.form[p+"AccessLog.S3BucketPrefix"]; ok {
		a.AccessLogPrefix = v[0]
	}
	if a.AccessLog && a.AccessLogBucket == "" {
		return nil, errorf("InvalidConfigurationRequest", "access logs need an S3 bucket")
	}
	if len(structs(r.form, p+"AdditionalAttributes.member.")) > 0 {
		return nil, errorf("ValidationError", "fakeec2 knows no additional attributes")
	}
	lb.Attributes = a
	return &modifyLoadBalancerAttributesResult{Name: lb.Name, Attributes: attributesXML(a)}, nil
}

var healthTargetRE = regexp.MustCompile(`^(?:(?:HTTP|HTTPS):[0-9]{1,5}/.*|(?:TCP|SSL):[0-9]{1,5})$`)

func (s *Server) configureHealthCheck(r *request) (any, *apiError) {
	lb, err := s.loadBalancer(r)
	if err != nil {
		return nil, err
	}
	const p = "HealthCheck."
	hc := HealthCheck{Target: r.form.Get(p + "Target")}
	if !healthTargetRE.MatchString(hc.Target) {
		return nil, errorf("ValidationError", "HealthCheck.Target %q is not PROTOCOL:port[/path]", hc.Target)
	}
	for name, v := range map[string]*int32{"Interval": &hc.Interval, "Timeout": &hc.Timeout,
		"UnhealthyThreshold": &hc.UnhealthyThreshold, "HealthyThreshold": &hc.HealthyThreshold} {
		n, ok, err := int32Field(r.form, p+name)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errorf("ValidationError", "HealthCheck.%s is required", name)
		}
		*v = n
	}
	if hc.Timeout >= hc.Interval {
		return nil, errorf("ValidationError", "HealthCheck.Timeout must be less than the interval")
	}
	lb.HealthCheck = hc
	return &healthCheckResult{HealthCheck: healthCheckXML(hc)}, nil
}

// instancesOf reads Instances.member.N.InstanceId and records them.
func instancesOf(r *request) []string {
	var ids []string
	for _, p := range structs(r.form, "Instances.member.") {
		ids = append(ids, r.form.Get(p+"InstanceId"))
	}
	r.call.InstanceIDs = ids
	return ids
}

// registerInstances registers instances of the load balancer's VPC that are
// not terminated (others: InvalidInstance, nothing changes).
func (s *Server) registerInstances(r *request) (any, *apiError) {
	lb, err := s.loadBalancer(r)
	if err != nil {
		return nil, err
	}
	ids := instancesOf(r)
	for _, id := range ids {
		i, ok := s.instance(r, id)
		if !ok || i.State == Terminated || i.VPC != lb.VPC {
			return nil, errorf("InvalidInstance", "The requested instance %s is not in a valid state or not in VPC %s", id, lb.VPC)
		}
	}
	for _, id := range ids {
		if !slices.Contains(lb.Instances, id) {
			lb.Instances = append(lb.Instances, id)
		}
	}
	slices.Sort(lb.Instances)
	return &instancesResult{Instances: instanceIDsXML(lb.Instances)}, nil
}

// deregisterInstances deregisters registered instances (others:
// InvalidInstance, nothing changes).
func (s *Server) deregisterInstances(r *request) (any, *apiError) {
	lb, err := s.loadBalancer(r)
	if err != nil {
		return nil, err
	}
	ids := instancesOf(r)
	for _, id := range ids {
		if !slices.Contains(lb.Instances, id) {
			return nil, errorf("InvalidInstance", "The instance %s is not registered with load balancer %s", id, lb.Name)
		}
	}
	lb.Instances = slices.DeleteFunc(lb.Instances, func(id string) bool { return slices.Contains(ids, id) })
	return &instancesResult{Instances: instanceIDsXML(lb.Instances)}, nil
}

func (s *Server) addTags(r *request) (any, *apiError) {
	names := indexed(r.form, "LoadBalancerNames.member.")
	if len(names) == 1 {
		r.call.Resource = names[0]
	}
	for _, n := range names {
		if _, ok := s.lbs[n]; !ok {
			return nil, notFound(n)
		}
	}
	for _, n := range names {
		for _, p := range structs(r.form, "Tags.member.") {
			s.lbs[n].Tags[r.form.Get(p+"Key")] = r.form.Get(p + "Value")
		}
	}
	return &struct{}{}, nil
}

func itoa(n int32) string { return strconv.Itoa(int(n)) }

func listenerXML(l Listener) listenerX {
	return listenerX{Protocol: l.Protocol, Port: l.Port, InstanceProtocol: l.InstanceProtocol, InstancePort: l.InstancePort, SSLCertificateID: l.SSLCertificateID}
}

func healthCheckXML(h HealthCheck) healthCheckX {
	return healthCheckX{Target: h.Target, Interval: h.Interval, Timeout: h.Timeout, UnhealthyThreshold: h.UnhealthyThreshold, HealthyThreshold: h.HealthyThreshold}
}

func attributesXML(a Attributes) attributesX {
	return attributesX{
		CrossZone:          enabledX{Enabled: a.CrossZone},
		AccessLog:          accessLogX{Enabled: a.AccessLog, Bucket: a.AccessLogBucket, Prefix: a.AccessLogPrefix, Interval: a.AccessLogInterval},
		ConnectionDraining: drainingX{Enabled: a.ConnectionDraining, Timeout: a.ConnectionDrainingTimeout},
		ConnectionSettings: settingsX{IdleTimeout: a.IdleTimeout},
	}
}

func instanceIDsXML(ids []string) []instanceIDXML {
	out := make([]instanceIDXML, 0, len(ids))
	for _, id := range ids {
		out = append(out, instanceIDXML{ID: id})
	}
	return out
}

type describeLoadBalancersResult struct {
	LoadBalancers []loadBalancerXML `xml:"LoadBalancerDescriptions>member"`
}

type loadBalancerXML struct {
	Name                      string                   `xml:"LoadBalancerName"`
	DNSName                   string                   `xml:"DNSName"`
	CanonicalHostedZoneName   string                   `xml:"CanonicalHostedZoneName,omitempty"`
	CanonicalHostedZoneNameID string                   `xml:"CanonicalHostedZoneNameID"`
	Listeners                 []listenerDescriptionXML `xml:"ListenerDescriptions>member"`
	Zones                     []string                 `xml:"AvailabilityZones>member"`
	Subnets                   []string                 `xml:"Subnets>member"`
	VPC                       string                   `xml:"VPCId"`
	Instances                 []instanceIDXML          `xml:"Instances>member"`
	HealthCheck               healthCheckX             `xml:"HealthCheck"`
	SourceSecurityGroup       *sourceSecurityGroupXML  `xml:"SourceSecurityGroup,omitempty"`
	SecurityGroups            []string                 `xml:"SecurityGroups>member"`
	Created                   string                   `xml:"CreatedTime"`
	Scheme                    string                   `xml:"Scheme"`
}

type listenerDescriptionXML struct {
	Listener listenerX `xml:"Listener"`
}

type listenerX struct {
	Protocol         string `xml:"Protocol"`
	Port             int32  `xml:"LoadBalancerPort"`
	InstanceProtocol string `xml:"InstanceProtocol"`
	InstancePort     int32  `xml:"InstancePort"`
	SSLCertificateID string `xml:"SSLCertificateId,omitempty"`
}

type instanceIDXML struct {
	ID string `xml:"InstanceId"`
}

type healthCheckX struct {
	Target             string `xml:"Target"`
	Interval           int32  `xml:"Interval"`
	Timeout            int32  `xml:"Timeout"`
	UnhealthyThreshold int32  `xml:"UnhealthyThreshold"`
	HealthyThreshold   int32  `xml:"HealthyThreshold"`
}

type sourceSecurityGroupXML struct {
	Owner string `xml:"OwnerAlias"`
	Name  string `xml:"GroupName"`
}

type createLoadBalancerResult struct {
	DNSName string `xml:"DNSName"`
}

type loadBalancerAttributesResult struct {
	Attributes attributesX `xml:"LoadBalancerAttributes"`
}

type modifyLoadBalancerAttributesResult struct {
	Name       string      `xml:"LoadBalancerName"`
	Attributes attributesX `xml:"LoadBalancerAttributes"`
}

type attributesX struct {
	CrossZone          enabledX   `xml:"CrossZoneLoadBalancing"`
	AccessLog          accessLogX `xml:"AccessLog"`
	ConnectionDraining drainingX  `xml:"ConnectionDraining"`
	ConnectionSettings settingsX  `xml:"ConnectionSettings"`
}

type enabledX struct {
	Enabled bool `xml:"Enabled"`
}

type accessLogX struct {
	Enabled  bool   `xml:"Enabled"`
	Bucket   string `xml:"S3BucketName,omitempty"`
	Interval int32  `xml:"EmitInterval,omitempty"`
	Prefix   string `xml:"S3BucketPrefix,omitempty"`
}

type drainingX struct {
	Enabled bool  `xml:"Enabled"`
	Timeout int32 `xml:"Timeout"`
}

type settingsX struct {
	IdleTimeout int32 `xml:"IdleTimeout"`
}

type healthCheckResult struct {
	HealthCheck healthCheckX `xml:"HealthCheck"`
}

type instancesResult struct {
	Instances []instanceIDXML `xml:"Instances>member"`
}
