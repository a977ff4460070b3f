package harness

import (
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
)

// StoredEntry is one entry of a topic's managed ledger, as the broker's admin REST API returns
// it: the outer MessageMetadata fields the broker turns into X-Pulsar-* headers, and the entry's
// payload (decompressed by the broker). Fields the REST API does not expose (for example
// entry_hash_min/max) are not here; a raw protocol reader is needed for those.
type StoredEntry struct {
	Ledger, Entry int64

	ProducerName      string
	SequenceID        int64
	HighestSequenceID int64 // 0 when the header is absent
	PublishTime       string
	EventTime         string

	// Batched is true when the outer metadata has num_messages_in_batch (the batch format).
	Batched     bool
	NumMessages int // num_messages_in_batch; 1 for an entry that is not batched
	BatchSize   int // X-Pulsar-batch-size, when present

	PartitionKey string
	OrderingKey  []byte
	Properties   map[string]string // outer properties

	Compression      string // empty when NONE
	UncompressedSize int
	Encrypted        bool

	ChunkID           int // -1 when the entry is not a chunk
	NumChunksFromMsg  int
	TotalChunkMsgSize int
	UUID              string

	// Payload is the body the broker returned: the uncompressed entry payload.
	Payload []byte
	// Messages are the records of a batched payload, in order; for an entry that is not
	// batched it holds one message built from the outer fields.
	Messages []StoredMessage

	Header http.Header
}

// StoredMessage is one message inside a stored entry.
type StoredMessage struct {
	Properties   map[string]string
	PartitionKey string
	HasKey       bool
	OrderingKey  []byte
	EventTime    uint64
	SequenceID   uint64
	HasSequence  bool // SingleMessageMetadata.sequence_id was set
	NullValue    bool
	Payload      []byte
}

// ErrMalformedBatch is returned when a stored batch payload does not parse.
var ErrMalformedBatch = errors.New("harness: malformed batch payload")

type internalStats struct {
	Ledgers []struct {
		LedgerID int64 `json:"ledgerId"`
		Entries  int64 `json:"entries"`
	} `json:"ledgers"`
	LastConfirmedEntry string `json:"lastConfirmedEntry"`
	NumberOfEntries    int64  `json:"numberOfEntries"`
}

// errEntriesInconsistent: the topic's ledger list does not account for its entry count.
var errEntriesInconsistent = errors.New("harness: internalStats ledgers do not add up to numberOfEntries")

// internalStats reads a non-partitioned topic's (or one partition's) internal stats.
func (b *Broker) internalStats(ctx context.Context, topic string) (internalStats, error) {
	var st internalStats
	data, err := b.get(ctx, topicPath(topic)+"/internalStats")
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return st, fmt.Errorf("internalStats of %s: %w", topic, err)
	}
	return st, nil
}

// EntryCount is the number of entries a non-partitioned topic (or one partition) holds, its
// numberOfEntries: what the broker stored, markers included.
func (b *Broker) EntryCount(ctx context.Context, topic string) (int64, error) {
	st, err := b.internalStats(ctx, topic)
	return st.NumberOfEntries, err
}

// StoredEntries reads every entry of a non-partitioned topic (or one partition,
// "…-partition-N"), oldest first. The ledger list is trusted only once its entry counts add up
// to the topic's numberOfEntries: right after a topic unload or a broker restart the ledger the
// unload closed can be listed before its count is, and reading it as empty would report stored
// messages as missing. It waits up to 15 s for the two to agree, then fails naming both.
func (b *Broker) StoredEntries(ctx context.Context, topic string) ([]StoredEntry, error) {
	type span struct{ ledger, last int64 }
	var spans []span
	for attempt := 0; ; attempt++ {
		st, err := b.internalStats(ctx, topic)
		if err != nil {
			return nil, err
		}
		lacLedger, lacEntry := int64(-1), int64(-1)
		if l, e, ok := strings.Cut(st.LastConfirmedEntry, ":"); ok {
			lacLedger, _ = strconv.ParseInt(l, 10, 64)
			lacEntry, _ = strconv.ParseInt(e, 10, 64)
		}
		spans = spans[:0]
		total := int64(0)
		for _, l := range st.Ledgers {
			last := l.Entries - 1
			if l.LedgerID == lacLedger {
				// The open ledger reports 0 entries; the last confirmed entry bounds it.
				last = lacEntry
			}
			spans = append(spans, span{l.LedgerID, last})
			total += last + 1
		}
		if total == st.NumberOfEntries {
			break
		}
		if attempt == 30 {
			return nil, fmt.Errorf("%w: %s lists %d entries in its ledgers, numberOfEntries %d", errEntriesInconsistent, topic, total, st.NumberOfEntries)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	var out []StoredEntry
	for _, sp := range spans {
		for e := int64(0); e <= sp.last; e++ {
			se, err := b.StoredEntry(ctx, topic, sp.ledger, e)
			if err != nil {
				return nil, err
			}
			out = append(out, se)
		}
	}
	return out, nil
}

// StoredEntry reads one entry by ledger and entry id.
func (b *Broker) StoredEntry(ctx context.Context, topic string, ledger, entry int64) (StoredEntry, error) {
	path := fmt.Sprintf("%s/ledger/%d/entry/%d", topicPath(topic), ledger, entry)
	body, h, err := b.do(ctx, http.MethodGet, path, nil, "")
	if err != nil {
		return StoredEntry{}, err
	}
	se, err := parseStoredEntry(ledger, entry, h, body)
	if err != nil {
		return StoredEntry{}, fmt.Errorf("%s %d:%d: %w", topic, ledger, entry, err)
	}
	return se, nil
}

func parseStoredEntry(ledger, entry int64, h http.Header, body []byte) (StoredEntry, error) {
	num := func(name string) int64 {
		v, _ := strconv.ParseInt(h.Get(name), 10, 64)
		return v
	}
	se := StoredEntry{
		Ledger: ledger, Entry: entry,
		ProducerName:      h.Get("X-Pulsar-producer-name"),
		SequenceID:        num("X-Pulsar-sequence-id"),
		HighestSequenceID: num("X-Pulsar-highest-sequence-id"),
		PublishTime:       h.Get("X-Pulsar-publish-time"),
		EventTime:         h.Get("X-Pulsar-event-time"),
		BatchSize:         int(num("X-Pulsar-batch-size")),
		PartitionKey:      h.Get("X-Pulsar-partition-key"),
		Compression:       h.Get("X-Pulsar-compression"),
		UncompressedSize:  int(num("X-Pulsar-uncompressed-size")),
		Encrypted:         h.Get("X-Pulsar-Is-Encrypted") == "true",
		ChunkID:           -1,
		UUID:              h.Get("X-Pulsar-uuid"),
		Payload:           body,
		Properties:        parsePropertyHeaders(h),
		Header:            h,
	}
	if v := h.Get("X-Pulsar-Base64-ordering-key"); v != "" {
		se.OrderingKey, _ = base64.StdEncoding.DecodeString(v)
	}
	if h.Get("X-Pulsar-chunk-id") != "" {
		se.ChunkID = int(num("X-Pulsar-chunk-id"))
		se.NumChunksFromMsg = int(num("X-Pulsar-num-chunks-from-msg"))
		se.TotalChunkMsgSize = int(num("X-Pulsar-total-chunk-msg-size"))
	}
	if h.Get("X-Pulsar-num-batch-message") != "" {
		se.Batched = true
		se.NumMessages = int(num("X-Pulsar-num-batch-message"))
		msgs, err := SplitBatch(body)
		if err != nil {
			return se, err
		}
		if len(msgs) != se.NumMessages {
			return se, fmt.Errorf("%w: num_messages_in_batch=%d but %d records", ErrMalformedBatch, se.NumMessages, len(msgs))
		}
		se.Messages = msgs
		return se, nil
	}
	se.NumMessages = 1
	se.Messages = []StoredMessage{{
		Properties:   se.Properties,
		PartitionKey: se.PartitionKey,
		HasKey:       h.Get("X-Pulsar-partition-key") != "",
		OrderingKey:  se.OrderingKey,
		SequenceID:   uint64(se.SequenceID),
		HasSequence:  true,
		Payload:      body,
	}}
	return se, nil
}

// parsePropertyHeaders reads outer properties in both spellings the broker has used: one
// X-Pulsar-PROPERTY header holding a JSON object (Pulsar 3.1 and later, PIP-279) and one
// X-Pulsar-PROPERTY-<key> header per property (older brokers).
func parsePropertyHeaders(h http.Header) map[string]string {
	props := map[string]string{}
	for name, values := range h {
		canon := http.CanonicalHeaderKey("X-Pulsar-PROPERTY")
		switch {
		case name == canon:
			for _, v := range values {
				var m map[string]string
				if json.Unmarshal([]byte(v), &m) == nil {
					for k, val := range m {
						props[k] = val
					}
				}
			}
		case strings.HasPrefix(name, canon+"-") && len(values) > 0:
			props[name[len(canon)+1:]] = values[0]
		}
	}
	return props
}

// SplitBatch parses an uncompressed batch payload: records of
// [4-byte big-endian size][SingleMessageMetadata][payload of payload_size bytes].
func SplitBatch(buf []byte) ([]StoredMessage, error) {
	var out []StoredMessage
	for len(buf) > 0 {
		if len(buf) < 4 {
			return nil, fmt.Errorf("%w: %d trailing bytes", ErrMalformedBatch, len(buf))
		}
		n := int(binary.BigEndian.Uint32(buf))
		buf = buf[4:]
		if n > len(buf) {
			return nil, fmt.Errorf("%w: metadata size %d exceeds %d remaining", ErrMalformedBatch, n, len(buf))
		}
		m, size, err := parseSingleMessageMetadata(buf[:n])
		if err != nil {
			return nil, err
		}
		buf = buf[n:]
		if size < 0 || size > len(buf) {
			return nil, fmt.Errorf("%w: payload size %d exceeds %d remaining", ErrMalformedBatch, size, len(buf))
		}
		m.Payload = buf[:size]
		buf = buf[size:]
		out = append(out, m)
	}
	return out, nil
}

// parseSingleMessageMetadata decodes the SingleMessageMetadata fields tests assert on:
// properties=1, partition_key=2, payload_size=3, event_time=5, ordering_key=7, sequence_id=8,
// null_value=9.
func parseSingleMessageMetadata(b []byte) (StoredMessage, int, error) {
	m := StoredMessage{Properties: map[string]string{}}
	size := -1
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return m, 0, fmt.Errorf("%w: bad tag", ErrMalformedBatch)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			kv, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return m, 0, fmt.Errorf("%w: bad property", ErrMalformedBatch)
			}
			k, v, err := parseKeyValue(kv)
			if err != nil {
				return m, 0, err
			}
			m.Properties[k] = v
			b = b[n:]
		case (num == 2 || num == 7) && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return m, 0, fmt.Errorf("%w: bad key", ErrMalformedBatch)
			}
			if num == 2 {
				m.PartitionKey, m.HasKey = string(v), true
			} else {
				m.OrderingKey = append([]byte(nil), v...)
			}
			b = b[n:]
		case (num == 3 || num == 5 || num == 8 || num == 9) && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return m, 0, fmt.Errorf("%w: bad varint", ErrMalformedBatch)
			}
			switch num {
			case 3:
				size = int(int32(v))
			case 5:
				m.EventTime = v
			case 8:
				m.SequenceID, m.HasSequence = v, true
			case 9:
				m.NullValue = v != 0
			}
			b = b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return m, 0, fmt.Errorf("%w: bad field %d", ErrMalformedBatch, num)
			}
			b = b[n:]
		}
	}
	if size < 0 {
		return m, 0, fmt.Errorf("%w: payload_size missing", ErrMalformedBatch)
	}
	return m, size, nil
}

func parseKeyValue(b []byte) (string, string, error) {
	var k, v string
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", "", fmt.Errorf("%w: bad KeyValue", ErrMalformedBatch)
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return "", "", fmt.Errorf("%w: bad KeyValue", ErrMalformedBatch)
			}
			b = b[n:]
			continue
		}
		s, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return "", "", fmt.Errorf("%w: bad KeyValue", ErrMalformedBatch)
		}
		switch num {
		case 1:
			k = string(s)
		case 2:
			v = string(s)
		}
		b = b[n:]
	}
	return k, v, nil
}
