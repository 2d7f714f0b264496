package proxy

import (
	"net/http"
	"strings"

	"github.com/hybrid-ccm/hybrid-ccm/coordinator/gate/proxy/wire"
)

// prepareAnswerRequest asks the API server for exactly the encoding the gate
// will read. The gate reads the answer uncompressed: where the client accepts
// gzip, the gate's transport asks for it and unpacks it (the link to the API
// server carries what it would have carried for the client); where it does
// not, the gate does not either.
func prepareAnswerRequest(r *http.Request, media wire.Media) {
	r.Header.Set("Accept", media.ContentType())
	if strings.Contains(strings.ToLower(strings.Join(r.Header.Values("Accept-Encoding"), ",")), "gzip") {
		r.Header.Del("Accept-Encoding")
	} else {
		r.Header.Set("Accept-Encoding", "identity")
	}
	r.RequestURI = ""
}
