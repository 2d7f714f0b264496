package wire

import "mime"

// Media is an encoding of the API server the gate reads and edits.
type Media int

const (
	MediaNone Media = iota
	MediaJSON
	MediaProtobuf
)

const (
	ContentTypeJSON     = "application/json"
	ContentTypeProtobuf = "application/vnd.kubernetes.protobuf"
)

func (m Media) ContentType() string {
	if m == MediaProtobuf {
		return ContentTypeProtobuf
	}
	return ContentTypeJSON
}

// MediaOf reads a Content-Type header.
func MediaOf(contentType string) Media {
	t, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return MediaNone
	}
	switch t {
	case ContentTypeJSON:
		return MediaJSON
	case ContentTypeProtobuf:
		return MediaProtobuf
	}
	return MediaNone
}
