package proxy

import (
	"time"

	"github.com/rebatchproxy/rebatchproxy/wire"
)

// forwardPath is a ProducerPath that forwards every frame unchanged: the base the tests' own
// producer paths embed.
type forwardPath struct{}

func (forwardPath) FromClient(wire.Frame, Outputs) (Verdict, error) { return Forward, nil }
func (forwardPath) FromBroker(wire.Frame, Outputs) (Verdict, error) { return Forward, nil }
func (forwardPath) ForwardHead(wire.Head) bool                      { return true }
func (forwardPath) Tick(time.Time, Outputs) error                   { return nil }
func (forwardPath) NextDeadline() time.Time                         { return time.Time{} }
func (forwardPath) Close()                                          {}
