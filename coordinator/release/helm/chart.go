package helm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"strings"
	"sync"

	"github.com/Masterminds/semver/v3"
	"helm.sh/helm/v3/pkg/chart"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/registry"
	"helm.sh/helm/v3/pkg/repo"
	"sigs.k8s.io/yaml"

	nativeccm "github.com/hybrid-ccm/hybrid-ccm/charts/native-ccm"
	"github.com/hybrid-ccm/hybrid-ccm/coordinator/profile"
)

var (
	builtinOnce   sync.Once
	builtinFiles  []*loader.BufferedFile
	builtinErr    error
	maxChartBytes int64 = 20 << 20
)

func loadBuiltinFiles() {
	builtinOnce.Do(func() {
		builtinErr = fs.WalkDir(nativeccm.Files, ".", func(p string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := fs.ReadFile(nativeccm.Files, p)
			if err != nil {
				return err
			}
			builtinFiles = append(builtinFiles, &loader.BufferedFile{Name: p, Data: data})
			return nil
		})
	})
}

// BuiltinChart loads the embedded generic chart charts/native-ccm. A
// non-empty version (the coordinator's release version) becomes the chart's
// version and appVersion, so that a release's native CCM releases carry the
// version the user released, whatever charts/native-ccm/Chart.yaml said when
// the binary was built; it must be a semantic version.
func BuiltinChart(version string) (*chart.Chart, error) {
	loadBuiltinFiles()
	if builtinErr != nil {
		return nil, fmt.Errorf("embedded native-ccm chart: %w", builtinErr)
	}
	// LoadFiles keeps references to the buffers; give it copies so a chart
	// mutated by Helm never leaks into the next load.
	files := make([]*loader.BufferedFile, len(builtinFiles))
	for i, f := range builtinFiles {
		files[i] = &loader.BufferedFile{Name: f.Name, Data: bytes.Clone(f.Data)}
	}
	ch, err := loader.LoadFiles(files)
	if err != nil || version == "" {
		return ch, err
	}
	if _, err := semver.StrictNewVersion(version); err != nil {
		return nil, fmt.Errorf("embedded native-ccm chart: version %q: %w", version, err)
	}
	ch.Metadata.Version, ch.Metadata.AppVersion = version, version
	return ch, nil
}

// chartSource fetches charts from the embedded chart, HTTP chart repositories
// and OCI registries. Downloaded archives are cached by URL and digest.
type chartSource struct {
	// builtinVersion is Options.BuiltinChartVersion.
	builtinVersion string
	http           *http.Client
	registry       func() (*registry.Client, error)

	mu    sync.Mutex
	cache map[string][]byte
}

func (s *chartSource) load(ctx context.Context, c profile.Chart) (*chart.Chart, error) {
	switch c.Source {
	case profile.ChartBuiltin:
		return BuiltinChart(s.builtinVersion)
	case profile.ChartRepository:
		data, err := s.fromRepository(ctx, c)
		if err != nil {
			return nil, err
		}
		return loader.LoadArchive(bytes.NewReader(data))
	case profile.ChartOCI:
		data, err := s.fromOCI(c)
		if err != nil {
			return nil, err
		}
		return loader.LoadArchive(bytes.NewReader(data))
	default:
		return nil, fmt.Errorf("unknown chart source %q", c.Source)
	}
}

func (s *chartSource) get(ctx context.Context, u string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", u, resp.Status)
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxChartBytes+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > maxChartBytes {
		return nil, fmt.Errorf("GET %s: larger than %d bytes", u, maxChartBytes)
	}
	return data, nil
}

func (s *chartSource) fromRepository(ctx context.Context, c profile.Chart) ([]byte, error) {
	const op = "helm/chartSource.fromRepository"
	base := strings.TrimSuffix(c.Repository, "/") + "/"
	raw, err := s.get(ctx, base+"index.yaml")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	idx := &repo.IndexFile{}
	if err := yaml.Unmarshal(raw, idx); err != nil {
		return nil, fmt.Errorf("%s: %s: index.yaml: %w", op, c.Repository, err)
	}
	idx.SortEntries()
	cv, err := idx.Get(c.Name, c.Version)
	if err != nil {
		return nil, fmt.Errorf("%s: %s: chart %s version %q: %w", op, c.Repository, c.Name, c.Version, err)
	}
	if len(cv.URLs) == 0 {
		return nil, fmt.Errorf("%s: %s: chart %s %s has no URL", op, c.Repository, c.Name, cv.Version)
	}
	ref, err := url.Parse(cv.URLs[0])
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	baseURL, err := url.Parse(base)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	archiveURL := baseURL.ResolveReference(ref).String()
	key := archiveURL + "@" + cv.Digest
	s.mu.Lock()
	data, ok := s.cache[key]
	s.mu.Unlock()
	if ok && cv.Digest != "" {
		return data, nil
	}
	data, err = s.get(ctx, archiveURL)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if cv.Digest != "" {
		sum := sha256.Sum256(data)
		if hex.EncodeToString(sum[:]) != cv.Digest {
			return nil, fmt.Errorf("%s: %s: digest mismatch (index says %s)", op, archiveURL, cv.Digest)
		}
		s.mu.Lock()
		if s.cache == nil {
			s.cache = map[string][]byte{}
		}
		s.cache[key] = data
		s.mu.Unlock()
	}
	return data, nil
}

func (s *chartSource) fromOCI(c profile.Chart) ([]byte, error) {
	const op = "helm/chartSource.fromOCI"
	ref := strings.TrimPrefix(strings.TrimSuffix(c.Repository, "/"), "oci://")
	if c.Name != "" {
		ref += "/" + c.Name
	}
	ref += ":" + c.Version
	key := "oci://" + ref
	s.mu.Lock()
	data, ok := s.cache[key]
	s.mu.Unlock()
	if ok {
		return data, nil
	}
	rc, err := s.registry()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	res, err := rc.Pull(ref, registry.PullOptWithChart(true))
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", op, ref, err)
	}
	s.mu.Lock()
	if s.cache == nil {
		s.cache = map[string][]byte{}
	}
	s.cache[key] = res.Chart.Data
	s.mu.Unlock()
	return res.Chart.Data, nil
}
