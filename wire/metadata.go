package wire

import (
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// DecodeMetadata decodes an encoded MessageMetadata (Frame.Metadata) into
// md, replacing its contents. Missing required fields are accepted, as a
// broker would; unknown fields (for example from a newer client) are kept
// and written back by AppendMetadata and the frame encoders.
func DecodeMetadata(b []byte, md *pulsarpb.MessageMetadata) error {
	if err := decodeOpts.Unmarshal(b, md); err != nil {
		return ErrMalformedMetadata
	}
	return nil
}

// AppendMetadata appends the encoding of md to dst.
func AppendMetadata(dst []byte, md *pulsarpb.MessageMetadata) ([]byte, error) {
	return encodeOpts.MarshalAppend(dst, md)
}
