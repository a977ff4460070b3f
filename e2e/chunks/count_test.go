package chunks_test

import (
	"reflect"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

func chunk(uuid string, id, of int) harness.StoredEntry {
	return harness.StoredEntry{UUID: uuid, ChunkID: id, NumChunksFromMsg: of}
}

func TestCountChunks_CountsRepeatedUUIDAndChunkIDPairs(t *testing.T) {
	// Given a topic holding a resent message (0 1 0 1 2), a clean one, an incomplete one and a
	// plain entry
	entries := []harness.StoredEntry{
		chunk("p-0", 0, 3), chunk("p-0", 1, 3), chunk("p-0", 0, 3), chunk("p-0", 1, 3), chunk("p-0", 2, 3),
		chunk("p-1", 0, 2), chunk("p-1", 1, 2),
		chunk("p-2", 0, 2),
		{ChunkID: -1},
	}

	// When the chunks are counted
	got := countChunks(entries)

	// Then the two resent chunks are the duplicates, and the rest is classified
	want := chunkCount{Entries: 9, Messages: 3, Stored: 8, Duplicates: 2, Incomplete: 1, NotChunks: 1,
		DuplicatedUUIDs: map[string][]int{"p-0": {0, 1, 0, 1, 2}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestCountDelivery_FindsMissingRepeatedAndWrongMessages(t *testing.T) {
	// Given a consumer that got message 1 twice, message 2 truncated, and never message 0
	res := &drivers.ConsumeResult{Messages: []drivers.Received{
		{I: 1, PayloadLen: messageSize}, {I: 1, PayloadLen: messageSize}, {I: 2, PayloadLen: 10}, {I: 3, PayloadLen: messageSize},
	}}

	// When its deliveries of 4 sent messages are counted
	got := countDelivery(res, 4)

	// Then each kind of failure is counted once
	want := delivery{Received: 4, Distinct: 2, Missing: []int{0, 2}, Repeated: 1, Wrong: 1}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}
