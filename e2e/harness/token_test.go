package harness

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// verifyHS256 checks a compact JWT's HMAC-SHA256 signature with key and returns its decoded
// header and claims.
func verifyHS256(t *testing.T, tok string, key []byte) (head, claims map[string]any, ok bool) {
	t.Helper()
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q has %d parts, want 3", tok, len(parts))
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		t.Fatalf("signature is not base64url: %v", err)
	}
	for i, dst := range []*map[string]any{&head, &claims} {
		raw, err := base64.RawURLEncoding.DecodeString(parts[i])
		if err != nil {
			t.Fatalf("part %d is not base64url: %v", i, err)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(dst); err != nil {
			t.Fatalf("part %d is not a JSON object: %q: %v", i, raw, err)
		}
	}
	return head, claims, hmac.Equal(sig, mac.Sum(nil))
}

func TestSignTokenExpiringVerifiesAndCarriesExp(t *testing.T) {
	// Given a secret key and an expiry with a fraction of a second
	key := []byte("0123456789abcdef0123456789abcdef")
	exp := time.Unix(1893456000, 750_000_000)

	// When a token for alice is signed to expire then
	tok := SignTokenExpiring(key, "alice", exp)

	// Then it verifies with that key only, is HS256, names alice, and its exp is the expiry in
	// whole seconds as a JSON number (NumericDate, RFC 7519 section 2)
	head, claims, ok := verifyHS256(t, tok, key)
	if !ok {
		t.Fatal("signature does not verify with the signing key")
	}
	if _, _, ok := verifyHS256(t, tok, []byte("another-key-another-key-another-k")); ok {
		t.Fatal("signature verifies with another key")
	}
	if head["alg"] != "HS256" {
		t.Fatalf("header %v, want alg HS256", head)
	}
	if claims["sub"] != "alice" {
		t.Fatalf("claims %v, want sub alice", claims)
	}
	n, isNum := claims["exp"].(json.Number)
	if !isNum || n.String() != "1893456000" {
		t.Fatalf("claims %v, want exp 1893456000 as a number", claims)
	}
	if len(claims) != 2 {
		t.Fatalf("claims %v, want only sub and exp", claims)
	}
}
