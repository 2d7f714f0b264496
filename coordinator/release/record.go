package release

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// A Helm release record (a HelmStorageType Secret) written by the
// coordinator is never trusted input for anyone else's Helm: Helm runs its
// hooks and deletes everything its manifest lists with the rights of whoever
// runs it. RecordProblems reads a record without Helm, for hybridctl doctor.

// MaxRecordBytes bounds a decoded record (Helm's own Secrets are below 1 MiB
// before compression).
const MaxRecordBytes = 8 << 20

// recordKinds are the kinds a native CCM release holds: what the native-ccm
// chart renders and the coordinator's mutators add, and what an upstream
// chart may bring within the coordinator's admission policy.
var recordKinds = []string{
	"ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "Deployment", "Lease",
	"NetworkPolicy", "PodDisruptionBudget", "Role", "RoleBinding", "Secret", "ServiceAccount",
}

// clusterScoped are the recordKinds without a namespace.
var clusterScoped = []string{"ClusterRole", "ClusterRoleBinding"}

// storedRelease is the part of Helm's stored release that RecordProblems
// reads (the JSON Helm encodes, gzipped and base64-encoded, in the Secret's
// "release" key).
type storedRelease struct {
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	Manifest  string `json:"manifest"`
	Hooks     []struct {
		Name string `json:"name"`
		Kind string `json:"kind"`
	} `json:"hooks"`
}

// manifestObject is what RecordProblems reads of each object of a manifest.
type manifestObject struct {
	Kind     string `json:"kind"`
	Metadata struct {
		Name      string `json:"name"`
		Namespace string `json:"namespace"`
	} `json:"metadata"`
}

// RecordProblems says what in the release record s a native CCM release of
// the coordinator's never holds: a hook (Helm runs it on uninstall and
// rollback), a kind the native-ccm chart never renders, an object outside the
// release's namespace (but the RoleBinding to the API server's
// authentication reader in kube-system), or a cluster-scoped object or one
// outside that namespace whose name is not the release's. A record it cannot
// decode is a problem too. It never panics on any input.
func RecordProblems(s *corev1.Secret) []string {
	rel, err := decodeRecord(s.Data["release"])
	if err != nil {
		return []string{fmt.Sprintf("cannot be read: %v", err)}
	}
	release := s.Labels[StorageNameLabel]
	var out []string
	if rel.Name != release {
		out = append(out, fmt.Sprintf("names release %q, its label %q", clipName(rel.Name), clipName(release)))
	}
	for _, h := range rel.Hooks {
		out = append(out, fmt.Sprintf("holds hook %s %q, which Helm would run", clipName(h.Kind), clipName(h.Name)))
	}
	for i, doc := range splitManifest(rel.Manifest) {
		var o manifestObject
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			out = append(out, fmt.Sprintf("manifest document %d does not parse", i))
			continue
		}
		if o.Kind == "" {
			continue
		}
		what := fmt.Sprintf("%s %s/%s", clipName(o.Kind), clipName(o.Metadata.Namespace), clipName(o.Metadata.Name))
		ownName := strings.HasPrefix(o.Metadata.Name, release) && release != ""
		switch {
		case !slices.Contains(recordKinds, o.Kind):
			out = append(out, fmt.Sprintf("lists %s, a kind a native CCM release never holds", what))
		case slices.Contains(clusterScoped, o.Kind) && !ownName:
			out = append(out, fmt.Sprintf("lists %s, a cluster-wide object not named after the release", what))
		case slices.Contains(clusterScoped, o.Kind):
		case o.Metadata.Namespace == "" || o.Metadata.Namespace == s.Namespace:
		case o.Kind == "RoleBinding" && o.Metadata.Namespace == "kube-system" && ownName:
		default:
			out = append(out, fmt.Sprintf("lists %s, outside the release's namespace %s", what, s.Namespace))
		}
	}
	return out
}

// decodeRecord undoes Helm's storage encoding: base64, then gzip (when the
// data starts with its magic), then JSON.
func decodeRecord(data []byte) (*storedRelease, error) {
	if len(data) == 0 {
		return nil, errors.New("no release data")
	}
	raw := make([]byte, base64.StdEncoding.DecodedLen(len(data)))
	n, err := base64.StdEncoding.Decode(raw, data)
	if err != nil {
		return nil, fmt.Errorf("base64: %w", err)
	}
	raw = raw[:n]
	if bytes.HasPrefix(raw, []byte{0x1f, 0x8b}) {
		zr, err := gzip.NewReader(bytes.NewReader(raw))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		raw, err = io.ReadAll(io.LimitReader(zr, MaxRecordBytes+1))
		if err != nil {
			return nil, fmt.Errorf("gzip: %w", err)
		}
		if len(raw) > MaxRecordBytes {
			return nil, fmt.Errorf("larger than %d bytes", MaxRecordBytes)
		}
	}
	var rel storedRelease
	if err := json.Unmarshal(raw, &rel); err != nil {
		return nil, fmt.Errorf("json: %w", err)
	}
	return &rel, nil
}

// splitManifest splits a manifest into its YAML documents.
func splitManifest(m string) []string {
	var out []string
	for _, doc := range strings.Split("\n"+m, "\n---") {
		if strings.TrimSpace(doc) != "" {
			out = append(out, doc)
		}
	}
	return out
}

func clipName(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	return strings.ToValidUTF8(s[:max], "") + "…"
}
