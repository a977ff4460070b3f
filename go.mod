module github.com/rebatchproxy/rebatchproxy

go 1.26

require (
	github.com/apache/pulsar-client-go v0.21.0 // indirect
	github.com/klauspost/compress v1.20.4 // indirect
	github.com/pierrec/lz4/v4 v4.1.33 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)
