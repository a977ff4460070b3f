package pbscan

import (
	"bytes"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

func TestUvarint(t *testing.T) {
	tests := []struct {
		in    []byte
		v     uint64
		n     int
		valid bool
	}{
		{[]byte{0x00}, 0, 1, true},
		{[]byte{0x7f}, 127, 1, true},
		{[]byte{0x80, 0x01}, 128, 2, true},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01}, 1<<64 - 1, 10, true},
		{[]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02}, 0, 0, false}, // overflow
		{[]byte{0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00}, 0, 0, false},
		{[]byte{0x80}, 0, 0, false},
		{nil, 0, 0, false},
	}
	for _, tc := range tests {
		v, n := Uvarint(tc.in)
		if v != tc.v || n != tc.n {
			t.Errorf("Uvarint(%x) = %d, %d; want %d, %d", tc.in, v, n, tc.v, tc.n)
		}
		// Agree with the protobuf runtime on every valid input.
		if tc.valid {
			pv, pn := protowire.ConsumeVarint(tc.in)
			if pv != v || pn != n {
				t.Errorf("protowire disagrees on %x: %d, %d", tc.in, pv, pn)
			}
		}
	}
}

func TestNextAndAppend(t *testing.T) {
	var msg []byte
	msg = AppendTag(msg, 1, Varint)
	msg = AppendVarint(msg, 300)
	msg = protowire.AppendTag(msg, 2, protowire.Fixed64Type)
	msg = protowire.AppendFixed64(msg, 0x0102030405060708)
	msg = protowire.AppendTag(msg, 3, protowire.BytesType)
	msg = protowire.AppendBytes(msg, []byte("abc"))
	msg = protowire.AppendTag(msg, 4, protowire.Fixed32Type)
	msg = protowire.AppendFixed32(msg, 0x01020304)
	msg = AppendTag(msg, 3, Bytes)
	msg = AppendVarint(msg, 1)
	msg = append(msg, 'z')

	want := []Field{{1, Varint, 300, nil}, {2, Fixed64, 0x0102030405060708, nil}, {3, Bytes, 0, []byte("abc")}, {4, Fixed32, 0x01020304, nil}, {3, Bytes, 0, []byte("z")}}
	i := 0
	for _, w := range want {
		f, n := Next(msg[i:])
		if n == 0 || f.Num != w.Num || f.WireType != w.WireType || f.V != w.V || !bytes.Equal(f.B, w.B) {
			t.Fatalf("field %+v, want %+v", f, w)
		}
		i += n
	}
	if i != len(msg) || !Valid(msg) {
		t.Fatal("did not consume the message")
	}
	if b, found, ok := LastBytes(msg, 3); !ok || !found || string(b) != "z" {
		t.Fatalf("LastBytes = %q %v %v", b, found, ok)
	}
	if _, found, ok := LastBytes(msg, 9); !ok || found {
		t.Fatal("LastBytes found an absent field")
	}
	for _, bad := range [][]byte{{0x00}, {0x0b}, {0x1a, 0x05, 'a'}, {0x11, 1, 2}, {0x25, 1}, {0x08}} {
		if Valid(bad) {
			t.Errorf("Valid(%x)", bad)
		}
	}
	if VarintLen(0) != 1 || VarintLen(127) != 1 || VarintLen(128) != 2 || VarintLen(1<<64-1) != 10 {
		t.Fatal("VarintLen")
	}
}

// Groups never occur in Pulsar messages but protobuf decoders skip them, so
// Next must too, exactly as far as protowire does.
func TestGroups(t *testing.T) {
	var inner []byte
	inner = protowire.AppendTag(inner, 1, protowire.Fixed32Type)
	inner = protowire.AppendFixed32(inner, 0xffffffff) // high bytes right before the end tag
	inner = protowire.AppendTag(inner, 2, protowire.StartGroupType)
	inner = protowire.AppendTag(inner, 3, protowire.VarintType)
	inner = protowire.AppendVarint(inner, 1)
	inner = protowire.AppendTag(inner, 2, protowire.EndGroupType)
	var msg []byte
	msg = protowire.AppendTag(msg, 300, protowire.StartGroupType)
	msg = append(msg, inner...)
	msg = protowire.AppendTag(msg, 300, protowire.EndGroupType)
	msg = protowire.AppendTag(msg, 1, protowire.VarintType)
	msg = protowire.AppendVarint(msg, 5)

	f, n := Next(msg)
	_, _, pn := protowire.ConsumeField(msg)
	if n != pn || f.Num != 300 || f.WireType != StartGroup || !bytes.Equal(f.B, inner) {
		t.Fatalf("group: n=%d (protowire %d) num=%d contents %x", n, pn, f.Num, f.B)
	}
	if !Valid(msg) {
		t.Fatal("message with a group is valid")
	}
	// Inside a group protowire takes any field number that fits an int32 (a fuzz finding:
	// the scan once refused what the runtime decodes).
	var wide []byte
	wide = protowire.AppendTag(wide, 6, protowire.StartGroupType)
	wide = protowire.AppendTag(wide, 1<<30, protowire.VarintType)
	wide = protowire.AppendVarint(wide, 48)
	wide = protowire.AppendTag(wide, 6, protowire.EndGroupType)
	if _, n := Next(wide); n != len(wide) {
		t.Errorf("a field number above 2^29 inside a group: Next read %d of %d bytes", n, len(wide))
	}
	bad := map[string][]byte{
		"unterminated":      msg[:n-2],
		"mismatched end":    append(protowire.AppendTag(nil, 7, protowire.StartGroupType), protowire.AppendTag(nil, 8, protowire.EndGroupType)...),
		"stray end group":   protowire.AppendTag(nil, 7, protowire.EndGroupType),
		"too deeply nested": bytes.Repeat(protowire.AppendTag(nil, 1, protowire.StartGroupType), maxGroupDepth+1),
	}
	for name, b := range bad {
		if _, n := Next(b); n != 0 {
			t.Errorf("%s: Next accepted %x", name, b)
		}
	}
}
