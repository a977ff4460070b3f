package wire

import (
	"testing"

	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

func TestDecodeMetadataMalformed(t *testing.T) {
	var md pulsarpb.MessageMetadata
	if err := DecodeMetadata([]byte{0x0a, 0x05, 'a'}, &md); err != ErrMalformedMetadata {
		t.Fatalf("truncated: %v", err)
	}
}
