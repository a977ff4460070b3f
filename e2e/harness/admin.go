package harness

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// ErrNotFound is returned by admin calls the broker answered with 404.
var ErrNotFound = errors.New("harness: not found")

func newHTTPClient() *http.Client { return &http.Client{Timeout: 30 * time.Second} }

// do sends one admin request and returns the body of a 2xx answer.
func (b *Broker) do(ctx context.Context, method, path string, body io.Reader, contentType string) ([]byte, http.Header, error) {
	req, err := http.NewRequestWithContext(ctx, method, b.AdminURL+path, body)
	if err != nil {
		return nil, nil, err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if b.AdminToken != "" {
		req.Header.Set("Authorization", "Bearer "+b.AdminToken)
	}
	resp, err := b.http.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode == http.StatusNotFound {
		return nil, resp.Header, fmt.Errorf("%s %s: %w: %s", method, path, ErrNotFound, strings.TrimSpace(string(data)))
	}
	if resp.StatusCode/100 != 2 {
		return nil, resp.Header, fmt.Errorf("%s %s: HTTP %d: %s", method, path, resp.StatusCode, strings.TrimSpace(string(data)))
	}
	return data, resp.Header, nil
}

func (b *Broker) get(ctx context.Context, path string) ([]byte, error) {
	data, _, err := b.do(ctx, http.MethodGet, path, nil, "")
	return data, err
}

func (b *Broker) sendJSON(ctx context.Context, method, path string, v any) error {
	var body io.Reader
	if v != nil {
		enc, err := json.Marshal(v)
		if err != nil {
			return err
		}
		body = strings.NewReader(string(enc))
	}
	_, _, err := b.do(ctx, method, path, body, "application/json")
	return err
}

// WaitReady waits until the broker's health check answers ok and namespace public/default exists.
func (b *Broker) WaitReady(ctx context.Context) error {
	var last error
	for {
		h, err := b.get(ctx, "/admin/v2/brokers/health")
		if err == nil && strings.TrimSpace(string(h)) == "ok" {
			ns, err2 := b.get(ctx, "/admin/v2/namespaces/public")
			if err2 == nil && strings.Contains(string(ns), `"public/default"`) {
				return nil
			}
			err = err2
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last error: %v)", ctx.Err(), last)
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// topicPath turns "persistent://tenant/ns/topic" or "tenant/ns/topic" into the REST path prefix
// "/admin/v2/persistent/tenant/ns/topic".
func topicPath(topic string) string {
	domain := "persistent"
	if d, rest, ok := strings.Cut(topic, "://"); ok {
		domain, topic = d, rest
	}
	return "/admin/v2/" + domain + "/" + topic
}

// CreateNamespace creates tenant/namespace (the tenant must exist; "public" always does).
func (b *Broker) CreateNamespace(ctx context.Context, namespace string) error {
	return b.sendJSON(ctx, http.MethodPut, "/admin/v2/namespaces/"+namespace, nil)
}

// CreateTopic creates a topic: partitioned with that many partitions, or non-partitioned when
// partitions is 0.
func (b *Broker) CreateTopic(ctx context.Context, topic string, partitions int) error {
	if partitions > 0 {
		return b.sendJSON(ctx, http.MethodPut, topicPath(topic)+"/partitions", partitions)
	}
	return b.sendJSON(ctx, http.MethodPut, topicPath(topic), nil)
}

// GrantNamespacePermission lets role do actions ("produce", "consume", ...) on a namespace's
// topics (a broker with authorization on).
func (b *Broker) GrantNamespacePermission(ctx context.Context, namespace, role string, actions ...string) error {
	return b.sendJSON(ctx, http.MethodPost, "/admin/v2/namespaces/"+namespace+"/permissions/"+role, actions)
}

// SetNamespaceDeduplication switches broker de-duplication for every topic of a namespace.
func (b *Broker) SetNamespaceDeduplication(ctx context.Context, namespace string, on bool) error {
	return b.sendJSON(ctx, http.MethodPost, "/admin/v2/namespaces/"+namespace+"/deduplication", on)
}

// SetTopicDeduplication switches broker de-duplication for one topic (a topic-level policy).
func (b *Broker) SetTopicDeduplication(ctx context.Context, topic string, on bool) error {
	return b.sendJSON(ctx, http.MethodPost, topicPath(topic)+"/deduplicationEnabled", on)
}

// UnloadTopic unloads a topic from its broker; its producers and consumers are disconnected and
// reconnect.
func (b *Broker) UnloadTopic(ctx context.Context, topic string) error {
	return b.sendJSON(ctx, http.MethodPut, topicPath(topic)+"/unload", nil)
}

// PartitionCount returns a topic's partition count; 0 means non-partitioned.
func (b *Broker) PartitionCount(ctx context.Context, topic string) (int, error) {
	data, err := b.get(ctx, topicPath(topic)+"/partitions")
	if err != nil {
		return 0, err
	}
	var meta struct {
		Partitions int `json:"partitions"`
	}
	if err := json.Unmarshal(data, &meta); err != nil {
		return 0, err
	}
	return meta.Partitions, nil
}

// SignToken returns an HS256 JWT with the given subject, as Pulsar's token authentication
// provider verifies it with a secret key.
func SignToken(key []byte, subject string) string {
	return signJWT(key, `{"sub":`+strconv.Quote(subject)+`}`)
}

// SignTokenExpiring is SignToken with an exp claim: the token is valid until exp (whole
// seconds, rounded down), after which the broker refuses it and challenges a connection that
// authenticated with it.
func SignTokenExpiring(key []byte, subject string, exp time.Time) string {
	return signJWT(key, `{"sub":`+strconv.Quote(subject)+`,"exp":`+strconv.FormatInt(exp.Unix(), 10)+`}`)
}

// signJWT signs the JSON claims with HMAC-SHA256 as a compact JWT.
func signJWT(key []byte, claims string) string {
	enc := base64.RawURLEncoding
	head := enc.EncodeToString([]byte(`{"alg":"HS256"}`))
	body := enc.EncodeToString([]byte(claims))
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(head + "." + body))
	return head + "." + body + "." + enc.EncodeToString(mac.Sum(nil))
}

// NamespaceDeduplication reports the namespace's de-duplication policy as the broker states it.
func (b *Broker) NamespaceDeduplication(ctx context.Context, namespace string) (bool, error) {
	data, err := b.get(ctx, "/admin/v2/namespaces/"+namespace+"/deduplication")
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(data)) == "true", nil
}

// TopicDeduplication reports the topic-level de-duplication policy as the broker states it.
func (b *Broker) TopicDeduplication(ctx context.Context, topic string) (bool, error) {
	data, err := b.get(ctx, topicPath(topic)+"/deduplicationEnabled")
	if err != nil {
		return false, err
	}
	return strings.TrimSpace(string(data)) == "true", nil
}

// Admin sends one admin REST request whose body is v as JSON (no body when v is nil) and returns
// the body of a 2xx answer, for calls the harness has no helper for (clusters, tenants, policies).
func (b *Broker) Admin(ctx context.Context, method, path string, v any) ([]byte, error) {
	var body io.Reader
	if v != nil {
		enc, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		body = strings.NewReader(string(enc))
	}
	data, _, err := b.do(ctx, method, path, body, "application/json")
	return data, err
}

// MessagesIn returns the topic's msgInCounter: messages the broker has taken for it since the
// topic was loaded (duplicates dropped by de-duplication are not counted).
func (b *Broker) MessagesIn(ctx context.Context, topic string) (int64, error) {
	data, err := b.get(ctx, topicPath(topic)+"/stats")
	if err != nil {
		return 0, err
	}
	var st struct {
		MsgInCounter int64 `json:"msgInCounter"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return 0, fmt.Errorf("topic stats: %w", err)
	}
	return st.MsgInCounter, nil
}

// SubscriptionStats is what the topic stats say of one subscription.
type SubscriptionStats struct {
	MsgBacklog      int64 `json:"msgBacklog"`
	UnackedMessages int64 `json:"unackedMessages"`
	Consumers       []struct {
		ConsumerName string `json:"consumerName"`
		// KeyHashRanges are a Key_Shared consumer's inclusive hash ranges, [start, end] each.
		KeyHashRanges [][]int `json:"keyHashRangeArrays"`
	} `json:"consumers"`
}

// Subscription returns the stats of subscription sub of topic (zero if it has none yet).
func (b *Broker) Subscription(ctx context.Context, topic, sub string) (SubscriptionStats, error) {
	data, err := b.get(ctx, topicPath(topic)+"/stats")
	if err != nil {
		return SubscriptionStats{}, err
	}
	var st struct {
		Subscriptions map[string]SubscriptionStats `json:"subscriptions"`
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return SubscriptionStats{}, fmt.Errorf("topic stats: %w", err)
	}
	return st.Subscriptions[sub], nil
}
