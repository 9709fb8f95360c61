"""The publish-rr and rr commands end to end: JSON layouts, tables, one-line errors, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dpsql.cli import main
from tests.conftest import make_database

POLICY = """
[dataset]
epsilon = 100.0
delta = 1e-6
[analysts.alice]
epsilon = 50.0
delta = 1e-6
[tables.events]
privacy_unit = "user_id"
max_rows_per_unit = 4
[tables.events.columns.item_id]
bounds = [0, 49]
[tables.events.columns.kind]
public_keys = ["a", "b"]
"""


@pytest.fixture
def db(tmp_path: Path) -> str:
    rng = np.random.default_rng(11)
    person = np.repeat(np.arange(300), 3)
    frame = pd.DataFrame(
        {
            "user_id": person,
            "item_id": rng.integers(0, 60, person.size),
            "kind": rng.choice(["a", "b"], person.size),
            "note": "x",
        }
    )
    return str(make_database(tmp_path / "cli.duckdb", {"events": frame}, POLICY))


def _run(capsys, *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _publish(db: str, capsys, name: str = "r1", *extra: str) -> tuple[int, str, str]:
    return _run(
        capsys, "publish-rr", "--db", db, "--analyst", "alice", "--table", "events",
        "--unit", "user_id", "--item", "item_id", "--epsilon", "8", "--out", name,
        "--format", "json", *extra,
    )  # fmt: skip


def test_publish_and_query_json(db: str, capsys) -> None:
    code, out, _ = _publish(db, capsys)
    assert code == 0
    release = json.loads(out)
    assert release["name"] == "r1" and release["persons"] == 300
    assert release["epsilon"] == 8.0 and 0 < release["delta"] < 1e-9
    assert release["max_items"] == 4 and release["hamming_bound"] == 8
    assert release["universe"] == {"source": "bounds", "size": 50, "kind": "integer", "low": 0}
    assert release["bits_per_person"] > 0 and len(release["public_seed"]) == 64

    code, out, _ = _run(capsys, "rr", "list", "--db", db, "--format", "json")
    assert code == 0 and [r["name"] for r in json.loads(out)] == ["r1"]

    args = ["--db", db, "--analyst", "alice", "--release", "r1", "--format", "json"]
    code, out, _ = _run(capsys, "rr", "popularity", *args, "--top", "5")
    popularity = json.loads(out)
    assert code == 0 and popularity["columns"] == ["item", "estimate"]
    assert len(popularity["rows"]) == 5 and len(popularity["intervals"]["estimate"]) == 5
    assert popularity["epsilon_spent"] == 0.0 and popularity["persons"] == 300
    assert all(lo <= hi for lo, hi in popularity["intervals"]["estimate"])
    assert popularity["estimates"].startswith("unbiased, unclipped")

    code, out, _ = _run(capsys, "rr", "common", *args, "3", "17")
    common = json.loads(out)
    assert code == 0 and (common["person_a"], common["person_b"]) == (3, 17)
    assert common["std_error"] > 0 and common["epsilon_spent"] == 0.0
    assert common["estimates"].startswith("unbiased, unclipped")

    code, out, _ = _run(capsys, "rr", "decode", *args, "42")
    decoded = json.loads(out)
    assert code == 0 and decoded["person"] == 42 and decoded["n"] == 50
    assert decoded["ones"] == len(decoded["items"]) and set(decoded["items"]) <= set(range(50))

    code, out, _ = _run(capsys, "ledger", "--db", db, "--format", "json")
    entries = json.loads(out)
    assert [e["mechanism"] for e in entries[1:]] == ["compressed_rr"] + ["post_processing"] * 3
    assert [e["epsilon"] for e in entries[1:]] == [8.0, 0.0, 0.0, 0.0]


def test_table_and_csv_output(db: str, capsys) -> None:
    code, out, _ = _run(
        capsys, "publish-rr", "--db", db, "--analyst", "alice", "--table", "events",
        "--unit", "user_id", "--item", "kind", "--epsilon", "2", "--out", "kinds",
        "--max-items", "1", "--chunks", "2",
    )  # fmt: skip
    assert code == 0 and "kinds" in out and "epsilon_per_item" in out
    args = ["--db", db, "--analyst", "alice", "--release", "kinds"]
    code, out, _ = _run(capsys, "rr", "popularity", *args, "--format", "csv")
    lines = out.splitlines()
    assert code == 0 and lines[0] == "item,estimate,estimate_low,estimate_high"
    assert [line.split(",")[0] for line in lines[1:]] == ["a", "b"]
    code, out, _ = _run(capsys, "rr", "popularity", *args)
    assert code == 0 and "free (post-processing)" in out
    code, out, _ = _run(capsys, "rr", "decode", *args, "7")
    assert code == 0 and out.startswith("7: ")
    code, out, _ = _run(capsys, "rr", "common", *args, "7", "8")
    assert code == 0 and out.startswith("common items of 7 and 8:")
    code, out, _ = _run(capsys, "rr", "list", "--db", db)
    assert code == 0 and "kinds" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--item", "note"), "no public item universe"),
        (("--epsilon", "80"), "budget exceeded"),
        (("--out", "bad-name"), "name must start"),
        (("--unit", "item_id", "--item", "user_id"), "not the privacy unit"),
    ],
)
def test_errors_are_one_line_and_charge_nothing(db: str, capsys, args, message) -> None:
    base = {
        "--db": db, "--analyst": "alice", "--table": "events", "--unit": "user_id",
        "--item": "item_id", "--epsilon": "8", "--out": "r",
    }  # fmt: skip
    base.update(dict(zip(args[0::2], args[1::2], strict=True)))
    code, out, err = _run(capsys, "publish-rr", *[x for kv in base.items() for x in kv])
    assert code == 1 and out == ""
    assert err.startswith("dpsql: error: ") and message in err and err.count("\n") == 1
    code, out, _ = _run(capsys, "ledger", "--db", db, "--format", "json")
    assert [e["kind"] for e in json.loads(out)] == ["policy"]


def test_duplicate_release_and_unknown_names(db: str, capsys) -> None:
    assert _publish(db, capsys)[0] == 0
    code, _, err = _publish(db, capsys)
    assert code == 1 and "already exists" in err and err.count("\n") == 1
    code, _, err = _run(
        capsys, "rr", "decode", "--db", db, "--analyst", "alice", "--release", "nope", "1"
    )
    assert code == 1 and err.startswith("dpsql: error: no release named 'nope'")
    code, _, err = _run(
        capsys, "rr", "decode", "--db", db, "--analyst", "alice", "--release", "r1", "x"
    )
    assert code == 1 and "integer id" in err
    code, _, err = _publish(db, capsys, "r2", "--max-items", "0")
    assert code == 2 and "--max-items" in err
