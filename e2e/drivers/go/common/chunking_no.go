// This variant is linked as chunking.go into the modules of client versions without chunking
// (pulsar-client-go before v0.10.0).

package main

import (
	"errors"

	"github.com/apache/pulsar-client-go/pulsar"
)

// setChunking reports that this client version cannot chunk.
func setChunking(_ *pulsar.ProducerOptions, _ bool, _ int) error {
	return errors.New("pulsar-client-go before v0.10.0 has no producer chunking")
}
