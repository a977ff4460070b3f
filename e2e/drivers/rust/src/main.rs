//! The pulsar-rs driver: the command line and JSON-lines output of e2e/drivers (README.md
//! beside this crate), for the subset this client and this driver implement. A flag outside
//! it is refused as unsupported (exit 3), never ignored.
//!
//! pulsar-rs is a Pulsar client written from the protocol (not on the C++ library), so it
//! behaves differently from the other drivers where the protocol leaves room: it numbers a
//! batch with one sequence id, and on a broker's CLOSE_CONSUMER it closes the consumer id
//! itself before it subscribes again.

use futures::TryStreamExt;
use pulsar::{
    compression::{Compression, CompressionLz4, CompressionSnappy, CompressionZlib, CompressionZstd},
    consumer::{ConsumerOptions, InitialPosition},
    message::proto::{command_subscribe::SubType, MessageIdData},
    producer,
    routing_policy::RoutingPolicy,
    Authentication, Consumer, OperationRetryOptions, Pulsar, TokioExecutor,
};
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::io::Write;
use std::time::{Duration, Instant};

const EXIT_OK: i32 = 0;
const EXIT_FAILED: i32 = 1;
const EXIT_USAGE: i32 = 2;
const EXIT_UNSUPPORTED: i32 = 3;
const CLIENT: &str = "rust-6.9.1";

fn emit(v: Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn usage(msg: &str) -> ! {
    emit(json!({"kind": "usage_error", "client": CLIENT, "error": msg}));
    std::process::exit(EXIT_USAGE)
}

fn unsupported(feature: &str, detail: &str) -> ! {
    emit(json!({"kind": "unsupported", "client": CLIENT, "feature": feature, "detail": detail}));
    std::process::exit(EXIT_UNSUPPORTED)
}

/// Flags as given: "--name value" or "--name=value"; a flag alone is "true".
struct Flags(HashMap<String, String>);

impl Flags {
    fn parse(args: &[String], known: &[&str], bools: &[&str]) -> Flags {
        let mut m = HashMap::new();
        let mut i = 0;
        while i < args.len() {
            let a = args[i].strip_prefix("--").unwrap_or_else(|| usage(&format!("unexpected argument {}", args[i])));
            let (name, value) = match a.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (a.to_string(), None),
            };
            if !known.contains(&name.as_str()) {
                refuse_flag(&name);
            }
            let value = match value {
                Some(v) => v,
                None if bools.contains(&name.as_str()) => "true".to_string(),
                None => {
                    i += 1;
                    args.get(i).cloned().unwrap_or_else(|| usage(&format!("--{name} needs a value")))
                }
            };
            m.insert(name, value);
            i += 1;
        }
        Flags(m)
    }
    fn str(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(|s| s.as_str())
    }
    fn need(&self, name: &str) -> String {
        self.str(name).map(str::to_string).unwrap_or_else(|| usage(&format!("--{name} is required")))
    }
    fn int(&self, name: &str, def: i64) -> i64 {
        match self.str(name) {
            None => def,
            Some(s) => s.parse().unwrap_or_else(|_| usage(&format!("--{name}: not a number: {s}"))),
        }
    }
    fn bool(&self, name: &str, def: bool) -> bool {
        match self.str(name) {
            None => def,
            Some("true") => true,
            Some("false") => false,
            Some(s) => usage(&format!("--{name}: not true or false: {s}")),
        }
    }
}

/// A flag of the shared command line that this driver does not implement, with the feature
/// name the drivers package knows it by where it has one.
fn refuse_flag(name: &str) -> ! {
    match name {
        "chunking" => unsupported("chunking", "pulsar-rs has no producer chunking"),
        "chunk-size" => unsupported("chunk-size", "pulsar-rs has no producer chunking"),
        "ordering-key" => unsupported("ordering-key", "pulsar-rs's message builder has no ordering key in this driver"),
        "sticky-ranges" => unsupported("key_shared_sticky", "this driver does not set Key_Shared sticky ranges"),
        "empty-key" | "seq-scramble" | "txn" => unsupported(name, "a Java driver flag"),
        "" => usage("empty flag"),
        _ => unsupported(name, "not implemented by the pulsar-rs driver"),
    }
}

fn format_id(id: &MessageIdData) -> String {
    format!("{}:{}:{}:{}", id.ledger_id, id.entry_id, id.partition.unwrap_or(-1), id.batch_index.unwrap_or(-1))
}

async fn client(f: &Flags) -> Result<Pulsar<TokioExecutor>, pulsar::Error> {
    let url = f.need("url");
    if url.starts_with("http://") || url.starts_with("https://") {
        unsupported("http-lookup", "pulsar-rs takes pulsar:// and pulsar+ssl:// service URLs only (no HTTP lookup)");
    }
    if f.str("tls-cert-file").is_some() || f.str("tls-key-file").is_some() {
        unsupported("tls-cert", "pulsar-rs has no TLS client-certificate authentication");
    }
    // pulsar-rs retries an operation the broker refuses as busy or not ready (a second consumer
    // of an Exclusive subscription: ConsumerBusy) every 5 s for ever by default, where the other
    // clients fail it at once; two retries let such a refusal reach the caller. It has no send
    // timeout of its own: a send is one of its operations, bounded by the operation timeout
    // (--send-timeout-ms 0, none: the longest it takes).
    let mut retry = OperationRetryOptions { max_retries: Some(2), ..Default::default() };
    if let Some(ms) = f.str("send-timeout-ms") {
        let ms: u64 = ms.parse().unwrap_or_else(|_| usage(&format!("--send-timeout-ms: not a number: {ms}")));
        retry.operation_timeout = if ms == 0 { Duration::from_secs(u32::MAX as u64) } else { Duration::from_millis(ms) };
    }
    let mut b = Pulsar::builder(url, TokioExecutor).with_operation_retry_options(retry);
    if let Some(tok) = f.str("token") {
        b = b.with_auth(Authentication { name: "token".to_string(), data: tok.as_bytes().to_vec() });
    }
    if let Some(ca) = f.str("tls-trust-certs") {
        b = b
            .with_certificate_chain_file(ca)
            .map_err(|e| pulsar::Error::Custom(format!("reading {ca}: {e}")))?
            .with_tls_hostname_verification_enabled(true);
    }
    b.build().await
}

/// Per-message property values: "{i}" and "{i%N}" expanded.
fn expand(v: &str, i: i64) -> String {
    let mut out = String::new();
    let mut rest = v;
    while let Some(start) = rest.find('{') {
        out.push_str(&rest[..start]);
        let Some(end) = rest[start..].find('}') else { break };
        let inner = &rest[start + 1..start + end];
        if inner == "i" {
            out.push_str(&i.to_string());
        } else if let Some(n) = inner.strip_prefix("i%").and_then(|n| n.parse::<i64>().ok()).filter(|n| *n > 0) {
            out.push_str(&(i % n).to_string());
        } else {
            out.push_str(&rest[start..start + end + 1]);
        }
        rest = &rest[start + end + 1..];
    }
    out.push_str(rest);
    out
}

/// The first fields of a run's summary line.
fn summary_head(op: &str, count: i64) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("kind".into(), json!("summary"));
    m.insert("op".into(), json!(op));
    m.insert("client".into(), json!(CLIENT));
    m.insert("count".into(), json!(count));
    m
}

const PRODUCE_FLAGS: &[&str] = &[
    "url", "topic", "count", "batching", "batch-max-messages", "batch-max-bytes", "batch-delay-ms", "batcher",
    "key-mode", "keys", "properties", "compression", "size", "schema", "sync", "producer-name", "token",
    "tls-trust-certs", "tls-cert-file", "tls-key-file", "send-timeout-ms", "timeout-ms",
];

async fn produce(f: Flags) -> i32 {
    let start = Instant::now();
    let count = f.int("count", 0);
    let mut summary = summary_head("produce", count);
    if !matches!(f.str("schema"), None | Some("bytes")) {
        unsupported("schema", "this driver sends bytes only");
    }
    if matches!(f.str("batcher"), Some(b) if b != "default") {
        unsupported("batcher", "pulsar-rs has one batcher (one batch per producer)");
    }
    let compression = match f.str("compression") {
        None | Some("none") => None,
        Some("lz4") => Some(Compression::Lz4(CompressionLz4::default())),
        Some("zlib") => Some(Compression::Zlib(CompressionZlib::default())),
        Some("zstd") => Some(Compression::Zstd(CompressionZstd::default())),
        Some("snappy") => Some(Compression::Snappy(CompressionSnappy::default())),
        Some(c) => usage(&format!("--compression: unknown {c}")),
    };
    let key_mode = f.str("key-mode").unwrap_or("none").to_string();
    let keys = f.int("keys", 10).max(1);
    let size = f.int("size", 0).max(0) as usize;
    let sync = f.bool("sync", false);
    let props: Vec<(String, String)> = f
        .str("properties")
        .unwrap_or("")
        .split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())).unwrap_or_else(|| usage(&format!("--properties: {kv} is not k=v"))))
        .collect();
    // The shared command line's default is batching on, as in the other clients; pulsar-rs
    // batches only when given a batch size.
    // Partitioned topics: pulsar-rs's default (no routing policy) sends round robin whatever
    // the key; its RoundRobin policy routes a keyed message by the key's hash, as the other
    // clients do by default.
    let mut opts = producer::ProducerOptions {
        compression,
        block_queue_if_full: true,
        routing_policy: Some(RoutingPolicy::RoundRobin),
        ..Default::default()
    };
    if f.bool("batching", true) {
        let n = f.int("batch-max-messages", 1000);
        let bytes = f.int("batch-max-bytes", 128 * 1024);
        let delay = f.int("batch-delay-ms", 10);
        if n < 1 || bytes < 1 || delay < 0 {
            usage("--batch-max-messages and --batch-max-bytes must be positive, --batch-delay-ms not negative");
        }
        opts.batch_size = Some(n as u32); // 1: pulsar-rs sends each message on its own
        opts.batch_byte_size = Some(bytes as usize);
        opts.batch_timeout = Some(Duration::from_millis(delay as u64));
    }
    let pulsar = match client(&f).await {
        Ok(p) => p,
        Err(e) => {
            summary.insert("acked".into(), json!(0));
            summary.insert("failed".into(), json!(count));
            summary.insert("error".into(), json!(format!("client: {e}")));
            emit(Value::Object(summary));
            return EXIT_FAILED;
        }
    };
    let mut pb = pulsar.producer().with_topic(f.need("topic")).with_options(opts);
    if let Some(n) = f.str("producer-name") {
        pb = pb.with_name(n);
    }
    let mut p = match pb.build().await {
        Ok(p) => p,
        Err(e) => {
            summary.insert("acked".into(), json!(0));
            summary.insert("failed".into(), json!(count));
            summary.insert("error".into(), json!(format!("create producer: {e}")));
            emit(Value::Object(summary));
            return EXIT_FAILED;
        }
    };
    let mut rng: u64 = start.elapsed().as_nanos() as u64 ^ 0x9e37_79b9_7f4a_7c15 ^ std::process::id() as u64;
    let mut pending = Vec::new();
    let (mut acked, mut first_error) = (0i64, None::<String>);
    let mut report = |i: i64, key: &Option<String>, r: Result<pulsar::message::proto::CommandSendReceipt, pulsar::Error>, with_seq: bool| match r {
        Ok(rc) => {
            let id = rc.message_id.as_ref().map(format_id).unwrap_or_default();
            let seq = if with_seq { json!(rc.sequence_id) } else { Value::Null };
            emit(json!({"kind": "ack", "i": i, "key": key, "msg_id": id, "seq": seq}));
            acked += 1;
        }
        Err(e) => {
            let e = e.to_string();
            emit(json!({"kind": "error", "i": i, "key": key, "error": e}));
            first_error.get_or_insert(e);
        }
    };
    for i in 0..count {
        let key = match key_mode.as_str() {
            "none" => None,
            "fixed" => Some("key-0".to_string()),
            "seq" => Some(format!("key-{}", i % keys)),
            "random" => {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                Some(format!("key-{}", rng % keys as u64))
            }
            m => usage(&format!("--key-mode: unknown {m}")),
        };
        let mut payload = format!("msg-{i}").into_bytes();
        if payload.len() < size {
            payload.resize(size, b'.');
        }
        let mut m = p.create_message().with_content(payload);
        if let Some(k) = &key {
            m = m.with_key(k.clone());
        }
        for (k, v) in &props {
            m = m.with_property(k.clone(), expand(v, i));
        }
        match m.send_non_blocking().await {
            Ok(fut) if sync => report(i, &key, fut.await, true),
            Ok(fut) => pending.push((i, key, fut)),
            Err(e) => report(i, &key, Err(e), false),
        }
    }
    for (i, key, fut) in pending {
        report(i, &key, fut.await, false);
    }
    summary.insert("acked".into(), json!(acked));
    summary.insert("failed".into(), json!(count - acked));
    if let Some(e) = first_error {
        summary.insert("error".into(), json!(e));
    }
    summary.insert("elapsed_ms".into(), json!(start.elapsed().as_millis() as u64));
    if let Err(e) = p.close().await {
        emit(json!({"kind": "warning", "detail": format!("close: {e}")}));
    }
    emit(Value::Object(summary));
    if acked == count { EXIT_OK } else { EXIT_FAILED }
}

const CONSUME_FLAGS: &[&str] = &[
    "url", "topic", "sub", "type", "count", "idle-ms", "timeout-ms", "schema", "token", "tls-trust-certs",
    "tls-cert-file", "tls-key-file", "initial-position", "consumer-name",
];

async fn consume(f: Flags, deadline: Instant) -> i32 {
    let start = Instant::now();
    let count = f.int("count", 0);
    let idle = Duration::from_millis(f.int("idle-ms", 5000).max(1) as u64);
    let mut summary = summary_head("consume", count);
    if !matches!(f.str("schema"), None | Some("bytes")) {
        unsupported("schema", "this driver reads bytes only");
    }
    let sub_type = match f.str("type").unwrap_or("exclusive") {
        "exclusive" => SubType::Exclusive,
        "shared" => SubType::Shared,
        "failover" => SubType::Failover,
        "key_shared" => SubType::KeyShared,
        t => usage(&format!("--type: unknown {t}")),
    };
    let position = match f.str("initial-position").unwrap_or("earliest") {
        "earliest" => InitialPosition::Earliest,
        "latest" => InitialPosition::Latest,
        p => usage(&format!("--initial-position: unknown {p}")),
    };
    let fail = |mut summary: Map<String, Value>, e: String| {
        summary.insert("error".into(), json!(e));
        emit(Value::Object(summary));
        EXIT_FAILED
    };
    let pulsar = match client(&f).await {
        Ok(p) => p,
        Err(e) => return fail(summary, format!("client: {e}")),
    };
    let mut cb = pulsar
        .consumer()
        .with_topic(f.need("topic"))
        .with_subscription(f.need("sub"))
        .with_subscription_type(sub_type)
        .with_options(ConsumerOptions::default().with_initial_position(position));
    if let Some(n) = f.str("consumer-name") {
        cb = cb.with_consumer_name(n);
    }
    let mut c: Consumer<Vec<u8>, _> = match cb.build().await {
        Ok(c) => c,
        Err(e) => return fail(summary, format!("subscribe: {e}")),
    };
    emit(json!({"kind": "ready", "client": CLIENT}));
    let (mut received, mut acked, mut timed_out) = (0i64, 0i64, false);
    let mut error = None;
    while count == 0 || received < count {
        let now = Instant::now();
        if now >= deadline {
            timed_out = count > 0;
            break;
        }
        // With --count the run waits until the deadline; without, until --idle-ms passes
        // without a message.
        let wait = if count > 0 { deadline - now } else { idle.min(deadline - now) };
        let m = match tokio::time::timeout(wait, c.try_next()).await {
            Ok(Ok(Some(m))) => m,
            Ok(Ok(None)) => break,
            Ok(Err(e)) => {
                error = Some(format!("receive: {e}"));
                break;
            }
            Err(_) => {
                timed_out = count > 0;
                break;
            }
        };
        received += 1;
        let md = &m.payload.metadata;
        let text = String::from_utf8_lossy(&m.payload.data);
        let i: i64 = text.strip_prefix("msg-").map(|s| s.trim_end_matches('.')).and_then(|s| s.parse().ok()).unwrap_or(-1);
        let props: Map<String, Value> = md.properties.iter().map(|kv| (kv.key.clone(), json!(kv.value))).collect();
        let ordering_key = md.ordering_key.as_ref().map(|k| String::from_utf8_lossy(k).into_owned());
        emit(json!({"kind": "msg", "i": i, "key": md.partition_key, "props": props, "payload_len": m.payload.data.len(),
            "msg_id": format_id(&m.message_id.id), "redelivery": 0, "ordering_key": ordering_key, "nacked": false}));
        match c.ack(&m).await {
            Ok(()) => acked += 1,
            Err(e) => {
                error = Some(format!("ack: {e}"));
                break;
            }
        }
    }
    summary.insert("received".into(), json!(received));
    summary.insert("acked".into(), json!(acked));
    summary.insert("nacked".into(), json!(0));
    summary.insert("timed_out".into(), json!(timed_out));
    // pulsar-rs's Message does not carry the broker's redelivery count.
    summary.insert("unobservable".into(), json!(["redelivery"]));
    summary.insert("elapsed_ms".into(), json!(start.elapsed().as_millis() as u64));
    let failed = error.is_some() || timed_out;
    if let Some(e) = error {
        summary.insert("error".into(), json!(e));
    }
    if let Err(e) = c.close().await {
        emit(json!({"kind": "warning", "detail": format!("close: {e}")}));
    }
    emit(Value::Object(summary));
    if failed { EXIT_FAILED } else { EXIT_OK }
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(op) = args.first() else { usage("want produce, consume or version") };
    let code = match op.as_str() {
        "version" => {
            emit(json!({"kind": "version", "client": CLIENT}));
            EXIT_OK
        }
        "produce" | "consume" => {
            let known = if op == "produce" { PRODUCE_FLAGS } else { CONSUME_FLAGS };
            let f = Flags::parse(&args[1..], known, &["batching", "sync"]);
            let limit = Duration::from_millis(f.int("timeout-ms", 120_000).max(1) as u64);
            let deadline = Instant::now() + limit;
            let run = async {
                if op == "produce" { produce(f).await } else { consume(f, deadline).await }
            };
            match tokio::time::timeout(limit + Duration::from_secs(5), run).await {
                Ok(code) => code,
                Err(_) => {
                    emit(json!({"kind": "summary", "op": op, "client": CLIENT, "timed_out": true,
                        "error": "deadline reached before the run completed"}));
                    EXIT_FAILED
                }
            }
        }
        o => usage(&format!("unknown operation {o}")),
    };
    std::process::exit(code)
}
