"""`report -o` never replaces the user's work without --force (issue 65): a report ddprobe wrote is rendered again in
place only while its content is what ddprobe wrote (the digest on its last line); notes appended or a cell changed
make it the user's. Real files, the real command."""
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddprobe.cli import app
from ddprobe.reports import render

DATA = Path(__file__).parent / "data"
RESULTS = DATA / "bench-verify-h200-raw.json"
runner = CliRunner()


def report(*args):
    return runner.invoke(app, ["report", str(RESULTS), *map(str, args)])


@pytest.mark.parametrize("name", ["r.html", "r.md"])
def test_an_unedited_report_renders_again_and_an_edited_one_is_kept(tmp_path, name):
    out = tmp_path / name
    assert report("-o", out).exit_code == 0
    first = out.read_text()
    assert first.splitlines()[-1].startswith("<!-- ddprobe report sha256:") and render.rewritable(out) is None
    r = report("-o", out)  # unedited: rendered again in place
    assert r.exit_code == 0 and "report written to" in r.output, r.output
    notes = out.read_text() + "\nMy notes: the 128k row was measured with the fan broken.\n"
    out.write_text(notes)
    r = report("-o", out)
    assert r.exit_code == 1 and len(r.output.strip().splitlines()) == 1, r.output
    assert "already holds a ddprobe report edited since ddprobe wrote it" in r.output and "--force" in r.output
    assert out.read_text() == notes  # the notes are kept
    r = report("-o", out, "--force")
    assert r.exit_code == 0 and "My notes" not in out.read_text()


def test_an_edit_inside_the_report_counts_as_much_as_an_appended_note(tmp_path):
    out = tmp_path / "r.md"
    assert report("-o", out).exit_code == 0
    text = out.read_text()
    i = text.index("\n## ") + 1
    out.write_text(text[:i] + "Note: rerun after the driver update.\n\n" + text[i:])
    assert "edited since" in render.rewritable(out)
    out.write_text(text.replace("ddprobe report", "ddprobe report (checked by Ana)", 1))
    assert "edited since" in render.rewritable(out)


def test_an_older_report_without_a_digest_is_kept_and_another_file_too(tmp_path):
    """A report of an older ddprobe (no digest line) cannot be told from an edited one: kept without --force."""
    out = tmp_path / "r.html"
    assert report("-o", out).exit_code == 0
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:-1]))
    r = report("-o", out)
    assert r.exit_code == 1 and "without its digest line" in r.output
    (tmp_path / "page.html").write_text("<html>mine</html>\n")
    r = report("-o", tmp_path / "page.html")
    assert r.exit_code == 1 and "not a ddprobe report" in r.output
    assert (tmp_path / "page.html").read_text() == "<html>mine</html>\n"
