package pulsarpb

import (
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// TestFieldNumbers pins the numbers and types that the proxy's logic and the
// reference (shared/reference/protocol.md section 2) depend on, so an edit of
// pulsar_api.proto cannot silently renumber or retype them.
func TestFieldNumbers(t *testing.T) {
	tests := []struct {
		message string
		field   protoreflect.Name
		number  protoreflect.FieldNumber
		kind    protoreflect.Kind
		card    protoreflect.Cardinality
	}{
		{"MessageMetadata", "producer_name", 1, protoreflect.StringKind, protoreflect.Required},
		{"MessageMetadata", "sequence_id", 2, protoreflect.Uint64Kind, protoreflect.Required},
		{"MessageMetadata", "publish_time", 3, protoreflect.Uint64Kind, protoreflect.Required},
		{"MessageMetadata", "properties", 4, protoreflect.MessageKind, protoreflect.Repeated},
		{"MessageMetadata", "partition_key", 6, protoreflect.StringKind, protoreflect.Optional},
		{"MessageMetadata", "compression", 8, protoreflect.EnumKind, protoreflect.Optional},
		{"MessageMetadata", "uncompressed_size", 9, protoreflect.Uint32Kind, protoreflect.Optional},
		{"MessageMetadata", "num_messages_in_batch", 11, protoreflect.Int32Kind, protoreflect.Optional},
		{"MessageMetadata", "encryption_keys", 13, protoreflect.MessageKind, protoreflect.Repeated},
		{"MessageMetadata", "schema_version", 16, protoreflect.BytesKind, protoreflect.Optional},
		{"MessageMetadata", "ordering_key", 18, protoreflect.BytesKind, protoreflect.Optional},
		{"MessageMetadata", "deliver_at_time", 19, protoreflect.Int64Kind, protoreflect.Optional},
		{"MessageMetadata", "marker_type", 20, protoreflect.Int32Kind, protoreflect.Optional},
		{"MessageMetadata", "txnid_least_bits", 22, protoreflect.Uint64Kind, protoreflect.Optional},
		{"MessageMetadata", "highest_sequence_id", 24, protoreflect.Uint64Kind, protoreflect.Optional},
		{"MessageMetadata", "uuid", 26, protoreflect.StringKind, protoreflect.Optional},
		{"MessageMetadata", "chunk_id", 29, protoreflect.Int32Kind, protoreflect.Optional},
		{"MessageMetadata", "null_partition_key", 30, protoreflect.BoolKind, protoreflect.Optional},
		{"MessageMetadata", "compacted_batch_indexes", 31, protoreflect.Int32Kind, protoreflect.Repeated},
		{"MessageMetadata", "schema_id", 32, protoreflect.BytesKind, protoreflect.Optional},
		{"MessageMetadata", "entry_hash_min", 33, protoreflect.Uint32Kind, protoreflect.Optional},
		{"MessageMetadata", "entry_hash_max", 34, protoreflect.Uint32Kind, protoreflect.Optional},
		{"SingleMessageMetadata", "payload_size", 3, protoreflect.Int32Kind, protoreflect.Required},
		{"SingleMessageMetadata", "ordering_key", 7, protoreflect.BytesKind, protoreflect.Optional},
		{"SingleMessageMetadata", "sequence_id", 8, protoreflect.Uint64Kind, protoreflect.Optional},
		{"SingleMessageMetadata", "null_partition_key", 10, protoreflect.BoolKind, protoreflect.Optional},
		{"KeySharedMeta", "hash_ranges", 3, protoreflect.MessageKind, protoreflect.Repeated},
		{"KeySharedMeta", "entry_bucket_dispatch", 5, protoreflect.BoolKind, protoreflect.Optional},
		{"BrokerEntryMetadata", "index", 2, protoreflect.Uint64Kind, protoreflect.Optional},
		{"CommandConnect", "original_auth_data", 8, protoreflect.StringKind, protoreflect.Optional},
		{"CommandConnect", "proxy_version", 11, protoreflect.StringKind, protoreflect.Optional},
		{"CommandConnected", "max_message_size", 3, protoreflect.Int32Kind, protoreflect.Optional},
		{"FeatureFlags", "supports_tc_metadata_discovery", 9, protoreflect.BoolKind, protoreflect.Optional},
		{"CommandSend", "highest_sequence_id", 6, protoreflect.Uint64Kind, protoreflect.Optional},
		{"CommandSend", "is_chunk", 7, protoreflect.BoolKind, protoreflect.Optional},
		{"CommandSend", "message_id", 9, protoreflect.MessageKind, protoreflect.Optional},
		{"CommandSendReceipt", "highest_sequence_id", 4, protoreflect.Uint64Kind, protoreflect.Optional},
		{"CommandProducerSuccess", "last_sequence_id", 3, protoreflect.Int64Kind, protoreflect.Optional},
		{"CommandLookupTopicResponse", "proxy_through_service_url", 8, protoreflect.BoolKind, protoreflect.Optional},
		{"CommandSubscribe", "key_shared_meta", 17, protoreflect.MessageKind, protoreflect.Optional},
		{"CommandAck", "message_id", 3, protoreflect.MessageKind, protoreflect.Repeated},
		{"BaseCommand", "type", 1, protoreflect.EnumKind, protoreflect.Required},
		{"BaseCommand", "topic_migrated", 68, protoreflect.MessageKind, protoreflect.Optional},
	}
	for _, tc := range tests {
		d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName("rebatchproxy.pulsar." + tc.message))
		if err != nil {
			t.Fatalf("%s: %v", tc.message, err)
		}
		f := d.(protoreflect.MessageDescriptor).Fields().ByName(tc.field)
		if f == nil {
			t.Errorf("%s.%s missing", tc.message, tc.field)
			continue
		}
		if f.Number() != tc.number || f.Kind() != tc.kind || f.Cardinality() != tc.card {
			t.Errorf("%s.%s = #%d %v %v, want #%d %v %v", tc.message, tc.field, f.Number(), f.Kind(), f.Cardinality(), tc.number, tc.kind, tc.card)
		}
	}
}

// Every BaseCommand.Type value 2..68 (and the 5.0 values 70..81) names the
// sub-command field with the same number, except the scalable-topic ones
// whose bodies this proto leaves to unknown fields.
func TestBaseCommandTypesHaveFields(t *testing.T) {
	md := (&BaseCommand{}).ProtoReflect().Descriptor()
	values := md.Enums().ByName("Type").Values()
	for i := 0; i < values.Len(); i++ {
		v := values.Get(i)
		f := md.Fields().ByNumber(protoreflect.FieldNumber(v.Number()))
		if v.Number() >= 70 {
			if f != nil {
				t.Errorf("type %s: unexpected field", v.Name())
			}
			continue
		}
		if f == nil || f.Kind() != protoreflect.MessageKind {
			t.Errorf("type %s (%d): no sub-command field", v.Name(), v.Number())
		}
	}
	if values.Len() != 39+19+12 {
		t.Errorf("BaseCommand.Type has %d values, want 70 (2..40, 50..68, 70..81)", values.Len())
	}
	// Defaults that change behaviour when a field is absent.
	if (&MessageMetadata{}).GetNumMessagesInBatch() != 1 || (&CommandProducerSuccess{}).GetLastSequenceId() != -1 ||
		(&MessageIdData{}).GetPartition() != -1 || (&CommandSubscribe{}).GetDurable() != true {
		t.Error("proto2 defaults changed")
	}
}
