"""The catalogue a PostgreSQL client sees: only the schema it was built from, sealed."""

from __future__ import annotations

import duckdb
import pytest

from dpsql.serving.pgcatalog import Catalogue, parse

SCHEMA = {
    "dataset": {"name": "shop"},
    "tables": [
        {
            "name": "orders",
            "columns": [
                {"name": "customer", "type": "BIGINT"},
                {"name": "amount", "type": "DECIMAL(10,2)"},
                {"name": "day", "type": "DATE"},
            ],
        }
    ],
    "public_tables": [{"name": "regions", "columns": [{"name": "code", "type": "VARCHAR"}]}],
}


@pytest.fixture
def catalogue():
    built = Catalogue(SCHEMA, analyst="ann")
    yield built
    built.close()


def run(catalogue: Catalogue, sql: str):
    return catalogue.run(parse(sql))


def test_lists_exactly_the_schema(catalogue: Catalogue) -> None:
    listed = "SELECT table_catalog, table_schema, table_name FROM information_schema.tables"
    rows = run(catalogue, f"{listed} ORDER BY 3").rows
    assert rows == (("shop", "public", "orders"), ("shop", "public", "regions"))
    columns = run(
        catalogue,
        "SELECT a.attname, a.atttypid FROM pg_catalog.pg_attribute a "
        "JOIN pg_catalog.pg_class c ON a.attrelid = c.oid WHERE c.relname = 'orders' "
        "ORDER BY a.attnum",
    ).rows
    assert columns == (("customer", 20), ("amount", 1700), ("day", 1082))
    assert run(catalogue, "SELECT COUNT(*) FROM orders").rows == ((0,),)  # never a row


def test_answers_as_postgresql_for_the_analyst(catalogue: Catalogue) -> None:
    result = run(
        catalogue,
        "SELECT version(), current_user, current_schema(), current_database(), "
        "'orders'::regclass = (SELECT oid FROM pg_class WHERE relname = 'orders') AS same",
    )
    assert [c.name for c in result.columns] == [
        "version", "current_user", "current_schema", "current_database", "same",
    ]  # fmt: skip
    version, user, schema, database, same = result.rows[0]
    assert version.startswith("PostgreSQL 15.0 (dpsql")
    assert (user, schema, database, same) == ("ann", "public", "shop", True)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/hostname')",
        "SELECT * FROM read_text('/etc/hostname')",
        "SELECT * FROM 'data.parquet'",
    ],
)
def test_reads_no_file(catalogue: Catalogue, sql: str) -> None:
    with pytest.raises(duckdb.Error, match=r"disabled|Permission|does not exist"):
        run(catalogue, sql)


def test_configuration_is_locked(catalogue: Catalogue) -> None:
    with pytest.raises(duckdb.Error, match="locked"):
        catalogue._connection.execute("SET enable_external_access = true")
