"""Python test driver for the PyPI pulsar-client package.

One source, run by each pinned pulsar-client version's own venv (see ../README.md for the CLI
contract shared with the Go and Java drivers). Features are detected from the installed package's
API; a missing one is reported as unsupported (exit 3), never silently replaced.
"""

import argparse
import faulthandler
import inspect
import json
import os
import random
import re
import sys
import threading
import time

import pulsar
from pulsar.schema import AvroSchema, Integer, JsonSchema, Record, String

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_UNSUPPORTED = 0, 1, 2, 3

_out_lock = threading.Lock()


def client_name():
    try:
        from importlib.metadata import version
        return "python-" + version("pulsar-client")
    except Exception:  # pragma: no cover - metadata always present in a venv install
        return "python-unknown"


def emit(obj):
    line = json.dumps(obj, separators=(",", ":"))
    with _out_lock:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Exit(Exception):
    def __init__(self, code):
        super().__init__(code)
        self.code = code


def unsupported(feature, detail):
    emit({"kind": "unsupported", "client": client_name(), "feature": feature, "detail": detail})
    return Exit(EXIT_UNSUPPORTED)


def usage(msg):
    emit({"kind": "usage_error", "client": client_name(), "error": msg})
    return Exit(EXIT_USAGE)


class DriverRecord(Record):
    """Value type of --schema json|avro; renders the same schema text as the Go and Java drivers."""
    _avro_namespace = "rebatchproxy.drivers"
    i = Integer(required=True)
    text = String(required=True)


def make_schema(name):
    if name == "bytes":
        return None
    if name == "json":
        return JsonSchema(DriverRecord)
    if name == "avro":
        return AvroSchema(DriverRecord)
    raise usage("unknown --schema %s" % name)


def payload_text(i, size):
    s = "msg-%d" % i
    return s + "." * (size - len(s)) if len(s) < size else s


_INDEX = re.compile(r"^msg-(\d+)")


def index_of(text):
    m = _INDEX.match(text)
    return int(m.group(1)) if m else -1


_PLACEHOLDER = re.compile(r"\{i(?:%(\d+))?\}")


def expand(value, i):
    def repl(m):
        n = int(m.group(1)) if m.group(1) else 0
        return str(i % n if n > 0 else i)
    return _PLACEHOLDER.sub(repl, value)


def format_id(mid):
    return "%d:%d:%d:%d" % (mid.ledger_id(), mid.entry_id(), mid.partition(), mid.batch_index())


def root_message(e):
    return "%s: %s" % (type(e).__name__, e)


def client_logger():
    """C++ client logs go to stderr (the default console logger writes to stdout, which is ours).

    A native file logger is used rather than a Python logging.Logger: with the latter, pulsar-client
    3.13.0 intermittently aborts at interpreter exit ("terminate called without an active exception").
    """
    level = pulsar.LoggerLevel.Debug if os.environ.get("DRIVER_DEBUG") else pulsar.LoggerLevel.Warn
    return pulsar.FileLogger(level, "/dev/stderr")


def make_client(a):
    # The client's own retries are bounded by the run's deadline as well.
    kw = dict(operation_timeout_seconds=max(1, min(30, a.timeout_ms // 1000)),
              connection_timeout_ms=max(1000, min(10000, a.timeout_ms)), logger=client_logger())
    if a.token:
        kw["authentication"] = pulsar.AuthenticationToken(a.token)
    if a.tls_cert_file:
        kw["authentication"] = pulsar.AuthenticationTLS(a.tls_cert_file, a.tls_key_file)
    if a.tls_trust_certs:
        kw.update(tls_trust_certs_file_path=a.tls_trust_certs, tls_validate_hostname=True,
                  tls_allow_insecure_connection=False)
    return pulsar.Client(a.url, **kw)


class Parser(argparse.ArgumentParser):
    def error(self, message):
        raise usage(message)


def str2bool(v):
    if v in ("true", "1", "True"):
        return True
    if v in ("false", "0", "False"):
        return False
    raise usage("bad boolean %r" % v)


def produce(argv):
    p = Parser(prog="driver.py produce", allow_abbrev=False)
    p.add_argument("--url", default="pulsar://127.0.0.1:6650")
    p.add_argument("--topic", required=True)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--batching", type=str2bool, nargs="?", const=True, default=None)
    p.add_argument("--batch-max-messages", type=int, default=0)
    p.add_argument("--batch-max-bytes", type=int, default=0)
    p.add_argument("--batch-delay-ms", type=int, default=-1)
    p.add_argument("--batcher", default="default")
    p.add_argument("--key-mode", default="none")
    p.add_argument("--keys", type=int, default=10)
    p.add_argument("--ordering-key", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--properties", default="")
    p.add_argument("--compression", default="none")
    p.add_argument("--chunking", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--chunk-size", type=int, default=0)
    p.add_argument("--size", type=int, default=0)
    p.add_argument("--schema", default="bytes")
    p.add_argument("--sync", type=str2bool, nargs="?", const=True, default=False)
    p.add_argument("--producer-name", default="")
    p.add_argument("--token", default="")
    p.add_argument("--tls-trust-certs", default="")
    p.add_argument("--tls-cert-file", default="")
    p.add_argument("--tls-key-file", default="")
    p.add_argument("--send-timeout-ms", type=int, default=-1)
    p.add_argument("--seq-start", type=int, default=-1)
    p.add_argument("--timeout-ms", type=int, default=120000)
    a = p.parse_args(argv)
    watchdog(a.timeout_ms)

    if a.keys <= 0:
        raise usage("--keys must be > 0")
    if a.key_mode not in ("none", "fixed", "random", "seq"):
        raise usage("unknown --key-mode %s" % a.key_mode)
    templates = []
    if a.properties:
        for kv in a.properties.split(","):
            k, sep, v = kv.partition("=")
            if not sep or not k:
                raise usage("bad property %r (want k=v)" % kv)
            templates.append((k, v))
    compressions = {"none": pulsar.CompressionType.NONE, "lz4": pulsar.CompressionType.LZ4,
                    "zlib": pulsar.CompressionType.ZLib, "zstd": pulsar.CompressionType.ZSTD}
    if hasattr(pulsar.CompressionType, "SNAPPY"):
        compressions["snappy"] = pulsar.CompressionType.SNAPPY
    if a.compression not in compressions:
        if a.compression == "snappy":
            raise unsupported("compression=snappy", "this pulsar-client has no SNAPPY")
        raise usage("unknown --compression %s" % a.compression)
    schema = make_schema(a.schema)
    batching = a.batching if a.batching is not None else not a.chunking
    if a.chunk_size > 0:
        if not a.chunking:
            raise usage("--chunk-size needs --chunking")
        raise unsupported("chunk-size", "the Python client has no chunk size setting "
                          "(chunks follow the broker's max message size)")
    create_params = inspect.signature(pulsar.Client.create_producer).parameters
    if a.chunking and "chunking_enabled" not in create_params:
        raise unsupported("chunking", "create_producer has no chunking_enabled")
    send_params = inspect.signature(pulsar.Producer.send).parameters
    if a.ordering_key and "ordering_key" not in send_params:
        raise unsupported("ordering-key", "Producer.send has no ordering_key in this version")
    if a.batcher not in ("default", "key-based"):
        raise usage("unknown --batcher %s" % a.batcher)

    kw = dict(compression_type=compressions[a.compression], batching_enabled=batching,
              block_if_queue_full=True)
    if schema is not None:
        kw["schema"] = schema
    if a.chunking:
        kw["chunking_enabled"] = True
    if a.producer_name:
        kw["producer_name"] = a.producer_name
    if a.batch_max_messages > 0:
        kw["batching_max_messages"] = a.batch_max_messages
    if a.batch_max_bytes > 0:
        kw["batching_max_allowed_size_in_bytes"] = a.batch_max_bytes
    if a.batch_delay_ms >= 0:
        kw["batching_max_publish_delay_ms"] = a.batch_delay_ms
    if a.batcher == "key-based":
        kw["batching_type"] = pulsar.BatchingType.KeyBased
    if a.send_timeout_ms >= 0:
        kw["send_timeout_millis"] = a.send_timeout_ms

    start = time.monotonic()
    summary = {"kind": "summary", "op": "produce", "client": client_name(), "count": a.count}
    try:
        client = make_client(a)
        producer = client.create_producer(a.topic, **kw)
    except Exception as e:  # connection or configuration failure
        summary.update(acked=0, failed=a.count, error="create producer: " + root_message(e))
        emit(summary)
        return EXIT_FAILED

    rng = random.Random()
    state = {"acked": 0, "failed": 0, "first_error": None, "done": 0}
    cond = threading.Condition()

    def report(i, key, mid, seq, err):
        with cond:
            if err is not None:
                state["failed"] += 1
                state["first_error"] = state["first_error"] or err
                emit({"kind": "error", "i": i, "key": key, "error": err})
            else:
                state["acked"] += 1
                emit({"kind": "ack", "i": i, "key": key, "msg_id": format_id(mid), "seq": seq})
            state["done"] += 1
            cond.notify_all()

    deadline = time.monotonic() + a.timeout_ms / 1000.0
    sent = 0
    for i in range(a.count):
        text = payload_text(i, a.size)
        content = text.encode() if schema is None else DriverRecord(i=i, text=text)
        key = None
        if a.key_mode == "fixed":
            key = "key-0"
        elif a.key_mode == "seq":
            key = "key-%d" % (i % a.keys)
        elif a.key_mode == "random":
            key = "key-%d" % rng.randrange(a.keys)
        skw = {}
        if key is not None:
            skw["partition_key"] = key
            if a.ordering_key:
                skw["ordering_key"] = key
        if templates:
            skw["properties"] = {k: expand(v, i) for k, v in templates}
        explicit_seq = None
        if a.seq_start >= 0:
            explicit_seq = a.seq_start + i
            skw["sequence_id"] = explicit_seq
        sent += 1
        if a.sync:
            try:
                mid = producer.send(content, **skw)
                seq = explicit_seq if explicit_seq is not None else producer.last_sequence_id()
                report(i, key, mid, seq, None)
            except Exception as e:
                report(i, key, None, None, root_message(e))
            if time.monotonic() > deadline:
                break
            continue

        def callback(res, mid, i=i, key=key, seq=explicit_seq):
            # The client does not say which sequence id an async send got unless it was explicit.
            if res == pulsar.Result.Ok:
                report(i, key, mid, seq, None)
            else:
                report(i, key, None, None, "send failed: %s" % res)
        try:
            producer.send_async(content, callback, **skw)
        except Exception as e:
            report(i, key, None, None, root_message(e))
    if not a.sync:
        def wait_done(until):
            with cond:
                while state["done"] < sent:
                    left = until - time.monotonic()
                    if left <= 0:
                        return False
                    cond.wait(left)
            return True
        # The batching timer sends what is left; flush() only if it has not done so by then.
        # pulsar-client 3.1.0's flush holds the interpreter lock while it waits for the sends,
        # whose callbacks need that lock: called while callbacks are due, it never returns.
        delay = (a.batch_delay_ms if a.batch_delay_ms >= 0 else 10) / 1000.0
        if not wait_done(min(deadline, time.monotonic() + delay + 2.0)) and batching:
            try:
                producer.flush()
            except Exception as e:
                emit({"kind": "warning", "detail": "flush: " + root_message(e)})
        if not wait_done(deadline):
            emit({"kind": "warning", "detail": "deadline reached before every send completed"})
    with cond:
        summary["acked"] = state["acked"]
        summary["failed"] = a.count - state["acked"]
        if state["first_error"]:
            summary["error"] = state["first_error"]
    summary["last_seq"] = producer.last_sequence_id()
    summary["producer_name"] = producer.producer_name()
    summary["elapsed_ms"] = int((time.monotonic() - start) * 1000)
    try:
        producer.close()
        client.close()
    except Exception as e:
        emit({"kind": "warning", "detail": "close: " + root_message(e)})
    emit(summary)
    sys.stdout.flush()
    # Leave without waiting for the client's own threads at interpreter exit.
    os._exit(EXIT_OK if summary["acked"] == a.count else EXIT_FAILED)


def watchdog(timeout_ms):
    # A client call that never returns (seen once: a python-3.1.0 producer outlived its own
    # deadline by 45 s with nothing on stderr) must not hang the run silently: 15 s past the
    # deadline, every thread's stack goes to stderr and the process exits 1.
    faulthandler.dump_traceback_later(timeout_ms / 1000.0 + 15, exit=True)


def parse_ranges(s):
    out = []
    for r in s.split(","):
        x, sep, y = r.strip().partition("-")
        try:
            lo, hi = int(x), int(y)
        except ValueError:
            raise usage("bad range %r (want a-b)" % r)
        if not sep or lo < 0 or hi < lo or hi > 65535:
            raise usage("bad range %r" % r)
        out.append((lo, hi))
    return out


def consume(argv):
    p = Parser(prog="driver.py consume", allow_abbrev=False)
    p.add_argument("--url", default="pulsar://127.0.0.1:6650")
    p.add_argument("--topic", required=True)
    p.add_argument("--sub", required=True)
    p.add_argument("--type", default="exclusive")
    p.add_argument("--sticky-ranges", default="")
    p.add_argument("--count", type=int, default=0)
    p.add_argument("--timeout-ms", type=int, default=60000)
    p.add_argument("--idle-ms", type=int, default=3000)
    p.add_argument("--nack-first", type=int, default=0)
    p.add_argument("--nack-delay-ms", type=int, default=300)
    p.add_argument("--schema", default="bytes")
    p.add_argument("--token", default="")
    p.add_argument("--tls-trust-certs", default="")
    p.add_argument("--tls-cert-file", default="")
    p.add_argument("--tls-key-file", default="")
    p.add_argument("--initial-position", default="earliest")
    p.add_argument("--consumer-name", default="")
    a = p.parse_args(argv)
    watchdog(a.timeout_ms)

    types = {"exclusive": pulsar.ConsumerType.Exclusive, "shared": pulsar.ConsumerType.Shared,
             "failover": pulsar.ConsumerType.Failover, "key_shared": pulsar.ConsumerType.KeyShared}
    if a.type not in types:
        raise usage("unknown --type %s" % a.type)
    positions = {"earliest": pulsar.InitialPosition.Earliest, "latest": pulsar.InitialPosition.Latest}
    if a.initial_position not in positions:
        raise usage("unknown --initial-position %s" % a.initial_position)
    schema = make_schema(a.schema)
    kw = dict(consumer_type=types[a.type], initial_position=positions[a.initial_position],
              negative_ack_redelivery_delay_ms=a.nack_delay_ms)
    if schema is not None:
        kw["schema"] = schema
    if a.consumer_name:
        kw["consumer_name"] = a.consumer_name
    if a.sticky_ranges:
        if a.type != "key_shared":
            raise usage("--sticky-ranges needs --type key_shared")
        ranges = parse_ranges(a.sticky_ranges)
        if not hasattr(pulsar, "ConsumerKeySharedPolicy") or \
                "key_shared_policy" not in inspect.signature(pulsar.Client.subscribe).parameters:
            raise unsupported("key_shared_sticky", "subscribe has no key_shared_policy in this version")
        kw["key_shared_policy"] = pulsar.ConsumerKeySharedPolicy(
            key_shared_mode=pulsar.KeySharedMode.Sticky, sticky_ranges=ranges)
    ordering_key_observable = hasattr(pulsar.Message, "ordering_key")

    start = time.monotonic()
    summary = {"kind": "summary", "op": "consume", "client": client_name(), "count": a.count}
    try:
        client = make_client(a)
        consumer = client.subscribe(a.topic, a.sub, **kw)
    except Exception as e:
        summary["error"] = "subscribe: " + root_message(e)
        emit(summary)
        return EXIT_FAILED
    emit({"kind": "ready", "client": client_name()})

    received = acked = nacked = redelivered = 0
    timed_out = False
    deadline = time.monotonic() + a.timeout_ms / 1000.0
    while a.count == 0 or acked < a.count:
        left_ms = int((deadline - time.monotonic()) * 1000)
        if left_ms <= 0:
            timed_out = True
            break
        wait = min(a.idle_ms, left_ms) if a.count == 0 else left_ms
        try:
            msg = consumer.receive(timeout_millis=max(1, wait))
        except pulsar.Timeout:
            if a.count > 0 or wait < a.idle_ms:
                timed_out = True
            break
        except Exception as e:
            summary["error"] = "receive: " + root_message(e)
            break
        received += 1
        line = {"kind": "msg"}
        data = msg.data()
        if schema is None:
            line["i"] = index_of(data.decode("utf-8", "replace"))
        else:
            try:
                r = msg.value()
                line["i"] = r.i
                if index_of(r.text) != r.i:
                    line["decode_error"] = "text does not match i"
            except Exception as e:
                line["i"] = -1
                line["decode_error"] = root_message(e)
        try:
            line["key"] = msg.partition_key() or None
        except UnicodeDecodeError as e:
            # This client decodes keys as UTF-8 and cannot hand out others.
            line["key"] = None
            line["key_error"] = root_message(e)
        line["props"] = msg.properties() or {}
        line["payload_len"] = len(data)
        line["msg_id"] = format_id(msg.message_id())
        line["redelivery"] = msg.redelivery_count()
        if ordering_key_observable:
            line["ordering_key"] = msg.ordering_key() or None
        if msg.redelivery_count() > 0:
            redelivered += 1
        if nacked < a.nack_first:
            nacked += 1
            line["nacked"] = True
            consumer.negative_acknowledge(msg)
        else:
            consumer.acknowledge(msg)
            acked += 1
        emit(line)
    summary.update(received=received, acked=acked, nacked=nacked, redelivered=redelivered,
                   timed_out=timed_out, elapsed_ms=int((time.monotonic() - start) * 1000))
    if not ordering_key_observable:
        summary["unobservable"] = ["ordering_key"]
    try:
        consumer.close()
        client.close()
    except Exception as e:
        emit({"kind": "warning", "detail": "close: " + root_message(e)})
    emit(summary)
    if a.count > 0 and acked < a.count:
        return EXIT_FAILED
    return EXIT_FAILED if "error" in summary else EXIT_OK


def main(argv):
    try:
        if not argv:
            raise usage("usage: driver.py produce|consume|version [flags]")
        cmd, rest = argv[0], argv[1:]
        if cmd == "produce":
            return produce(rest)
        if cmd == "consume":
            return consume(rest)
        if cmd == "version":
            emit({"kind": "version", "client": client_name()})
            return EXIT_OK
        raise usage("unknown subcommand %s" % cmd)
    except Exit as e:
        return e.code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
