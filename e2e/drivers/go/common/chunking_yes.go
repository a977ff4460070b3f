// This variant is linked as chunking.go into the modules of client versions that have chunking
// (pulsar-client-go v0.10.0 and later).

package main

import "github.com/apache/pulsar-client-go/pulsar"

// setChunking turns on chunking with an optional chunk size (0 = the broker's max message size).
func setChunking(o *pulsar.ProducerOptions, enable bool, size int) error {
	o.EnableChunking = enable
	if size > 0 {
		o.ChunkMaxMessageSize = uint(size)
	}
	return nil
}
