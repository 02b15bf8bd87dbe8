"""Per-partition query results on the wire: one Arrow IPC stream for a whole request; and the
names both ends of a node-to-node call share (headers, result codes).

The stream's schema is the answers' (the store's, or what a pipeline or plugin query makes). Each partition's result is one record batch
whose batch-level custom metadata holds a small JSON header (partition, position, failure,
message, execution info); a failed partition is a 0-row batch with its header. Keeping the
header per batch (not per row) means encoding and decoding do no per-row Python work, and
the Arrow buffers are read zero-copy from the received bytes.
"""

from __future__ import annotations

import json
import struct
from typing import IO, Any, Callable, Iterable

import pyarrow as pa

from federator.query.position import Position
from federator.query.result import FailureReason, QueryResult
from federator.query.rows import as_batch, empty_batch
from federator.errors import FederatorError

MEDIA_TYPE = "application/vnd.apache.arrow.stream"
# The header that carries the cluster secret on node-to-node calls (--cluster-secret).
SECRET_HEADER = "X-Federator-Secret"
# QueryResult.code of a co-partitioned join whose other partition is not on the owner (a
# rebalance parted them): the receiver joins instead.
NOT_COLOCATED = "NOT_COLOCATED"

# The point lookup's own node-to-node call, on the node's key port (NodeInfo.key_endpoint):
# a TCP connection kept open, no HTTP, no JSON, no Arrow. The caller opens with KEY_HELLO and
# the cluster secret (a length-prefixed UTF-8 string; empty for none); the node answers one
# byte, KEY_WELCOME, or closes. Then come requests, and their answers in the same order (see
# below; a caller may send more before the answers to the first: the node answers those that
# arrived together in one send, and an event loop's concurrent reads share a connection). The answer
# is the key's stored bytes from the node's active, current copy, or that it has no such key,
# or KEY_CANNOT: it cannot answer it so (not the active copy, still restoring, behind the
# offset the caller's token asks for) and the caller takes the general path, whose errors say why.
KEY_HELLO = b"FEDERATOR-KEY/1\n"
KEY_WELCOME = b"\x01"
KEY_FOUND, KEY_ABSENT, KEY_CANNOT = 0, 1, 2
_KEY_REQUEST = struct.Struct("!HIqI")  # store name length, partition, offset asked (-1: any), key length
_KEY_ANSWER = struct.Struct("!Bqi")  # status, the partition's offset (-1: unknown), stored length (-1: none)
_SHORT = struct.Struct("!H")


def key_hello(secret: str | None) -> bytes:
    raw = (secret or "").encode()
    return KEY_HELLO + _SHORT.pack(len(raw)) + raw


# The per-partition query's call on the same port (the one POST /internal/v1/query makes over
# HTTP), for the scatter-gather of every statement that reads another node's partitions: the
# caller opens with CALL_HELLO and the secret, as above; then each request is a length-prefixed
# StateQueryRequest as JSON, and each answer a status (HTTP's meaning) and a length-prefixed
# payload: the Arrow IPC result stream when 200, else the JSON error body the HTTP route sends.
CALL_HELLO = b"FEDERATOR-QRY/1\n"  # as long as KEY_HELLO: the port reads one length and tells them apart
_LENGTH = struct.Struct("!I")
_CALL_ANSWER = struct.Struct("!HI")  # status, payload length


# The positions watch on the same port: a node that answers statements over another node's
# partitions keeps the answers it computed and gives one again while every partition it read
# is still at the offset it was read at. It learns the offsets here rather than by asking: it
# opens with WATCH_HELLO and the secret, as above; the node answers KEY_WELCOME, then sends
# frames, each a length-prefixed JSON list of [store, partition, offset] for every partition
# it would answer as the current active copy (offset -1: nothing applied yet) whose offset
# changed since the last frame, or [store, partition, null] for one it no longer would, after
# the node's epoch: [epoch, changes]. An offset names a state only within one epoch (a shard
# reset or rebuilt starts its offsets over; the epoch moves with every change but records
# applied). The first frame has them all; a frame follows every change, and an empty one at
# least every WATCH_BEAT_SECONDS, so a caller that hears nothing for longer stops trusting it.
WATCH_HELLO = b"FEDERATOR-POS/1\n"
WATCH_BEAT_SECONDS = 1.0


def watch_hello(secret: str | None) -> bytes:
    raw = (secret or "").encode()
    return WATCH_HELLO + _SHORT.pack(len(raw)) + raw


def watch_frame(epoch: int, changes: list[tuple[str, int, int | None]]) -> bytes:
    body = json.dumps([epoch, changes], separators=(",", ":")).encode()
    return _LENGTH.pack(len(body)) + body


def read_watch_frame(read: Callable[[int], bytes]) -> tuple[int, list[tuple[str, int, int | None]]]:
    (n,) = _LENGTH.unpack(read(_LENGTH.size))
    epoch, changes = json.loads(read(n))
    return int(epoch), [(str(s), int(p), None if o is None else int(o)) for s, p, o in changes]


def read_hello(read: Callable[[int], bytes]) -> tuple[bytes, str] | None:
    """(the hello, the secret) a caller opened with; None when it did not open as a node."""
    hello = read(len(KEY_HELLO))
    if hello not in (KEY_HELLO, CALL_HELLO, WATCH_HELLO):
        return None
    (n,) = _SHORT.unpack(read(_SHORT.size))
    return hello, read(n).decode("utf-8", "replace")


def call_hello(secret: str | None) -> bytes:
    raw = (secret or "").encode()
    return CALL_HELLO + _SHORT.pack(len(raw)) + raw


def call_request(body: bytes) -> bytes:
    return _LENGTH.pack(len(body)) + body


def read_call_request(read: Callable[[int], bytes]) -> bytes:
    (n,) = _LENGTH.unpack(read(_LENGTH.size))
    return read(n)


def call_answer(status: int, payload: bytes) -> bytes:
    return _CALL_ANSWER.pack(status, len(payload)) + payload


def read_call_answer(read: Callable[[int], bytes]) -> tuple[int, bytes]:
    status, n = _CALL_ANSWER.unpack(read(_CALL_ANSWER.size))
    return status, read(n)


def key_request(store: str, partition: int, key: bytes, at: int | None) -> bytes:
    name = store.encode()
    return _KEY_REQUEST.pack(len(name), partition, -1 if at is None else at, len(key)) + name + key


def split_key_request(buf: bytes | bytearray) -> tuple[tuple[str, int, bytes, int | None], int] | None:
    """The request at the start of ``buf`` (store, partition, key, offset asked or None) and its length
    in bytes; None while not all of it is there."""
    if len(buf) < _KEY_REQUEST.size:
        return None
    n, partition, at, k = _KEY_REQUEST.unpack_from(buf)
    end = _KEY_REQUEST.size + n + k
    if len(buf) < end:
        return None
    store = bytes(buf[_KEY_REQUEST.size:_KEY_REQUEST.size + n]).decode("utf-8", "replace")
    return (store, partition, bytes(buf[_KEY_REQUEST.size + n:end]), None if at < 0 else at), end


def key_answer(status: int, offset: int | None, stored: bytes | None) -> bytes:
    head = _KEY_ANSWER.pack(status, -1 if offset is None else offset, -1 if stored is None else len(stored))
    return head if stored is None else head + stored


def read_key_answer(read: Callable[[int], bytes]) -> tuple[int, int | None, bytes | None]:
    status, offset, n = _key_answer_head(read(_KEY_ANSWER.size))
    return status, offset, None if n < 0 else read(n)


def split_key_answer(buf: bytes | bytearray) -> tuple[tuple[int, int | None, bytes | None], int] | None:
    """The answer at the start of ``buf`` (as ``read_key_answer`` gives it) and its length in
    bytes; None while not all of it is there (a caller that reads what comes, as it comes)."""
    if len(buf) < _KEY_ANSWER.size:
        return None
    status, offset, n = _key_answer_head(buf[:_KEY_ANSWER.size])
    end = _KEY_ANSWER.size + max(n, 0)
    if len(buf) < end:
        return None
    return (status, offset, None if n < 0 else bytes(buf[_KEY_ANSWER.size:end])), end


def _key_answer_head(head: bytes | bytearray) -> tuple[int, int | None, int]:
    """An answer's status, offset (None: unknown) and stored length (-1: none)."""
    status, offset, n = _KEY_ANSWER.unpack(head)
    return status, None if offset < 0 else offset, n


def exact_reader(stream: IO[bytes]) -> Callable[[int], bytes]:
    """``read(n)`` of exactly n bytes from ``stream``; EOFError when it ends first."""
    def read(n: int) -> bytes:
        data = stream.read(n)
        if len(data) != n:
            raise EOFError(f"the connection ended {n - len(data)} bytes short")
        return data

    return read


# Batch metadata key. Versioned so that a node running a newer layout fails loudly, not subtly.
_HEADER_KEY = b"federator.result"
_VERSION = 1


class WireError(FederatorError, ValueError):
    """Bytes that are not a Federator result stream (or one this version cannot read)."""


def _header(r: QueryResult) -> bytes:
    return json.dumps(
        {
            "v": _VERSION,
            "partition": r.partition,
            "position": None if r.position is None else r.position.to_dict(),
            "failure": None if r.failure is None else r.failure.value,
            "message": r.message,
            "code": r.code,
            "execution_info": list(r.execution_info),
        },
        separators=(",", ":"),
    ).encode()


def _batch_for(r: QueryResult, schema: pa.Schema) -> pa.RecordBatch:
    if r.failure is not None or r.batch is None:
        # A failure carries no rows; a success without a batch is sent as a 0-row success.
        return empty_batch(schema)
    if not r.batch.schema.equals(schema):
        # Arrow would refuse the batch anyway; this says which partition and what differs.
        raise ValueError(
            f"partition {r.partition}'s batch has schema {r.batch.schema} but the stream's schema is {schema}; "
            "every partition of one request must answer in the same schema"
        )
    return as_batch(r.batch)


def write_results(sink: Any, results: Iterable[QueryResult], schema: pa.Schema) -> None:
    """Write ``results`` as one Arrow IPC stream to ``sink`` (a file-like object or pyarrow NativeFile)."""
    with pa.ipc.new_stream(sink, schema) as writer:
        for r in results:
            writer.write_batch(_batch_for(r, schema), custom_metadata={_HEADER_KEY: _header(r)})


def encode_results(results: Iterable[QueryResult], schema: pa.Schema) -> bytes:
    """The Arrow IPC stream of ``results`` as bytes (an HTTP body)."""
    sink = pa.BufferOutputStream()
    write_results(sink, results, schema)
    return sink.getvalue().to_pybytes()


def _result_from(batch: pa.RecordBatch, meta: pa.KeyValueMetadata | None) -> QueryResult:
    raw = None if meta is None else meta.get(_HEADER_KEY)
    if raw is None:
        raise WireError("an Arrow batch in the result stream has no Federator header; the peer is not a Federator node")
    try:
        h: dict[str, Any] = json.loads(raw)
        if h.get("v") != _VERSION:
            raise WireError(
                f"result stream layout version {h.get('v')!r} is not {_VERSION}; run the same Federator version on every node"
            )
        failure = None if h["failure"] is None else FailureReason(h["failure"])
        position = None if h["position"] is None else Position.from_dict(h["position"])
        return QueryResult(
            partition=int(h["partition"]),
            batch=None if failure is not None else batch,
            position=position,
            failure=failure,
            message=str(h.get("message", "")),
            code=h.get("code"),
            execution_info=list(h.get("execution_info") or []),
        )
    except WireError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise WireError(f"malformed result header {raw[:200]!r}: {e}") from e


def read_results(source: Any) -> tuple[pa.Schema, list[QueryResult]]:
    """Read a result stream from bytes, a pyarrow Buffer or a file-like object; also return its schema.

    The schema matters when no partition returned rows (or there are no results at all).
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        source = pa.py_buffer(source)
    try:
        reader = pa.ipc.open_stream(source)
        return reader.schema, [_result_from(b, m) for b, m in reader.iter_batches_with_custom_metadata()]
    except WireError:
        raise
    except (pa.ArrowInvalid, OSError) as e:
        raise WireError(f"not an Arrow IPC result stream: {e}") from e


def decode_results(data: bytes | pa.Buffer | IO[bytes]) -> list[QueryResult]:
    """The per-partition results carried by ``data`` (see :func:`encode_results`)."""
    return read_results(data)[1]
