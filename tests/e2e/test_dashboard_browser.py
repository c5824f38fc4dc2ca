"""The dashboard in a real browser: headless Chromium (driven by selenium through the system's
chromedriver) loads ``celery -A ... pq dashboard`` against a live queue that a real Celery worker
consumes slowly, and the figures on the page are those of ``pq stats --json``.

Chromium and chromedriver come from scripts/ensure-chromium.sh (``make test`` runs it; as root on
Debian it installs them). When they are missing this test fails with that script's message.
It saves a screenshot of the page in pytest's temporary directory, and as docs/img/dashboard.png
when PQ_UPDATE_SCREENSHOTS=1 (how that picture is made: a test run never changes a tracked file
otherwise).
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from celery_pq.testing import wait_for

try:
    from e2e.test_celery_e2e import Harness
except ImportError:  # collected with the repository root on sys.path instead of tests/
    from tests.e2e.test_celery_e2e import Harness

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOT = ROOT / "docs" / "img" / "dashboard.png"
TOKEN = "browser-test-token-0123456789"
TENANTS = ("acme", "globex", "initech")
PRIORITIES = (0, 100, 200, 255)
COMPARED = ("waiting", "delayed", "leased", "dead")


def browser_paths() -> dict:
    """CHROMIUM and CHROMEDRIVER as scripts/ensure-chromium.sh finds them; fails with its message."""
    found = subprocess.run(
        ["bash", str(ROOT / "scripts" / "ensure-chromium.sh"), "--check"], capture_output=True, text=True
    )
    if found.returncode != 0:
        pytest.fail(found.stderr.strip() or "scripts/ensure-chromium.sh --check failed", pytrace=False)
    return dict(line.split("=", 1) for line in found.stdout.split())


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    paths = browser_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = paths["CHROMIUM"]
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--no-first-run",
        "--window-size=1280,800",
        f"--user-data-dir={tmp_path / 'chromium'}",
    ):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(paths["CHROMEDRIVER"]), options=options)
    driver.set_page_load_timeout(20)
    try:
        yield driver
    finally:
        driver.quit()


class Dashboard:
    """A ``pq dashboard`` subprocess on a free port; ``url`` once it said where it listens."""

    def __init__(self, h, tmp_path, *extra):
        self.log = tmp_path / f"dashboard{len(extra)}.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "tests.e2e.app", "pq", "dashboard", "--port", "0", *extra],
            cwd=ROOT,
            env=h.env,
            stdout=open(self.log, "wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.url = None

    def wait(self):
        def said():
            m = re.search(r"dashboard on (http://\S+/)", self.log.read_text())
            assert self.proc.poll() is None, self.log.read_text()
            return m and m.group(1)

        self.url = wait_for(said, 30, "the dashboard's address")
        return self

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


def cli_stats(h) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "celery", "-A", "tests.e2e.app", "pq", "stats", "--json", "q"],
        cwd=ROOT,
        env=h.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    [row] = json.loads(out.stdout)
    return row


def refreshes(driver) -> int:
    return int(driver.find_element("id", "updated").get_attribute("data-updated"))


def after_next_refresh(driver):
    seen = refreshes(driver)
    wait_for(lambda: refreshes(driver) > seen, 10, "a refresh of the page")


#: Reads a queue's figures from the page in one go (the page redraws itself every refresh, so
#: elements found one call earlier may be gone).
READ_PAGE = """
const q = arguments[0], sel = (s) => document.querySelectorAll(s);
const stat = (name) => {
  const e = document.querySelector(`[data-queue="${q}"][data-stat="${name}"]`);
  return e && e.dataset.value !== "" ? JSON.parse(e.dataset.value) : null;
};
const out = {per_priority: {}, per_tenant: {}, shares: {}};
for (const name of ["waiting", "delayed", "leased", "dead", "paused"]) out[name] = stat(name);
out.bar_order = [];
for (const g of sel(`svg[data-queue="${q}"] g.bar`)) {
  out.per_priority[g.dataset.priority] = Number(g.dataset.count);
  out.bar_order.push(Number(g.dataset.priority));
}
for (const row of sel(`tr[data-queue="${q}"][data-tenant]`)) {
  const v = (k) => Number(row.querySelector(`[data-stat="${k}"]`).dataset.value);
  out.per_tenant[row.dataset.tenant] = {waiting: v("waiting"), leased: v("leased")};
  out.shares[row.dataset.tenant] = v("share");
}
out.leases = sel(`section[data-queue="${q}"] tr[data-lease]`).length;
out.dead_reasons = [...sel(`section[data-queue="${q}"] [data-dead] [data-stat="reason"]`)].map((e) => e.textContent);
out.buttons = sel("button[data-action]").length;
return out;
"""


def page_figures(driver, queue="q") -> dict:
    """What the page shows for ``queue``, read from its data attributes."""
    return driver.execute_script(READ_PAGE, queue)


def cli_figures(row) -> dict:
    figures = {name: row[name] for name in COMPARED}
    figures["paused"] = row["paused"]
    figures["per_priority"] = row["per_priority"]  # JSON object keys: the priorities as text
    figures["per_tenant"] = {t: {"waiting": c["waiting"], "leased": c["leased"]} for t, c in row["per_tenant"].items()}
    return figures


def click(driver, action, queue="q"):
    """Press the queue's button (found and pressed in one go: the page redraws itself)."""
    pressed = driver.execute_script(
        "const b = document.querySelector(arguments[0]); if (b) b.click(); return !!b;",
        f'button[data-action="{action}"][data-queue="{queue}"]:not([data-tenant])',
    )
    assert pressed, f"no {action} button on the page"


@pytest.fixture
def live(redis_server, key_prefix, tmp_path):
    """A fair queue ``q`` with work of several priorities and tenants, two dead letters, three
    delayed tasks, and a real worker consuming it slowly."""
    h = Harness(redis_server, key_prefix, tmp_path, {"fair_key": "tenant"}, acks_late=False)
    dashboards = []
    try:
        n = 0
        for round_ in range(8):
            for tenant in TENANTS:
                for priority in PRIORITIES[: 2 + round_ % 3]:
                    h.send("e2e.sleep", 0.25, f"{tenant}-{n}", priority=priority, headers={"tenant": tenant})
                    n += 1
        for i in range(3):
            h.send("e2e.sleep", 0.1, f"later-{i}", priority=100, countdown=3600, headers={"tenant": "acme"})
        q = h.queue()
        for reason in ("rejected", "poisoned"):
            [lease] = q.pop(1, consumer="browser-test:1:dead")
            q.dead_letter(lease, reason)
        yield h, dashboards
    finally:
        for d in dashboards:
            d.close()
        h.close()


def test_the_page_shows_the_live_queue_as_stats_json_does_and_its_actions_work(live, browser, tmp_path):
    h, dashboards = live
    readonly = Dashboard(h, tmp_path)
    actions = Dashboard(h, tmp_path, "--allow-actions", "--token", TOKEN)
    dashboards += [readonly, actions]
    readonly.wait(), actions.wait()
    h.worker("w1")

    # Read-only: the figures are there and move, and no button is shown.
    browser.get(readonly.url)
    wait_for(lambda: refreshes(browser) >= 1, 15, "the first state")
    assert browser.find_element("id", "mode").text == "read-only"
    first = page_figures(browser)
    assert first["buttons"] == 0
    assert first["dead"] == 2 and first["delayed"] == 3 and first["paused"] is False
    wait_for(lambda: page_figures(browser)["waiting"] < first["waiting"], 20, "the worker to take work")

    # With actions but no token: the page asks for it, and a button pressed without it does nothing.
    browser.get(actions.url)
    wait_for(lambda: refreshes(browser) >= 1, 15, "the first state")
    assert browser.find_element("id", "token-form").is_displayed()
    click(browser, "pause")
    wait_for(lambda: "missing or wrong token" in browser.find_element("id", "error").text, 10, "the refusal")
    assert cli_stats(h)["paused"] is False and page_figures(browser)["paused"] is False

    # With the token in the address's fragment; the page drops it from the address.
    browser.get(actions.url + "#token=" + TOKEN)
    wait_for(lambda: "#token" not in browser.current_url, 10, "the token to leave the address")
    assert not browser.find_element("id", "token-form").is_displayed()
    assert browser.find_element("id", "mode").text == "actions allowed"
    # Shares of deliveries appear once the sampler has seen deliveries (every 2 s).
    wait_for(lambda: sum(page_figures(browser)["shares"].values()) > 0.99, 20, "tenants' shares of deliveries")
    wait_for(lambda: page_figures(browser)["leases"] > 0, 10, "a lease in flight")
    assert browser.find_element("id", "error").text == ""  # the refusal went with the new token
    shot = SCREENSHOT if os.environ.get("PQ_UPDATE_SCREENSHOTS") == "1" else tmp_path / "dashboard.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    assert browser.save_screenshot(str(shot)) and shot.stat().st_size > 10_000

    # Pause from the page: deliveries stop, the worker finishes what it holds, the queue is frozen.
    click(browser, "pause")
    wait_for(lambda: page_figures(browser)["paused"] is True, 10, "the page to show the queue paused")
    wait_for(lambda: page_figures(browser)["leased"] == 0, 20, "the worker to finish its task")
    frozen = cli_stats(h)
    after_next_refresh(browser)
    shown = page_figures(browser)
    assert cli_figures(cli_stats(h)) == cli_figures(frozen)  # nothing moved meanwhile
    assert {k: shown[k] for k in cli_figures(frozen)} == cli_figures(frozen)
    assert shown["buttons"] > 0
    assert shown["bar_order"] == [int(p) for p in frozen["per_priority"]]  # served first on the left
    assert frozen["waiting"] > 0 and len(frozen["per_priority"]) >= 2 and set(frozen["per_tenant"]) == set(TENANTS)
    assert browser.find_element("css selector", '[data-queue="q"][data-stat="paused"]').text == "paused"
    assert sorted(shown["dead_reasons"]) == ["poisoned", "rejected"]

    # Replay one dead letter from the page: it waits in the queue again (still paused, so it stays).
    pressed = browser.execute_script("""
        const row = [...document.querySelectorAll('[data-dead]')].find(
            (r) => r.querySelector('[data-stat="reason"]').textContent === "rejected");
        const b = row && row.querySelector('button[data-action="replay"]');
        if (b) b.click();
        return !!b;""")
    assert pressed, "no replay button beside the dead letter"
    wait_for(lambda: page_figures(browser)["dead_reasons"] == ["poisoned"], 10, "the replayed letter to leave")
    replayed = cli_stats(h)
    assert (replayed["dead"], replayed["waiting"]) == (1, frozen["waiting"] + 1)

    # Resume from the page: the worker takes work again.
    click(browser, "resume")
    wait_for(lambda: page_figures(browser)["paused"] is False, 10, "the page to show the queue delivering")
    wait_for(lambda: page_figures(browser)["waiting"] < replayed["waiting"], 20, "deliveries to start again")


def test_beyond_loopback_the_page_asks_for_the_token_before_it_shows_anything(live, browser, tmp_path):
    # Given a read-only dashboard listening on every interface, with a token
    h, dashboards = live
    open_ = Dashboard(h, tmp_path, "--host", "0.0.0.0", "--token", TOKEN)
    dashboards.append(open_)
    url = open_.wait().url.replace("0.0.0.0", "127.0.0.1")
    # When the page is opened without the token: it asks for it, and shows no queue
    browser.get(url)
    wait_for(lambda: "needs the token" in browser.find_element("id", "error").text, 15, "the state's refusal")
    assert browser.find_element("id", "token-form").is_displayed()
    assert refreshes(browser) == 0 and page_figures(browser)["waiting"] is None
    # Then, given the token in the form, it shows the queue as pq stats does
    browser.find_element("id", "token-input").send_keys(TOKEN)
    browser.execute_script("document.getElementById('token-form').requestSubmit();")
    wait_for(lambda: refreshes(browser) >= 1, 15, "the first state with the token")
    assert not browser.find_element("id", "token-form").is_displayed()
    assert browser.find_element("id", "mode").text == "read-only"
    assert page_figures(browser)["dead"] == cli_stats(h)["dead"] == 2
