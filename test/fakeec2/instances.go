package fakeec2

import (
	"slices"
	"sort"
	"strings"
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
	ID    string
	State string
	// Zone is its availability zone; Region the region it lives in, when
	// not the zone's (RegionOf): an endpoint finds it only in that region.
	Zone, Region   string
	PrivateDNSName string
	PrivateIP      string
	Type           string
	Tags           map[string]string
	// VPC and Subnet the instance runs in; SecurityGroups are the IDs of
	// its groups (PutSecurityGroup). All optional.
	VPC, Subnet    string
	SecurityGroups []string
}

// Put adds or replaces an instance.
func (s *Server) Put(i Instance) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := i
	c.Tags = copyTags(i.Tags)
	c.SecurityGroups = slices.Clone(i.SecurityGroups)
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

// describeInstances answers DescribeInstances for the request's region: by
// InstanceId.N (every one must exist there; another region's instance does
// not) and Filter.N (private-dns-name, instance-state-name,
// instance-id, vpc-id, subnet-id, tag-key, tag:<key>), all instances in one
// page.
func (s *Server) describeInstances(r *request) (any, *apiError) {
	r.call.InstanceIDs = indexed(r.form, "InstanceId.")
	filters := r.filters()
	var selected []*Instance
	if ids := r.call.InstanceIDs; len(ids) > 0 {
		var missing []string
		for _, id := range ids {
			if i, ok := s.instance(r, id); ok {
				selected = append(selected, i)
			} else {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return nil, errorf("InvalidInstanceID.NotFound", "The instance IDs '%s' do not exist", strings.Join(missing, ", "))
		}
	} else {
		for _, i := range s.instances {
			if r.sees(i.region()) {
				selected = append(selected, i)
			}
		}
		sort.Slice(selected, func(a, b int) bool { return selected[a].ID < selected[b].ID })
	}
	out := &describeInstancesResponse{}
	for _, i := range selected {
		ok, err := matches(filters, i.field)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		x := instanceXML{ID: i.ID, ImageID: "ami-00000000", Type: i.Type, PrivateDNSName: i.PrivateDNSName, PrivateIP: i.PrivateIP,
			State: stateXML{Code: stateCodes[i.State], Name: i.State}, Placement: placementXML{Zone: i.Zone},
			VPC: i.VPC, Subnet: i.Subnet, Tags: tagSet(i.Tags)}
		if i.PrivateIP != "" {
			// its primary network interface, attached, holding the private
			// address: where the AWS CCM's cloud-node controller takes the
			// node's InternalIP from
			eni := "eni-" + strings.TrimPrefix(i.ID, "i-")
			x.NetworkInterfaces = []networkInterfaceXML{{ID: eni, Subnet: i.Subnet, VPC: i.VPC, Status: "in-use",
				PrivateIP: i.PrivateIP, PrivateDNSName: i.PrivateDNSName,
				Attachment: attachmentXML{ID: "eni-attach-" + strings.TrimPrefix(i.ID, "i-"), DeviceIndex: 0, Status: "attached"},
				PrivateIPs: []privateIPXML{{IP: i.PrivateIP, DNSName: i.PrivateDNSName, Primary: true}}}}
		}
		for _, g := range i.SecurityGroups {
			name := ""
			if sg, ok := s.groups[g]; ok {
				name = sg.Name
			}
			x.Groups = append(x.Groups, groupIdentifierXML{ID: g, Name: name})
		}
		out.Reservations = append(out.Reservations, reservationXML{ID: "r-" + strings.TrimPrefix(i.ID, "i-"), OwnerID: s.ownerID, Instances: []instanceXML{x}})
	}
	return out, nil
}

func (i *Instance) field(name string) ([]string, bool) {
	switch name {
	case "private-dns-name":
		return []string{i.PrivateDNSName}, true
	case "instance-state-name":
		return []string{i.State}, true
	case "instance-id":
		return []string{i.ID}, true
	case "vpc-id":
		return []string{i.VPC}, true
	case "subnet-id":
		return []string{i.Subnet}, true
	}
	return tagField(i.Tags, name)
}

type describeInstancesResponse struct {
	ec2Meta
	Reservations []reservationXML `xml:"reservationSet>item"`
}

type reservationXML struct {
	ID        string        `xml:"reservationId"`
	OwnerID   string        `xml:"ownerId"`
	Instances []instanceXML `xml:"instancesSet>item"`
}

type instanceXML struct {
	ID             string               `xml:"instanceId"`
	ImageID        string               `xml:"imageId"`
	State          stateXML             `xml:"instanceState"`
	PrivateDNSName string               `xml:"privateDnsName"`
	Type           string               `xml:"instanceType,omitempty"`
	Placement      placementXML         `xml:"placement"`
	Subnet         string               `xml:"subnetId,omitempty"`
	VPC            string               `xml:"vpcId,omitempty"`
	PrivateIP      string               `xml:"privateIpAddress,omitempty"`
	Groups         []groupIdentifierXML `xml:"groupSet>item"`
	Tags           []tagXML             `xml:"tagSet>item"`
	// NetworkInterfaces: the primary one, for an instance with a private
	// address.
	NetworkInterfaces []networkInterfaceXML `xml:"networkInterfaceSet>item"`
}

type networkInterfaceXML struct {
	ID             string         `xml:"networkInterfaceId"`
	Subnet         string         `xml:"subnetId,omitempty"`
	VPC            string         `xml:"vpcId,omitempty"`
	Status         string         `xml:"status"`
	PrivateIP      string         `xml:"privateIpAddress"`
	PrivateDNSName string         `xml:"privateDnsName,omitempty"`
	Attachment     attachmentXML  `xml:"attachment"`
	PrivateIPs     []privateIPXML `xml:"privateIpAddressesSet>item"`
}

type attachmentXML struct {
	ID          string `xml:"attachmentId"`
	DeviceIndex int    `xml:"deviceIndex"`
	Status      string `xml:"status"`
}

type privateIPXML struct {
	IP      string `xml:"privateIpAddress"`
	DNSName string `xml:"privateDnsName,omitempty"`
	Primary bool   `xml:"primary"`
}

type groupIdentifierXML struct {
	ID   string `xml:"groupId"`
	Name string `xml:"groupName"`
}

type stateXML struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type placementXML struct {
	Zone string `xml:"availabilityZone"`
}
