package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/hybrid-ccm/hybrid-ccm/ccm/cloud"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/talos"
	"github.com/hybrid-ccm/hybrid-ccm/ccm/transform"
)

// explainOptions are the flags of `transform explain`.
type explainOptions struct {
	config   string // rules file
	metadata string // metadata file
	node     string // live mode: node address, read through the Talos API
	nodeIP   string // file mode: the address talos-ccm reaches the node's Talos API on

	talosconfig    string   // live mode: talosconfig (default paths as talos-ccm)
	talosContext   string   // live mode: talosconfig context
	talosEndpoints []string // live mode: endpoint override
	output         string   // text, yaml or json
}

func newTransformExplainCommand() *cobra.Command {
	o := &explainOptions{output: "text"}
	cmd := &cobra.Command{
		Use:   "explain --config rules.yaml --metadata node.yaml",
		Short: "Show what the transformation rules give a node, and why",
		Long: "explain evaluates a talos-ccm rules file against one node's platform metadata exactly as\n" +
			"talos-ccm does, and shows which rules matched (and, for the others, which expression failed),\n" +
			"the metadata after overrides, and what talos-ccm writes on the Node: the providerID, every label\n" +
			"(its own — platform, cluster name, lifecycle, topology, instance type — and the rules'), the\n" +
			"annotations and taints, and the features the node gets.\n\n" +
			"The metadata file holds the Talos PlatformMetadata fields (platform, hostname, region, zone,\n" +
			"instanceType, instanceId, providerId, spot, internalDNS, externalDNS, tags), optionally the\n" +
			"SystemInformation ones, or simply the output of\n" +
			"  talosctl -n <node> get platformmetadata -o yaml\n" +
			"(append `talosctl -n <node> get systeminformation -o yaml` after a --- line for hardware rules).\n\n" +
			"It fails (non-zero exit) if the rules file is invalid or a rule fails for this node.",
		Example: "  hybridctl transform explain --config rules.yaml --metadata node.yaml\n" +
			"  hybridctl transform explain --config rules.yaml --node 10.0.0.5\n" +
			"  talosctl -n 10.0.0.5 get platformmetadata -o yaml > node.yaml\n" +
			"  hybridctl transform explain -c rules.yaml -m node.yaml -o yaml",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	fs := cmd.Flags()
	fs.StringVarP(&o.config, "config", "c", "", "transformation rules file (talos-ccm --cloud-config)")
	fs.StringVarP(&o.metadata, "metadata", "m", "", "node metadata file (YAML or JSON, plain fields or talosctl output)")
	fs.StringVar(&o.node, "node", "", "read the metadata of a live node (its IP) through its Talos API instead of --metadata")
	fs.StringVar(&o.nodeIP, "node-ip", "", "with --metadata: the node's IP (its provided-node-ip), for the talos://<platform>/<ip> providerID of platforms without a native CCM")
	fs.StringVar(&o.talosconfig, "talosconfig", os.Getenv("TALOSCONFIG"), "with --node: Talos client config (default: $TALOSCONFIG, ~/.talos/config)")
	fs.StringVar(&o.talosContext, "talos-context", "", "with --node: talosconfig context")
	fs.StringSliceVar(&o.talosEndpoints, "talos-endpoints", nil, "with --node: Talos API endpoints overriding the talosconfig")
	fs.StringVarP(&o.output, "output", "o", o.output, "output format: text, yaml or json")
	_ = cmd.MarkFlagRequired("config")
	return cmd
}

// metadataSource picks where the metadata comes from.
func (o *explainOptions) metadataSource() (MetadataSource, error) {
	switch {
	case o.metadata != "" && o.node != "":
		return nil, errors.New("use either --metadata or --node, not both")
	case o.node != "" && o.nodeIP != "":
		return nil, errors.New("--node-ip is for --metadata; with --node the providerID uses the --node address")
	case o.nodeIP != "" && !isIP(o.nodeIP):
		return nil, fmt.Errorf("--node-ip %q: not an IP address", o.nodeIP)
	case o.metadata != "":
		return FileMetadataSource{Path: o.metadata}, nil
	case o.node != "":
		return o.newNodeMetadataSource()
	}
	return nil, errors.New("--metadata is required")
}

// newNodeMetadataSource returns the source for --node: the node's Talos API,
// read through ccm/talos exactly as talos-ccm reads it.
func (o *explainOptions) newNodeMetadataSource() (MetadataSource, error) {
	return &TalosMetadataSource{Node: o.node, Options: talos.Options{
		ConfigPath: o.talosconfig, Context: o.talosContext, Endpoints: o.talosEndpoints, Timeout: 10 * time.Second,
	}}, nil
}

func (o *explainOptions) run(cmd *cobra.Command) error {
	switch o.output {
	case "text", "yaml", "json":
	default:
		return fmt.Errorf("--output %q: want text, yaml or json", o.output)
	}
	cfg, err := transform.Load(o.config)
	if err != nil {
		return err
	}
	src, err := o.metadataSource()
	if err != nil {
		return err
	}
	if ts, ok := src.(*TalosMetadataSource); ok && len(ts.Options.Endpoints) == 0 {
		// as talos-ccm: the file's global.endpoints when --talos-endpoints is not given
		ts.Options.Endpoints = cfg.Global.Endpoints
	}
	md, warnings, err := src.Metadata(cmd.Context())
	for _, w := range warnings {
		fmt.Fprintln(cmd.ErrOrStderr(), "warning:", w)
	}
	if err != nil {
		return err
	}
	if ts, ok := src.(*TalosMetadataSource); ok && cfg.Global.ClusterName == "" {
		// as talos-ccm with this talosconfig
		cfg.Global.ClusterName = ts.ClusterName
	}
	ex, applyErr := cfg.Explain(md)
	nodeIP := o.nodeIP
	if o.node != "" {
		nodeIP = o.node
	}
	r := newExplainReport(cfg, src, md, ex, applyErr, nodeIP)
	out := cmd.OutOrStdout()
	switch o.output {
	case "json":
		b, err := json.MarshalIndent(r, "", "  ")
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s\n", b)
	case "yaml":
		b, err := yaml.Marshal(r)
		if err != nil {
			return err
		}
		fmt.Fprintf(out, "%s", b)
	default:
		r.writeText(out)
	}
	if applyErr != nil {
		return fmt.Errorf("the rules fail for this node: %w", applyErr)
	}
	return nil
}

// explainReport is what explain prints (also as YAML and JSON).
type explainReport struct {
	Config string `json:"config"`
	Source string `json:"source"`
	// Rules in order; rules after a failing one are not evaluated.
	Rules []ruleReport `json:"rules"`
	// Input is the metadata as read; Metadata after the overrides.
	Input    transform.Metadata  `json:"input"`
	Metadata *transform.Metadata `json:"metadata,omitempty"`
	// ProviderID is what talos-ccm writes as spec.providerID (ccm/cloud.ProviderID);
	// ProviderIDRetry says why it writes none yet and leaves the node
	// uninitialized (a cloud platform without instance ID or providerID).
	ProviderID      string `json:"providerID,omitempty"`
	ProviderIDRetry string `json:"providerIDRetry,omitempty"`
	// Labels are every label talos-ccm writes (ccm/cloud.NodeLabels): its own
	// and the rules'; RuleLabels only the rules'.
	Labels      map[string]string   `json:"labels,omitempty"`
	RuleLabels  map[string]string   `json:"ruleLabels,omitempty"`
	Annotations map[string]string   `json:"annotations,omitempty"`
	Taints      []corev1.Taint      `json:"taints,omitempty"`
	Features    *transform.Features `json:"features,omitempty"`
	Error       string              `json:"error,omitempty"`

	enforce bool
}

type ruleReport struct {
	transform.RuleOutcome
	// Evaluated is false for rules after a rule that failed.
	Evaluated bool `json:"evaluated"`
}

// unknownNodeIP stands for the node's address in a talos:// providerID when
// explain was given neither --node nor --node-ip.
const unknownNodeIP = "<node-ip>"

func newExplainReport(cfg *transform.Config, src MetadataSource, md transform.Metadata, ex *transform.Explanation, applyErr error, nodeIP string) *explainReport {
	r := &explainReport{Config: cfg.Source(), Source: src.String(), Input: md, enforce: cfg.Global.Enforce}
	for i, t := range cfg.Transformations {
		rr := ruleReport{RuleOutcome: transform.RuleOutcome{Index: i, Name: t.Name, Term: -1}}
		if ex != nil && i < len(ex.Rules) {
			rr.RuleOutcome, rr.Evaluated = ex.Rules[i], true
		}
		r.Rules = append(r.Rules, rr)
	}
	if applyErr != nil {
		r.Error = applyErr.Error()
		return r
	}
	res := ex.Result
	r.Metadata, r.RuleLabels, r.Annotations, r.Taints, r.Features = &res.Metadata, res.Labels, res.Annotations, res.Taints, &res.Features
	// exactly what talos-ccm derives: the same functions it uses
	r.Labels = cloud.NodeLabels(&res.Metadata, res.Labels, cfg.Global.ClusterName)
	if nodeIP == "" {
		nodeIP = unknownNodeIP
	}
	if id, err := cloud.ProviderID(&res.Metadata, nodeIP); err != nil {
		r.ProviderIDRetry = err.Error()
	} else {
		r.ProviderID = id
	}
	return r
}

func (r *explainReport) writeText(w io.Writer) {
	mode := ""
	if r.enforce {
		mode = ", enforce mode"
	}
	rules := "rules"
	if len(r.Rules) == 1 {
		rules = "rule"
	}
	fmt.Fprintf(w, "Config:  %s (%d %s%s)\n", r.Config, len(r.Rules), rules, mode)
	fmt.Fprintf(w, "Input:   %s\n", r.Source)

	fmt.Fprintln(w, "\nRules")
	if len(r.Rules) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	names := make([]string, len(r.Rules))
	width := 0
	for i, rr := range r.Rules {
		names[i] = fmt.Sprintf("[%d] %s", rr.Index, rr.Name)
		if rr.Name == "" {
			names[i] = fmt.Sprintf("[%d]", rr.Index)
		}
		width = max(width, len(names[i]))
	}
	for i, rr := range r.Rules {
		var status string
		switch {
		case !rr.Evaluated:
			status = "not evaluated (an earlier rule failed)"
		case rr.Matched && rr.Term < 0:
			status = "matched (no selector: every node)"
		case rr.Matched:
			status = fmt.Sprintf("matched (nodeSelector[%d])", rr.Term)
		default:
			status = "no match"
		}
		fmt.Fprintf(w, "  %-*s  %s\n", width, names[i], status)
		for _, m := range rr.Misses {
			fmt.Fprintf(w, "      %s\n", m)
		}
	}
	if r.Error != "" {
		fmt.Fprintf(w, "\nError\n  %s\n", r.Error)
		return
	}

	fmt.Fprintln(w, "\nMetadata (after overrides)")
	in, out := fieldsOf(r.Input), fieldsOf(*r.Metadata)
	before := map[string]string{}
	width = 0
	for _, kv := range in {
		before[kv[0]] = kv[1]
		width = max(width, len(kv[0]))
	}
	after := map[string]bool{}
	for _, kv := range out {
		after[kv[0]] = true
		width = max(width, len(kv[0]))
	}
	for _, kv := range out {
		if was, ok := before[kv[0]]; ok && was == kv[1] {
			fmt.Fprintf(w, "  %-*s  %s\n", width, kv[0], kv[1])
		} else {
			fmt.Fprintf(w, "  %-*s  %s  (was %q)\n", width, kv[0], kv[1], was)
		}
	}
	for _, kv := range in {
		if !after[kv[0]] {
			fmt.Fprintf(w, "  %-*s  %s  (was %q)\n", width, kv[0], `""`, kv[1])
		}
	}

	switch {
	case r.ProviderIDRetry != "":
		section(w, "ProviderID", []string{"none yet: talos-ccm leaves the node uninitialized and retries (" + r.ProviderIDRetry + ")"})
	case strings.Contains(r.ProviderID, unknownNodeIP):
		section(w, "ProviderID", []string{r.ProviderID + "  (the node's IP: give --node-ip)"})
	default:
		section(w, "ProviderID", []string{r.ProviderID})
	}
	section(w, "Labels", sortedPairs(r.Labels, "="))
	section(w, "Annotations", sortedPairs(r.Annotations, ": "))
	var taints []string
	for _, t := range r.Taints {
		s := t.Key
		if t.Value != "" {
			s += "=" + t.Value
		}
		taints = append(taints, s+":"+string(t.Effect))
	}
	section(w, "Taints", taints)
	section(w, "Features", []string{fmt.Sprintf("publicIPDiscovery: %t", r.Features.PublicIPDiscovery)})
}

func section(w io.Writer, title string, lines []string) {
	fmt.Fprintf(w, "\n%s\n", title)
	if len(lines) == 0 {
		fmt.Fprintln(w, "  (none)")
	}
	for _, l := range lines {
		fmt.Fprintf(w, "  %s\n", l)
	}
}

func sortedPairs(m map[string]string, sep string) []string {
	out := make([]string, 0, len(m))
	for k, v := range m {
		out = append(out, k+sep+fmt.Sprintf("%q", v))
	}
	sort.Strings(out)
	return out
}

// fieldsOf lists the set fields of md as key/value pairs, in the order the
// metadata documentation uses, tags last.
func fieldsOf(md transform.Metadata) [][2]string {
	var out [][2]string
	add := func(k, v string) {
		if v != "" {
			out = append(out, [2]string{k, v})
		}
	}
	add("platform", md.Platform)
	add("hostname", md.Hostname)
	add("region", md.Region)
	add("zone", md.Zone)
	add("instanceType", md.InstanceType)
	add("instanceID", md.InstanceID)
	add("providerID", md.ProviderID)
	add("spot", fmt.Sprint(md.Spot))
	add("internalDNS", md.InternalDNS)
	add("externalDNS", md.ExternalDNS)
	add("manufacturer", md.Manufacturer)
	add("productName", md.ProductName)
	add("version", md.Version)
	add("serialNumber", md.SerialNumber)
	add("uuid", md.UUID)
	add("skuNumber", md.SKUNumber)
	tags := make([]string, 0, len(md.Tags))
	for k := range md.Tags {
		tags = append(tags, k)
	}
	sort.Strings(tags)
	for _, k := range tags {
		out = append(out, [2]string{"tags." + k, md.Tags[k]})
	}
	return out
}

func isIP(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}
