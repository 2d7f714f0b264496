package publish

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/nacl/secretbox"
	"golang.org/x/crypto/scrypt"
)

func writePEM(t *testing.T, typ string, der []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "key.pem")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func pkcs8(t *testing.T, k any) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// encryptCosign seals der as cosign's encrypted key format does (scrypt,
// NaCl secretbox), with a small work factor.
func encryptCosign(t *testing.T, der, password []byte) []byte {
	t.Helper()
	var e encryptedKey
	e.KDF.Name, e.Cipher.Name = "scrypt", "nacl/secretbox"
	e.KDF.Params.N, e.KDF.Params.R, e.KDF.Params.P = 1024, 8, 1
	e.KDF.Salt = make([]byte, 32)
	e.Cipher.Nonce = make([]byte, 24)
	rand.Read(e.KDF.Salt)
	rand.Read(e.Cipher.Nonce)
	k, err := scrypt.Key(password, e.KDF.Salt, 1024, 8, 1, 32)
	if err != nil {
		t.Fatal(err)
	}
	var key [32]byte
	var nonce [24]byte
	copy(key[:], k)
	copy(nonce[:], e.Cipher.Nonce)
	e.Ciphertext = secretbox.Seal(nil, der, &nonce, &key)
	b, err := json.Marshal(e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Every accepted format signs the simple-signing payload so that the public
// key verifies it (SHA-256, as cosign verifies); ECDSA signatures are the
// same each time.
func TestSigningKeys(t *testing.T) {
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	p384, _ := ecdsa.GenerateKey(elliptic.P384(), rand.Reader)
	rsa2048, _ := rsa.GenerateKey(rand.Reader, 2048)
	sec1, _ := x509.MarshalECPrivateKey(p256)
	cases := []struct {
		name     string
		file     string
		password string
		pub      crypto.PublicKey
	}{
		{"PKCS#8 P-256", writePEM(t, "PRIVATE KEY", pkcs8(t, p256)), "", &p256.PublicKey},
		{"PKCS#8 P-384", writePEM(t, "PRIVATE KEY", pkcs8(t, p384)), "", &p384.PublicKey},
		{"SEC 1 P-256", writePEM(t, "EC PRIVATE KEY", sec1), "", &p256.PublicKey},
		{"PKCS#1 RSA", writePEM(t, "RSA PRIVATE KEY", x509.MarshalPKCS1PrivateKey(rsa2048)), "", &rsa2048.PublicKey},
		{"cosign encrypted", writePEM(t, "ENCRYPTED SIGSTORE PRIVATE KEY", encryptCosign(t, pkcs8(t, p256), []byte("pw"))), "pw", &p256.PublicKey},
	}
	payload, err := SimpleSigningPayload("registry.example/hybrid-ccm/talos-ccm", "sha256:"+strings.Repeat("0f", 32))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"critical":{"identity":{"docker-reference":"registry.example/hybrid-ccm/talos-ccm"},"image":{"docker-manifest-digest":"sha256:` + strings.Repeat("0f", 32) + `"},"type":"cosign container image signature"},"optional":null}`
	if string(payload) != want {
		t.Errorf("payload\n%s\nwant\n%s", payload, want)
	}
	h := sha256.Sum256(payload)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := LoadSigningKey(c.file, []byte(c.password))
			if err != nil {
				t.Fatal(err)
			}
			sig, err := s.Sign(payload)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := base64.StdEncoding.DecodeString(sig)
			if err != nil {
				t.Fatal(err)
			}
			switch pub := c.pub.(type) {
			case *ecdsa.PublicKey:
				if !ecdsa.VerifyASN1(pub, h[:], raw) {
					t.Error("signature does not verify")
				}
				if !ecdsa.VerifyASN1(pub, h[:], raw) || ecdsa.VerifyASN1(pub, sha256.New().Sum(nil), raw) {
					t.Error("signature verifies another message")
				}
				again, _ := s.Sign(payload)
				if again != sig {
					t.Error("two ECDSA signatures of one payload differ")
				}
			case *rsa.PublicKey:
				if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, h[:], raw); err != nil {
					t.Error(err)
				}
			}
			pemPub, err := s.PublicKeyPEM()
			if err != nil {
				t.Fatal(err)
			}
			block, _ := pem.Decode(pemPub)
			got, err := x509.ParsePKIXPublicKey(block.Bytes)
			if err != nil || !got.(interface{ Equal(crypto.PublicKey) bool }).Equal(c.pub) {
				t.Errorf("public key %v (%v)", got, err)
			}
		})
	}
}

// A key that cannot sign is refused with the file's name and the reason.
func TestSigningKeyRefused(t *testing.T) {
	_, ed, _ := ed25519.GenerateKey(rand.Reader)
	rsa1024, _ := rsa.GenerateKey(rand.Reader, 1024)
	p256, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	pub, _ := x509.MarshalPKIXPublicKey(&p256.PublicKey)
	garbage := filepath.Join(t.TempDir(), "garbage")
	os.WriteFile(garbage, []byte("not a key"), 0o600)
	cases := []struct {
		name, file, password, why string
	}{
		{"missing", filepath.Join(t.TempDir(), "nope.key"), "", "no such file"},
		{"not PEM", garbage, "", "not a PEM file"},
		{"public key", writePEM(t, "PUBLIC KEY", pub), "", "not a private key"},
		{"ed25519", writePEM(t, "PRIVATE KEY", pkcs8(t, ed)), "", "not supported"},
		{"RSA 1024", writePEM(t, "PRIVATE KEY", pkcs8(t, rsa1024)), "", "1024 bits"},
		{"encrypted PKCS#8", writePEM(t, "ENCRYPTED PRIVATE KEY", []byte{1, 2}), "", "decrypt it first"},
		{"wrong password", writePEM(t, "ENCRYPTED SIGSTORE PRIVATE KEY", encryptCosign(t, pkcs8(t, p256), []byte("pw"))), "other", "wrong password"},
		{"no password", writePEM(t, "ENCRYPTED SIGSTORE PRIVATE KEY", encryptCosign(t, pkcs8(t, p256), []byte("pw"))), "", "COSIGN_PASSWORD is empty or unset"},
		{"hostile scrypt", writePEM(t, "ENCRYPTED SIGSTORE PRIVATE KEY", []byte(`{"kdf":{"name":"scrypt","params":{"N":1073741824,"r":8,"p":1},"salt":""},"cipher":{"name":"nacl/secretbox","nonce":"AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},"ciphertext":""}`)), "", "out of range"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := LoadSigningKey(c.file, []byte(c.password))
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), c.file) || !strings.Contains(err.Error(), c.why) {
				t.Errorf("error %q: want the file %s and %q", err, c.file, c.why)
			}
		})
	}
}
