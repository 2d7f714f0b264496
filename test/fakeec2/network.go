package fakeec2

import (
	"slices"
	"sort"
	"strings"
)

// Subnet is a VPC subnet the fake knows.
type Subnet struct {
	ID, VPC, Zone, CIDR string
	// Public subnets route 0.0.0.0/0 to an internet gateway (their own
	// route table); the others use the VPC's main route table, which routes
	// only within the VPC.
	Public bool
	Tags   map[string]string
}

// SecurityGroup is a VPC security group.
type SecurityGroup struct {
	ID, Name, Description, VPC string
	Tags                       map[string]string
	// Ingress rules, one per protocol and port range, as EC2 groups them.
	Ingress []Permission
}

// Permission is one ingress rule: traffic of a protocol and port range from
// address ranges and from members of security groups.
type Permission struct {
	// Protocol is tcp, udp, icmp (ports are type and code) or -1 (all, no
	// ports).
	Protocol         string
	FromPort, ToPort int32
	CIDRs            []string
	// Groups are the source security groups' IDs.
	Groups []string
}

func (p Permission) sameRange(q Permission) bool {
	return p.Protocol == q.Protocol && (p.Protocol == "-1" || p.FromPort == q.FromPort && p.ToPort == q.ToPort)
}

// PutSubnet adds or replaces a subnet.
func (s *Server) PutSubnet(n Subnet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := n
	c.Tags = copyTags(n.Tags)
	s.subnets[n.ID] = &c
}

// PutSecurityGroup adds or replaces a security group.
func (s *Server) PutSecurityGroup(g SecurityGroup) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[g.ID] = cloneGroup(&g)
}

// SecurityGroups returns the security groups, by ID.
func (s *Server) SecurityGroups() []SecurityGroup {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SecurityGroup, 0, len(s.groups))
	for _, g := range s.sortedGroups() {
		out = append(out, *cloneGroup(g))
	}
	return out
}

func cloneGroup(g *SecurityGroup) *SecurityGroup {
	c := *g
	c.Tags = copyTags(g.Tags)
	c.Ingress = make([]Permission, len(g.Ingress))
	for i, p := range g.Ingress {
		c.Ingress[i] = Permission{Protocol: p.Protocol, FromPort: p.FromPort, ToPort: p.ToPort, CIDRs: slices.Clone(p.CIDRs), Groups: slices.Clone(p.Groups)}
	}
	return &c
}

func (s *Server) sortedGroups() []*SecurityGroup {
	out := make([]*SecurityGroup, 0, len(s.groups))
	for _, g := range s.groups {
		out = append(out, g)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

func (s *Server) sortedSubnets() []*Subnet {
	out := make([]*Subnet, 0, len(s.subnets))
	for _, n := range s.subnets {
		out = append(out, n)
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}

// describeAvailabilityZones lists the zones of the fake's subnets and
// instances in the request's region, all of type availability-zone.
func (s *Server) describeAvailabilityZones(r *request) (any, *apiError) {
	if len(r.filters()) > 0 || len(indexed(r.form, "ZoneName.")) > 0 {
		return nil, errorf("InvalidParameterValue", "fakeec2 lists all availability zones only")
	}
	zones := map[string]bool{}
	for _, n := range s.subnets {
		if r.sees(RegionOf(n.Zone)) {
			zones[n.Zone] = true
		}
	}
	for _, i := range s.instances {
		if i.Zone != "" && r.sees(i.region()) {
			zones[i.Zone] = true
		}
	}
	names := make([]string, 0, len(zones))
	for z := range zones {
		names = append(names, z)
	}
	slices.Sort(names)
	out := &describeAvailabilityZonesResponse{}
	for _, z := range names {
		region := RegionOf(z)
		out.Zones = append(out.Zones, zoneXML{Name: z, ID: "fake-" + z, Type: "availability-zone", State: "available",
			Region: region, Group: region, BorderGroup: region, OptIn: "opt-in-not-required"})
	}
	return out, nil
}

// describeSubnets answers DescribeSubnets for the request's region by
// SubnetId.N and Filter.N (vpc-id, subnet-id, availability-zone, tag-key,
// tag:<key>).
func (s *Server) describeSubnets(r *request) (any, *apiError) {
	ids := indexed(r.form, "SubnetId.")
	filters := r.filters()
	for _, id := range ids {
		if _, ok := s.subnet(r, id); !ok {
			return nil, errorf("InvalidSubnetID.NotFound", "The subnet ID '%s' does not exist", id)
		}
	}
	out := &describeSubnetsResponse{}
	for _, n := range s.sortedSubnets() {
		if len(ids) > 0 && !slices.Contains(ids, n.ID) || !r.sees(RegionOf(n.Zone)) {
			continue
		}
		ok, err := matches(filters, n.field)
		if err != nil {
			return nil, err
		}
		if ok {
			out.Subnets = append(out.Subnets, subnetXML{ID: n.ID, VPC: n.VPC, Zone: n.Zone, ZoneID: "fake-" + n.Zone, CIDR: n.CIDR,
				State: "available", Owner: s.ownerID, Tags: tagSet(n.Tags)})
		}
	}
	return out, nil
}

func (n *Subnet) field(name string) ([]string, bool) {
	switch name {
	case "vpc-id":
		return []string{n.VPC}, true
	case "subnet-id":
		return []string{n.ID}, true
	case "availability-zone":
		return []string{n.Zone}, true
	}
	return tagField(n.Tags, name)
}

// routeTable is a route table as the fake derives it from its subnets.
type routeTable struct {
	id, vpc string
	main    bool
	gateway string
	subnets []string
}

// routeTables derives the route tables: per VPC a main one (local routes
// only) and, when the VPC has public subnets, one that they are associated
// with and that routes 0.0.0.0/0 to the VPC's internet gateway.
func (s *Server) routeTables() []routeTable {
	byVPC := map[string][]string{} // VPC -> public subnets
	for _, n := range s.sortedSubnets() {
		if _, ok := byVPC[n.VPC]; !ok {
			byVPC[n.VPC] = nil
		}
		if n.Public {
			byVPC[n.VPC] = append(byVPC[n.VPC], n.ID)
		}
	}
	var out []routeTable
	for vpc, public := range byVPC {
		suffix := strings.TrimPrefix(vpc, "vpc-")
		out = append(out, routeTable{id: "rtb-main" + suffix, vpc: vpc, main: true})
		if len(public) > 0 {
			out = append(out, routeTable{id: "rtb-public" + suffix, vpc: vpc, gateway: "igw-" + suffix, subnets: public})
		}
	}
	sort.Slice(out, func(a, b int) bool { return out[a].id < out[b].id })
	return out
}

// describeRouteTables answers DescribeRouteTables by Filter.N (vpc-id,
// association.subnet-id, route-table-id).
func (s *Server) describeRouteTables(r *request) (any, *apiError) {
	filters := r.filters()
	if len(indexed(r.form, "RouteTableId.")) > 0 {
		return nil, errorf("InvalidParameterValue", "fakeec2 selects route tables by filters only")
	}
	out := &describeRouteTablesResponse{}
	for _, t := range s.routeTables() {
		ok, err := matches(filters, func(name string) ([]string, bool) {
			switch name {
			case "vpc-id":
				return []string{t.vpc}, true
			case "route-table-id":
				return []string{t.id}, true
			case "association.subnet-id":
				return t.subnets, true
			}
			return nil, false
		})
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		x := routeTableXML{ID: t.id, VPC: t.vpc, Owner: s.ownerID,
			Routes: []routeXML{{Destination: "10.0.0.0/16", Gateway: "local", State: "active", Origin: "CreateRouteTable"}}}
		if t.gateway != "" {
			x.Routes = append(x.Routes, routeXML{Destination: "0.0.0.0/0", Gateway: t.gateway, State: "active", Origin: "CreateRoute"})
		}
		if t.main {
			x.Associations = append(x.Associations, associationXML{ID: "rtbassoc-main" + strings.TrimPrefix(t.id, "rtb-main"), Table: t.id, Main: true, State: "associated"})
		}
		for _, n := range t.subnets {
			x.Associations = append(x.Associations, associationXML{ID: "rtbassoc-" + strings.TrimPrefix(n, "subnet-"), Table: t.id, Subnet: n, State: "associated"})
		}
		out.Tables = append(out.Tables, x)
	}
	return out, nil
}

// describeSecurityGroups answers DescribeSecurityGroups by GroupId.N (every
// one must exist) and Filter.N (group-id, group-name, vpc-id,
// ip-permission.group-id, tag-key, tag:<key>), all in one page.
func (s *Server) describeSecurityGroups(r *request) (any, *apiError) {
	ids := indexed(r.form, "GroupId.")
	if len(indexed(r.form, "GroupName.")) > 0 {
		return nil, errorf("InvalidParameterValue", "fakeec2 selects security groups by ID and filters only")
	}
	filters := r.filters()
	if len(ids) == 1 {
		r.call.Resource = ids[0]
	}
	for _, id := range ids {
		if _, ok := s.groups[id]; !ok {
			return nil, errorf("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
		}
	}
	out := &describeSecurityGroupsResponse{}
	for _, g := range s.sortedGroups() {
		if len(ids) > 0 && !slices.Contains(ids, g.ID) {
			continue
		}
		ok, err := matches(filters, g.field)
		if err != nil {
			return nil, err
		}
		if ok {
			out.Groups = append(out.Groups, s.groupXML(g))
		}
	}
	return out, nil
}

func (g *SecurityGroup) field(name string) ([]string, bool) {
	switch name {
	case "group-id":
		return []string{g.ID}, true
	case "group-name":
		return []string{g.Name}, true
	case "vpc-id":
		return []string{g.VPC}, true
	case "ip-permission.group-id":
		var ids []string
		for _, p := range g.Ingress {
			ids = append(ids, p.Groups...)
		}
		return ids, true
	}
	return tagField(g.Tags, name)
}

func (s *Server) groupXML(g *SecurityGroup) securityGroupXML {
	x := securityGroupXML{Owner: s.ownerID, ID: g.ID, Name: g.Name, Description: g.Description, VPC: g.VPC,
		ARN: "arn:aws:ec2:fake:" + s.ownerID + ":security-group/" + g.ID, Tags: tagSet(g.Tags),
		Egress: []permissionXML{{Protocol: "-1", Ranges: []ipRangeXML{{CIDR: "0.0.0.0/0"}}}}}
	for _, p := range g.Ingress {
		px := permissionXML{Protocol: p.Protocol}
		if p.Protocol != "-1" {
			from, to := p.FromPort, p.ToPort
			px.FromPort, px.ToPort = &from, &to
		}
		for _, c := range p.CIDRs {
			px.Ranges = append(px.Ranges, ipRangeXML{CIDR: c})
		}
		for _, id := range p.Groups {
			px.Groups = append(px.Groups, groupPairXML{User: s.ownerID, ID: id})
		}
		x.Ingress = append(x.Ingress, px)
	}
	return x
}

// createSecurityGroup answers CreateSecurityGroup (GroupName,
// GroupDescription, VpcId of a VPC the fake knows, that is one of its
// subnets', tags of TagSpecification.N); a name is unique per VPC
// (InvalidGroup.Duplicate).
func (s *Server) createSecurityGroup(r *request) (any, *apiError) {
	name, desc, vpc := r.form.Get("GroupName"), r.form.Get("GroupDescription"), r.form.Get("VpcId")
	r.call.Resource = name
	if name == "" || desc == "" {
		return nil, errorf("MissingParameter", "GroupName and GroupDescription are required")
	}
	if vpc == "" || !slices.ContainsFunc(s.sortedSubnets(), func(n *Subnet) bool { return n.VPC == vpc }) {
		return nil, errorf("InvalidVpcID.NotFound", "The vpc ID '%s' does not exist", vpc)
	}
	for _, g := range s.groups {
		if g.VPC == vpc && g.Name == name {
			return nil, errorf("InvalidGroup.Duplicate", "The security group '%s' already exists for VPC '%s'", name, vpc)
		}
	}
	g := &SecurityGroup{ID: s.newID("sg"), Name: name, Description: desc, VPC: vpc, Tags: map[string]string{}}
	for _, spec := range structs(r.form, "TagSpecification.") {
		if t := r.form.Get(spec + "ResourceType"); t != "security-group" {
			return nil, errorf("InvalidParameterValue", "TagSpecification for %q on a security group", t)
		}
		for k, v := range tagsFrom(r.form, spec+"Tag.") {
			g.Tags[k] = v
		}
	}
	s.groups[g.ID] = g
	return &createSecurityGroupResponse{ID: g.ID, Tags: tagSet(g.Tags)}, nil
}

// deleteSecurityGroup answers DeleteSecurityGroup by GroupId: a group that a
// load balancer, an instance or another group's rule still uses is a
// DependencyViolation.
func (s *Server) deleteSecurityGroup(r *request) (any, *apiError) {
	id := r.form.Get("GroupId")
	r.call.Resource = id
	if _, ok := s.groups[id]; !ok {
		return nil, errorf("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
	}
	for _, lb := range s.lbs {
		if slices.Contains(lb.SecurityGroups, id) {
			return nil, errorf("DependencyViolation", "resource %s has a dependent object (load balancer %s)", id, lb.Name)
		}
	}
	for _, i := range s.instances {
		if slices.Contains(i.SecurityGroups, id) {
			return nil, errorf("DependencyViolation", "resource %s has a dependent object (instance %s)", id, i.ID)
		}
	}
	for _, g := range s.groups {
		if v, _ := g.field("ip-permission.group-id"); g.ID != id && slices.Contains(v, id) {
			return nil, errorf("DependencyViolation", "resource %s has a dependent object (a rule of %s)", id, g.ID)
		}
	}
	delete(s.groups, id)
	return &returnResponse{Return: true}, nil
}

// permissions reads IpPermissions.N (IpProtocol, FromPort, ToPort,
// IpRanges.M.CidrIp, Groups.M.GroupId).
func (s *Server) permissions(r *request) ([]Permission, *apiError) {
	var out []Permission
	for _, p := range structs(r.form, "IpPermissions.") {
		perm := Permission{Protocol: strings.ToLower(r.form.Get(p + "IpProtocol"))}
		switch perm.Protocol {
		case "tcp", "udp", "icmp", "-1":
		default:
			return nil, errorf("InvalidParameterValue", "Invalid value '%s' for IP protocol", perm.Protocol)
		}
		from, hasFrom, err := int32Field(r.form, p+"FromPort")
		if err != nil {
			return nil, err
		}
		to, hasTo, err := int32Field(r.form, p+"ToPort")
		if err != nil {
			return nil, err
		}
		if perm.Protocol != "-1" {
			if !hasFrom || !hasTo {
				return nil, errorf("InvalidParameterValue", "protocol %s needs FromPort and ToPort", perm.Protocol)
			}
			perm.FromPort, perm.ToPort = from, to
		}
		for _, q := range structs(r.form, p+"IpRanges.") {
			perm.CIDRs = append(perm.CIDRs, r.form.Get(q+"CidrIp"))
		}
		for _, q := range structs(r.form, p+"Groups.") {
			id := r.form.Get(q + "GroupId")
			if _, ok := s.groups[id]; !ok {
				return nil, errorf("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
			}
			perm.Groups = append(perm.Groups, id)
		}
		if len(perm.CIDRs)+len(perm.Groups) == 0 {
			return nil, errorf("InvalidParameterValue", "a rule needs a source")
		}
		out = append(out, perm)
	}
	if len(out) == 0 {
		return nil, errorf("MissingParameter", "IpPermissions are required")
	}
	return out, nil
}

func (s *Server) targetGroup(r *request) (*SecurityGroup, *apiError) {
	id := r.form.Get("GroupId")
	r.call.Resource = id
	g, ok := s.groups[id]
	if !ok {
		return nil, errorf("InvalidGroup.NotFound", "The security group '%s' does not exist", id)
	}
	return g, nil
}

// authorizeSecurityGroupIngress adds rules to GroupId; a source the group
// already allows for that protocol and range is InvalidPermission.Duplicate
// and nothing changes.
func (s *Server) authorizeSecurityGroupIngress(r *request) (any, *apiError) {
	g, err := s.targetGroup(r)
	if err != nil {
		return nil, err
	}
	add, err := s.permissions(r)
	if err != nil {
		return nil, err
	}
	next := cloneGroup(g)
	for _, p := range add {
		i := slices.IndexFunc(next.Ingress, p.sameRange)
		if i < 0 {
			next.Ingress = append(next.Ingress, Permission{Protocol: p.Protocol, FromPort: p.FromPort, ToPort: p.ToPort})
			i = len(next.Ingress) - 1
		}
		rule := &next.Ingress[i]
		for _, c := range p.CIDRs {
			if slices.Contains(rule.CIDRs, c) {
				return nil, errorf("InvalidPermission.Duplicate", "the specified rule \"peer: %s, %s\" already exists", c, rangeString(p))
			}
			rule.CIDRs = append(rule.CIDRs, c)
		}
		for _, id := range p.Groups {
			if slices.Contains(rule.Groups, id) {
				return nil, errorf("InvalidPermission.Duplicate", "the specified rule \"peer: %s, %s\" already exists", id, rangeString(p))
			}
			rule.Groups = append(rule.Groups, id)
		}
	}
	s.groups[g.ID] = next
	return &returnResponse{Return: true}, nil
}

// revokeSecurityGroupIngress removes rules from GroupId; a source the group
// does not allow is InvalidPermission.NotFound and nothing changes.
func (s *Server) revokeSecurityGroupIngress(r *request) (any, *apiError) {
	g, err := s.targetGroup(r)
	if err != nil {
		return nil, err
	}
	remove, err := s.permissions(r)
	if err != nil {
		return nil, err
	}
	next := cloneGroup(g)
	for _, p := range remove {
		i := slices.IndexFunc(next.Ingress, p.sameRange)
		for _, c := range p.CIDRs {
			if i < 0 || !slices.Contains(next.Ingress[i].CIDRs, c) {
				return nil, errorf("InvalidPermission.NotFound", "The specified rule does not exist in this security group (peer: %s, %s)", c, rangeString(p))
			}
			next.Ingress[i].CIDRs = slices.DeleteFunc(next.Ingress[i].CIDRs, func(x string) bool { return x == c })
		}
		for _, id := range p.Groups {
			if i < 0 || !slices.Contains(next.Ingress[i].Groups, id) {
				return nil, errorf("InvalidPermission.NotFound", "The specified rule does not exist in this security group (peer: %s, %s)", id, rangeString(p))
			}
			next.Ingress[i].Groups = slices.DeleteFunc(next.Ingress[i].Groups, func(x string) bool { return x == id })
		}
		if i >= 0 && len(next.Ingress[i].CIDRs)+len(next.Ingress[i].Groups) == 0 {
			next.Ingress = slices.Delete(next.Ingress, i, i+1)
		}
	}
	s.groups[g.ID] = next
	return &returnResponse{Return: true}, nil
}

func rangeString(p Permission) string {
	if p.Protocol == "-1" {
		return "ALL"
	}
	return p.Protocol + " " + itoa(p.FromPort) + "-" + itoa(p.ToPort)
}

// createTags answers CreateTags (ResourceId.N, Tag.N) on security groups,
// and the subnets and instances of the request's region.
func (s *Server) createTags(r *request) (any, *apiError) {
	ids := indexed(r.form, "ResourceId.")
	if len(ids) == 1 {
		r.call.Resource = ids[0]
	}
	tags := tagsFrom(r.form, "Tag.")
	var targets []map[string]string
	for _, id := range ids {
		n, subnet := s.subnet(r, id)
		i, instance := s.instance(r, id)
		switch {
		case s.groups[id] != nil:
			targets = append(targets, s.groups[id].Tags)
		case subnet:
			targets = append(targets, n.Tags)
		case instance:
			targets = append(targets, i.Tags)
		default:
			return nil, errorf("InvalidID", "The ID '%s' is not valid", id)
		}
	}
	for _, t := range targets {
		for k, v := range tags {
			t[k] = v
		}
	}
	return &returnResponse{Return: true}, nil
}

type returnResponse struct {
	ec2Meta
	Return bool `xml:"return"`
}

type describeAvailabilityZonesResponse struct {
	ec2Meta
	Zones []zoneXML `xml:"availabilityZoneInfo>item"`
}

type zoneXML struct {
	Name        string `xml:"zoneName"`
	State       string `xml:"zoneState"`
	Region      string `xml:"regionName"`
	ID          string `xml:"zoneId"`
	Type        string `xml:"zoneType"`
	Group       string `xml:"groupName"`
	BorderGroup string `xml:"networkBorderGroup"`
	OptIn       string `xml:"optInStatus"`
}

type describeSubnetsResponse struct {
	ec2Meta
	Subnets []subnetXML `xml:"subnetSet>item"`
}

type subnetXML struct {
	ID     string   `xml:"subnetId"`
	State  string   `xml:"state"`
	Owner  string   `xml:"ownerId"`
	VPC    string   `xml:"vpcId"`
	CIDR   string   `xml:"cidrBlock"`
	Zone   string   `xml:"availabilityZone"`
	ZoneID string   `xml:"availabilityZoneId"`
	Tags   []tagXML `xml:"tagSet>item"`
}

type describeRouteTablesResponse struct {
	ec2Meta
	Tables []routeTableXML `xml:"routeTableSet>item"`
}

type routeTableXML struct {
	ID           string           `xml:"routeTableId"`
	VPC          string           `xml:"vpcId"`
	Owner        string           `xml:"ownerId"`
	Routes       []routeXML       `xml:"routeSet>item"`
	Associations []associationXML `xml:"associationSet>item"`
}

type routeXML struct {
	Destination string `xml:"destinationCidrBlock"`
	Gateway     string `xml:"gatewayId"`
	State       string `xml:"state"`
	Origin      string `xml:"origin"`
}

type associationXML struct {
	ID     string `xml:"routeTableAssociationId"`
	Table  string `xml:"routeTableId"`
	Subnet string `xml:"subnetId,omitempty"`
	Main   bool   `xml:"main"`
	State  string `xml:"associationState>state"`
}

type describeSecurityGroupsResponse struct {
	ec2Meta
	Groups []securityGroupXML `xml:"securityGroupInfo>item"`
}

type securityGroupXML struct {
	Owner       string          `xml:"ownerId"`
	ID          string          `xml:"groupId"`
	Name        string          `xml:"groupName"`
	Description string          `xml:"groupDescription"`
	VPC         string          `xml:"vpcId"`
	ARN         string          `xml:"securityGroupArn"`
	Ingress     []permissionXML `xml:"ipPermissions>item"`
	Egress      []permissionXML `xml:"ipPermissionsEgress>item"`
	Tags        []tagXML        `xml:"tagSet>item"`
}

type permissionXML struct {
	Protocol string         `xml:"ipProtocol"`
	FromPort *int32         `xml:"fromPort,omitempty"`
	ToPort   *int32         `xml:"toPort,omitempty"`
	Groups   []groupPairXML `xml:"groups>item"`
	Ranges   []ipRangeXML   `xml:"ipRanges>item"`
}

type groupPairXML struct {
	User string `xml:"userId"`
	ID   string `xml:"groupId"`
}

type ipRangeXML struct {
	CIDR string `xml:"cidrIp"`
}

type createSecurityGroupResponse struct {
	ec2Meta
	ID   string   `xml:"groupId"`
	Tags []tagXML `xml:"tagSet>item"`
}
