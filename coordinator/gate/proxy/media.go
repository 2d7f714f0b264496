package proxy

import (
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// mediaKind is an encoding the Service view can read and edit.
type mediaKind int

const (
	mediaNone mediaKind = iota
	mediaJSON
	mediaProtobuf
)

const (
	contentTypeJSON     = "application/json"
	contentTypeProtobuf = "application/vnd.kubernetes.protobuf"
)

func (m mediaKind) contentType() string {
	if m == mediaProtobuf {
		return contentTypeProtobuf
	}
	return contentTypeJSON
}

// mediaOf reads a Content-Type header.
func mediaOf(contentType string) mediaKind {
	t, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return mediaNone
	}
	switch t {
	case contentTypeJSON:
		return mediaJSON
	case contentTypeProtobuf:
		return mediaProtobuf
	}
	return mediaNone
}

// negotiateMedia picks the encoding of a Service response from the client's
// Accept headers: JSON or protobuf, the client's preference by q-value and
// then order; */* and an absent header mean JSON, as at the API server.
// Media types that ask the API server to transform the answer (as=Table,
// as=PartialObjectMetadata, ...) are skipped: the view filters Services, and
// a table or metadata-only answer would not show it what it filters on.
// ok is false when nothing acceptable remains (406).
func negotiateMedia(accept []string) (m mediaKind, ok bool) {
	header := strings.Join(accept, ",")
	if strings.TrimSpace(header) == "" {
		return mediaJSON, true
	}
	best, bestQ := mediaNone, -1.0
	for _, part := range strings.Split(header, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		t, params, err := mime.ParseMediaType(part)
		if err != nil {
			continue
		}
		q := 1.0
		if v, set := params["q"]; set {
			if q, err = strconv.ParseFloat(v, 64); err != nil || q < 0 || q > 1 {
				continue
			}
		}
		if q == 0 || params["as"] != "" || params["g"] != "" || params["v"] != "" {
			continue
		}
		kind := mediaNone
		switch t {
		case contentTypeJSON, "*/*", "application/*":
			kind = mediaJSON
		case contentTypeProtobuf:
			kind = mediaProtobuf
		}
		if kind != mediaNone && q > bestQ {
			best, bestQ = kind, q
		}
	}
	return best, best != mediaNone
}

// prepareAnswerRequest asks the API server for exactly the encoding the gate
// will read. The gate reads the answer uncompressed: where the client accepts
// gzip, the gate's transport asks for it and unpacks it (the link to the API
// server carries what it would have carried for the client); where it does
// not, the gate does not either.
func prepareAnswerRequest(r *http.Request, media mediaKind) {
	r.Header.Set("Accept", media.contentType())
	if strings.Contains(strings.ToLower(strings.Join(r.Header.Values("Accept-Encoding"), ",")), "gzip") {
		r.Header.Del("Accept-Encoding")
	} else {
		r.Header.Set("Accept-Encoding", "identity")
	}
	r.RequestURI = ""
}
