// Package pulsarpb holds the Go types generated from pulsar_api.proto, this
// project's own definition of the Pulsar binary protocol messages (proto2).
// Its protobuf package is rebatchproxy.pulsar rather than upstream's
// pulsar.proto so that it can be linked beside pulsar-client-go, whose
// generated code registers the upstream names; the wire format is the same.
//
// The generated code is committed. To change a message, edit
// pulsar_api.proto and run
//
//	go generate ./wire/...
//
// which downloads a pinned protoc into wire/.cache/ and builds protoc-gen-go
// at the version go.mod pins (see gen.sh).
//
// Decoding: proto2 required fields are enforced by the Go runtime unless
// AllowPartial is set. The proxy must not reject what a broker would accept,
// so decode through package wire (which sets AllowPartial) rather than
// proto.Unmarshal directly. Fields this file does not know are kept as
// unknown fields and written back on Marshal.
//
// The types are ordinary protobuf messages: not safe for concurrent mutation.
package pulsarpb

//go:generate bash gen.sh
