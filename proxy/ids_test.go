package proxy

import "testing"

// Given one connection's allocator,
// when the rebatching path and the session both take ids from it,
// then every id is distinct and above every id a client counts up to.
func TestOneAllocatorForTheProxysOwnIDs(t *testing.T) {
	var a idAllocator
	path := RebatchPaths(nil, nil, nil, nil)(ConnInfo{ID: 1, NewID: a.next}).(*rebatchPath)
	seen := map[uint64]bool{}
	for i := 0; i < 1000; i++ {
		for _, id := range []uint64{path.newID(), a.next()} {
			if seen[id] || !isOwnID(id) || isOwnID(id-ownIDBase) {
				t.Fatalf("id %d: seen before %v, own %v", id, seen[id], isOwnID(id))
			}
			seen[id] = true
		}
	}
}
