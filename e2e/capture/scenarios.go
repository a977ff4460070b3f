package main

import (
	"strconv"
	"strings"
)

// Scenario is one producer/consumer exchange to capture. Its fields are
// what every driver understands; Args renders them as driver flags.
type Scenario struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	Count       int    `json:"count"`        // messages produced
	Batching    bool   `json:"batching"`     // client-side batching on
	KeyBased    bool   `json:"key_based"`    // key-based batch builder
	Compression string `json:"compression"`  // none|lz4|zlib|zstd|snappy
	Keys        bool   `json:"keys"`         // partition keys (8 distinct)
	OrderingKey bool   `json:"ordering_key"` // the key is also the ordering key
	Properties  bool   `json:"properties"`   // two properties per message
	Chunking    bool   `json:"chunking"`
	ChunkSize   int    `json:"chunk_size,omitempty"` // client chunk size, 0: client default
	Size        int    `json:"size"`                 // payload bytes per message
	// RelayMaxMessageSize lowers CONNECTED.max_message_size seen by the
	// client (see Relay), for clients that chunk only at that size.
	RelayMaxMessageSize int32 `json:"relay_max_message_size,omitempty"`
}

// Args renders the scenario as command-line flags for an external driver
// (the Python driver in python/, or any driver passed with -exec).
func (s Scenario) Args() []string {
	return []string{
		"--scenario", s.Name,
		"--count", strconv.Itoa(s.Count),
		"--batching", strconv.FormatBool(s.Batching),
		"--key-based", strconv.FormatBool(s.KeyBased),
		"--compression", s.Compression,
		"--keys", strconv.FormatBool(s.Keys),
		"--ordering-key", strconv.FormatBool(s.OrderingKey),
		"--properties", strconv.FormatBool(s.Properties),
		"--chunking", strconv.FormatBool(s.Chunking),
		"--chunk-size", strconv.Itoa(s.ChunkSize),
		"--size", strconv.Itoa(s.Size),
	}
}

// scenarios is the capture matrix. Every client runs every scenario it
// supports; see README.md for which ones each client cannot do.
var scenarios = []Scenario{
	{Name: "unbatched", Description: "3 plain messages, batching off", Count: 3, Compression: "none", Size: 16},
	{Name: "unbatched-keyed-props", Description: "5 messages with partition key, ordering key and properties, batching off",
		Count: 5, Compression: "none", Keys: true, OrderingKey: true, Properties: true, Size: 32},
	{Name: "batched", Description: "20 messages in one batch, no compression", Count: 20, Batching: true, Compression: "none", Size: 24},
	{Name: "batched-keyed-props", Description: "20 keyed messages with properties in one batch",
		Count: 20, Batching: true, Compression: "none", Keys: true, OrderingKey: true, Properties: true, Size: 24},
	{Name: "batched-keybased", Description: "20 keyed messages through the key-based batch builder (one batch per key)",
		Count: 20, Batching: true, KeyBased: true, Compression: "none", Keys: true, Size: 24},
	{Name: "batched-lz4", Description: "20 batched messages, LZ4", Count: 20, Batching: true, Compression: "lz4", Keys: true, Properties: true, Size: 64},
	{Name: "batched-zlib", Description: "20 batched messages, ZLIB", Count: 20, Batching: true, Compression: "zlib", Keys: true, Properties: true, Size: 64},
	{Name: "batched-zstd", Description: "20 batched messages, ZSTD", Count: 20, Batching: true, Compression: "zstd", Keys: true, Properties: true, Size: 64},
	{Name: "batched-snappy", Description: "20 batched messages, SNAPPY", Count: 20, Batching: true, Compression: "snappy", Keys: true, Properties: true, Size: 64},
	{Name: "unbatched-lz4", Description: "3 unbatched messages, LZ4", Count: 3, Compression: "lz4", Size: 200},
	{Name: "chunked", Description: "one 10,000-byte message split into chunks of at most 2,048 bytes",
		Count: 1, Chunking: true, ChunkSize: 2048, Compression: "none", Size: 10000, RelayMaxMessageSize: 4096},
}

func findScenarios(spec string) []Scenario {
	if spec == "all" {
		return scenarios
	}
	var out []Scenario
	for _, name := range strings.Split(spec, ",") {
		for _, s := range scenarios {
			if s.Name == name {
				out = append(out, s)
			}
		}
	}
	return out
}
