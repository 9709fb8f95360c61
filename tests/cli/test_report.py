"""``dpsql report plan|run`` end to end: the printed plan, the refusal and its exit status."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from dpsql.accountant import periods
from dpsql.cli import main
from dpsql.engine.demo import DEMO_POLICY, build_demo
from dpsql.engine.session import database_budget, set_policy
from tests.engine.test_report import SPEC


def _setup(tmp_path: Path, total: float) -> tuple[str, str]:
    database = build_demo(tmp_path / "d.duckdb", rows=5_000, users=500)
    set_policy(database, DEMO_POLICY)
    spec = tmp_path / "report.toml"
    spec.write_text(SPEC.format(rule="weights").replace("epsilon = 1.0", f"epsilon = {total}"))
    return str(database), str(spec)


def test_plan_prints_the_split_and_run_writes_the_report(tmp_path: Path, capsys) -> None:
    database, spec = _setup(tmp_path, 1.0)
    assert main(["report", "plan", spec, "--db", database, "--analyst", "bob"]) == 0
    out = capsys.readouterr().out
    assert "by_country" in out and "0.45" in out and "fits: yes" in out
    assert "total: epsilon=1 (1000000000 units of 1e-9)" in out
    assert main(["report", "plan", spec, "--db", database, "--analyst", "bob", "--format",
                 "json"]) == 0  # fmt: skip
    planned = json.loads(capsys.readouterr().out)
    assert sum(q["epsilon_units"] for q in planned["queries"]) == 10**9
    assert database_budget(database, "bob").for_analyst("bob").epsilon_spent == 0
    out_dir = tmp_path / "out"
    assert main(["report", "run", spec, "--db", database, "--analyst", "bob", "--out",
                 str(out_dir)]) == 0  # fmt: skip
    assert "ledger entry 2" in capsys.readouterr().out
    assert (out_dir / "report.html").is_file() and (out_dir / "by_country.csv").is_file()
    assert database_budget(database, "bob").for_analyst("bob").epsilon_spent == 1.0


def test_a_batch_that_does_not_fit_exits_1_naming_the_shortfall(tmp_path: Path, capsys) -> None:
    database, spec = _setup(tmp_path, 3.0)
    assert main(["report", "plan", spec, "--db", database, "--analyst", "bob"]) == 1
    captured = capsys.readouterr()
    assert "fits: NO" in captured.out
    assert captured.err.strip() == (
        "dpsql: error: report 'Monthly traffic' needs epsilon=3, delta=0: analyst 'bob' has "
        "epsilon=2, delta=0 remaining: short by epsilon=1; nothing was charged"
    )
    assert main(["report", "run", spec, "--db", database, "--analyst", "bob", "--out",
                 str(tmp_path / "out")]) == 1  # fmt: skip
    assert not (tmp_path / "out").exists()
    assert database_budget(database, "bob").for_analyst("bob").epsilon_spent == 0


def test_budget_shows_the_current_period(tmp_path: Path, capsys) -> None:
    database = build_demo(tmp_path / "d.duckdb", rows=2_000, users=200)
    set_policy(database, DEMO_POLICY.replace("[dataset]\n", '[dataset]\nperiod = "month"\n'))
    month = periods.label("month", dt.datetime.now(dt.UTC))
    assert main(["budget", "--db", str(database)]) == 0
    assert f"Privacy budget (period {month})" in capsys.readouterr().out
    assert main(["budget", "--db", str(database), "--format", "json"]) == 0
    lines = json.loads(capsys.readouterr().out)["lines"]
    assert {line["period"] for line in lines} == {month}
