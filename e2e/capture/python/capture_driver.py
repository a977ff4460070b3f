"""Drives one capture scenario with the PyPI pulsar-client (C++ core).

Run by e2e/capture with the flags of Scenario.Args plus --url and
--topic: subscribe, produce, receive and acknowledge every message, close.
Exit 0 on success, 3 when this client cannot do what the scenario asks.
"""

import argparse
import sys

import pulsar


def flag(v):
    return v == "true"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--scenario", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--batching", type=flag, default=False)
    p.add_argument("--key-based", type=flag, default=False)
    p.add_argument("--compression", default="none")
    p.add_argument("--keys", type=flag, default=False)
    p.add_argument("--ordering-key", type=flag, default=False)
    p.add_argument("--properties", type=flag, default=False)
    p.add_argument("--chunking", type=flag, default=False)
    p.add_argument("--chunk-size", type=int, default=0)
    p.add_argument("--size", type=int, default=16)
    a = p.parse_args()

    codecs = {
        "none": pulsar.CompressionType.NONE,
        "lz4": pulsar.CompressionType.LZ4,
        "zlib": pulsar.CompressionType.ZLib,
        "zstd": pulsar.CompressionType.ZSTD,
        "snappy": pulsar.CompressionType.SNAPPY,
    }
    # The C++ client chunks at the broker's max_message_size; the relay
    # lowers it for chunking scenarios, so --chunk-size is not needed.
    client = pulsar.Client(a.url, operation_timeout_seconds=30,
                           logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    try:
        consumer = client.subscribe(a.topic, "golden",
                                    initial_position=pulsar.InitialPosition.Earliest)
        producer = client.create_producer(
            a.topic,
            producer_name="golden-" + a.scenario,
            compression_type=codecs[a.compression],
            batching_enabled=a.batching,
            batching_max_messages=max(a.count, 2),  # the C++ client wants > 1
            batching_max_publish_delay_ms=10000,
            batching_type=pulsar.BatchingType.KeyBased if a.key_based else pulsar.BatchingType.Default,
            chunking_enabled=a.chunking,
        )
        results = []
        for i in range(a.count):
            # Same conventions as the e2e drivers: "msg-<i>" padded with
            # dots, keys key-<i%8>, ordering key = key, index and region
            # properties.
            payload = ("msg-%d" % i).ljust(a.size, ".").encode()
            kw = {"event_timestamp": 1700000000000 + i}
            if a.keys:
                kw["partition_key"] = "key-%d" % (i % 8)
                if a.ordering_key:
                    kw["ordering_key"] = kw["partition_key"]
            if a.properties:
                kw["properties"] = {"index": str(i), "region": str(i % 2)}
            if a.batching:
                producer.send_async(payload, lambda res, _id: results.append(res), **kw)
            else:
                producer.send(payload, **kw)
        producer.flush()
        bad = [r for r in results if r != pulsar.Result.Ok]
        if bad:
            print("send failed: %s" % bad, file=sys.stderr)
            return 1
        for _ in range(a.count):
            msg = consumer.receive(timeout_millis=30000)
            consumer.acknowledge(msg)
        producer.close()
        consumer.close()
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
