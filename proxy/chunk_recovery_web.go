package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rebatchproxy/rebatchproxy/chunkdedup"
)

// AdminStoredReader is the StoredReader of cmd/proxy: it reads a topic's newest entries one
// by one through the brokers' admin REST API (GET .../examinemessage?initialPosition=latest
// &messagePosition=N, N = 1, 2, ...; a broker that does not own the topic redirects to the
// one that does), and keeps the producer's chunks from the metadata the broker returns in
// X-Pulsar-* headers and the payload in the body. It needs a role allowed to peek at the
// topic's messages (Token, when the brokers require authentication).
//
// It stops at the first entry of the producer with a sequence id below fromSeq (what the
// producer sent before the resumed message), at the topic's first entry, after MaxEntries
// entries, or when ctx ends. Any goroutine may call ReadStored.
type AdminStoredReader struct {
	// WebURLs are the brokers' web service URLs; requests go to them round robin, the next
	// one when one cannot be reached.
	WebURLs []string
	// Token, if set, is sent as "Authorization: Bearer".
	Token string
	// MaxEntries bounds the entries read per look.
	MaxEntries int
	// MaxPayload bounds a body read (the brokers' max message size plus headroom).
	MaxPayload int64
	// Client makes the requests; nil means a client with TLS settings TLS.
	Client *http.Client
	TLS    *tls.Config

	rr   atomic.Uint32
	once sync.Once
	own  *http.Client // the client made for a nil Client, once (its connections are reused)
}

// errTopicStart means the read went past the topic's first entry: the broker answers a
// position beyond the entries it has with an error status.
var errTopicStart = errors.New("before the topic's first entry")

// ReadStored implements StoredReader.
func (a *AdminStoredReader) ReadStored(ctx context.Context, topic, producer string, fromSeq uint64) ([]chunkdedup.Stored, int, error) {
	path, err := adminTopicPath(topic)
	if err != nil {
		return nil, 0, err
	}
	client := a.Client
	if client == nil {
		a.once.Do(func() {
			tr := http.DefaultTransport.(*http.Transport).Clone()
			tr.TLSClientConfig = a.TLS
			a.own = &http.Client{Transport: tr, CheckRedirect: func(req *http.Request, via []*http.Request) error {
				if len(via) >= 10 {
					return errors.New("stopped after 10 redirects")
				}
				keepAuthorization(req, via) // to the broker that owns the topic, under another host name
				return nil
			}}
		})
		client = a.own
	}
	var found []chunkdedup.Stored
	read := 0
	for n := 1; n <= a.MaxEntries; n++ {
		e, err := a.entry(ctx, client, path, n)
		if errors.Is(err, errTopicStart) {
			return reverse(found), read, nil
		}
		if err != nil {
			return reverse(found), read, fmt.Errorf("entry %d from the newest: %w", n, err)
		}
		read++
		if e.producer != producer {
			continue
		}
		if e.seq < fromSeq {
			return reverse(found), read, nil
		}
		if e.numChunks >= 2 {
			found = append(found, chunkdedup.Stored{SequenceID: e.seq, ChunkID: e.chunkID, NumChunks: e.numChunks,
				Fingerprint: e.fingerprint, Ledger: e.ledger, Entry: e.entry})
		}
	}
	return reverse(found), read, fmt.Errorf("read %d entries without reaching the producer's earlier sends", read)
}

func reverse(s []chunkdedup.Stored) []chunkdedup.Stored {
	for i, j := 0, len(s)-1; i < j; i, j = i+1, j-1 {
		s[i], s[j] = s[j], s[i]
	}
	return s
}

// adminTopicPath turns persistent://tenant/ns/name into the admin API's topic path.
func adminTopicPath(topic string) (string, error) {
	rest, ok := strings.CutPrefix(topic, "persistent://")
	parts := strings.SplitN(rest, "/", 3)
	if !ok || len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", fmt.Errorf("topic %q is not persistent://tenant/namespace/name", topic)
	}
	return "/admin/v2/persistent/" + url.PathEscape(parts[0]) + "/" + url.PathEscape(parts[1]) + "/" + url.PathEscape(parts[2]), nil
}

// storedEntry is what one examinemessage answer says of an entry.
type storedEntry struct {
	producer           string
	seq                uint64
	chunkID, numChunks int
	ledger, entry      uint64
	fingerprint        uint64
}

// entry reads the n-th newest entry, trying each broker in turn when one cannot be reached.
func (a *AdminStoredReader) entry(ctx context.Context, client *http.Client, path string, n int) (storedEntry, error) {
	start := a.rr.Add(1)
	var lastErr error
	for i := range a.WebURLs {
		base := strings.TrimRight(a.WebURLs[(int(start)+i)%len(a.WebURLs)], "/")
		u := base + path + "/examinemessage?initialPosition=latest&messagePosition=" + strconv.Itoa(n)
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
		if err != nil {
			return storedEntry{}, err
		}
		if a.Token != "" {
			req.Header.Set("Authorization", "Bearer "+a.Token)
		}
		resp, err := client.Do(req)
		if err != nil {
			if ctx.Err() != nil {
				return storedEntry{}, ctx.Err()
			}
			lastErr = err
			continue
		}
		e, err := a.decode(resp)
		resp.Body.Close()
		return e, err
	}
	return storedEntry{}, lastErr
}

func (a *AdminStoredReader) decode(resp *http.Response) (storedEntry, error) {
	switch {
	case resp.StatusCode == http.StatusInternalServerError || resp.StatusCode == http.StatusNotFound ||
		resp.StatusCode == http.StatusPreconditionFailed:
		// Pulsar 4.0 answers a position before the first entry with 500 ("Incorrect
		// parameter input"); an empty or absent topic with 404 or 412.
		return storedEntry{}, fmt.Errorf("%w: HTTP %d", errTopicStart, resp.StatusCode)
	case resp.StatusCode != http.StatusOK:
		return storedEntry{}, fmt.Errorf("HTTP %d", resp.StatusCode)
	}
	h := resp.Header
	var e storedEntry
	e.producer = h.Get("X-Pulsar-producer-name")
	seq, err := strconv.ParseUint(h.Get("X-Pulsar-sequence-id"), 10, 64)
	if err != nil {
		return e, fmt.Errorf("X-Pulsar-sequence-id: %v", err)
	}
	e.seq = seq
	if _, err := fmt.Sscanf(h.Get("X-Pulsar-Message-ID"), "%d:%d", &e.ledger, &e.entry); err != nil {
		return e, fmt.Errorf("X-Pulsar-Message-ID %q: %v", h.Get("X-Pulsar-Message-ID"), err)
	}
	if v := h.Get("X-Pulsar-num-chunks-from-msg"); v != "" {
		if e.numChunks, err = strconv.Atoi(v); err != nil {
			return e, fmt.Errorf("X-Pulsar-num-chunks-from-msg: %v", err)
		}
		if e.chunkID, err = strconv.Atoi(h.Get("X-Pulsar-chunk-id")); err != nil {
			return e, fmt.Errorf("X-Pulsar-chunk-id: %v", err)
		}
	}
	if e.numChunks < 2 {
		return e, nil // not a chunk: the payload is not needed
	}
	pt, err := time.Parse(time.RFC3339Nano, h.Get("X-Pulsar-publish-time"))
	if err != nil {
		return e, fmt.Errorf("X-Pulsar-publish-time: %v", err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, a.MaxPayload+1))
	if err != nil {
		return e, err
	}
	if int64(len(body)) > a.MaxPayload {
		return e, fmt.Errorf("payload over %d bytes", a.MaxPayload)
	}
	e.fingerprint = ChunkFingerprint(body, uint64(pt.UnixMilli()), h.Get("X-Pulsar-uuid"))
	return e, nil
}
