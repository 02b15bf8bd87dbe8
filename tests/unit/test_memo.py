import functools

import pyarrow as pa

from federator.memo import by_identity


def test_a_value_is_built_once_per_arguments_and_again_for_none_of_them():
    built = []

    @by_identity
    def layout(schema: pa.Schema, n: int) -> tuple:
        built.append((schema, n))
        return (schema.names, n)

    s = pa.schema([("a", pa.int64())])
    assert layout(s, 1) == (["a"], 1)
    assert layout(s, 1) == (["a"], 1)
    assert layout(pa.schema([("a", pa.int64())]), 1) == (["a"], 1)  # an equal schema: found by value
    assert layout(s, 2) == (["a"], 2)
    assert layout(pa.schema([("b", pa.int64())]), 1) == (["b"], 1)
    assert len(built) == 3


def test_an_entry_keeps_its_arguments_so_their_ids_stay_theirs():
    @by_identity
    def names(schema: pa.Schema) -> list:
        return schema.names

    for i in range(300):  # made and dropped at once: ids would be reused if entries did not hold them
        assert names(pa.schema([(f"c{i}", pa.int64())])) == [f"c{i}"]


def test_arguments_that_cannot_be_hashed_are_found_by_identity_alone():
    built = []

    @functools.partial(by_identity, by_value=False)
    def width(row: list) -> int:
        built.append(row)
        return len(row)

    row = [1, 2]
    assert width(row) == 2 and width(row) == 2
    assert width([1, 2, 3]) == 3  # another object: built, with no hash asked of it
    assert len(built) == 2
