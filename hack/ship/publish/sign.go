package publish

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"os"

	"golang.org/x/crypto/nacl/secretbox"
	"golang.org/x/crypto/scrypt"
)

// Media types and annotations of cosign's signature format: a manifest
// tagged sha256-<hex of the signed digest>.sig in the signed artifact's
// repository, one layer per signature, each layer a simple-signing payload
// with the base64 signature of it in an annotation.
const (
	SimpleSigningMediaType = "application/vnd.dev.cosign.simplesigning.v1+json"
	SignatureAnnotation    = "dev.cosignproject.cosign/signature"
	// SignatureType is the payload's critical.type.
	SignatureType = "cosign container image signature"
)

// SigningKeyEnv and SigningPasswordEnv: `make release` reads the key file's
// path from SIGNING_KEY (a make variable, so the environment works too) and
// an encrypted cosign key's password from COSIGN_PASSWORD, as cosign does.
const (
	SigningKeyEnv      = "SIGNING_KEY"
	SigningPasswordEnv = "COSIGN_PASSWORD"
)

// Signer signs a release's images and charts with a key of the user's.
type Signer struct {
	key crypto.Signer
	// File is where the key was read from.
	File string
}

// LoadSigningKey reads a private key file: PKCS#8 ("PRIVATE KEY", what
// openssl genpkey and `cosign import-key-pair` take), SEC 1 ("EC PRIVATE
// KEY"), PKCS#1 ("RSA PRIVATE KEY"), or cosign's own encrypted format
// ("ENCRYPTED SIGSTORE PRIVATE KEY" / "ENCRYPTED COSIGN PRIVATE KEY", what
// `cosign generate-key-pair` writes), decrypted with password. ECDSA keys on
// P-256, P-384 or P-521 and RSA keys of 2048 bits or more; signatures are over
// the SHA-256 of the payload, as cosign verifies them. Every error names the
// file.
func LoadSigningKey(file string, password []byte) (*Signer, error) {
	k, err := loadSigningKey(file, password)
	if err != nil {
		return nil, fmt.Errorf("signing key %s: %w", file, err)
	}
	return &Signer{key: k, File: file}, nil
}

func loadSigningKey(file string, password []byte) (crypto.Signer, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	block, rest := pem.Decode(data)
	if block == nil {
		return nil, errors.New("not a PEM file")
	}
	if b, _ := pem.Decode(rest); b != nil {
		return nil, errors.New("more than one PEM block: want the private key alone")
	}
	var key any
	switch block.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	case "ENCRYPTED SIGSTORE PRIVATE KEY", "ENCRYPTED COSIGN PRIVATE KEY":
		var der []byte
		if der, err = decryptCosignKey(block.Bytes, password); err == nil {
			key, err = x509.ParsePKCS8PrivateKey(der)
		}
	case "ENCRYPTED PRIVATE KEY":
		return nil, errors.New("an encrypted PKCS#8 key: decrypt it first (openssl pkcs8 -in KEY -out PLAIN) or import it with cosign import-key-pair")
	default:
		return nil, fmt.Errorf("PEM block %q is not a private key", block.Type)
	}
	if err != nil {
		return nil, err
	}
	switch k := key.(type) {
	case *ecdsa.PrivateKey:
		switch k.Curve {
		case elliptic.P256(), elliptic.P384(), elliptic.P521():
			return k, nil
		}
		return nil, fmt.Errorf("ECDSA curve %s is not supported (P-256, P-384, P-521)", k.Curve.Params().Name)
	case *rsa.PrivateKey:
		if k.N.BitLen() < 2048 {
			return nil, fmt.Errorf("RSA key of %d bits: want 2048 or more", k.N.BitLen())
		}
		return k, nil
	default:
		return nil, fmt.Errorf("%T keys are not supported (ECDSA or RSA)", key)
	}
}

// encryptedKey is cosign's encrypted private key (the JSON inside its PEM
// block): the PKCS#8 DER sealed with NaCl secretbox under a key derived from
// the password with scrypt.
type encryptedKey struct {
	KDF struct {
		Name   string `json:"name"`
		Params struct {
			N int `json:"N"`
			R int `json:"r"`
			P int `json:"p"`
		} `json:"params"`
		Salt []byte `json:"salt"`
	} `json:"kdf"`
	Cipher struct {
		Name  string `json:"name"`
		Nonce []byte `json:"nonce"`
	} `json:"cipher"`
	Ciphertext []byte `json:"ciphertext"`
}

func decryptCosignKey(data, password []byte) ([]byte, error) {
	var e encryptedKey
	if err := json.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("encrypted key: %w", err)
	}
	if e.KDF.Name != "scrypt" || e.Cipher.Name != "nacl/secretbox" {
		return nil, fmt.Errorf("encrypted key: kdf %q, cipher %q: want scrypt and nacl/secretbox", e.KDF.Name, e.Cipher.Name)
	}
	p := e.KDF.Params
	// Bounds keep a hostile file from asking for gigabytes of memory.
	if p.N < 2 || p.N > 1<<20 || p.N&(p.N-1) != 0 || p.R < 1 || p.R > 32 || p.P < 1 || p.P > 16 || len(e.Cipher.Nonce) != 24 {
		return nil, errors.New("encrypted key: parameters out of range")
	}
	k, err := scrypt.Key(password, e.KDF.Salt, p.N, p.R, p.P, 32)
	if err != nil {
		return nil, fmt.Errorf("encrypted key: %w", err)
	}
	var key [32]byte
	var nonce [24]byte
	copy(key[:], k)
	copy(nonce[:], e.Cipher.Nonce)
	out, ok := secretbox.Open(nil, e.Ciphertext, &nonce, &key)
	if !ok {
		if len(password) == 0 {
			return nil, fmt.Errorf("cannot decrypt it: %s is empty or unset", SigningPasswordEnv)
		}
		return nil, fmt.Errorf("cannot decrypt it: wrong password (%s)?", SigningPasswordEnv)
	}
	return out, nil
}

// PublicKeyPEM is the signer's public key as cosign's verify --key takes it
// (PKIX, "PUBLIC KEY").
func (s *Signer) PublicKeyPEM() ([]byte, error) {
	der, err := x509.MarshalPKIXPublicKey(s.key.Public())
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), nil
}

// SimpleSigningPayload is cosign's payload for the manifest digest of the
// repository (without tag or digest): what a signature signs.
func SimpleSigningPayload(repository, digest string) ([]byte, error) {
	type identity struct {
		DockerReference string `json:"docker-reference"`
	}
	type image struct {
		DockerManifestDigest string `json:"docker-manifest-digest"`
	}
	type critical struct {
		Identity identity `json:"identity"`
		Image    image    `json:"image"`
		Type     string   `json:"type"`
	}
	return json.Marshal(struct {
		Critical critical `json:"critical"`
		Optional any      `json:"optional"`
	}{Critical: critical{Identity: identity{repository}, Image: image{digest}, Type: SignatureType}})
}

// Sign returns the base64 signature of payload: ASN.1 ECDSA or PKCS #1
// v1.5 over its SHA-256. ECDSA signatures are deterministic (RFC 6979), so a
// release signed twice with one key pushes the same signature manifests.
func (s *Signer) Sign(payload []byte) (string, error) {
	h := sha256.Sum256(payload)
	// A nil random source: deterministic signatures (crypto/ecdsa, Go 1.24+).
	sig, err := s.key.Sign(nil, h[:], crypto.SHA256)
	if err != nil {
		return "", fmt.Errorf("sign with %s: %w", s.File, err)
	}
	return base64.StdEncoding.EncodeToString(sig), nil
}
