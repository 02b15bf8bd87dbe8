"""Write any Spark DataFrame into a Federator store.

``write_store(df, "name", key="player", value=[...], bootstrap_servers=..., application_id=...)``
registers the store in the catalog (or checks the definition already there), then produces
every row from the Spark partition that holds it, with confluent-kafka, in the changelog
layouts of Kafka Streams (``federator.store.layout`` lays them out; docs/reference/stores.md):

- kv:      key bytes -> value bytes, record time = the write's start
- window:  key + 8-byte window start + 4-byte seqnum 0, record time = the window start
- session: key + 8-byte session end + 8-byte session start, record time = the session end

Every record goes to the partition of its plain key (Kafka's murmur2, passed explicitly).
It returns a consistency token: the last offset written to each changelog partition, so a
reader that passes it to ``/v1/sql`` sees this write (read-your-writes).

Bad input fails before anything is written (not even the catalog entry), with a SinkError
naming the column and saying what to do. ``mode="replace"`` also deletes, with tombstones,
the keys that the changelog holds but the DataFrame no longer has.

Two Spark jobs. Pass 1 runs in Spark alone (no Python worker): every check is a row
condition, and each row gets a 64-bit hash of its changelog key, null where a check fails;
only the hashes come back. Pass 2 (mapInArrow) serializes each Arrow batch at once (keys,
values, Kafka's murmur2 vectorized) and produces it: the per-record work is one ``produce``
call, and only failed deliveries are reported back to Python; each task's last record per
partition is produced after the rest is delivered, and its offset goes into the token.

The modules, by concern:

- ``plan``: Spark types to formats, the store definition, the columns and row checks of a write
- ``checks``: the store against the catalog; pass 1 (failed checks, duplicate keys)
- ``partitioning``: Kafka's murmur2 over a column of keys
- ``encoding``: keys and values as their formats' bytes (changelog keys: ``federator.store.layout``)
- ``producing``: pass 2's tasks, and the producers of the workers and the driver
- ``deletes``: the live keys before a replace, and tombstones
- ``tasks``: running Python tasks in Spark, and reporting their failures
- ``write``: ``write_store`` and ``delete_keys``
- ``checkpoint_files``: a JSON file per micro-batch beside a stream's checkpoint
- ``written_batches``: which stores each micro-batch of a stream wrote (there)
"""

from federator_spark.sink.errors import SinkError
from federator_spark.sink.partitioning import murmur2_partitions
from federator_spark.sink.plan import JSON_FIELD_OF, SIMPLE_FORMAT_OF
from federator_spark.sink.producing import PRODUCER_CONFIG
from federator_spark.sink.write import delete_keys, write_store

__all__ = [
    "SinkError",
    "write_store",
    "delete_keys",
    "murmur2_partitions",
    "SIMPLE_FORMAT_OF",
    "JSON_FIELD_OF",
    "PRODUCER_CONFIG",
]
