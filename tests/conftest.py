"""Shared fixtures (a headless browser that loads a report and says what it saw, the test data folder, a Triton
script in an interpreter child) and the suite's markers: ``interpreter`` tests run their Triton kernels; on a
machine without a GPU they run in one child pytest per file under TRITON_INTERPRET=1 and are reported here test by
test (``ChildResult``)."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"

# Injected before </body>: reports what the browser loaded and laid out, as JSON in a <pre>.
CHECK = """<script>
window.addEventListener('load', function () {
  var imgs = Array.prototype.slice.call(document.images);
  var secs = Array.prototype.slice.call(document.querySelectorAll('section'));
  var out = {
    images: imgs.length,
    loaded: imgs.filter(function (i) { return i.complete && i.naturalWidth > 0; }).length,
    shown: imgs.filter(function (i) { return i.getBoundingClientRect().width > 100; }).length,
    sections: secs.filter(function (s) { return s.getBoundingClientRect().height > 0; }).map(function (s) {
      return s.id; }),
    overflow: document.documentElement.scrollWidth - window.innerWidth
  };
  var pre = document.createElement('pre');
  pre.id = 'ddprobe-check';
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


@pytest.fixture(scope="session", autouse=True)
def _foreign_log(tmp_path_factory):
    """The third-party messages the suite's commands keep go to a log in the suite's own temp folder, not the
    machine's shared one (``ddprobe.foreign.log_path``): child processes inherit it."""
    os.environ["DDPROBE_FOREIGN_LOG"] = str(tmp_path_factory.mktemp("foreign") / "ddprobe-foreign.log")
    yield


@pytest.fixture(scope="session")
def browser() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.skip("headless Chromium is not installed (Debian: apt-get install chromium; .ci/run installs it)")


@pytest.fixture
def load_in_browser(browser, tmp_path):
    """load(html_text, width) -> what the page reported after loading in headless Chromium (no network)."""

    def load(html: str, width: int = 1400) -> dict:
        page = tmp_path / f"page-{width}.html"
        page.write_text(html.replace("</body>", CHECK + "\n</body>"))
        cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               f"--user-data-dir={tmp_path / 'profile'}", "--host-resolver-rules=MAP * ~NOTFOUND",
               f"--window-size={width},900", "--virtual-time-budget=5000", "--dump-dom", page.as_uri()]
        dom = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
        m = re.search(r'<pre id="ddprobe-check">(.*?)</pre>', dom)
        assert m, f"the check script did not run; chromium printed {dom[:300]!r}"
        return json.loads(m.group(1).replace("&quot;", '"'))

    return load


@pytest.fixture
def run_triton_script():
    """run(script): runs a Python script that uses the Triton paths in a child process, on a machine without a
    GPU under TRITON_INTERPRET=1 set for that child alone (the switch cannot leak into other tests); the script
    must print ok."""
    import os
    import sys

    import torch

    pytest.importorskip("triton")

    def run(script: str, timeout: int = 300) -> None:
        env = dict(os.environ)
        if not torch.cuda.is_available():
            env["TRITON_INTERPRET"] = "1"
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                              timeout=timeout)
        assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-3000:]

    return run


# ---- Triton kernel tests in an interpreter child, reported per test ---------------------------------------------
CHILD_REPORT = "DDPROBE_CHILD_REPORT"  # set in the child: the file its per-test outcomes are appended to


def kernels_run_here() -> bool:
    """Triton kernels run in this process: a GPU, or the interpreter switched on before triton was imported."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    """Without a GPU (and not in the interpreter child) each ``interpreter`` test is replaced by a ChildResult of
    the same id: the file's kernel tests run once, in one child, when the first of them is reached."""
    if not any(i.get_closest_marker("interpreter") for i in items) or kernels_run_here():
        return
    children: dict = {}
    for n, item in enumerate(items):
        if item.get_closest_marker("interpreter"):
            items[n] = ChildResult.from_parent(item.parent, name=item.name, children=children,
                                               timeout=getattr(item.module, "INTERPRETER_TIMEOUT", 600),
                                               origin=item.reportinfo())
            items[n].own_markers = list(item.own_markers)
            items[n].keywords.update(item.keywords)
            items[n].add_marker("slow")  # the file's child runs for minutes


def run_child(ids: list[str], timeout: int) -> dict:
    """The ``interpreter`` tests ``ids`` (node ids) in a child pytest with TRITON_INTERPRET=1 set for that child alone
    -> {node id: (outcome, text)}: 'failed' when any phase failed (the report's text), 'skipped' (the reason), else
    'passed'. A child that stops early (a crash, the timeout) leaves its tests missing from the answer."""
    import tempfile

    pytest.importorskip("triton")
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "reports.jsonl"
        env = dict(os.environ, TRITON_INTERPRET="1", **{CHILD_REPORT: str(log)})
        cmd = [sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider", "-m", "interpreter",
               "-W", "ignore::RuntimeWarning", *ids]
        try:
            done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                                  cwd=Path(__file__).parents[1])
            tail = done.stdout[-3000:] + done.stderr[-2000:]
        except subprocess.TimeoutExpired:
            tail = f"the child ran past {timeout} s"
        out: dict = {"": ("", tail)}
        for line in log.read_text().splitlines() if log.exists() else []:
            r = json.loads(line)  # a test's phases in order: the first that did not pass decides
            if out.get(r["nodeid"], ("passed",))[0] == "passed":
                out[r["nodeid"]] = (r["outcome"], r["text"])
    return out


class ChildResult(pytest.Item):
    """An ``interpreter`` test on a machine without a GPU: passes, fails or skips as the same test did in the
    interpreter child of its file (run once per file, for the first of its tests reached, on the file's tests that
    this run selected)."""

    def __init__(self, *, children: dict, timeout: int, origin: tuple, **kw):
        super().__init__(**kw)
        self.children, self.timeout, self.origin = children, timeout, origin

    def runtest(self) -> None:
        path = self.path
        if path not in self.children:
            ids = [i.nodeid for i in self.session.items if isinstance(i, ChildResult) and i.path == path]
            self.children[path] = run_child(ids, self.timeout)
        got = self.children[path]
        outcome, text = got.get(self.nodeid, ("missing", ""))
        if outcome == "skipped":
            pytest.skip(text)
        if outcome != "passed":
            raise ChildFailure(text if outcome == "failed" else
                               f"not reported by the interpreter child; its output ends:\n{got[''][1]}")

    def repr_failure(self, excinfo):
        return str(excinfo.value) if isinstance(excinfo.value, ChildFailure) else super().repr_failure(excinfo)

    def reportinfo(self):
        return self.origin  # the test function's file and line


class ChildFailure(Exception):
    """What the interpreter child reported for a failed test."""


def pytest_runtest_logreport(report):
    """In the interpreter child: each phase's outcome appended to the parent's file (ChildResult reads it)."""
    log = os.environ.get(CHILD_REPORT)
    if log and (report.when == "call" or report.outcome != "passed"):
        text = report.longrepr[2] if report.skipped and isinstance(report.longrepr, tuple) else \
            (report.longreprtext if report.outcome == "failed" else "")
        with open(log, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "outcome": report.outcome, "text": text}) + "\n")
