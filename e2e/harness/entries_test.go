package harness

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"net/http"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// record encodes one batch record the way clients do: size, SingleMessageMetadata, payload.
func record(key string, props [][2]string, payload string, seq uint64) []byte {
	var smm []byte
	for _, kv := range props {
		var p []byte
		p = protowire.AppendTag(p, 1, protowire.BytesType)
		p = protowire.AppendString(p, kv[0])
		p = protowire.AppendTag(p, 2, protowire.BytesType)
		p = protowire.AppendString(p, kv[1])
		smm = protowire.AppendTag(smm, 1, protowire.BytesType)
		smm = protowire.AppendBytes(smm, p)
	}
	if key != "" {
		smm = protowire.AppendTag(smm, 2, protowire.BytesType)
		smm = protowire.AppendString(smm, key)
	}
	smm = protowire.AppendTag(smm, 3, protowire.VarintType)
	smm = protowire.AppendVarint(smm, uint64(len(payload)))
	smm = protowire.AppendTag(smm, 8, protowire.VarintType)
	smm = protowire.AppendVarint(smm, seq)
	// An unknown field must be skipped, not rejected.
	smm = protowire.AppendTag(smm, 99, protowire.BytesType)
	smm = protowire.AppendString(smm, "future")
	out := binary.BigEndian.AppendUint32(nil, uint32(len(smm)))
	out = append(out, smm...)
	return append(out, payload...)
}

func TestSplitBatch(t *testing.T) {
	two := append(record("k1", [][2]string{{"a", "1"}}, "hello", 7), record("", nil, "", 8)...)
	tests := []struct {
		name    string
		in      []byte
		want    []StoredMessage
		wantErr bool
	}{
		{name: "empty", in: nil, want: nil},
		{name: "two records", in: two, want: []StoredMessage{
			{PartitionKey: "k1", HasKey: true, Properties: map[string]string{"a": "1"}, Payload: []byte("hello"), SequenceID: 7, HasSequence: true},
			{Properties: map[string]string{}, Payload: []byte{}, SequenceID: 8, HasSequence: true},
		}},
		{name: "truncated size", in: []byte{0, 0}, wantErr: true},
		{name: "metadata past end", in: []byte{0, 0, 0, 9, 1}, wantErr: true},
		{name: "payload past end", in: two[:len(record("k1", [][2]string{{"a", "1"}}, "hello", 7))-1], wantErr: true},
		{name: "no payload_size", in: []byte{0, 0, 0, 2, 0x10, 0x01}, wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := SplitBatch(tc.in)
			if tc.wantErr {
				if !errors.Is(err, ErrMalformedBatch) {
					t.Fatalf("err = %v, want ErrMalformedBatch", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("%d messages, want %d", len(got), len(tc.want))
			}
			for i := range got {
				g, w := got[i], tc.want[i]
				if string(g.Payload) != string(w.Payload) || g.PartitionKey != w.PartitionKey || g.HasKey != w.HasKey ||
					g.SequenceID != w.SequenceID || g.HasSequence != w.HasSequence || len(g.Properties) != len(w.Properties) {
					t.Fatalf("message %d = %+v, want %+v", i, g, w)
				}
				for k, v := range w.Properties {
					if g.Properties[k] != v {
						t.Fatalf("message %d properties %v, want %v", i, g.Properties, w.Properties)
					}
				}
			}
		})
	}
}

func TestParsePropertyHeadersBothSpellings(t *testing.T) {
	tests := []struct {
		name string
		h    http.Header
		want map[string]string
	}{
		{"json header (Pulsar 3.1+)", http.Header{"X-Pulsar-Property": {`{"a":"1","b":"x y"}`}}, map[string]string{"a": "1", "b": "x y"}},
		{"one header per property (older)", http.Header{"X-Pulsar-Property-A": {"1"}, "X-Pulsar-Property-B": {"2"}}, map[string]string{"A": "1", "B": "2"}},
		{"none", http.Header{"X-Pulsar-Sequence-Id": {"3"}}, map[string]string{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := parsePropertyHeaders(tc.h)
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}

func TestParseStoredEntryUnbatchedUsesOuterFields(t *testing.T) {
	h := http.Header{}
	h.Set("X-Pulsar-partition-key", "k")
	h.Set("X-Pulsar-sequence-id", "41")
	h.Set("X-Pulsar-PROPERTY", `{"x":"y"}`)
	e, err := parseStoredEntry(3, 4, h, []byte("body"))
	if err != nil {
		t.Fatal(err)
	}
	if e.Batched || e.NumMessages != 1 || len(e.Messages) != 1 || string(e.Messages[0].Payload) != "body" ||
		e.Messages[0].PartitionKey != "k" || e.SequenceID != 41 || e.Properties["x"] != "y" || e.ChunkID != -1 {
		t.Fatalf("unexpected entry %+v", e)
	}
}

func TestParseStoredEntryRejectsCountMismatch(t *testing.T) {
	h := http.Header{}
	h.Set("X-Pulsar-num-batch-message", "2")
	if _, err := parseStoredEntry(1, 1, h, record("k", nil, "p", 0)); !errors.Is(err, ErrMalformedBatch) {
		t.Fatalf("err = %v, want ErrMalformedBatch", err)
	}
}

func TestSignTokenIsVerifiableHS256(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	tok := SignToken(key, "alice")
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token %q has %d parts", tok, len(parts))
	}
	body, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil || string(body) != `{"sub":"alice"}` {
		t.Fatalf("body %q, err %v", body, err)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(parts[0] + "." + parts[1]))
	if got := base64.RawURLEncoding.EncodeToString(mac.Sum(nil)); got != parts[2] {
		t.Fatalf("signature %q, want %q", parts[2], got)
	}
}

func TestTopicPath(t *testing.T) {
	for in, want := range map[string]string{
		"persistent://public/default/t":     "/admin/v2/persistent/public/default/t",
		"non-persistent://public/default/t": "/admin/v2/non-persistent/public/default/t",
		"public/default/t":                  "/admin/v2/persistent/public/default/t",
	} {
		if got := topicPath(in); got != want {
			t.Errorf("topicPath(%q) = %q, want %q", in, got, want)
		}
	}
}

func FuzzSplitBatch(f *testing.F) {
	f.Add(record("k", [][2]string{{"a", "b"}}, "payload", 1))
	f.Add([]byte{0, 0, 0, 0})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, b []byte) {
		msgs, err := SplitBatch(b)
		if err != nil && !errors.Is(err, ErrMalformedBatch) {
			t.Fatalf("unexpected error type: %v", err)
		}
		total := 0
		for _, m := range msgs {
			total += len(m.Payload)
		}
		if total > len(b) {
			t.Fatalf("payloads (%d bytes) larger than input (%d)", total, len(b))
		}
	})
}
