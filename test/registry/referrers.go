package registry

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// referrers completes the OCI 1.1 referrers API of go-containerregistry's
// registry (GET /v2/<name>/referrers/<digest>, which it answers from the
// manifests' subject fields): each descriptor's artifactType is the
// manifest's artifactType when it has one (the registry reports the config's
// media type, the empty one for artifacts), its annotations are the
// manifest's, and the artifactType query parameter filters the list
// (OCI-Filters-Applied says so), as the distribution spec asks.
func referrers(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		elems := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
		if req.Method != http.MethodGet || len(elems) < 4 || elems[0] != "v2" || elems[len(elems)-2] != "referrers" {
			next.ServeHTTP(w, req)
			return
		}
		rec := httptest.NewRecorder()
		next.ServeHTTP(rec, req)
		var idx v1.IndexManifest
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &idx) != nil {
			copyResponse(w, rec)
			return
		}
		repo := strings.Join(elems[1:len(elems)-2], "/")
		filter := req.URL.Query().Get("artifactType")
		kept := []v1.Descriptor{}
		for _, d := range idx.Manifests {
			get := httptest.NewRequestWithContext(req.Context(), http.MethodGet, "/v2/"+repo+"/manifests/"+d.Digest.String(), nil)
			m := httptest.NewRecorder()
			next.ServeHTTP(m, get)
			var mf struct {
				ArtifactType string            `json:"artifactType"`
				Annotations  map[string]string `json:"annotations"`
			}
			if m.Code == http.StatusOK && json.Unmarshal(m.Body.Bytes(), &mf) == nil {
				if mf.ArtifactType != "" {
					d.ArtifactType = mf.ArtifactType
				}
				d.Annotations = mf.Annotations
			}
			if filter == "" || d.ArtifactType == filter {
				kept = append(kept, d)
			}
		}
		slices.SortFunc(kept, func(a, b v1.Descriptor) int { return strings.Compare(a.Digest.String(), b.Digest.String()) })
		idx.Manifests = kept
		body, err := json.Marshal(idx)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", rec.Header().Get("Content-Type"))
		if filter != "" {
			w.Header().Set("OCI-Filters-Applied", "artifactType")
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(body)
	})
}

func copyResponse(w http.ResponseWriter, rec *httptest.ResponseRecorder) {
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.WriteHeader(rec.Code)
	_, _ = bytes.NewReader(rec.Body.Bytes()).WriteTo(w)
}
