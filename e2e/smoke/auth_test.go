package smoke

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"

	"github.com/rebatchproxy/rebatchproxy/e2e/harness"
)

// Given a private broker started with token authentication,
// when a client produces with a token signed by the broker's key and another with a token
// signed by a different key,
// then the first is accepted and the second is refused by the broker.
func TestTokenAuthBrokerAcceptsGoodTokenRefusesBadOne(t *testing.T) {
	b, err := harness.StartBroker(harness.Options{TokenAuth: true})
	if err != nil {
		t.Fatalf("starting a token-auth broker: %v", err)
	}
	defer b.Stop()
	good, err := b.Token("alice")
	if err != nil {
		t.Fatal(err)
	}
	bad := harness.SignToken([]byte("not-the-broker-key-not-the-broker-key"), "alice")
	topic := fmt.Sprintf("persistent://public/default/auth-%d", time.Now().UnixNano())

	produce := func(token string) error {
		c, err := pulsar.NewClient(pulsar.ClientOptions{
			URL: b.ServiceURL, Authentication: pulsar.NewAuthenticationToken(token),
			OperationTimeout: 5 * time.Second, Logger: quietLogger(),
		})
		if err != nil {
			return err
		}
		defer c.Close()
		p, err := c.CreateProducer(pulsar.ProducerOptions{Topic: topic})
		if err != nil {
			return err
		}
		defer p.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_, err = p.Send(ctx, &pulsar.ProducerMessage{Payload: []byte("x")})
		return err
	}

	if err := produce(good); err != nil {
		t.Fatalf("good token refused: %v", err)
	}
	// The Go client retries a refused CONNECT until its operation timeout, so its error only
	// says the connection failed; the broker's verdict is checked on the admin API as well.
	if err := produce(bad); err == nil {
		t.Fatal("bad token accepted by the binary protocol")
	}
	req, _ := http.NewRequest(http.MethodGet, b.AdminURL+"/admin/v2/namespaces/public", nil)
	req.Header.Set("Authorization", "Bearer "+bad)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Fatalf("admin API answered a bad token with HTTP %d, want 401", resp.StatusCode)
	}
}
