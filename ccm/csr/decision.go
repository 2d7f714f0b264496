package csr

// Action is what the controller does with a certificate signing request.
type Action int

const (
	// Ignore leaves the request alone: it is not a pending kubelet-serving request.
	// It is the zero value, so an incomplete Decision never approves anything.
	Ignore Action = iota
	// Approve adds an Approved condition; the kubelet-serving signer then signs it.
	Approve
	// Deny adds a Denied condition; the kubelet will submit a new request later.
	Deny
	// Retry leaves the request pending and looks at it again later (the node is not
	// initialized yet, or its Talos API could not be read).
	Retry
)

// String returns the lower-case name used in metrics and logs.
func (a Action) String() string {
	switch a {
	case Approve:
		return "approve"
	case Deny:
		return "deny"
	case Retry:
		return "retry"
	default:
		return "ignore"
	}
}

// Decision is the outcome of Validate for one request.
type Decision struct {
	Action Action
	// Reason is a PascalCase constant (Reason*); it becomes the condition reason and
	// the `reason` label of talos_ccm_csr_decisions_total.
	Reason string
	// Message explains the decision to a human; it becomes the condition message.
	Message string
}

// Reasons. Each check of the policy has exactly one reason; docs/csr-approval.md
// describes what each check prevents.
const (
	// ReasonNotKubeletServing: spec.signerName is not kubernetes.io/kubelet-serving (Ignore).
	ReasonNotKubeletServing = "NotKubeletServing"
	// ReasonAlreadyDecided: the request already has an Approved, Denied or Failed condition (Ignore).
	ReasonAlreadyDecided = "AlreadyDecided"

	// ReasonUsernameNotNode: spec.username is not system:node:<valid node name>.
	ReasonUsernameNotNode = "UsernameNotNode"
	// ReasonNotInNodesGroup: spec.groups does not contain system:nodes.
	ReasonNotInNodesGroup = "NotInNodesGroup"
	// ReasonRequestTooLarge: spec.request is larger than MaxRequestBytes.
	ReasonRequestTooLarge = "RequestTooLarge"
	// ReasonInvalidPEM: spec.request is not exactly one CERTIFICATE REQUEST PEM block
	// (no headers, nothing but whitespace around it).
	ReasonInvalidPEM = "InvalidPEM"
	// ReasonInvalidRequest: the PEM block is not a well-formed PKCS#10 request.
	ReasonInvalidRequest = "InvalidRequest"
	// ReasonInvalidSignature: the request is not signed by its own key.
	ReasonInvalidSignature = "InvalidSignature"
	// ReasonUnsupportedKey: the key is not ECDSA P-256/P-384/P-521, Ed25519 or RSA
	// 2048–8192 bits with exponent 65537.
	ReasonUnsupportedKey = "UnsupportedKey"
	// ReasonOrganizationMismatch: the subject Organization is not exactly [system:nodes].
	ReasonOrganizationMismatch = "OrganizationMismatch"
	// ReasonCommonNameMismatch: the subject has not exactly one CN, equal to spec.username.
	ReasonCommonNameMismatch = "CommonNameMismatch"
	// ReasonMissingServerAuth: spec.usages does not contain "server auth".
	ReasonMissingServerAuth = "MissingServerAuth"
	// ReasonDisallowedUsage: spec.usages contains something other than digital
	// signature, key encipherment or server auth.
	ReasonDisallowedUsage = "DisallowedUsage"
	// ReasonExpirationOutOfBounds: spec.expirationSeconds is set and outside
	// [MinExpiration, MaxExpiration].
	ReasonExpirationOutOfBounds = "ExpirationOutOfBounds"
	// ReasonUnexpectedExtension: the request asks for an X.509 extension other than
	// one subjectAltName (e.g. basicConstraints CA:TRUE).
	ReasonUnexpectedExtension = "UnexpectedExtension"
	// ReasonNoSubjectAltNames: the request has no DNS or IP SAN.
	ReasonNoSubjectAltNames = "NoSubjectAltNames"
	// ReasonEmailSAN: the request has an email (rfc822Name) SAN.
	ReasonEmailSAN = "EmailSAN"
	// ReasonURISAN: the request has a URI SAN.
	ReasonURISAN = "URISAN"
	// ReasonUnsupportedSAN: the request has a SAN of another type (otherName,
	// directoryName, registeredID, ...).
	ReasonUnsupportedSAN = "UnsupportedSAN"
	// ReasonWildcardDNSName: a DNS SAN contains "*".
	ReasonWildcardDNSName = "WildcardDNSName"
	// ReasonReservedDNSName: a DNS SAN names the cluster, not a node: its first
	// label starts with "kubernetes", a later label starts with "svc", it is
	// in the cluster domain (Options.ClusterDomain), or it is localhost (any case).
	ReasonReservedDNSName = "ReservedDNSName"
	// ReasonReservedIPAddress: an IP SAN is loopback, link-local, unspecified,
	// multicast or broadcast, or in Options.ReservedIPRanges (the cluster's
	// Service and pod CIDRs).
	ReasonReservedIPAddress = "ReservedIPAddress"
	// ReasonClusterAddress: a SAN is the cluster's own, as the API server says
	// (a ServiceCIDR, the kubernetes Service's IP, an endpoint of the API
	// server) or the host talos-ccm reaches the API server at (Deny,
	// controller only).
	ReasonClusterAddress = "ClusterAddress"
	// ReasonClusterAddressesUnknown: the cluster's own addresses have not been
	// read yet (Retry, controller only).
	ReasonClusterAddressesUnknown = "ClusterAddressesUnknown"
	// ReasonAddressOfOtherNode: a SAN is an address or name talos-ccm
	// established for another node (Deny, naming the node; controller only).
	ReasonAddressOfOtherNode = "AddressOfOtherNode"
	// ReasonAddressClaimedByOtherNode: a SAN is listed by another node that
	// talos-ccm has not read yet, or by a node deleted within the hold of the
	// facts source (Retry, naming the node; controller only).
	ReasonAddressClaimedByOtherNode = "AddressClaimedByOtherNode"
	// ReasonNodeNotFound: the Node named by spec.username does not exist.
	ReasonNodeNotFound = "NodeNotFound"
	// ReasonNodeNotInitialized: the Node still has the uninitialized taint (Retry).
	ReasonNodeNotInitialized = "NodeNotInitialized"
	// ReasonIPAddressNotEstablished: an IP SAN is not an address talos-ccm established
	// for the node (nor in an allowed range).
	ReasonIPAddressNotEstablished = "IPAddressNotEstablished"
	// ReasonDNSNameNotEstablished: a DNS SAN is neither the node name nor a
	// Hostname/InternalDNS/ExternalDNS address talos-ccm established (nor under an
	// allowed suffix).
	ReasonDNSNameNotEstablished = "DNSNameNotEstablished"
	// ReasonNodeIdentityMismatch: the node's facts source found that the machine
	// answering for the node is another node (facts.ErrIdentity; Deny, controller only).
	ReasonNodeIdentityMismatch = "NodeIdentityMismatch"
	// ReasonAddressLookupFailed: the node's facts source failed otherwise (Retry;
	// controller only).
	ReasonAddressLookupFailed = "AddressLookupFailed"
	// ReasonProvidedNodeIPInvalid: the kubelet-written addresses the node is reached
	// by are unparsable or more than one per family (facts.ErrProvidedNodeIP; Deny,
	// controller only). Nothing was dialled.
	ReasonProvidedNodeIPInvalid = "ProvidedNodeIPInvalid"

	// ReasonNodeIdentityVerified: every check passed (Approve).
	ReasonNodeIdentityVerified = "NodeIdentityVerified"
)
