// This variant is linked as snappy.go into the modules of client versions with the snappy
// codec (pulsar-client-go v0.17.0 and later).

package main

import "github.com/apache/pulsar-client-go/pulsar"

// setSnappy makes the producer compress with snappy.
func setSnappy(opts *pulsar.ProducerOptions) error {
	opts.CompressionType = pulsar.SNAPPY
	return nil
}
