package rebatch

import (
	"bytes"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/wire"
	"github.com/rebatchproxy/rebatchproxy/wire/pulsarpb"
)

// FuzzProducerSend feeds arbitrary frames to an engine: it must never panic, and whatever it
// accepts must come out as well-formed broker frames with checksums that verify.
func FuzzProducerSend(f *testing.F) {
	f.Add(clientSingle(f, msg{key: "k", props: map[string]string{"region": "eu"}, payload: "x", seq: 0}))
	f.Add(clientBatch(f, pip191Messages(), pulsarpb.CompressionType_NONE, nil))
	f.Add(clientBatch(f, pip191Messages(), pulsarpb.CompressionType_LZ4, nil))
	f.Add(clientBatch(f, pip191Messages(), pulsarpb.CompressionType_ZSTD, []byte{1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		p := newEngine(t, pip191Policy, -1)
		fr, _, err := wire.ReadFrame(b, 1<<20)
		if err != nil || fr.Type() != pulsarpb.BaseCommand_SEND {
			return
		}
		var out Output
		if err := p.Send(t0, fr, &out); err != nil {
			return
		}
		if err := p.Flush(&out); err != nil {
			return
		}
		for rest := out.Broker; len(rest) > 0; {
			g, n, err := wire.ReadFrame(rest, 2<<20)
			if err != nil {
				t.Fatalf("engine wrote a frame that does not parse: %v", err)
			}
			// Frames forwarded verbatim keep the client's bytes, checksum included; every
			// frame the engine built must verify.
			if !bytes.Equal(g.Bytes(), fr.Bytes()) {
				if err := g.VerifyChecksum(); err != nil {
					t.Fatalf("built entry has a bad checksum: %v", err)
				}
			}
			rest = rest[n:]
		}
	})
}
