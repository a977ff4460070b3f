package pbscan

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// FuzzNextAgreesWithProtowire holds Next (its fast path for one-byte keys and values included)
// to the protobuf runtime's own field reader: the same field number, wire type, length, value
// and bytes, and a refusal exactly where protowire (with the runtime decoder's limit on field
// numbers) refuses. Groups are compared by length only
// (Next returns their contents), and Next may refuse a group only where it can be nested
// deeper than maxGroupDepth.
func FuzzNextAgreesWithProtowire(f *testing.F) {
	for _, seed := range [][]byte{
		{0x08, 0x01}, {0x08, 0x96, 0x01}, {0x12, 0x02, 'h', 'i'}, {0x12, 0x05, 'h'}, {0x0d, 1, 2, 3, 4},
		{0x09, 1, 2, 3, 4, 5, 6, 7, 8}, {0x0b, 0x08, 0x01, 0x0c}, {0x0c}, {0x00, 0x01}, {0xf8, 0xff, 0xff, 0xff, 0x0f, 0x01},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		fl, n := Next(b)
		if sf, sn := NextSmall(b); sn != 0 && (sn != n || sf.Num != fl.Num || sf.WireType != fl.WireType || sf.V != fl.V || !bytes.Equal(sf.B, fl.B)) {
			t.Fatalf("NextSmall(%x) = %+v of %d bytes, Next read %+v of %d bytes", b, sf, sn, fl, n)
		}
		num, typ, tn := protowire.ConsumeTag(b)
		m := -1
		if tn >= 0 && num <= protowire.MaxValidNumber { // the runtime's decoder refuses larger numbers
			m = protowire.ConsumeFieldValue(num, typ, b[tn:])
		}
		if tn < 0 || m < 0 {
			if n != 0 {
				t.Fatalf("Next read %d bytes (%+v) of %x, protowire refuses it", n, fl, b)
			}
			return
		}
		if n == 0 {
			if typ == protowire.StartGroupType && len(b) > maxGroupDepth {
				return // possibly nested deeper than Next follows (each level takes a byte)
			}
			t.Fatalf("Next refuses %x, protowire reads field %d type %d of %d bytes", b, num, typ, tn+m)
		}
		if n != tn+m || fl.Num != uint64(num) || fl.WireType != uint64(typ) {
			t.Fatalf("Next: field %d type %d, %d bytes; protowire: field %d type %d, %d bytes (%x)", fl.Num, fl.WireType, n, num, typ, tn+m, b)
		}
		switch typ {
		case protowire.VarintType:
			if v, _ := protowire.ConsumeVarint(b[tn:]); v != fl.V {
				t.Fatalf("varint %d, protowire %d (%x)", fl.V, v, b)
			}
		case protowire.BytesType:
			if v, _ := protowire.ConsumeBytes(b[tn:]); !bytes.Equal(v, fl.B) {
				t.Fatalf("bytes %x, protowire %x", fl.B, v)
			}
		case protowire.Fixed32Type:
			if v, _ := protowire.ConsumeFixed32(b[tn:]); uint64(v) != fl.V {
				t.Fatalf("fixed32 %d, protowire %d", fl.V, v)
			}
		case protowire.Fixed64Type:
			if v, _ := protowire.ConsumeFixed64(b[tn:]); v != fl.V {
				t.Fatalf("fixed64 %d, protowire %d", fl.V, v)
			}
		}
	})
}
