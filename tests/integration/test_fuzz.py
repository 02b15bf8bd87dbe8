"""The differential fuzzer (``fuzz_sql``) against the shared live cluster: random statements,
each answered by Federator as DuckDB answers it over the same rows, or refused by both. One
difference is allowed and counted apart (``cut_by_limit``): with ORDER BY ... LIMIT, the owners
cut each partition to its top rows before the select list is computed, so a value error on a
row the LIMIT drops (an overflow, a division by zero), which DuckDB raises, does not stop
Federator's answer.

Short by default (150 statements, seed 14); ``make fuzz`` runs thousands. Set
``FEDERATOR_FUZZ_STATEMENTS`` and ``FEDERATOR_FUZZ_SEED`` to choose. The summary (statements,
equal, mismatches, unsupported, 5xx, crashes, and the first statements of each kind) is printed
and is the failure message.
"""

from __future__ import annotations

import os
from typing import Iterator

import duckdb
import pytest

from tests.integration import bi_cluster as shared
from tests.integration import fuzz_sql
from tests.integration.bi_cluster import bi_cluster  # noqa: F401 - a fixture

STATEMENTS = int(os.environ.get("FEDERATOR_FUZZ_STATEMENTS", "150"))
SEED = int(os.environ.get("FEDERATOR_FUZZ_SEED", "14"))


@pytest.fixture
def fuzz_db(broker, bi_cluster, request) -> Iterator[duckdb.DuckDBPyConnection]:  # noqa: F811
    """The fuzz stores in the shared cluster (and DuckDB). They stay in its catalog, so a test
    after this one that lists the stores (the SQLAlchemy inspector does) must get a cluster
    without them: the shared one stops unless the hostile-input suite comes next."""
    try:
        yield fuzz_sql.load(broker, bi_cluster)
    finally:
        items = request.session.items
        i = items.index(request.node)
        if i + 1 >= len(items) or not items[i + 1].module.__name__.endswith("test_hostile"):
            shared._stop()


def test_random_statements_answer_as_duckdb_does(bi_cluster, fuzz_db) -> None:  # noqa: F811
    summary, report = fuzz_sql.fuzz(bi_cluster, fuzz_db, STATEMENTS, SEED)
    print(report)
    assert summary.counts["crash"] == 0, report
    assert summary.counts["5xx"] == 0, report
    assert summary.counts["mismatch"] == 0, report
