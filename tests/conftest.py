"""Shared fixtures: a headless browser that loads a report and says what it saw, and the test data folder."""
import json
import re
import shutil
import subprocess
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


@pytest.fixture
def rerun_under_interpreter():
    """run(test_file, timeout): the whole test file again in one child pytest with TRITON_INTERPRET=1 set for that
    child alone (kernel tests on a machine without a GPU); the child must pass every test it runs."""
    import os
    import sys

    pytest.importorskip("triton")

    def run(test_file: str, timeout: int = 600) -> None:
        env = dict(os.environ, TRITON_INTERPRET="1")
        done = subprocess.run([sys.executable, "-m", "pytest", "-o", "addopts=", "-q", "-p", "no:cacheprovider",
                               "-W", "ignore::RuntimeWarning", test_file],
                              env=env, capture_output=True, text=True, timeout=timeout, cwd=Path(__file__).parents[1])
        print(done.stdout[-3000:])
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
        assert " passed" in done.stdout and " failed" not in done.stdout

    return run
