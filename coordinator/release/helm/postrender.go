package helm

import (
	"bytes"

	"helm.sh/helm/v3/pkg/postrender"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/release"
)

// postRenderer hands what Helm rendered to the request's mutators.
type postRenderer struct {
	req release.Request
}

var _ postrender.PostRenderer = postRenderer{}

func (p postRenderer) Run(rendered *bytes.Buffer) (*bytes.Buffer, error) {
	out, err := p.req.PostRender(rendered.Bytes())
	if err != nil {
		return nil, err
	}
	return bytes.NewBuffer(out), nil
}
