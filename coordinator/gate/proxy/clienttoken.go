package proxy

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// minClientToken is the shortest client token the proxy accepts (bytes of
// text); LoadOrCreateClientToken writes 43 (32 random bytes, base64url).
const minClientToken = 32

// LoadOrCreateClientToken returns the bearer token the proxy accepts from its
// client, read from path, or a new random one written there (mode 0644: the
// file's directory is what limits who reads it; the CCM may run as any user).
// A restarted gate container reuses the token in the pod's volume, so that
// the CCM, which read it once, keeps working; a new pod gets a new token.
func LoadOrCreateClientToken(path string) ([]byte, error) {
	const op = "proxy.LoadOrCreateClientToken"
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		if tok := strings.TrimSpace(string(b)); validClientToken(tok) {
			return []byte(tok), nil
		}
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	tok := base64.RawURLEncoding.EncodeToString(raw)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if err := writeAtomic(path, []byte(tok), 0o644); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return []byte(tok), nil
}

// validClientToken: long enough and only base64url characters (what this
// package writes), so that a truncated or foreign file is replaced.
func validClientToken(tok string) bool {
	if len(tok) < minClientToken {
		return false
	}
	for _, c := range tok {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}
