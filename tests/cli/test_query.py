"""``dpsql query``, ``explain``, ``contributions`` and ``result`` on the demo data: output
formats, valid JSON, one-line errors that charge nothing, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from dpsql.cli import main
from tests.conftest import released_answer


def _strict_json(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise ValueError(f"invalid JSON constant {constant}")

    return json.loads(text, parse_constant=refuse)


def test_query_json_layout(db: str, capsys) -> None:
    sql = "SELECT country, COUNT(*) AS n, AVG(latency_ms) AS l FROM requests GROUP BY country"
    assert (
        main(
            ["query", "--db", db, "--analyst", "alice", "--epsilon", "0.3", "--format", "json", sql]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["columns"] == ["country", "n", "l"]
    assert len(out["rows"]) == 5 and set(out["intervals"]) == {"n", "l"}
    assert out["epsilon_spent"] == 0.3 and out["delta_spent"] == 0.0
    assert out["mechanism"] == "discrete_laplace" and out["confidence"] == 0.95
    assert all(
        lo <= row[1] <= hi for row, (lo, hi) in zip(out["rows"], out["intervals"]["n"], strict=True)
    )


def test_query_table_and_csv(db: str, capsys) -> None:
    assert (
        main(
            [
                "query",
                "--db",
                db,
                "--analyst",
                "bob",
                "--epsilon",
                "0.5",
                "SELECT COUNT(*) AS n FROM requests",
            ]
        )
        == 0
    )
    assert "spent epsilon=0.5" in capsys.readouterr().out
    assert (
        main(
            [
                "query",
                "--db",
                db,
                "--analyst",
                "bob",
                "--format",
                "csv",
                "SELECT COUNT(*) AS n FROM requests",
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "n,n_low,n_high" and len(lines) == 2


def test_json_output_is_valid_json_with_null_for_avg_noise_scale(db: str, capsys) -> None:
    sql = "SELECT country, AVG(latency_ms) AS l FROM requests GROUP BY country"
    assert main(["query", "--db", db, "--analyst", "alice", "--format", "json", sql]) == 0
    out = _strict_json(capsys.readouterr().out)
    assert out["noise_scale"] == {"l": None}
    assert out["measures"]["l"].startswith("mean of latency_ms clamped to [0, 2000]")
    # IS has no rows: its mean is the middle of the bounds, its interval all of them.
    iceland = out["columns"].index("l"), [r[0] for r in out["rows"]].index("IS")
    assert out["intervals"]["l"][iceland[1]] == [0, 2000]
    assert out["rows"][iceland[1]][1] == 1000


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--epsilon", "0.1", "SELECT COUNT(* FROM requests"], "malformed SQL"),
        (
            ["--epsilon", "0.1", "SELECT url, SUM(bytes) FROM requests GROUP BY url"],
            "single GROUP BY column with COUNT(*) only",
        ),
        (["--epsilon", "-1", "SELECT COUNT(*) FROM requests"], "epsilon must be > 0"),
        (["--epsilon", "nan", "SELECT COUNT(*) FROM requests"], "epsilon must be finite"),
        (
            ["--epsilon", "0.1", "--delta", "2", "SELECT COUNT(*) FROM requests"],
            "delta must be < 1",
        ),
        (["--epsilon", "50", "SELECT COUNT(*) FROM requests"], "budget exceeded"),
        (["--epsilon", "0.1", "DROP TABLE requests"], "only SELECT"),
    ],
)
def test_errors_are_one_line_on_stderr_and_charge_nothing(db: str, capsys, args, fragment) -> None:
    assert main(["query", "--db", db, "--analyst", "alice", *args]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.startswith("dpsql: error: ") and fragment in captured.err
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    main(["ledger", "--db", db, "--format", "json"])
    assert len(json.loads(capsys.readouterr().out)) == 1


def test_the_analyst_cannot_set_a_memory_limit(db: str, capsys) -> None:
    args = ["--epsilon", "0.1", "--memory-limit", "8MB", "SELECT COUNT(*) FROM requests"]
    assert main(["query", "--db", db, "--analyst", "alice", *args]) == 2
    assert "No such option '--memory-limit'" in capsys.readouterr().err
    main(["ledger", "--db", db, "--format", "json"])
    assert len(json.loads(capsys.readouterr().out)) == 1


def test_a_database_locked_by_another_process_gets_a_clear_message(db: str, capsys) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, time; c = duckdb.connect({db!r}); print('ready', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        sql = "SELECT COUNT(*) FROM requests"
        assert main(["query", "--db", db, "--analyst", "alice", sql]) == 1
        err = capsys.readouterr().err
        assert "another process has it open for writing" in err and "IOException" not in err
    finally:
        holder.kill()
        holder.wait()
    time.sleep(0.1)
    assert main(["ledger", "--db", db, "--analyst", "alice"]) == 0
    assert "SELECT COUNT" not in capsys.readouterr().out  # nothing was charged


def test_contributions_command_prints_suggested_bounds(db: str, capsys) -> None:
    args = ["contributions", "--db", db, "--analyst", "alice", "--table", "requests"]
    assert main([*args, "--group-by", "country", "--suggest"]) == 0
    out = capsys.readouterr().out
    assert "suggested max_groups_per_unit" in out and "spent epsilon=0.1" in out


def test_a_released_answer_is_fetched_again_for_free_by_its_analyst_only(
    db: str,
    capsys,
) -> None:
    sql = "SELECT country, COUNT(*) AS n FROM requests GROUP BY country"
    assert main(["query", "--db", db, "--analyst", "alice", "--format", "json", sql]) == 0
    first = _strict_json(capsys.readouterr().out)
    seq = first["ledger_entry"]
    assert main(["budget", "--db", db, "--format", "json"]) == 0
    spent = json.loads(capsys.readouterr().out)["lines"][0]["epsilon_spent"]
    assert main(["result", "--db", db, "--analyst", "alice", "--format", "json", str(seq)]) == 0
    assert _strict_json(capsys.readouterr().out) == first
    assert main(["result", "--db", db, "--format", "json", str(seq)]) == 0  # administrator
    assert _strict_json(capsys.readouterr().out) == first
    assert main(["result", "--db", db, "--analyst", "bob", str(seq)]) == 1
    assert f"ledger entry {seq} has no stored answer of analyst 'bob'" in capsys.readouterr().err
    assert main(["budget", "--db", db, "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["lines"][0]["epsilon_spent"] == spent


def test_a_grouped_table_warns_it_counts_persons_and_rounds_to_the_noise(db: str, capsys) -> None:
    """The demo policy keeps 1 row per person per group of 20 in all: the table says so, and
    so does the JSON (the rounding of displayed values: ``_shown`` below)."""
    sql = "SELECT country, COUNT(*) AS n, AVG(latency_ms) AS l FROM requests GROUP BY country"
    args = ["query", "--db", db, "--analyst", "alice", "--epsilon", "0.3"]
    assert main([*args, sql]) == 0
    out = capsys.readouterr().out
    assert "warning: GROUP BY country keeps at most 1 row per person per group" in out
    assert "counts persons" in out
    assert main([*args, "--format", "json", sql]) == 0
    data = json.loads(capsys.readouterr().out)
    assert "counts persons" in data["details"]["warnings"][0]


def test_displayed_values_are_rounded_to_their_noise() -> None:
    from dpsql.cli.output import _shown

    result = released_answer(
        ["k", "mean"],
        [("a", 2006.6364399664149), ("b", 0.3238866396761)],
        {"mean": [(1861.4141745, 2159.2354713), (0.1826401, 0.5034482)]},
    )
    columns, rows = result.interval_table()
    assert [_shown(columns, row, result) for row in rows] == [
        ["a", 2010.0, 1860.0, 2160.0],
        ["b", 0.32, 0.18, 0.51],
    ]


@pytest.mark.parametrize(("output_format", "printer"), [("table", []), ("json", ["rich"])])
def test_a_count_loads_no_data_frames_and_no_service(
    db: str, output_format: str, printer: list[str]
) -> None:
    """A query answered as rows imports neither pandas nor pyarrow (0.3 s of start), nor the
    service or the plotting libraries; printed as JSON, not rich either."""
    unneeded = ["pandas", "pyarrow", "fastapi", "uvicorn", "jinja2", "matplotlib", "scipy"]
    unneeded += printer
    args = ["query", "--db", db, "--analyst", "bob", "--epsilon", "0.5", "--format", output_format]
    code = (
        "import sys; from dpsql.cli import main; "
        f"assert main({[*args, 'SELECT COUNT(*) AS n FROM requests']!r}) == 0; "
        f"print([m for m in {unneeded!r} if m in sys.modules])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.splitlines()[-1] == "[]"
