"""``privsched budget show --plot``: the blocks page's bars as an image file."""

from __future__ import annotations

from pathlib import Path

from tests.support.dashboard import populated_client


def test_budget_show_draws_every_dataset_to_a_png(tmp_db: Path, tmp_path: Path, run_cli):
    populated_client(tmp_db).close()
    figure = tmp_path / "out" / "budget.png"
    result = run_cli("budget", "show", "--plot", figure, "--db", tmp_db)
    assert result.returncode == 0, result.stderr
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"budget figure: {figure}" in result.stdout and "d1" in result.stdout


def test_an_unknown_image_format_is_refused_before_anything_is_read(tmp_db: Path, tmp_path: Path, run_cli):
    populated_client(tmp_db).close()
    result = run_cli("budget", "show", "--plot", tmp_path / "budget.gif", "--db", tmp_db)
    assert result.returncode == 1
    assert result.stderr.strip() == "error: --plot budget.gif: the file name must end in one of .png, .svg, .pdf"
    assert not (tmp_path / "budget.gif").exists()


def test_an_unwritable_figure_path_is_one_line(tmp_db: Path, run_cli):
    populated_client(tmp_db).close()
    result = run_cli("budget", "show", "--plot", "/proc/budget.png", "--db", tmp_db)
    assert result.returncode == 1
    assert len(result.stderr.strip().splitlines()) == 1 and result.stderr.startswith("error: --plot /proc/budget.png")
