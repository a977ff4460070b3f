package chunkdedup

import "time"

// Config bounds the tracker. Zero fields take the defaults below.
//
// Memory is bounded by, roughly:
//
//	MaxProducers     * (250 B + len(topic) + len(producer name))
//	MaxTrackedChunks * 40 B           (one slot per chunk of a remembered message)
//	MaxWaiters       * 100 B          (waiting duplicates)
//	in-flight chunks * 100 B          (bounded by the proxy's own pending-send limits)
//
// With the defaults that is about 2.5 MiB + names, 2.5 MiB and 0.4 MiB.
type Config struct {
	// MaxProducers bounds the (topic, producer name) keys. Default 10000.
	MaxProducers int
	// MaxMessagesPerProducer bounds the chunked messages remembered per key:
	// a client resends every message still pending after a reconnect, so
	// more than the newest one can be needed. Default 16.
	MaxMessagesPerProducer int
	// MaxChunksPerMessage: messages with more chunks are not tracked.
	// Default 1024.
	MaxChunksPerMessage int
	// MaxTrackedChunks bounds chunk slots over all keys. Default 65536.
	MaxTrackedChunks int
	// MaxWaiters bounds duplicates waiting for an in-flight original.
	// Default 4096.
	MaxWaiters int
	// TTL drops a key idle this long (unless a chunk of it is in flight or
	// waited for). Default 10 minutes: well above the clients' reconnect
	// backoff (Go and Java cap it at 60 s) and send timeout (30 s default).
	TTL time.Duration
	// Now is the clock. Default time.Now.
	Now func() time.Time
}

func (c Config) withDefaults() Config {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&c.MaxProducers, 10000)
	def(&c.MaxMessagesPerProducer, 16)
	def(&c.MaxChunksPerMessage, 1024)
	def(&c.MaxTrackedChunks, 65536)
	def(&c.MaxWaiters, 4096)
	if c.TTL <= 0 {
		c.TTL = 10 * time.Minute
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}
