package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"
)

// fakeEntry is one entry of the fake admin API's topic.
type fakeEntry struct {
	producer    string
	seq         uint64
	chunk, of   int // of 0: not a chunk
	ledger, ent uint64
}

// fakeAdmin serves examinemessage for one topic the way Pulsar 4.0.8 does (the headers
// captured from a real broker; a position before the first entry is a 500), newest last.
func fakeAdmin(t *testing.T, path string, entries []fakeEntry) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != path+"/examinemessage" || r.URL.Query().Get("initialPosition") != "latest" {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
		n, _ := strconv.Atoi(r.URL.Query().Get("messagePosition"))
		if n < 1 || n > len(entries) {
			http.Error(w, `{"reason":"Incorrect parameter input error code: -14"}`, http.StatusInternalServerError)
			return
		}
		e := entries[len(entries)-n]
		h := w.Header()
		h.Set("X-Pulsar-Message-ID", fmt.Sprintf("%d:%d", e.ledger, e.ent))
		h.Set("X-Pulsar-producer-name", e.producer)
		h.Set("X-Pulsar-sequence-id", strconv.FormatUint(e.seq, 10))
		h.Set("X-Pulsar-publish-time", time.UnixMilli(1).UTC().Format("2006-01-02T15:04:05.000Z"))
		if e.of > 0 {
			h.Set("X-Pulsar-uuid", fmt.Sprintf("%s-%d", e.producer, e.seq))
			h.Set("X-Pulsar-num-chunks-from-msg", strconv.Itoa(e.of))
			h.Set("X-Pulsar-chunk-id", strconv.Itoa(e.chunk))
		}
		_, _ = w.Write(make([]byte, 100))
	}))
}

func TestAdminStoredReaderReadsBackTheResumedChunks(t *testing.T) {
	const path = "/admin/v2/persistent/public/default/t"
	tests := []struct {
		name      string
		entries   []fakeEntry
		max       int
		wantFound []string // "seq.chunk@entry", oldest first
		wantRead  int
		wantErr   bool
	}{
		{"stops at the producer's earlier send, skipping other producers",
			[]fakeEntry{{"p", 4, 2, 3, 1, 1}, {"p", 5, 0, 3, 1, 2}, {"q", 9, 0, 0, 1, 3}, {"p", 5, 1, 3, 1, 4}},
			100, []string{"5.0@2", "5.1@4"}, 4, false},
		{"stops at the topic's first entry",
			[]fakeEntry{{"p", 5, 0, 3, 1, 0}, {"p", 5, 1, 3, 1, 1}},
			100, []string{"5.0@0", "5.1@1"}, 2, false},
		{"later messages are found too; non-chunks are skipped",
			[]fakeEntry{{"p", 3, 0, 0, 1, 0}, {"p", 5, 2, 3, 1, 1}, {"p", 6, 0, 0, 1, 2}, {"p", 7, 0, 2, 1, 3}},
			100, []string{"5.2@1", "7.0@3"}, 4, false},
		{"the entry bound ends the look with an error, keeping what was found",
			[]fakeEntry{{"p", 4, 0, 0, 1, 0}, {"q", 1, 0, 0, 1, 1}, {"q", 2, 0, 0, 1, 2}, {"p", 5, 0, 3, 1, 3}},
			2, []string{"5.0@3"}, 2, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			srv := fakeAdmin(t, path, tt.entries)
			defer srv.Close()
			r := &AdminStoredReader{WebURLs: []string{srv.URL}, MaxEntries: tt.max, MaxPayload: 1 << 20}

			found, read, err := r.ReadStored(context.Background(), "persistent://public/default/t", "p", 5)

			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			var got []string
			for _, s := range found {
				got = append(got, fmt.Sprintf("%d.%d@%d", s.SequenceID, s.ChunkID, s.Entry))
				if want := ChunkFingerprint(make([]byte, 100), 1, fmt.Sprintf("p-%d", s.SequenceID)); s.Fingerprint != want {
					t.Errorf("%d.%d: fingerprint %x, want %x (as computed from the sent chunk)", s.SequenceID, s.ChunkID, s.Fingerprint, want)
				}
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.wantFound) || read != tt.wantRead {
				t.Fatalf("found %v after reading %d entries, want %v after %d", got, read, tt.wantFound, tt.wantRead)
			}
		})
	}
}

func TestAdminTopicPathRefusesWhatIsNotAPersistentTopic(t *testing.T) {
	for _, topic := range []string{"non-persistent://a/b/c", "persistent://a/b", "a/b/c", "persistent:///b/c"} {
		if _, err := adminTopicPath(topic); err == nil {
			t.Errorf("adminTopicPath(%q): no error", topic)
		}
	}
	if p, err := adminTopicPath("persistent://a/b/c d"); err != nil || p != "/admin/v2/persistent/a/b/c%20d" {
		t.Errorf("adminTopicPath: %q, %v", p, err)
	}
}
