// Java test driver: one source compiled with javac against each pinned org.apache.pulsar:pulsar-client
// version (see ../README.md for the CLI contract shared with the Go and Python drivers). Only API
// present in every pinned version is called directly; newer API is reached by reflection and
// reported as unsupported when absent.
package rebatchproxy.drivers;

import java.io.BufferedWriter;
import java.io.OutputStreamWriter;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.pulsar.client.api.AuthenticationFactory;
import org.apache.pulsar.client.api.BatcherBuilder;
import org.apache.pulsar.client.api.ClientBuilder;
import org.apache.pulsar.client.api.CompressionType;
import org.apache.pulsar.client.api.Consumer;
import org.apache.pulsar.client.api.ConsumerBuilder;
import org.apache.pulsar.client.api.KeySharedPolicy;
import org.apache.pulsar.client.api.Message;
import org.apache.pulsar.client.api.MessageId;
import org.apache.pulsar.client.api.Producer;
import org.apache.pulsar.client.api.ProducerBuilder;
import org.apache.pulsar.client.api.PulsarClient;
import org.apache.pulsar.client.api.Range;
import org.apache.pulsar.client.api.Schema;
import org.apache.pulsar.client.api.SubscriptionInitialPosition;
import org.apache.pulsar.client.api.SubscriptionType;
import org.apache.pulsar.client.api.TypedMessageBuilder;
import org.apache.pulsar.client.api.schema.SchemaDefinition;
import org.apache.pulsar.client.api.transaction.Transaction;
import org.apache.pulsar.client.impl.BatchMessageIdImpl;
import org.apache.pulsar.client.impl.MessageIdImpl;
import org.apache.pulsar.client.impl.TopicMessageIdImpl;

/** Value type of --schema json|avro; its full name matches RECORD_SCHEMA. */
class DriverRecord {
    public int i;
    public String text;

    public DriverRecord() {
    }

    DriverRecord(int i, String text) {
        this.i = i;
        this.text = text;
    }
}

public final class PulsarDriver {
    static final int EXIT_OK = 0, EXIT_FAILED = 1, EXIT_USAGE = 2, EXIT_UNSUPPORTED = 3;

    /**
     * The schema the Go and Python drivers declare; here it is derived from {@link DriverRecord}
     * (the API refuses a POJO and a JSON definition together), and "schema-text" prints both.
     */
    static final String RECORD_SCHEMA = "{\"type\":\"record\",\"name\":\"DriverRecord\","
            + "\"namespace\":\"rebatchproxy.drivers\",\"fields\":[{\"name\":\"i\",\"type\":\"int\"},"
            + "{\"name\":\"text\",\"type\":\"string\"}]}";

    static final BufferedWriter OUT = new BufferedWriter(new OutputStreamWriter(System.out, StandardCharsets.UTF_8));

    // ---------------------------------------------------------------------------------------------
    // output

    static String clientName() {
        try {
            Class<?> c = Class.forName("org.apache.pulsar.PulsarVersion");
            return "java-" + c.getMethod("getVersion").invoke(null);
        } catch (Exception e) {
            return "java-unknown";
        }
    }

    static void quote(StringBuilder sb, String s) {
        sb.append('"');
        for (int k = 0; k < s.length(); k++) {
            char c = s.charAt(k);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
            }
        }
        sb.append('"');
    }

    @SuppressWarnings("unchecked")
    static void value(StringBuilder sb, Object v) {
        if (v == null) {
            sb.append("null");
        } else if (v instanceof String) {
            quote(sb, (String) v);
        } else if (v instanceof Number || v instanceof Boolean) {
            sb.append(v);
        } else if (v instanceof Map) {
            sb.append('{');
            boolean first = true;
            for (Map.Entry<String, Object> e : ((Map<String, Object>) v).entrySet()) {
                if (!first) {
                    sb.append(',');
                }
                first = false;
                quote(sb, e.getKey());
                sb.append(':');
                value(sb, e.getValue());
            }
            sb.append('}');
        } else {
            quote(sb, v.toString());
        }
    }

    static synchronized void emit(Map<String, Object> m) {
        StringBuilder sb = new StringBuilder();
        value(sb, m);
        try {
            OUT.write(sb.toString());
            OUT.write('\n');
            OUT.flush();
        } catch (java.io.IOException e) {
            System.exit(EXIT_FAILED);
        }
    }

    static Map<String, Object> obj(Object... kv) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int k = 0; k < kv.length; k += 2) {
            m.put((String) kv[k], kv[k + 1]);
        }
        return m;
    }

    static final class Exit extends RuntimeException {
        private static final long serialVersionUID = 1L;
        final int code;

        Exit(int code) {
            super(null, null, false, false);
            this.code = code;
        }
    }

    static Exit unsupported(String feature, String detail) {
        emit(obj("kind", "unsupported", "client", clientName(), "feature", feature, "detail", detail));
        return new Exit(EXIT_UNSUPPORTED);
    }

    static Exit usage(String msg) {
        emit(obj("kind", "usage_error", "client", clientName(), "error", msg));
        return new Exit(EXIT_USAGE);
    }

    // ---------------------------------------------------------------------------------------------
    // flags: --name value, --name=value, and bare --name for booleans

    static final class Flags {
        final Map<String, String> values = new HashMap<>();
        final Map<String, String> known;

        Flags(String[] args, int from, Map<String, String> known) {
            this.known = known;
            for (int k = from; k < args.length; k++) {
                String a = args[k];
                if (!a.startsWith("-")) {
                    throw usage("unexpected argument " + a);
                }
                String name = a.replaceFirst("^--?", "");
                String v = null;
                int eq = name.indexOf('=');
                if (eq >= 0) {
                    v = name.substring(eq + 1);
                    name = name.substring(0, eq);
                }
                String kind = known.get(name);
                if (kind == null) {
                    throw usage("flag provided but not defined: -" + name);
                }
                if (v == null) {
                    if (kind.equals("bool")) {
                        v = "true";
                    } else if (k + 1 < args.length) {
                        v = args[++k];
                    } else {
                        throw usage("flag needs an argument: -" + name);
                    }
                }
                values.put(name, v);
            }
        }

        boolean has(String n) {
            return values.containsKey(n);
        }

        String str(String n, String def) {
            return values.getOrDefault(n, def);
        }

        long num(String n, long def) {
            String v = values.get(n);
            if (v == null) {
                return def;
            }
            try {
                return Long.parseLong(v);
            } catch (NumberFormatException e) {
                throw usage("bad number for --" + n + ": " + v);
            }
        }

        boolean bool(String n, boolean def) {
            String v = values.get(n);
            if (v == null) {
                return def;
            }
            if (v.equals("true") || v.equals("1")) {
                return true;
            }
            if (v.equals("false") || v.equals("0")) {
                return false;
            }
            throw usage("bad boolean for --" + n + ": " + v);
        }
    }

    static Map<String, String> kinds(String... spec) {
        Map<String, String> m = new HashMap<>();
        for (String s : spec) {
            String[] p = s.split(":");
            m.put(p[0], p.length > 1 ? p[1] : "str");
        }
        return m;
    }

    // ---------------------------------------------------------------------------------------------
    // shared helpers

    static String payloadText(int i, int size) {
        StringBuilder sb = new StringBuilder("msg-").append(i);
        while (sb.length() < size) {
            sb.append('.');
        }
        return sb.toString();
    }

    static final Pattern INDEX = Pattern.compile("^msg-(\\d+)");

    static int indexOf(String text) {
        Matcher m = INDEX.matcher(text);
        if (!m.find()) {
            return -1;
        }
        try {
            return Integer.parseInt(m.group(1));
        } catch (NumberFormatException e) {
            return -1;
        }
    }

    static final Pattern PLACEHOLDER = Pattern.compile("\\{i(?:%(\\d+))?\\}");

    static String expand(String v, int i) {
        Matcher m = PLACEHOLDER.matcher(v);
        StringBuffer sb = new StringBuffer();
        while (m.find()) {
            int n = m.group(1) == null ? 0 : Integer.parseInt(m.group(1));
            m.appendReplacement(sb, Integer.toString(n > 0 ? i % n : i));
        }
        m.appendTail(sb);
        return sb.toString();
    }

    @SuppressWarnings("deprecation")
    static String formatId(MessageId id) {
        if (id instanceof TopicMessageIdImpl) {
            id = ((TopicMessageIdImpl) id).getInnerMessageId();
        }
        if (id instanceof MessageIdImpl) {
            MessageIdImpl m = (MessageIdImpl) id;
            int batch = id instanceof BatchMessageIdImpl ? ((BatchMessageIdImpl) id).getBatchIndex() : -1;
            return m.getLedgerId() + ":" + m.getEntryId() + ":" + m.getPartitionIndex() + ":" + batch;
        }
        return id == null ? "" : id.toString();
    }

    /** The client's own retries are bounded by the run's deadline as well. */
    static PulsarClient client(Flags f, long deadlineMs) throws Exception {
        ClientBuilder b = PulsarClient.builder()
                .serviceUrl(f.str("url", "pulsar://127.0.0.1:6650"))
                .operationTimeout((int) Math.max(1000, Math.min(30000, deadlineMs)), TimeUnit.MILLISECONDS)
                .connectionTimeout((int) Math.max(1000, Math.min(10000, deadlineMs)), TimeUnit.MILLISECONDS);
        String token = f.str("token", "");
        if (!token.isEmpty()) {
            b.authentication(AuthenticationFactory.token(token));
        }
        if (!f.str("txn", "").isEmpty()) {
            b.enableTransaction(true);
        }
        String trust = f.str("tls-trust-certs", "");
        if (!trust.isEmpty()) {
            b.tlsTrustCertsFilePath(trust).enableTlsHostnameVerification(true).allowTlsInsecureConnection(false);
        }
        String cert = f.str("tls-cert-file", "");
        if (!cert.isEmpty()) {
            b.authentication(AuthenticationFactory.TLS(cert, f.str("tls-key-file", "")));
        }
        return b.build();
    }

    @SuppressWarnings({"unchecked", "rawtypes"})
    static Schema<Object> schema(String name) {
        switch (name) {
            case "bytes":
                return (Schema) Schema.BYTES;
            case "json":
                return (Schema) Schema.JSON(SchemaDefinition.<DriverRecord>builder()
                        .withPojo(DriverRecord.class).withAlwaysAllowNull(false).build());
            case "avro":
                return (Schema) Schema.AVRO(SchemaDefinition.<DriverRecord>builder()
                        .withPojo(DriverRecord.class).withAlwaysAllowNull(false).build());
            default:
                throw usage("unknown --schema " + name);
        }
    }

    static String rootMessage(Throwable t) {
        while (t.getCause() != null && t.getCause() != t) {
            t = t.getCause();
        }
        return t.getClass().getSimpleName() + ": " + t.getMessage();
    }

    // ---------------------------------------------------------------------------------------------
    // produce

    @SuppressWarnings({"unchecked", "rawtypes"})
    static int produce(String[] args) throws Exception {
        Flags f = new Flags(args, 1, kinds("url", "topic", "count", "batching:bool", "batch-max-messages",
                "batch-max-bytes", "batch-delay-ms", "batcher", "key-mode", "keys", "ordering-key:bool", "empty-key:bool",
                "properties", "compression", "chunking:bool", "chunk-size", "size", "schema", "sync:bool",
                "producer-name", "token", "tls-trust-certs", "tls-cert-file", "tls-key-file", "send-timeout-ms", "seq-start", "seq-scramble:bool", "timeout-ms", "txn"));
        String topic = f.str("topic", "");
        if (topic.isEmpty()) {
            throw usage("--topic is required");
        }
        int count = (int) f.num("count", 10);
        int size = (int) f.num("size", 0);
        int keys = (int) f.num("keys", 10);
        if (keys <= 0) {
            throw usage("--keys must be > 0");
        }
        String keyMode = f.str("key-mode", "none");
        if (!List.of("none", "fixed", "random", "seq").contains(keyMode)) {
            throw usage("unknown --key-mode " + keyMode);
        }
        boolean orderingKey = f.bool("ordering-key", false);
        boolean emptyKey = f.bool("empty-key", false); // key index 0 is "" (present, empty) instead of key-0
        String schemaName = f.str("schema", "bytes");
        Schema<Object> schema = schema(schemaName);
        List<String[]> templates = new ArrayList<>();
        String props = f.str("properties", "");
        if (!props.isEmpty()) {
            for (String kv : props.split(",")) {
                int eq = kv.indexOf('=');
                if (eq <= 0) {
                    throw usage("bad property " + kv + " (want k=v)");
                }
                templates.add(new String[] {kv.substring(0, eq), kv.substring(eq + 1)});
            }
        }
        CompressionType ct;
        switch (f.str("compression", "none")) {
            case "none": ct = CompressionType.NONE; break;
            case "lz4": ct = CompressionType.LZ4; break;
            case "zlib": ct = CompressionType.ZLIB; break;
            case "zstd": ct = CompressionType.ZSTD; break;
            case "snappy": ct = CompressionType.SNAPPY; break;
            default: throw usage("unknown --compression " + f.str("compression", ""));
        }
        boolean chunking = f.bool("chunking", false);
        boolean batching = f.bool("batching", !(chunking && !f.has("batching")));
        long chunkSize = f.num("chunk-size", 0);
        if (chunkSize > 0 && !chunking) {
            throw usage("--chunk-size needs --chunking");
        }
        boolean sync = f.bool("sync", false);
        long seqStart = f.num("seq-start", -1);
        // --seq-scramble: message i gets seq-start + (i * 7919 mod count), a fixed permutation, so
        // the application's ids go out of order (7919 is prime: a permutation unless it divides count).
        boolean seqScramble = f.bool("seq-scramble", false);
        if (seqScramble && (seqStart < 0 || count % 7919 == 0)) {
            throw usage("--seq-scramble needs --seq-start and a count not divisible by 7919");
        }
        long timeoutMs = f.num("timeout-ms", 120000);
        // --txn commit|abort: messages count/3 .. 2*count/3-1 go in one transaction, committed or
        // aborted once every send has completed (the producer needs --send-timeout-ms 0).
        String txnEnd = f.str("txn", "");
        if (!txnEnd.isEmpty() && !txnEnd.equals("commit") && !txnEnd.equals("abort")) {
            throw usage("unknown --txn " + txnEnd + " (commit or abort)");
        }

        // Build the producer configuration before connecting, so unsupported features are cheap to report.
        Map<String, Object> conf = new LinkedHashMap<>();
        long start = System.nanoTime();
        Map<String, Object> summary = obj("kind", "summary", "op", "produce", "client", clientName(), "count", count);
        PulsarClient client;
        ProducerBuilder<Object> pb;
        try {
            client = client(f, timeoutMs);
        } catch (Exception e) {
            return nothingSent(summary, count, "client: " + rootMessage(e));
        }
        try {
            pb = client.newProducer(schema).topic(topic).compressionType(ct).enableBatching(batching)
                    .blockIfQueueFull(true);
            if (chunking) {
                pb = pb.enableChunking(true);
            }
            if (chunkSize > 0) {
                Method m;
                try {
                    m = ProducerBuilder.class.getMethod("chunkMaxMessageSize", int.class);
                } catch (NoSuchMethodException e) {
                    throw unsupported("chunk-size", "ProducerBuilder.chunkMaxMessageSize is missing in this version");
                }
                pb = (ProducerBuilder<Object>) m.invoke(pb, (int) chunkSize);
            }
            if (f.has("producer-name") && !f.str("producer-name", "").isEmpty()) {
                pb = pb.producerName(f.str("producer-name", ""));
            }
            if (f.num("batch-max-messages", 0) > 0) {
                pb = pb.batchingMaxMessages((int) f.num("batch-max-messages", 0));
            }
            if (f.num("batch-max-bytes", 0) > 0) {
                pb = pb.batchingMaxBytes((int) f.num("batch-max-bytes", 0));
            }
            if (f.num("batch-delay-ms", -1) >= 0) {
                pb = pb.batchingMaxPublishDelay(f.num("batch-delay-ms", -1), TimeUnit.MILLISECONDS);
            }
            switch (f.str("batcher", "default")) {
                case "default": break;
                case "key-based": pb = pb.batcherBuilder(BatcherBuilder.KEY_BASED); break;
                default: throw usage("unknown --batcher " + f.str("batcher", ""));
            }
            if (f.num("send-timeout-ms", -1) >= 0) {
                pb = pb.sendTimeout((int) f.num("send-timeout-ms", -1), TimeUnit.MILLISECONDS);
            }
        } catch (Exit e) {
            client.close();
            throw e;
        }
        Producer<Object> producer;
        try {
            producer = pb.create();
        } catch (Exception e) {
            client.close();
            return nothingSent(summary, count, "create producer: " + rootMessage(e));
        }

        Transaction txn = null;
        if (!txnEnd.isEmpty()) {
            try {
                txn = client.newTransaction().withTransactionTimeout(5, TimeUnit.MINUTES).build().get();
            } catch (Exception e) {
                producer.close();
                client.close();
                return nothingSent(summary, count, "new transaction: " + rootMessage(e));
            }
        }

        Random rng = new Random();
        AtomicInteger acked = new AtomicInteger();
        AtomicInteger failed = new AtomicInteger();
        String[] firstErr = new String[1];
        List<CompletableFuture<?>> pending = new ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        for (int i = 0; i < count; i++) {
            boolean inTxn = txn != null && i >= count / 3 && i < 2 * count / 3;
            TypedMessageBuilder<Object> mb = inTxn ? producer.newMessage(txn) : producer.newMessage();
            String text = payloadText(i, size);
            if (schemaName.equals("bytes")) {
                mb = mb.value(text.getBytes(StandardCharsets.UTF_8));
            } else {
                mb = mb.value(new DriverRecord(i, text));
            }
            String key = null;
            switch (keyMode) {
                case "fixed": key = "key-0"; break;
                case "seq": key = "key-" + (i % keys); break;
                case "random": key = "key-" + rng.nextInt(keys); break;
                default: break;
            }
            if (key != null && emptyKey && key.equals("key-0")) {
                key = "";
            }
            if (key != null) {
                mb = mb.key(key);
                if (orderingKey) {
                    mb = mb.orderingKey(key.getBytes(StandardCharsets.UTF_8));
                }
            }
            for (String[] t : templates) {
                mb = mb.property(t[0], expand(t[1], i));
            }
            Long explicitSeq = null;
            if (seqStart >= 0) {
                explicitSeq = seqStart + (seqScramble ? (i * 7919L) % count : i);
                mb = mb.sequenceId(explicitSeq);
            }
            final int idx = i;
            final String k = key;
            final Long seq = explicitSeq;
            if (sync) {
                try {
                    MessageId id = mb.send();
                    acked.incrementAndGet();
                    emit(obj("kind", "ack", "i", idx, "key", k, "msg_id", formatId(id),
                            "seq", seq != null ? seq : producer.getLastSequenceId()));
                } catch (Exception e) {
                    failed.incrementAndGet();
                    if (firstErr[0] == null) {
                        firstErr[0] = rootMessage(e);
                    }
                    emit(obj("kind", "error", "i", idx, "key", k, "error", rootMessage(e)));
                }
                if (System.nanoTime() > deadline) {
                    break;
                }
                continue;
            }
            pending.add(mb.sendAsync().whenComplete((id, err) -> {
                if (err != null) {
                    failed.incrementAndGet();
                    synchronized (firstErr) {
                        if (firstErr[0] == null) {
                            firstErr[0] = rootMessage(err);
                        }
                    }
                    emit(obj("kind", "error", "i", idx, "key", k, "error", rootMessage(err)));
                } else {
                    acked.incrementAndGet();
                    // The client does not say which sequence id an async send got unless it was explicit.
                    emit(obj("kind", "ack", "i", idx, "key", k, "msg_id", formatId(id), "seq", seq));
                }
            }));
        }
        if (!sync) {
            producer.flushAsync();
            try {
                long left = Math.max(1, deadline - System.nanoTime());
                CompletableFuture.allOf(pending.toArray(new CompletableFuture[0]))
                        .get(left, TimeUnit.NANOSECONDS);
            } catch (java.util.concurrent.TimeoutException e) {
                emit(obj("kind", "warning", "detail", "deadline reached before every send completed"));
            } catch (java.util.concurrent.ExecutionException e) {
                // individual failures were reported by their callbacks
            }
        }
        summary.put("acked", acked.get());
        summary.put("failed", count - acked.get());
        if (firstErr[0] != null) {
            summary.put("error", firstErr[0]);
        }
        boolean txnOK = true;
        if (txn != null) {
            try {
                if (txnEnd.equals("commit")) {
                    txn.commit().get(Math.max(1, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
                } else {
                    txn.abort().get(Math.max(1, deadline - System.nanoTime()), TimeUnit.NANOSECONDS);
                }
                summary.put("txn", txnEnd.equals("commit") ? "committed" : "aborted");
            } catch (Exception e) {
                txnOK = false;
                summary.put("txn", "failed");
                summary.put("error", "end transaction: " + rootMessage(e));
            }
        }
        summary.put("last_seq", producer.getLastSequenceId());
        summary.put("producer_name", producer.getProducerName());
        summary.put("elapsed_ms", TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start));
        try {
            producer.close();
        } finally {
            client.close();
        }
        emit(summary);
        return acked.get() == count && txnOK ? EXIT_OK : EXIT_FAILED;
    }

    /** Reports a produce run that failed before its first send: none of count acknowledged. */
    static int nothingSent(Map<String, Object> summary, int count, String error) {
        summary.put("acked", 0);
        summary.put("failed", count);
        summary.put("error", error);
        emit(summary);
        return EXIT_FAILED;
    }

    // ---------------------------------------------------------------------------------------------
    // consume

    static int consume(String[] args) throws Exception {
        Flags f = new Flags(args, 1, kinds("url", "topic", "sub", "type", "sticky-ranges", "count", "timeout-ms",
                "idle-ms", "nack-first", "nack-delay-ms", "schema", "token", "tls-trust-certs", "tls-cert-file", "tls-key-file", "initial-position", "consumer-name"));
        String topic = f.str("topic", "");
        String sub = f.str("sub", "");
        if (topic.isEmpty() || sub.isEmpty()) {
            throw usage("--topic and --sub are required");
        }
        int count = (int) f.num("count", 0);
        long timeoutMs = f.num("timeout-ms", 60000);
        long idleMs = f.num("idle-ms", 3000);
        int nackFirst = (int) f.num("nack-first", 0);
        String schemaName = f.str("schema", "bytes");
        Schema<Object> schema = schema(schemaName);
        SubscriptionType type;
        switch (f.str("type", "exclusive")) {
            case "exclusive": type = SubscriptionType.Exclusive; break;
            case "shared": type = SubscriptionType.Shared; break;
            case "failover": type = SubscriptionType.Failover; break;
            case "key_shared": type = SubscriptionType.Key_Shared; break;
            default: throw usage("unknown --type " + f.str("type", ""));
        }
        KeySharedPolicy policy = null;
        String sticky = f.str("sticky-ranges", "");
        if (!sticky.isEmpty()) {
            if (type != SubscriptionType.Key_Shared) {
                throw usage("--sticky-ranges needs --type key_shared");
            }
            List<Range> ranges = new ArrayList<>();
            for (String r : sticky.split(",")) {
                String[] ab = r.trim().split("-");
                try {
                    int a = Integer.parseInt(ab[0]);
                    int b = Integer.parseInt(ab[1]);
                    if (ab.length != 2 || a < 0 || b < a || b > 65535) {
                        throw usage("bad range " + r);
                    }
                    ranges.add(Range.of(a, b));
                } catch (RuntimeException e) {
                    if (e instanceof Exit) {
                        throw e;
                    }
                    throw usage("bad range " + r + " (want a-b)");
                }
            }
            policy = KeySharedPolicy.stickyHashRange().ranges(ranges.toArray(new Range[0]));
        }
        SubscriptionInitialPosition pos;
        switch (f.str("initial-position", "earliest")) {
            case "earliest": pos = SubscriptionInitialPosition.Earliest; break;
            case "latest": pos = SubscriptionInitialPosition.Latest; break;
            default: throw usage("unknown --initial-position " + f.str("initial-position", ""));
        }

        long start = System.nanoTime();
        Map<String, Object> summary = obj("kind", "summary", "op", "consume", "client", clientName(), "count", count);
        PulsarClient client;
        try {
            client = client(f, timeoutMs);
        } catch (Exception e) {
            summary.put("error", "client: " + rootMessage(e));
            emit(summary);
            return EXIT_FAILED;
        }
        Consumer<Object> consumer;
        try {
            ConsumerBuilder<Object> cb = client.newConsumer(schema).topic(topic).subscriptionName(sub)
                    .subscriptionType(type).subscriptionInitialPosition(pos)
                    .negativeAckRedeliveryDelay(f.num("nack-delay-ms", 300), TimeUnit.MILLISECONDS);
            if (policy != null) {
                cb = cb.keySharedPolicy(policy);
            }
            if (!f.str("consumer-name", "").isEmpty()) {
                cb = cb.consumerName(f.str("consumer-name", ""));
            }
            consumer = cb.subscribe();
        } catch (Exception e) {
            summary.put("error", "subscribe: " + rootMessage(e));
            emit(summary);
            client.close();
            return EXIT_FAILED;
        }
        emit(obj("kind", "ready", "client", clientName()));

        int received = 0, acked = 0, nacked = 0, redelivered = 0;
        boolean timedOut = false;
        // --timeout-ms bounds the whole consume, subscribe included, so a slow subscribe ends in
        // a summary saying what arrived, not in the caller killing the process.
        long deadline = start + TimeUnit.MILLISECONDS.toNanos(timeoutMs);
        while (count == 0 || acked < count) {
            long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            if (left <= 0) {
                timedOut = true;
                break;
            }
            long wait = count == 0 ? Math.min(idleMs, left) : left;
            Message<Object> msg;
            try {
                msg = consumer.receive((int) Math.min(wait, Integer.MAX_VALUE), TimeUnit.MILLISECONDS);
            } catch (Exception e) {
                summary.put("error", "receive: " + rootMessage(e));
                break;
            }
            if (msg == null) {
                if (count > 0 || wait < idleMs) {
                    timedOut = true;
                }
                break;
            }
            received++;
            Map<String, Object> line = obj("kind", "msg");
            Object iv = -1;
            if (schemaName.equals("bytes")) {
                iv = indexOf(new String(msg.getData(), StandardCharsets.UTF_8));
            } else {
                try {
                    DriverRecord r = (DriverRecord) msg.getValue();
                    iv = r.i;
                    if (indexOf(r.text) != r.i) {
                        line.put("decode_error", "text does not match i");
                    }
                } catch (Exception e) {
                    line.put("decode_error", rootMessage(e));
                }
            }
            line.put("i", iv);
            line.put("key", msg.hasKey() ? msg.getKey() : null);
            line.put("props", new LinkedHashMap<String, Object>(msg.getProperties()));
            line.put("payload_len", msg.getData().length);
            line.put("msg_id", formatId(msg.getMessageId()));
            line.put("redelivery", msg.getRedeliveryCount());
            line.put("ordering_key", msg.hasOrderingKey()
                    ? new String(msg.getOrderingKey(), StandardCharsets.UTF_8) : null);
            line.put("seq", msg.getSequenceId());
            if (msg.getRedeliveryCount() > 0) {
                redelivered++;
            }
            if (nacked < nackFirst) {
                nacked++;
                line.put("nacked", true);
                consumer.negativeAcknowledge(msg);
            } else {
                consumer.acknowledge(msg);
                acked++;
            }
            emit(line);
        }
        summary.put("received", received);
        summary.put("acked", acked);
        summary.put("nacked", nacked);
        summary.put("redelivered", redelivered);
        summary.put("timed_out", timedOut);
        summary.put("elapsed_ms", TimeUnit.NANOSECONDS.toMillis(System.nanoTime() - start));
        // The result first: a close that hangs (a client's known failure under load) must not
        // cost the run its result. The close flushes the grouped acks before the exit.
        emit(summary);
        closeBounded(consumer.closeAsync(), "consumer");
        closeBounded(client.closeAsync(), "client");
        if (count > 0 && acked < count) {
            return EXIT_FAILED;
        }
        return summary.containsKey("error") ? EXIT_FAILED : EXIT_OK;
    }

    /** Waits up to 10 s for a close; a close that fails or hangs is reported on stderr. */
    static void closeBounded(CompletableFuture<Void> close, String what) {
        try {
            close.get(10, TimeUnit.SECONDS);
        } catch (Exception e) {
            System.err.println("close " + what + ": " + rootMessage(e));
        }
    }

    public static void main(String[] args) {
        int code;
        try {
            if (args.length < 1) {
                throw usage("usage: PulsarDriver produce|consume|version [flags]");
            }
            switch (args[0]) {
                case "produce": code = produce(args); break;
                case "consume": code = consume(args); break;
                case "version": emit(obj("kind", "version", "client", clientName())); code = EXIT_OK; break;
                case "schema-text":
                    emit(obj("kind", "schema", "declared", RECORD_SCHEMA,
                            "json", new String(schema("json").getSchemaInfo().getSchema(), StandardCharsets.UTF_8),
                            "avro", new String(schema("avro").getSchemaInfo().getSchema(), StandardCharsets.UTF_8)));
                    code = EXIT_OK;
                    break;
                default: throw usage("unknown subcommand " + args[0]);
            }
        } catch (Exit e) {
            code = e.code;
        } catch (Throwable t) {
            emit(obj("kind", "summary", "client", clientName(), "error", "driver: " + rootMessage(t)));
            code = EXIT_FAILED;
        }
        System.exit(code);
    }
}
