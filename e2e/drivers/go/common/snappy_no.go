// This variant is linked as snappy.go into the modules of client versions without the snappy
// codec (pulsar-client-go before v0.17.0).

package main

import (
	"errors"

	"github.com/apache/pulsar-client-go/pulsar"
)

// setSnappy reports that this client version has no snappy codec.
func setSnappy(_ *pulsar.ProducerOptions) error {
	return errors.New("pulsar-client-go before v0.17.0 has no snappy codec")
}
