"""The co-partitioned join as a key lookup in Arrow (federator.owner.keyjoin): every answer
compared with DuckDB's own join over the same rows."""

from __future__ import annotations

import random
import struct
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from federator.catalog.definition import StoreDefinition
from federator.partitioner import partition_for
from federator.owner import keyjoin
from federator.owner.duck import Duck, DuckConfig
from federator.owner.keyjoin import LEFT, RIGHT
from federator.query.owner_work import KeyJoin, Side
from federator.sql.parse import parse
from federator.sql.planner import bind_parameters, plan_query
from federator.store.arrow import build_batch
from federator.store.kv import KeyValueStoreType
from federator.store.record import ChangelogRecord
from federator.store.scan_cache import ScanCache
from tests.registry import REGISTRY

P = 4


@pytest.fixture(scope="module")
def duck(tmp_path_factory) -> Duck:
    return Duck(DuckConfig(memory_limit="512MB", spill_dir=tmp_path_factory.mktemp("spill")))


CACHE = ScanCache(256 << 20)  # the scan cache a node would pass its owner work

def key_of(fmt: str, i: int) -> Any:
    return {"string": f"k{i:05d}", "bytes": b"k\x00" + i.to_bytes(3, "big"), "long": (i - 300) * 7919,
            "int": i - 300}[fmt]


def rows_of(table: pa.Table | pa.RecordBatch) -> list[tuple]:
    """The rows as a sorted list (a join's answer is a multiset), NULLs first."""
    return sorted((tuple(r.values()) for r in table.to_pylist()), key=lambda r: [(v is not None, v) for v in r])


# ---- the lookup of one partition's two sides --------------------------------------------------
def sides(fmt: str, left_keys: list, right_keys: list, value_type: pa.DataType) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    ktype = {"string": pa.string(), "bytes": pa.binary(), "long": pa.int64(), "int": pa.int32()}[fmt]

    def value(i: int) -> Any:
        return {pa.int64(): i * 3, pa.float64(): i / 4, pa.string(): f"v{i}", pa.bool_(): i % 3 == 0}[value_type]

    left = pa.record_batch([pa.array(left_keys, ktype), pa.array([None if i % 7 == 3 else value(i) for i in
                                                                  range(len(left_keys))], value_type)], names=["k", "v"])
    right = pa.record_batch([pa.array(right_keys, ktype), pa.array(range(len(right_keys)), pa.int64())], names=["id", "w"])
    return left, right


SPEC = dict(left=Side("k", (("k", "a.k"), ("v", "a.v"))), right=Side("id", (("id", "b.id"), ("w", "b.w"))),
            join_sql="", sql="")


def duckdb_join(duck: Duck, left: pa.RecordBatch, right: pa.RecordBatch, outer: bool) -> pa.RecordBatch:
    return duck.over(f'SELECT a.k AS "a.k", a.v AS "a.v", b.id AS "b.id", b.w AS "b.w" FROM {LEFT} a '
                     f'{"LEFT " if outer else ""}JOIN {RIGHT} b ON a.k = b.id', {LEFT: left, RIGHT: right})


CASES = {  # left keys, right keys (indexes; None a NULL key)
    "the same keys": (range(50), range(50)),
    "the same keys, other order": (range(50), list(reversed(range(50)))),
    "right misses some": (range(50), [i for i in range(50) if i % 3]),
    "left misses some": ([i for i in range(50) if i % 4], range(50)),
    "few on the right": (range(200), [5, 77, 199, 1000]),
    "few on the left": ([3, 150, 999], range(200)),
    "disjoint": (range(20), range(100, 130)),
    "an empty side": (range(20), []),
    "both empty": ([], []),
    "NULL keys on both sides": ([None, *range(20), None], [None, *range(10, 30)]),
    "NULL keys at the same rows": ([None, 1, 2], [None, 1, 2]),
}


@pytest.mark.parametrize("fmt", keyjoin.KEY_FORMATS)
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("outer", [False, True], ids=["inner", "left"])
@pytest.mark.parametrize("searched", [False, True], ids=["hashed", "searched"])
def test_a_partitions_lookup_is_duckdbs_join(duck, fmt, case, outer, searched, monkeypatch) -> None:
    lk, rk = CASES[case]
    def scan_order(keys) -> bool:  # a scan has no NULL keys, and gives them in key order
        return searched and None not in keys and list(keys) == sorted(keys)

    in_order = (scan_order(lk), scan_order(rk))
    if searched and not any(in_order):
        pytest.skip("neither side in key order")
    monkeypatch.setattr(keyjoin, "SEARCH_RATIO", 2 if searched else keyjoin.SEARCH_RATIO)  # search small sides
    left, right = sides(fmt, [None if i is None else key_of(fmt, i) for i in lk],
                        [None if i is None else key_of(fmt, i) for i in rk], pa.int64())
    searches = []
    monkeypatch.setattr(keyjoin, "_search", lambda *a, f=keyjoin._search: searches.append(1) or f(*a))
    got = keyjoin.join(left, right, KeyJoin(**SPEC, keep_unmatched=outer), in_order)
    assert bool(searches) == (searched and case in ("few on the right", "few on the left", "an empty side"))
    want = duckdb_join(duck, left, right, outer)
    assert got.schema.names == want.schema.names
    assert rows_of(got) == rows_of(want)


@pytest.mark.parametrize("value_type", [pa.int64(), pa.float64(), pa.string(), pa.bool_()])
@pytest.mark.parametrize("outer", [False, True], ids=["inner", "left"])
def test_value_columns_of_any_type_come_through(duck, value_type, outer) -> None:
    left, right = sides("string", [key_of("string", i) for i in range(40)],
                        [key_of("string", i) for i in range(0, 80, 3)], value_type)
    got = keyjoin.join(left, right, KeyJoin(**SPEC, keep_unmatched=outer))
    assert got.schema.types == [pa.string(), value_type, pa.string(), pa.int64()]
    assert rows_of(got) == rows_of(duckdb_join(duck, left, right, outer))


@pytest.mark.parametrize(("fmt", "ordered", "needles"), [
    # in a scan's key order: UTF-8 bytes for strings (é after z), bytes, integers by value
    ("string", ["", "a", "a\x00", "ab", "z", "é", "€", "𝄞"], ["a", "a\x00", "é", "𝄞", "b", "", "zz", None]),
    ("bytes", [b"", b"\x00", b"\x00\x00", b"a", b"\x7f", b"\x80", b"\xff"], [b"\x00", b"\xff", b"\x80\x00", None, b""]),
    ("long", [-(2 ** 63), -5, -1, 0, 3, 2 ** 63 - 1], [-1, 0, 2 ** 63 - 1, 4, -(2 ** 63), None]),
    ("int", [-(2 ** 31), -7, 0, 9, 2 ** 31 - 1], [9, -7, 1, None, 2 ** 31 - 1]),
])
def test_a_binary_search_in_a_scans_key_order_finds_what_a_hash_does(fmt, ordered, needles) -> None:
    ktype = {"string": pa.string(), "bytes": pa.binary(), "long": pa.int64(), "int": pa.int32()}[fmt]
    scan, keys = pa.array(ordered, ktype), pa.array(needles, ktype)
    assert scan.equals(pa.array(sorted(ordered, key=lambda k: k.encode() if isinstance(k, str) else k), ktype))
    assert keyjoin._search(keys, scan).to_pylist() == pc.index_in(keys, value_set=scan, skip_nulls=True).to_pylist()


def test_the_same_keys_pair_row_by_row_without_a_copy() -> None:
    left, right = sides("long", list(range(10)), list(range(10)), pa.int64())
    assert keyjoin.same_keys(left.column(0), right.column(0))
    got = keyjoin.join(left, right, KeyJoin(**SPEC, keep_unmatched=False))
    assert got.column(0).buffers()[1].address == left.column(0).buffers()[1].address


def test_a_lookup_of_other_keys_pays_for_a_small_side() -> None:
    assert keyjoin.pays(100, 25) and keyjoin.pays(25, 100) and keyjoin.pays(100, 0)
    assert not keyjoin.pays(100, 26) and not keyjoin.pays(100, 100)
    assert not keyjoin.same_keys(pa.array([None, 1]), pa.array([None, 1]))  # NULL is no key


# ---- planned statements over partitioned stores, against DuckDB over the whole stores ----------
def store(name: str, key: tuple[str, str], value: dict) -> StoreDefinition:
    return StoreDefinition.from_dict({"name": name, "type": "kv", "partitions": P, "topic": f"t-{name}",
                                      "key": {"name": key[0], "format": key[1]}, "value": value}, REGISTRY)


def scans(defn: StoreDefinition, rows: dict[Any, Any], deleted: dict[Any, Any] | None = None) -> list[pa.RecordBatch]:
    """Each partition's full scan, in key order as RocksDB gives it. ``deleted``: keys written
    after the scan was kept (None a tombstone), folded in as a kept scan is brought up to date."""
    by_part: list[list[Any]] = [[] for _ in range(P)]
    for k in rows:
        by_part[partition_for(defn.key.serialize(k), P)].append(k)
    out = []
    for p, keys in enumerate(by_part):
        keys.sort(key=lambda k: k if isinstance(k, int) else defn.key.serialize(k))  # ints: negatives first
        kb = [defn.key.serialize(k) for k in keys]
        batch = build_batch(defn.arrow_schema(), defn, kb, [struct.pack(">q", 1_700_000_000_000 + i) +
                                                            defn.value.serialize(rows[k]) for i, k in enumerate(keys)])
        later = [(k, v) for k, v in (deleted or {}).items() if partition_for(defn.key.serialize(k), P) == p]
        if later:
            records = [ChangelogRecord(defn.key.serialize(k), None if v is None else defn.value.serialize(v), i, 5)
                       for i, (k, v) in enumerate(later)]
            batch = KeyValueStoreType().follow_scan(defn, defn.arrow_schema(), batch, records)
        out.append(batch)
    return out


def fold(rows: dict[Any, Any], later: dict[Any, Any]) -> dict[Any, Any]:
    out = dict(rows)
    for k, v in later.items():
        if v is None:
            out.pop(k, None)
        else:
            out[k] = v
    return out


def schema_of(duck: Duck):
    def bind(sql: str, relations: dict[str, pa.Table]) -> pa.Schema:
        schema, batches = duck.stream(sql, relations, None)
        for _ in batches:
            pass
        return schema
    return bind


def answer(duck: Duck, sql: str, stores: dict[str, StoreDefinition], parts: dict[str, list[pa.RecordBatch]],
           path: str, owners: list[Any] | None = None, monkeypatch: pytest.MonkeyPatch | None = None
           ) -> tuple[pa.RecordBatch, Any]:
    """``sql`` as the planner and two owners (partitions 0-1 and 2-3) answer it, by ``path``:
    auto (as a node does), lookup (every partition a lookup), duckdb (every partition DuckDB's
    join), mixed (the two in turn), or before (the owner's SQL with DuckDB's join, as before)."""
    plan = plan_query(bind_parameters(parse(sql).select, [], 0), stores.get, lambda n: None, [], schema_of(duck))
    (ref,) = plan.refs
    assert ref.joined is not None, sql
    spec = KeyJoin.from_dict(ref.key_join.to_dict()) if ref.key_join is not None else None
    left, right = parts[ref.store.name], parts[ref.joined]
    if path != "auto" and monkeypatch is not None:
        turns = iter(range(1_000_000))
        monkeypatch.setattr(keyjoin, "pays", {"lookup": lambda a, b: True, "duckdb": lambda a, b: False,
                                              "mixed": lambda a, b: next(turns) % 2 == 0}.get(path, keyjoin.pays))
    got = []
    for node in (range(0, 2), range(2, P)):
        if spec is None or path == "before":
            got.append(duck.over(ref.work.sql, {LEFT: pa.Table.from_batches([left[p] for p in node]),
                                                RIGHT: pa.Table.from_batches([right[p] for p in node])}))
        else:
            got.append(keyjoin.run(spec, duck, [(left[p], right[p], *(owners[p] if owners else (None, None)))
                                                for p in node], in_key_order=True, cache=CACHE))  # full scans, in key order
    rows = pa.Table.from_batches([b if b.schema.equals(ref.rows_schema) else b.cast(ref.rows_schema) for b in got])
    return duck.over(plan.sql, {ref.relation: rows}), spec


PLAYERS = {key_of("string", i): {"team": ["red", "blue", None][i % 3], "score": (i * 37) % 101 - 20,
                                 "best": None if i % 5 == 0 else i / 8, "active": [True, False, None][i % 3],
                                 "seen": 1_700_000_000_000 + i * 1000} for i in range(300)}
BONUS = {key_of("string", i): i % 13 for i in range(0, 400, 2)}
LATER_PLAYERS = {key_of("string", 4): None, key_of("string", 10): None, key_of("string", 301): {"team": "red", "score": 5},
                 key_of("string", 6): {"team": "blue", "score": 1000}}
LATER_BONUS = {key_of("string", 8): None, key_of("string", 301): 99, key_of("string", 12): 50}
SAME_KEYS = {k: (v["score"] if v["score"] is not None else 0) for k, v in PLAYERS.items()}

STRING_STORES = {
    "players": store("players", ("player", "string"), {"format": "json", "fields": [
        {"name": "team", "type": "string"}, {"name": "score", "type": "long"}, {"name": "best", "type": "double"},
        {"name": "active", "type": "boolean"}, {"name": "seen", "type": "timestamp"}]}),
    "bonus": store("bonus", ("player", "string"), {"name": "bonus", "format": "long"}),
    "same": store("same", ("player", "string"), {"name": "points", "format": "long"}),
}

STATEMENTS = [
    "SELECT p.player, p.score, b.bonus FROM players p JOIN bonus b ON p.player = b.player",
    "SELECT p.player, b.bonus FROM players p LEFT JOIN bonus b ON p.player = b.player",
    # both sides filtered before the lookup, and a condition over both after it
    "SELECT p.player, p.team, b.bonus FROM players p JOIN bonus b ON p.player = b.player "
    "WHERE p.score > 10 AND b.bonus BETWEEN 2 AND 9 AND p.score > b.bonus",
    # a LEFT JOIN: the left side's filter first, the right side's after (it sees the NULLs)
    "SELECT p.player, b.bonus FROM players p LEFT JOIN bonus b ON p.player = b.player "
    "WHERE p.team = 'red' AND b.bonus IS NULL",
    "SELECT p.player, b.bonus FROM players p LEFT JOIN bonus b ON p.player = b.player WHERE COALESCE(b.bonus, 0) < 3",
    "SELECT p.team, COUNT(*) AS n, SUM(b.bonus) AS s, MIN(p.best) AS lo, MAX(p.seen) AS last FROM players p "
    "JOIN bonus b ON p.player = b.player WHERE p.active GROUP BY p.team",
    "SELECT COUNT(*), SUM(p.score + b.bonus) FROM players p JOIN bonus b ON b.player = p.player WHERE b.bonus < 3",
    "SELECT * FROM players JOIN bonus ON players.player = bonus.player WHERE players.player < 'k00100'",
    "SELECT p.player, p.rowtime, b.rowtime AS bt FROM players p JOIN bonus b ON p.player = b.player "
    "WHERE p.seen > TIMESTAMP '2023-11-14 22:15:00' AND b.rowtime IS NOT NULL",
    "SELECT p.player, p.score + b.bonus AS t FROM players p JOIN bonus b ON p.player = b.player "
    "ORDER BY t DESC, p.player LIMIT 7",
    "SELECT p.player, s.points FROM players p JOIN same s ON p.player = s.player WHERE p.player IN ('k00002', 'k00299', 'x')",
    "SELECT COUNT(*), SUM(s.points), COUNT(p.best) FROM players p JOIN same s ON p.player = s.player",
    "SELECT COUNT(*) FROM players p LEFT JOIN same s ON p.player = s.player WHERE s.points > 40",
]


@pytest.mark.parametrize("later", [False, True], ids=["scanned", "after writes and deletes"])
@pytest.mark.parametrize("path", ["auto", "lookup", "mixed", "duckdb"])
@pytest.mark.parametrize("sql", STATEMENTS)
def test_a_planned_co_partitioned_join_is_duckdbs_answer(duck, sql, path, later, monkeypatch) -> None:
    players, bonus = (fold(PLAYERS, LATER_PLAYERS), fold(BONUS, LATER_BONUS)) if later else (PLAYERS, BONUS)
    parts = {"players": scans(STRING_STORES["players"], PLAYERS, LATER_PLAYERS if later else None),
             "bonus": scans(STRING_STORES["bonus"], BONUS, LATER_BONUS if later else None),
             "same": scans(STRING_STORES["same"], SAME_KEYS)}
    whole = {name: pa.Table.from_batches(batches) for name, batches in parts.items()}
    assert whole["players"].num_rows == len(players) and whole["bonus"].num_rows == len(bonus)
    if "rowtime" not in sql:  # a pseudo-column: read when named, not part of *
        whole = {name: t.drop_columns(["rowtime"]) for name, t in whole.items()}
    got, spec = answer(duck, sql, STRING_STORES, parts, path, monkeypatch=monkeypatch)
    assert spec is not None, sql
    want = duck.over(sql, whole)
    assert got.schema.names == want.schema.names
    assert rows_of(got) == rows_of(want)
    before, _ = answer(duck, sql, STRING_STORES, parts, "before")
    assert rows_of(got) == rows_of(before)


@pytest.mark.parametrize("fmt", keyjoin.KEY_FORMATS)
@pytest.mark.parametrize("outer", [False, True], ids=["inner", "left"])
def test_every_key_format_joins_as_duckdb_does(duck, fmt, outer, monkeypatch) -> None:
    stores = {"a": store("a", ("id", fmt), {"name": "v", "format": "string"}),
              "b": store("b", ("id", fmt), {"name": "w", "format": "double"})}
    a = {key_of(fmt, i): f"s{i}" for i in range(0, 600, 1)}
    b = {key_of(fmt, i): i / 2 for i in range(0, 600, 3)}
    parts = {"a": scans(stores["a"], a, {key_of(fmt, 3): None}), "b": scans(stores["b"], b, {key_of(fmt, 9): None})}
    whole = {n: pa.Table.from_batches(p) for n, p in parts.items()}
    join = "LEFT JOIN" if outer else "JOIN"
    for sql in (f"SELECT a.id, a.v, b.w FROM a {join} b ON a.id = b.id WHERE a.v > 's3'",
                f"SELECT COUNT(*), COUNT(b.w), MAX(a.v) FROM a {join} b ON b.id = a.id"):
        for path in ("auto", "lookup", "mixed"):
            got, spec = answer(duck, sql, stores, parts, path, monkeypatch=monkeypatch)
            assert spec is not None and spec.keep_unmatched == outer
            assert rows_of(got) == rows_of(duck.over(sql, whole)), (sql, path)


@pytest.mark.parametrize("sql", [
    "SELECT COUNT(*) FROM players p JOIN bonus b ON p.player = b.player AND b.bonus < p.score",  # more than the keys
    "SELECT COUNT(*) FROM d1 JOIN d2 ON d1.x = d2.x",  # double keys: -0.0 = 0.0 in different bytes
])
def test_joins_a_lookup_cannot_answer_stay_duckdbs(duck, sql) -> None:
    stores = {**STRING_STORES, "d1": store("d1", ("x", "double"), {"name": "v", "format": "long"}),
              "d2": store("d2", ("x", "double"), {"name": "w", "format": "long"})}
    plan = plan_query(bind_parameters(parse(sql).select, [], 0), stores.get, lambda n: None, [], schema_of(duck))
    assert plan.refs[0].joined is not None and plan.refs[0].key_join is None


def test_a_sides_filter_over_a_kept_scan_is_kept_beside_it(duck) -> None:
    """As an owner's filter over one store is: the second run reads it, and answers the same."""
    parts = {"players": scans(STRING_STORES["players"], PLAYERS), "bonus": scans(STRING_STORES["bonus"], BONUS)}
    owners = [(object(), object()) for _ in range(P)]
    for p, (lo, ro) in enumerate(owners):
        CACHE.put(lo, 1, parts["players"][p])
        CACHE.put(ro, 1, parts["bonus"][p])
    sql = "SELECT COUNT(*), SUM(b.bonus) FROM players p JOIN bonus b ON p.player = b.player WHERE b.bonus > 6"
    first, spec = answer(duck, sql, STRING_STORES, parts, "auto", owners)
    key = "key join side: " + spec.right.filter
    assert all(CACHE.derived([(ro, parts["bonus"][p])], key) is not None for p, (_, ro) in enumerate(owners))
    again, _ = answer(duck, sql, STRING_STORES, parts, "auto", owners)
    assert rows_of(first) == rows_of(again) == rows_of(duck.over(sql, {n: pa.Table.from_batches(b)
                                                                       for n, b in parts.items()}))
    for lo, ro in owners:
        CACHE.drop(lo)
        CACHE.drop(ro)


def test_explain_says_the_owners_look_keys_up(duck) -> None:
    sql = "SELECT COUNT(*) FROM players p JOIN bonus b ON p.player = b.player WHERE b.bonus > 6"
    plan = plan_query(bind_parameters(parse(sql).select, [], 0), STRING_STORES.get, lambda n: None, [], schema_of(duck))
    text = plan.refs[0].key_join.describe()
    assert text.startswith("join as a key lookup in Arrow (right first: SELECT") and "partial aggregate: SELECT" in text


def test_random_key_sets_join_as_duckdb_does(duck) -> None:
    rnd = random.Random(7)
    for _ in range(30):
        n, m = rnd.randrange(0, 60), rnd.randrange(0, 60)
        lk = rnd.sample(range(100), n) + [None] * rnd.randrange(0, 2)
        rk = rnd.sample(range(100), m) + [None] * rnd.randrange(0, 2)
        left, right = sides("int", lk, rk, pa.int64())
        for outer in (False, True):
            got = keyjoin.join(left, right, KeyJoin(**SPEC, keep_unmatched=outer))
            assert rows_of(got) == rows_of(duckdb_join(duck, left, right, outer)), (lk, rk, outer)


@pytest.mark.parametrize(("sql", "left", "right"), [
    (STATEMENTS[2], 'SELECT "player", "team", "score" FROM rows WHERE score > 10',
     'SELECT "player", "bonus" FROM rows WHERE bonus BETWEEN 2 AND 9'),
    (STATEMENTS[3], 'SELECT "player", "team" FROM rows WHERE team = \'red\'', None),  # not the NULL-supplying side
    (STATEMENTS[0], None, None),
])
def test_each_sides_own_conditions_run_before_the_lookup(duck, sql, left, right) -> None:
    plan = plan_query(bind_parameters(parse(sql).select, [], 0), STRING_STORES.get, lambda n: None, [], schema_of(duck))
    spec = plan.refs[0].key_join
    assert (spec.left.filter, spec.right.filter) == (left, right)
