package wire

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// TestProtoMapEntry reads map entries as the API server's protobuf writes
// labels and annotations, and entries it would never write.
func TestProtoMapEntry(t *testing.T) {
	entry := func(fields ...func([]byte) []byte) []byte {
		var b []byte
		for _, f := range fields {
			b = f(b)
		}
		return b
	}
	str := func(num protowire.Number, v string) func([]byte) []byte {
		return func(b []byte) []byte {
			b = protowire.AppendTag(b, num, protowire.BytesType)
			return protowire.AppendString(b, v)
		}
	}
	varint := func(num protowire.Number, v uint64) func([]byte) []byte {
		return func(b []byte) []byte {
			b = protowire.AppendTag(b, num, protowire.VarintType)
			return protowire.AppendVarint(b, v)
		}
	}
	cases := []struct {
		name       string
		entry      []byte
		key, value string
		err        bool
	}{
		{"key and value", entry(str(1, "topology.kubernetes.io/region"), str(2, "eu-west-1")), "topology.kubernetes.io/region", "eu-west-1", false},
		{"value first", entry(str(2, "v"), str(1, "k")), "k", "v", false},
		{"empty value", entry(str(1, "k")), "k", "", false},
		{"a varint 1 is no key", entry(varint(1, 7), str(2, "v")), "", "v", false},
		{"unknown field skipped", entry(str(3, "x"), str(1, "k"), str(2, "v")), "k", "v", false},
		{"the last of a repeated key", entry(str(1, "a"), str(1, "b"), str(2, "v")), "b", "v", false},
		{"truncated", entry(str(1, "key"))[:3], "", "", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			key, value, err := ProtoMapEntry(tc.entry)
			if (err != nil) != tc.err {
				t.Fatalf("err = %v, want error %v", err, tc.err)
			}
			if tc.err {
				return
			}
			if string(key) != tc.key || string(value) != tc.value {
				t.Fatalf("got %q=%q, want %q=%q", key, value, tc.key, tc.value)
			}
		})
	}
}
