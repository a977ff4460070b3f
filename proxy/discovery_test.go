package proxy

import "testing"

// The allow-list learns real broker addresses only, and forgets the oldest
// learned one when full; configured addresses never expire.
func TestKnownBrokersLearn(t *testing.T) {
	k := newKnownBrokers([]string{"svc:6650"}, []string{"fixed:6650"})
	k.learn("")
	k.learn("b1:6650")
	if k.allowed("") {
		t.Fatal("an empty address was learned")
	}
	if !k.allowed("b1:6650") || !k.allowed("svc:6650") || !k.allowed("fixed:6650") {
		t.Fatal("a configured or learned address is not allowed")
	}
	for i := 0; i < maxLearnedBrokers; i++ {
		k.learn("other:" + string(rune('a'+i%26)) + string(rune('a'+i/26%26)) + string(rune('a'+i/676)))
	}
	if k.allowed("b1:6650") {
		t.Fatal("the oldest learned address was not forgotten when the set was full")
	}
	if !k.allowed("svc:6650") || !k.allowed("fixed:6650") {
		t.Fatal("a configured address expired")
	}
	if n := k.count(); n != 2+maxLearnedBrokers {
		t.Fatalf("count %d, want %d", n, 2+maxLearnedBrokers)
	}
}
