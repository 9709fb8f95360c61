from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dpsql.engine.policy import load_policy, parse_policy
from dpsql.engine.session import set_policy, show_policy
from dpsql.errors import PolicyError
from tests.conftest import make_database

ISSUE_EXAMPLE = """
[dataset]
epsilon = 10.0          # total over all analysts
delta = 1e-6

[analysts.alice]
epsilon = 4.0
delta = 1e-7

[tables.requests]
privacy_unit = "user_id"
max_groups_per_unit = 5     # distinct GROUP BY keys one unit may touch
max_rows_per_group = 1      # rows one unit may add to one group
max_rows_per_unit = 20      # rows one unit may add to an ungrouped aggregate

[tables.requests.columns.bytes]
bounds = [0, 1000000]

[tables.requests.columns.country]
public_keys = ["DK", "NO", "SE"]
"""


def test_the_documented_shape_parses() -> None:
    policy = parse_policy(ISSUE_EXAMPLE)
    table = policy.table("REQUESTS")
    assert table is not None
    assert (table.max_groups_per_unit, table.max_rows_per_group, table.max_rows_per_unit) == (
        5,
        1,
        20,
    )
    assert table.column("bytes").bounds == (0.0, 1_000_000.0)
    assert table.column("country").public_keys == ("DK", "NO", "SE")
    assert policy.analysts["alice"].delta == 1e-7


@pytest.mark.parametrize(
    ("addition", "key"),
    [
        ("[dataset2]\nepsilon = 1\n", "'dataset2'"),
        (
            "[tables.requests.columns.bytes2]\nbound = [0, 1]\n",
            "'tables.requests.columns.bytes2.bound'",
        ),
        ("[analysts.bob]\nepsilon = 1\nepsilom = 2\n", "'analysts.bob.epsilom'"),
    ],
)
def test_unknown_keys_are_named(addition: str, key: str) -> None:
    with pytest.raises(PolicyError, match=f"unknown key {key}"):
        parse_policy(ISSUE_EXAMPLE + addition)


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("epsilon = 10.0", "epsilon = -1.0", "dataset.epsilon"),
        ("epsilon = 10.0", "epsilon = nan", "dataset.epsilon"),
        ("delta = 1e-6", "delta = 1.0", "dataset.delta"),
        ("bounds = [0, 1000000]", "bounds = [5, 1]", "low <= high"),
        ('public_keys = ["DK", "NO", "SE"]', "public_keys = []", "must not be empty"),
        ('public_keys = ["DK", "NO", "SE"]', 'public_keys = ["DK", "DK"]', "distinct"),
        ("max_rows_per_unit = 20", "max_rows_per_unit = 0", "max_rows_per_unit"),
        ("epsilon = 4.0", "epsilon = 40.0", "more than the dataset cap"),
    ],
)
def test_invalid_values_are_refused(old: str, new: str, fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        parse_policy(ISSUE_EXAMPLE.replace(old, new, 1))


def test_malformed_toml_and_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="not valid TOML"):
        parse_policy("[dataset\nepsilon = 1")
    with pytest.raises(PolicyError, match="cannot read policy file"):
        load_policy(tmp_path / "missing.toml")


@pytest.fixture
def requests_db(tmp_path: Path) -> Path:
    frame = pd.DataFrame(
        {"user_id": [1, 2], "country": ["DK", "NO"], "bytes": [10, 20], "note": ["a", "b"]}
    )
    return make_database(tmp_path / "r.duckdb", {"requests": frame}, ISSUE_EXAMPLE)


@pytest.mark.parametrize(
    ("old", "new", "fragment"),
    [
        ("tables.requests", "tables.missing", "table 'missing' does not exist"),
        ('privacy_unit = "user_id"', 'privacy_unit = "uid"', "privacy unit 'uid'"),
        ("columns.bytes]", "columns.nope]", "requests.nope does not exist"),
        ("columns.bytes]", "columns.note]", "need a numeric column"),
        ('public_keys = ["DK", "NO", "SE"]', "public_keys = [1, 2]", "does not match its type"),
    ],
)
def test_policy_set_checks_the_schema(requests_db: Path, old: str, new: str, fragment: str) -> None:
    with pytest.raises(PolicyError, match=fragment):
        set_policy(requests_db, ISSUE_EXAMPLE.replace(old, new))
    assert show_policy(requests_db) == parse_policy(ISSUE_EXAMPLE)


def test_policy_round_trips_through_the_ledger(requests_db: Path) -> None:
    assert show_policy(requests_db) == parse_policy(ISSUE_EXAMPLE)
    raised = ISSUE_EXAMPLE.replace("epsilon = 10.0", "epsilon = 12.0", 1)
    set_policy(requests_db, raised)
    assert show_policy(requests_db).dataset.epsilon == 12.0
