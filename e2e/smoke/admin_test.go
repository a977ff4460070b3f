package smoke

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// Given a real broker,
// when the harness creates a namespace, a partitioned topic and a plain topic, switches
// de-duplication on for both, and unloads the plain topic,
// then the broker reports exactly that state.
func TestHarnessAdminHelpersChangeBrokerState(t *testing.T) {
	b := harness.Default(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := fmt.Sprintf("public/smoke-admin-%d", time.Now().UnixNano())
	partitioned, plain := "persistent://"+ns+"/parted", "persistent://"+ns+"/plain"

	if err := b.CreateNamespace(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := b.SetNamespaceDeduplication(ctx, ns, true); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateTopic(ctx, partitioned, 3); err != nil {
		t.Fatal(err)
	}
	if err := b.CreateTopic(ctx, plain, 0); err != nil {
		t.Fatal(err)
	}
	if err := b.SetTopicDeduplication(ctx, plain, true); err != nil {
		t.Fatal(err)
	}
	if err := b.UnloadTopic(ctx, plain); err != nil {
		t.Fatal(err)
	}

	if on, err := b.NamespaceDeduplication(ctx, ns); err != nil || !on {
		t.Fatalf("namespace dedup = %v, %v; want true", on, err)
	}
	if n, err := b.PartitionCount(ctx, partitioned); err != nil || n != 3 {
		t.Fatalf("partitions = %d, %v; want 3", n, err)
	}
	if n, err := b.PartitionCount(ctx, plain); err != nil || n != 0 {
		t.Fatalf("plain topic partitions = %d, %v; want 0", n, err)
	}
	// Topic policies are written through a system topic, so they become visible shortly after.
	deadline := time.Now().Add(20 * time.Second)
	for {
		on, err := b.TopicDeduplication(ctx, plain)
		if err == nil && on {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("topic dedup = %v, %v; want true", on, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}
