// Command driver is the pulsar-client-go test driver. The same source is compiled against several
// released pulsar-client-go versions: each ../v*/ module links this file (and one variant of
// chunking_*.go) and pins one client version in its go.mod. See ../README.md and ../../README.md
// for the CLI contract shared with the Java and Python drivers.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"regexp"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/apache/pulsar-client-go/pulsar"
	"github.com/sirupsen/logrus"
)

// Exit codes shared by every driver.
const (
	exitOK          = 0
	exitFailed      = 1 // the run happened but some sends failed or too few messages arrived
	exitUsage       = 2 // bad command line
	exitUnsupported = 3 // this client version cannot do what was asked
)

// recordSchema is the schema used by --schema json|avro in every driver (identical text in the
// Java and Python drivers so that they can share a topic).
const recordSchema = `{"type":"record","name":"DriverRecord","namespace":"rebatchproxy.drivers",` +
	`"fields":[{"name":"i","type":"int"},{"name":"text","type":"string"}]}`

// record carries both tags: older clients encode Avro through encoding/json (goavro), newer ones
// through hamba/avro, which reads the avro tag.
type record struct {
	I    int    `json:"i" avro:"i"`
	Text string `json:"text" avro:"text"`
}

var (
	outMu sync.Mutex
	enc   = json.NewEncoder(os.Stdout)
)

func emit(v map[string]any) {
	outMu.Lock()
	defer outMu.Unlock()
	_ = enc.Encode(v)
}

func clientName() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, d := range bi.Deps {
			if d.Path == "github.com/apache/pulsar-client-go" {
				return "go-" + d.Version
			}
		}
	}
	return "go-unknown"
}

func unsupported(feature, detail string) {
	emit(map[string]any{"kind": "unsupported", "client": clientName(), "feature": feature, "detail": detail})
	os.Exit(exitUnsupported)
}

func usage(format string, a ...any) {
	emit(map[string]any{"kind": "usage_error", "client": clientName(), "error": fmt.Sprintf(format, a...)})
	os.Exit(exitUsage)
}

func main() {
	if os.Getenv("DRIVER_DEBUG") == "" {
		logrus.SetLevel(logrus.WarnLevel)
	}
	if len(os.Args) < 2 {
		usage("usage: driver produce|consume|version [flags]")
	}
	switch os.Args[1] {
	case "produce":
		os.Exit(produce(os.Args[2:]))
	case "consume":
		os.Exit(consume(os.Args[2:]))
	case "version":
		emit(map[string]any{"kind": "version", "client": clientName()})
	default:
		usage("unknown subcommand %q", os.Args[1])
	}
}

// ---------------------------------------------------------------------------------------------
// shared helpers (payload, keys, properties, ids)

func payloadText(i, size int) string {
	s := "msg-" + strconv.Itoa(i)
	if len(s) < size {
		s += strings.Repeat(".", size-len(s))
	}
	return s
}

var payloadIndex = regexp.MustCompile(`^msg-(\d+)`)

func indexOf(text string) int {
	m := payloadIndex.FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		return -1
	}
	return n
}

type propTemplate struct{ key, value string }

func parseProps(s string) ([]propTemplate, error) {
	var out []propTemplate
	if s == "" {
		return nil, nil
	}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("bad property %q (want k=v)", kv)
		}
		out = append(out, propTemplate{k, v})
	}
	return out, nil
}

var placeholder = regexp.MustCompile(`\{i(?:%(\d+))?\}`)

// expand replaces {i} with the message index and {i%N} with the index modulo N.
func expand(v string, i int) string {
	return placeholder.ReplaceAllStringFunc(v, func(m string) string {
		sub := placeholder.FindStringSubmatch(m)
		if sub[1] == "" {
			return strconv.Itoa(i)
		}
		n, _ := strconv.Atoi(sub[1])
		if n <= 0 {
			return strconv.Itoa(i)
		}
		return strconv.Itoa(i % n)
	})
}

func formatID(id pulsar.MessageID) string {
	if id == nil {
		return ""
	}
	return fmt.Sprintf("%d:%d:%d:%d", id.LedgerID(), id.EntryID(), id.PartitionIdx(), id.BatchIdx())
}

func nullIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// clientOptions bounds the client's own retries by the run's deadline as well.
// trust is a CA file for pulsar+ssl:// URLs (hostnames verified); "" for none. cert and key,
// when set, authenticate the client by its TLS certificate (auth method "tls").
func clientOptions(url, token, trust, cert, key string, deadline time.Duration) pulsar.ClientOptions {
	o := pulsar.ClientOptions{
		URL:               url,
		OperationTimeout:  min(30*time.Second, deadline),
		ConnectionTimeout: min(10*time.Second, deadline),
	}
	if token != "" {
		o.Authentication = pulsar.NewAuthenticationToken(token)
	}
	if trust != "" {
		o.TLSTrustCertsFilePath = trust
		o.TLSValidateHostname = true
	}
	if cert != "" {
		o.Authentication = pulsar.NewAuthenticationTLS(cert, key)
	}
	return o
}

func flagWasSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}

// ---------------------------------------------------------------------------------------------
// produce

func produce(args []string) int {
	fs := flag.NewFlagSet("produce", flag.ContinueOnError)
	url := fs.String("url", "pulsar://127.0.0.1:6650", "service URL")
	topic := fs.String("topic", "", "topic")
	count := fs.Int("count", 10, "number of messages")
	batching := fs.Bool("batching", true, "enable batching (default true; false when --chunking is given alone)")
	batchMax := fs.Int("batch-max-messages", 0, "max messages per batch (0 = client default)")
	batchBytes := fs.Int("batch-max-bytes", 0, "max bytes per batch (0 = client default)")
	batchDelay := fs.Int("batch-delay-ms", -1, "max publish delay in ms (-1 = client default)")
	batcher := fs.String("batcher", "default", "batch builder: default|key-based")
	keyMode := fs.String("key-mode", "none", "none|fixed|random|seq")
	keys := fs.Int("keys", 10, "number of distinct keys for random|seq (keys are key-0..key-<K-1>)")
	orderingKey := fs.Bool("ordering-key", false, "also set each message's key as its ordering key")
	props := fs.String("properties", "", "k=v,... ({i} and {i%N} are replaced per message)")
	compression := fs.String("compression", "none", "none|lz4|zlib|zstd|snappy")
	chunking := fs.Bool("chunking", false, "enable chunking")
	chunkSize := fs.Int("chunk-size", 0, "max chunk size in bytes (0 = broker max message size)")
	size := fs.Int("size", 0, "pad payload to this many bytes")
	schema := fs.String("schema", "bytes", "bytes|json|avro")
	syncSend := fs.Bool("sync", false, "send synchronously, one message at a time")
	producerName := fs.String("producer-name", "", "producer name")
	token := fs.String("token", "", "JWT token")
	trust := fs.String("tls-trust-certs", "", "CA certificates file for pulsar+ssl:// (hostname verified)")
	certFile := fs.String("tls-cert-file", "", "client certificate file: authenticate by TLS certificate")
	keyFile := fs.String("tls-key-file", "", "private key file of --tls-cert-file")
	sendTimeout := fs.Int("send-timeout-ms", -1, "send timeout in ms (-1 = client default, 0 = none)")
	seqStart := fs.Int64("seq-start", -1, "if >= 0, message i is sent with sequence id seq-start+i")
	timeoutMs := fs.Int("timeout-ms", 120000, "overall deadline")
	if err := fs.Parse(args); err != nil {
		usage("%v", err)
	}
	if *topic == "" {
		usage("--topic is required")
	}
	templates, err := parseProps(*props)
	if err != nil {
		usage("%v", err)
	}
	if *keys <= 0 {
		usage("--keys must be > 0")
	}

	// Validate everything before connecting, so that unsupported features are reported cheaply.
	opts := pulsar.ProducerOptions{Topic: *topic, Name: *producerName}
	switch *compression {
	case "none":
		opts.CompressionType = pulsar.NoCompression
	case "lz4":
		opts.CompressionType = pulsar.LZ4
	case "zlib":
		opts.CompressionType = pulsar.ZLib
	case "zstd":
		opts.CompressionType = pulsar.ZSTD
	case "snappy":
		if err := setSnappy(&opts); err != nil {
			unsupported("compression=snappy", err.Error())
		}
	default:
		usage("unknown --compression %q", *compression)
	}
	switch *keyMode {
	case "none", "fixed", "random", "seq":
	default:
		usage("unknown --key-mode %q", *keyMode)
	}
	batchingOn := *batching
	if *chunking && !flagWasSet(fs, "batching") {
		batchingOn = false
	}
	opts.DisableBatching = !batchingOn
	if *batchMax > 0 {
		opts.BatchingMaxMessages = uint(*batchMax)
	}
	if *batchBytes > 0 {
		opts.BatchingMaxSize = uint(*batchBytes)
	}
	if *batchDelay >= 0 {
		// The Go client treats 0 as "use the default"; 1ms is its shortest real delay.
		d := time.Duration(*batchDelay) * time.Millisecond
		if d == 0 {
			d = time.Millisecond
		}
		opts.BatchingMaxPublishDelay = d
	}
	switch *batcher {
	case "default":
	case "key-based":
		opts.BatcherBuilderType = pulsar.KeyBasedBatchBuilder
	default:
		usage("unknown --batcher %q", *batcher)
	}
	if *chunkSize > 0 && !*chunking {
		usage("--chunk-size needs --chunking")
	}
	if *chunking {
		if err := setChunking(&opts, *chunking, *chunkSize); err != nil {
			unsupported("chunking", err.Error())
		}
	}
	if *sendTimeout >= 0 {
		opts.SendTimeout = time.Duration(*sendTimeout) * time.Millisecond
		if *sendTimeout == 0 {
			opts.SendTimeout = -1 // the Go client's "no timeout"
		}
	}
	switch *schema {
	case "bytes":
	case "json":
		opts.Schema = pulsar.NewJSONSchema(recordSchema, nil)
	case "avro":
		opts.Schema = pulsar.NewAvroSchema(recordSchema, nil)
	default:
		usage("unknown --schema %q", *schema)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*timeoutMs)*time.Millisecond)
	defer cancel()
	start := time.Now()
	summary := map[string]any{"kind": "summary", "op": "produce", "client": clientName(), "count": *count}
	fail := func(stage string, err error) int {
		summary["acked"] = 0
		summary["failed"] = *count
		summary["error"] = stage + ": " + err.Error()
		summary["elapsed_ms"] = time.Since(start).Milliseconds()
		emit(summary)
		return exitFailed
	}

	client, err := pulsar.NewClient(clientOptions(*url, *token, *trust, *certFile, *keyFile, time.Duration(*timeoutMs)*time.Millisecond))
	if err != nil {
		return fail("client", err)
	}
	defer client.Close()
	producer, err := client.CreateProducer(opts)
	if err != nil {
		return fail("create producer", err)
	}
	defer producer.Close()

	rng := rand.New(rand.NewSource(time.Now().UnixNano()))
	var (
		mu       sync.Mutex
		acked    int
		failed   int
		firstErr string
		wg       sync.WaitGroup
	)
	report := func(i int, key string, id pulsar.MessageID, seq any, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed++
			if firstErr == "" {
				firstErr = err.Error()
			}
			emit(map[string]any{"kind": "error", "i": i, "key": nullIfEmpty(key), "error": err.Error()})
			return
		}
		acked++
		emit(map[string]any{"kind": "ack", "i": i, "key": nullIfEmpty(key), "msg_id": formatID(id), "seq": seq})
	}

	for i := 0; i < *count; i++ {
		msg := &pulsar.ProducerMessage{}
		text := payloadText(i, *size)
		if *schema == "bytes" {
			msg.Payload = []byte(text)
		} else {
			msg.Value = &record{I: i, Text: text}
		}
		var key string
		switch *keyMode {
		case "fixed":
			key = "key-0"
		case "seq":
			key = "key-" + strconv.Itoa(i%*keys)
		case "random":
			key = "key-" + strconv.Itoa(rng.Intn(*keys))
		}
		msg.Key = key
		if *orderingKey {
			msg.OrderingKey = key
		}
		if len(templates) > 0 {
			msg.Properties = make(map[string]string, len(templates))
			for _, t := range templates {
				msg.Properties[t.key] = expand(t.value, i)
			}
		}
		var explicitSeq any
		if *seqStart >= 0 {
			s := *seqStart + int64(i)
			msg.SequenceID = &s
			explicitSeq = s
		}
		if *syncSend {
			id, err := producer.Send(ctx, msg)
			seq := explicitSeq
			if err == nil && seq == nil {
				seq = producer.LastSequenceID()
			}
			report(i, key, id, seq, err)
			continue
		}
		wg.Add(1)
		i := i
		producer.SendAsync(ctx, msg, func(id pulsar.MessageID, _ *pulsar.ProducerMessage, err error) {
			defer wg.Done()
			// Asynchronous sends: the client does not tell which sequence id a message got unless
			// it was given explicitly, so seq is null then.
			report(i, key, id, explicitSeq, err)
		})
	}
	if !*syncSend {
		// Flush only matters with batching; v0.10.0's Flush also panics (nil batch builder) when
		// batching is disabled.
		if batchingOn {
			if err := producer.Flush(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				emit(map[string]any{"kind": "warning", "detail": "flush: " + err.Error()})
			}
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			emit(map[string]any{"kind": "warning", "detail": "deadline reached before every send completed"})
		}
	}
	mu.Lock()
	summary["acked"] = acked
	summary["failed"] = *count - acked
	if firstErr != "" {
		summary["error"] = firstErr
	}
	mu.Unlock()
	summary["last_seq"] = producer.LastSequenceID()
	summary["producer_name"] = producer.Name()
	summary["elapsed_ms"] = time.Since(start).Milliseconds()
	emit(summary)
	if acked != *count {
		return exitFailed
	}
	return exitOK
}

// ---------------------------------------------------------------------------------------------
// consume

func parseRanges(s string) ([]int, error) {
	var out []int
	for _, r := range strings.Split(s, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(r), "-")
		if !ok {
			return nil, fmt.Errorf("bad range %q (want a-b)", r)
		}
		x, err1 := strconv.Atoi(a)
		y, err2 := strconv.Atoi(b)
		if err1 != nil || err2 != nil || x < 0 || y < x || y > 65535 {
			return nil, fmt.Errorf("bad range %q", r)
		}
		out = append(out, x, y)
	}
	return out, nil
}

func consume(args []string) int {
	fs := flag.NewFlagSet("consume", flag.ContinueOnError)
	url := fs.String("url", "pulsar://127.0.0.1:6650", "service URL")
	topic := fs.String("topic", "", "topic")
	sub := fs.String("sub", "", "subscription name")
	subType := fs.String("type", "exclusive", "exclusive|shared|failover|key_shared")
	sticky := fs.String("sticky-ranges", "", "Key_Shared STICKY hash ranges a-b,c-d (inclusive, 0..65535)")
	count := fs.Int("count", 0, "stop after acknowledging this many messages (0 = until idle)")
	timeoutMs := fs.Int("timeout-ms", 60000, "overall deadline")
	idleMs := fs.Int("idle-ms", 3000, "without --count: stop after this long without a message")
	nackFirst := fs.Int("nack-first", 0, "negative-ack the first K messages received")
	nackDelay := fs.Int("nack-delay-ms", 300, "negative-ack redelivery delay")
	schema := fs.String("schema", "bytes", "bytes|json|avro")
	token := fs.String("token", "", "JWT token")
	trust := fs.String("tls-trust-certs", "", "CA certificates file for pulsar+ssl:// (hostname verified)")
	certFile := fs.String("tls-cert-file", "", "client certificate file: authenticate by TLS certificate")
	keyFile := fs.String("tls-key-file", "", "private key file of --tls-cert-file")
	initial := fs.String("initial-position", "earliest", "earliest|latest")
	consumerName := fs.String("consumer-name", "", "consumer name")
	if err := fs.Parse(args); err != nil {
		usage("%v", err)
	}
	if *topic == "" || *sub == "" {
		usage("--topic and --sub are required")
	}
	opts := pulsar.ConsumerOptions{
		Topic:               *topic,
		SubscriptionName:    *sub,
		Name:                *consumerName,
		NackRedeliveryDelay: time.Duration(*nackDelay) * time.Millisecond,
	}
	switch *subType {
	case "exclusive":
		opts.Type = pulsar.Exclusive
	case "shared":
		opts.Type = pulsar.Shared
	case "failover":
		opts.Type = pulsar.Failover
	case "key_shared":
		opts.Type = pulsar.KeyShared
	default:
		usage("unknown --type %q", *subType)
	}
	if *sticky != "" {
		if opts.Type != pulsar.KeyShared {
			usage("--sticky-ranges needs --type key_shared")
		}
		ranges, err := parseRanges(*sticky)
		if err != nil {
			usage("%v", err)
		}
		p, err := pulsar.NewKeySharedPolicySticky(ranges)
		if err != nil {
			usage("sticky ranges: %v", err)
		}
		opts.KeySharedPolicy = p
	}
	switch *initial {
	case "earliest":
		opts.SubscriptionInitialPosition = pulsar.SubscriptionPositionEarliest
	case "latest":
		opts.SubscriptionInitialPosition = pulsar.SubscriptionPositionLatest
	default:
		usage("unknown --initial-position %q", *initial)
	}
	switch *schema {
	case "bytes":
	case "json":
		opts.Schema = pulsar.NewJSONSchema(recordSchema, nil)
	case "avro":
		opts.Schema = pulsar.NewAvroSchema(recordSchema, nil)
	default:
		usage("unknown --schema %q", *schema)
	}

	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*timeoutMs)*time.Millisecond)
	defer cancel()
	start := time.Now()
	summary := map[string]any{"kind": "summary", "op": "consume", "client": clientName(), "count": *count}
	client, err := pulsar.NewClient(clientOptions(*url, *token, *trust, *certFile, *keyFile, time.Duration(*timeoutMs)*time.Millisecond))
	if err != nil {
		summary["error"] = "client: " + err.Error()
		emit(summary)
		return exitFailed
	}
	defer client.Close()
	consumer, err := client.Subscribe(opts)
	if err != nil {
		summary["error"] = "subscribe: " + err.Error()
		emit(summary)
		return exitFailed
	}
	defer consumer.Close()
	emit(map[string]any{"kind": "ready", "client": clientName()})

	received, acked, nacked, redelivered := 0, 0, 0, 0
	timedOut := false
	for *count == 0 || acked < *count {
		rctx := ctx
		var rcancel context.CancelFunc = func() {}
		if *count == 0 {
			rctx, rcancel = context.WithTimeout(ctx, time.Duration(*idleMs)*time.Millisecond)
		}
		msg, err := consumer.Receive(rctx)
		rcancel()
		if err != nil {
			if ctx.Err() != nil {
				timedOut = true
			}
			if ctx.Err() == nil && rctx.Err() == nil {
				summary["error"] = "receive: " + err.Error()
			}
			break
		}
		received++
		line := map[string]any{
			"kind":         "msg",
			"key":          nullIfEmpty(msg.Key()),
			"props":        msg.Properties(),
			"payload_len":  len(msg.Payload()),
			"msg_id":       formatID(msg.ID()),
			"redelivery":   msg.RedeliveryCount(),
			"ordering_key": nullIfEmpty(msg.OrderingKey()),
		}
		if line["props"] == nil {
			line["props"] = map[string]string{}
		}
		if msg.RedeliveryCount() > 0 {
			redelivered++
		}
		if *schema == "bytes" {
			line["i"] = indexOf(string(msg.Payload()))
		} else {
			var r record
			if err := msg.GetSchemaValue(&r); err != nil {
				line["i"] = -1
				line["decode_error"] = err.Error()
			} else {
				line["i"] = r.I
				if indexOf(r.Text) != r.I {
					line["decode_error"] = "text does not match i"
				}
			}
		}
		if nacked < *nackFirst {
			nacked++
			line["nacked"] = true
			consumer.Nack(msg)
		} else {
			consumer.Ack(msg)
			acked++
		}
		emit(line)
	}
	summary["received"] = received
	summary["acked"] = acked
	summary["nacked"] = nacked
	summary["redelivered"] = redelivered
	summary["timed_out"] = timedOut
	summary["elapsed_ms"] = time.Since(start).Milliseconds()
	emit(summary)
	if *count > 0 && acked < *count {
		return exitFailed
	}
	if _, bad := summary["error"]; bad {
		return exitFailed
	}
	return exitOK
}
