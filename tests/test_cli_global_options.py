"""Options every command takes, before or after the command word: ``--db``, ``--version``."""

from __future__ import annotations

from privsched import __version__
from privsched.ledger import Ledger


def test_version_prints_the_package_version_and_exits_0(run_cli):
    result = run_cli("--version")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"privsched {__version__}"


def test_db_before_the_command_word_names_the_database_of_that_command(run_cli, tmp_path):
    first = run_cli("--db", tmp_path / "a.db", "init")
    second = run_cli("--db=" + str(tmp_path / "a.db"), "dataset", "create", "d", "--epsilon", "1", "--delta", "1e-6")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    with Ledger(tmp_path / "a.db") as ledger:
        assert [d.name for d in ledger.list_datasets()] == ["d"]
    assert not (tmp_path / "privsched.db").exists()


def test_db_after_the_command_word_wins_over_one_before_it(run_cli, tmp_path):
    assert run_cli("--db", tmp_path / "b.db", "init").returncode == 0
    result = run_cli("--db", tmp_path / "missing-parent" / "x.db", "dataset", "list", "--db", tmp_path / "b.db")
    assert result.returncode == 0, result.stderr
    assert not (tmp_path / "missing-parent").exists()


def test_show_completion_prints_a_bash_completion_script_for_privsched(run_cli):
    shown = run_cli("--show-completion", "bash")
    assert shown.returncode == 0, shown.stderr
    assert "complete " in shown.stdout and "_PRIVSCHED_COMPLETE" in shown.stdout.upper()


def test_the_help_offers_shell_completion(run_cli):
    helped = run_cli("--help", env={"COLUMNS": "200"})
    assert "--install-completion" in helped.stdout and "--show-completion" in helped.stdout
