package chunks_test

import (
	"reflect"
	"testing"

	"github.com/rebatchproxy/rebatchproxy/e2e/drivers"
)

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
