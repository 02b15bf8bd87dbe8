"""The Faust side of the point-lookup benchmark: a ``table_route`` worker over the bench's store.

A Faust Table (memory store) whose changelog topic is the topic Federator materializes (key:
UTF-8 string, value: Kafka's LongSerializer, 8 bytes big-endian), so the worker restores
every key at start as Faust restores any table, and a web view answers lookups by key from
it, the pattern of Faust's docs (``@app.page`` + ``@app.table_route``). (An agent copying the
topic into the table would also write every record to a changelog of its own: about 1,400
records/s here, against about 3,500/s for the restore.) Routes::

    GET /kv/<key>/   ->  {"key": "<key>", "value": <long>}   (value null for a key not there)
    GET /bench/size/ ->  {"keys": <keys in the table>}       (the bench waits for all of them)

It runs in its own virtualenv (``.venv-faust``, made by ``make bench`` from setup.cfg's
``bench`` extra), so it imports nothing of Federator. The bench starts it as
``.venv-faust/bin/python tests/bench/faust_app.py worker`` with its settings in the
environment: FAUST_BENCH_BROKER (host:port), FAUST_BENCH_TOPIC, FAUST_BENCH_PARTITIONS,
FAUST_BENCH_APP (the app id, so runs never share a group), FAUST_BENCH_PORT (web) and
FAUST_BENCH_DIR (Faust's data directory).
"""

from __future__ import annotations

import os

import faust
from faust.serializers import codecs

PARTITIONS = int(os.environ["FAUST_BENCH_PARTITIONS"])
PORT = int(os.environ["FAUST_BENCH_PORT"])

app = faust.App(
    os.environ["FAUST_BENCH_APP"],
    broker=f"kafka://{os.environ['FAUST_BENCH_BROKER']}",
    store="memory://",  # Faust's default table store
    topic_partitions=PARTITIONS,
    datadir=os.environ["FAUST_BENCH_DIR"],
    web_bind="127.0.0.1",
    web_host="127.0.0.1",
    web_port=PORT,
    web_in_thread=False,
    broker_session_timeout=6.0,
    broker_heartbeat_interval=1.0,
    broker_rebalance_timeout=6.0,
)



class LongCodec(codecs.Codec):
    """Kafka's LongSerializer: 8 bytes, big-endian, signed."""

    def _dumps(self, obj: int) -> bytes:
        return int(obj).to_bytes(8, "big", signed=True)

    def _loads(self, s: bytes) -> int:
        return int.from_bytes(s, "big", signed=True)


codecs.register("long", LongCodec())
changelog = app.topic(os.environ["FAUST_BENCH_TOPIC"], key_type=str, key_serializer="raw",
                      value_serializer="long", partitions=PARTITIONS)
table = app.Table("kv", default=None, partitions=PARTITIONS, changelog_topic=changelog, key_type=str)


@app.page("/kv/{key}/")
@app.table_route(table=table, match_info="key")
async def lookup(web, request, key):  # type: ignore[no-untyped-def]
    return web.json({"key": key, "value": table.get(key)})


@app.page("/bench/size/")
async def size(web, request):  # type: ignore[no-untyped-def]
    return web.json({"keys": len(table)})


if __name__ == "__main__":
    app.main()
