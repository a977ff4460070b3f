package harness

import (
	"reflect"
	"testing"
)

func chunk(uuid string, id, of int) StoredEntry {
	return StoredEntry{UUID: uuid, ChunkID: id, NumChunksFromMsg: of}
}

func TestCountChunks_CountsRepeatedUUIDAndChunkIDPairs(t *testing.T) {
	// Given a topic holding a resent message (0 1 0 1 2), a clean one, an incomplete one and a
	// plain entry
	entries := []StoredEntry{
		chunk("p-0", 0, 3), chunk("p-0", 1, 3), chunk("p-0", 0, 3), chunk("p-0", 1, 3), chunk("p-0", 2, 3),
		chunk("p-1", 0, 2), chunk("p-1", 1, 2),
		chunk("p-2", 0, 2),
		{ChunkID: -1},
	}

	// When the chunks are counted
	got := CountChunks(entries)

	// Then the two resent chunks are the duplicates, and the rest is classified
	want := ChunkCount{Entries: 9, Messages: 3, Stored: 8, Duplicates: 2, Incomplete: 1, NotChunks: 1,
		DuplicatedUUIDs: map[string][]int{"p-0": {0, 1, 0, 1, 2}}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}
