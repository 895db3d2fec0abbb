"""The dashboard in a real headless browser (Debian's chromium driven by Playwright) against a
real job service on loopback, with a real 2-rank job that logs TensorBoard scalars.

Screenshots of each page go to ``$RINGTRAIN_TEST_ARTIFACTS`` (else a folder under the test's
tmp dir); the test prints where.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ringtrain.jobs.client.connection import connect
from ringtrain.jobs.client.jobs_client import JobsClient
from ringtrain.jobs.home import Home
from ringtrain.jobs.models import ClusterSpec, JobState, parse_job_spec

from .conftest import wait_for

CHROMIUM = "/usr/bin/chromium"
JOB_FILES = Path(__file__).parent / "dashboard_job"

playwright_api = pytest.importorskip("playwright.sync_api")
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM),
                                reason="needs Debian's chromium (scripts/setup.sh installs it)")


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    root = Path(os.environ.get("RINGTRAIN_TEST_ARTIFACTS") or tmp_path / "artifacts")
    folder = root / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"dashboard screenshots: {folder}")
    return folder


@pytest.fixture
def browser() -> Iterator[Any]:
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def service(home: Home, tmp_path: Path) -> Iterator[JobsClient]:
    client = connect(home=home)
    client.create_cluster(ClusterSpec(name="c", nodes=2, slots=2))
    yield client
    for job in client.list_jobs():
        if not job.state.is_terminal():
            client.terminate(job.id)
    client.close()


def _submit(client: JobsClient, tmp_path: Path, name: str, cluster: str = "c") -> str:
    wd = tmp_path / f"wd-{name}"
    if not wd.exists():
        shutil.copytree(JOB_FILES, wd)
    spec = parse_job_spec({"name": name, "node_count": 1, "process_count_per_node": 2,
                           "command": f"{sys.executable} train.py", "working_dir": str(wd),
                           "outputs": ["tb"]})
    return client.submit(cluster, spec).id


def _state_of(page: Any, job_id: str) -> str:
    return page.eval_on_selector(f'tr[data-job="{job_id}"] td.state', "e => e.textContent")


def _chart_points(page: Any) -> int:
    return page.evaluate("() => { const c = document.querySelector('.chart[data-tag=\"loss\"]');"
                         " return c ? Number(c.dataset.points) : 0; }")


def test_jobs_logs_curves_and_terminate_live_in_a_browser(
        service: JobsClient, home: Home, tmp_path: Path, browser: Any, artifacts: Path) -> None:
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("dialog", lambda d: d.accept())
    page.goto(service.dashboard_url())
    assert "token=" not in page.url  # the token went into a cookie, out of the address bar
    page.wait_for_selector("#live.on")

    job_id = _submit(service, tmp_path, "curves")
    job_dir = Path(service.get_job(job_id).job_dir)
    page.wait_for_selector(f'tr[data-job="{job_id}"]')  # appeared without a reload
    wait_for(lambda: _state_of(page, job_id) == "running")
    page.screenshot(path=str(artifacts / "jobs.png"), full_page=True)

    page.click(f'tr[data-job="{job_id}"] a')
    page.wait_for_selector('.chart[data-tag="loss"]')
    first = wait_for(lambda: _chart_points(page))
    assert service.get_job(job_id).state == JobState.RUNNING
    wait_for(lambda: _chart_points(page) > first)  # the chart grows while the job runs
    # A line per rank: each rank's event file reaches the chart on its own schedule (a
    # writer flushes every 2 s), so either may come first.
    def with_both_ranks() -> bool:
        legend = page.inner_text('.chart[data-tag="loss"] .legend')
        return "outputs/tb/rank0" in legend and "outputs/tb/rank1" in legend

    wait_for(with_both_ranks)
    page.wait_for_function("() => document.querySelector('#split') && document.querySelector("
                           "'#split').textContent.includes('rank 1 · 16.0 ms per step')")
    assert "rank 0 · 15.0 ms per step" in page.inner_text("#split")
    page.screenshot(path=str(artifacts / "job-curves.png"), full_page=True)

    page.click("a[data-nav='clusters']")  # the node the job holds, and what it uses
    page.wait_for_function(f"() => [...document.querySelectorAll('tr[data-node^=\"c/\"]')]"
                           f".some(r => r.textContent.includes('{job_id}')"
                           " && r.textContent.includes(' proc.'))")
    page.screenshot(path=str(artifacts / "clusters-running.png"), full_page=True)
    page.go_back()
    page.wait_for_selector('.chart[data-tag="loss"]')
    page.click('button[data-tab="logs"]')
    page.select_option("#log-rank", "1")
    # stdout and stderr together by default: the steps and the progress bar.
    page.wait_for_function("() => document.querySelector('#log').textContent"
                           ".includes('rank 1 step') && document.querySelector('#log')"
                           ".textContent.includes('progress ')")
    page.select_option("#log-stream", "stderr")
    # The bar redraws its line with "\r": one updating line, not one line per update.
    bar = ("() => /^progress (\\d+)\\/600$/.exec(document.querySelector('#log')"
           ".textContent.trim())?.[1]")
    first_step = int(page.wait_for_function(bar).json_value())
    page.wait_for_function(f"() => Number(({bar})()) > {first_step}")
    page.select_option("#log-stream", "output")
    (job_dir / "say.1").write_text("written after the page opened: 7f3e")
    page.wait_for_function("() => document.querySelector('#log').textContent"
                           ".includes('written after the page opened: 7f3e')")
    page.select_option("#log-rank", "0")
    page.wait_for_function("() => document.querySelector('#log').textContent"
                           ".includes('<script>window.__pwned = 1</script>')")
    # The job's markup is text: no element was made of it and its script never ran.
    assert page.evaluate("() => document.querySelectorAll('#log *').length") == 0
    assert page.evaluate("() => window.__pwned") is None
    page.screenshot(path=str(artifacts / "job-logs.png"), full_page=True)

    (job_dir / "release").write_text("")
    page.wait_for_function("() => document.querySelector('#job-state').textContent"
                           " === 'succeeded'")
    assert page.is_disabled("#terminate") and not page.is_disabled("#delete")
    page.click('button[data-tab="files"]')
    page.wait_for_selector("#files td.mono")
    assert "outputs/tb/rank0" in page.inner_text("#files")
    page.screenshot(path=str(artifacts / "job-files.png"), full_page=True)

    doomed = _submit(service, tmp_path, "doomed")
    page.goto(f"{service.url}/dashboard#/jobs/{doomed}")
    page.wait_for_function("() => document.querySelector('#job-state').textContent"
                           " === 'running'")
    page.click("#terminate")  # the confirmation dialog is accepted
    page.wait_for_function("() => document.querySelector('#job-state').textContent"
                           " === 'terminated'")
    assert service.get_job(doomed).state == JobState.TERMINATED

    page.goto(f"{service.url}/dashboard#/jobs")
    wait_for(lambda: _state_of(page, job_id) == "succeeded" and _state_of(page, doomed)
             == "terminated")
    page.click("th[data-key='state']")  # sort by state
    page.fill("input[type=search]", "doomed")
    assert page.eval_on_selector_all("#jobs-body tr[data-job]",
                                     "rows => rows.map(r => r.dataset.job)") == [doomed]
    page.fill("input[type=search]", "")
    page.screenshot(path=str(artifacts / "jobs-done.png"), full_page=True)
    page.click("a[data-nav='clusters']")
    page.wait_for_selector("tr[data-node='c/0']")
    page.screenshot(path=str(artifacts / "clusters.png"), full_page=True)
    page.click("a[data-nav='deployments']")
    page.wait_for_selector("#deployments .panel")
    page.screenshot(path=str(artifacts / "deployments.png"), full_page=True)
    assert problems == [], "\n".join(problems)


def test_a_log_pane_drops_terminal_escapes_and_keeps_markup_text(service: JobsClient,
                                                                 browser: Any) -> None:
    # Issue 35: colour codes showed as raw "[31m". The page's own function, fed a stream cut in
    # the middle of escapes as the log stream may cut it.
    page = browser.new_page()
    page.goto(service.dashboard_url())
    page.wait_for_selector("#live.on")
    chunks = ["\x1b[31mred\x1b[0m plain \x1b[1;", "32mgreen\x1b[0m\n",
              "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b", "\\ <b>b</b>\x1b[K\x1b(B\x1b[m\n\x1b",
              "[2K\rbar 1\rbar 2\n"]
    shown = page.evaluate("""chunks => {
        const out = document.createElement("pre");
        const append = terminalText(out, () => {});
        chunks.forEach(append);
        return [out.textContent, out.querySelectorAll("*").length];
    }""", chunks)
    assert shown == ["red plain green\nlink <b>b</b>\nbar 2\n", 0]


# A job whose outputs look like a saved model (so that it can be deployed) but are not one: its
# deployment's job starts, fails to load it and ends, and stays a job that `serves` another.
BROKEN_MODEL = ('cd "$RINGTRAIN_OUTPUT_MODEL" && echo \'{"arch": "nonesuch"}\' > model.json '
                '&& echo junk > model.pt')
# TensorBoard's smoothing, as its scalar dashboard computes it: a debiased moving average.
SMOOTHED = [1.0, 1.625, 2.3265306122448983, 5.852941176470588]


def _tensorboard_smoothing(ys: list[float], weight: float) -> list[float]:
    last, out = 0.0, []
    for n, y in enumerate(ys, 1):
        last = last * weight + (1 - weight) * y
        out.append(last / (1 - weight ** n))
    return out


def test_smoothing_log_scale_compare_progress_ranks_and_stack_in_a_browser(
        service: JobsClient, tmp_path: Path, browser: Any, artifacts: Path) -> None:
    service.create_cluster(ClusterSpec(name="d", nodes=3, slots=2))
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}")
            if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.goto(service.dashboard_url())
    page.wait_for_selector("#live.on")

    # A deployment's job is no training job: out of the list unless asked for.
    model = service.submit("d", parse_job_spec({"name": "broken", "node_count": 1,
                                                "command": BROKEN_MODEL, "outputs": ["model"]}))
    wait_for(lambda: service.get_job(model.id).state == JobState.SUCCEEDED, timeout_s=120)
    serving = service.deploy(model.id).id
    assert service.get_job(serving).serves == model.id
    page.wait_for_function("() => document.querySelector('#jobs-table').closest('.panel')"
                           ".textContent.includes('1 deployment job(s) hidden')")
    assert page.query_selector(f'tr[data-job="{serving}"]') is None
    page.check("#show-serving")
    page.wait_for_selector(f'tr[data-job="{serving}"]')
    page.uncheck("#show-serving")
    page.wait_for_selector(f'tr[data-job="{serving}"]', state="detached")

    jobs = [_submit(service, tmp_path, name, cluster="d") for name in ("alpha", "beta")]
    for j in jobs:
        page.wait_for_selector(f'tr[data-job="{j}"]')
    wait_for(lambda: all(_state_of(page, j) == "running" for j in jobs))
    # Progress from the step scalars, with an ETA: rank 0 logged total_steps = 600.
    page.wait_for_function(
        f"() => /^step \\d+ \\/ 600 · [\\d.]+ steps\\/s · ETA \\d+m \\d+s$/.test(document"
        f".querySelector('tr[data-job=\"{jobs[0]}\"] td.progress')?.textContent || '')")
    page.screenshot(path=str(artifacts / "jobs-progress.png"), full_page=True)

    # Compare: tick both, one chart per tag with a line per job and rank.
    assert page.is_disabled("#compare")
    for j in jobs:
        page.check(f'tr[data-job="{j}"] td.pick input')
    page.click("#compare")
    legend = '.chart[data-tag="loss"] .legend'
    page.wait_for_function(f"() => {{ const t = document.querySelector('{legend}')?.textContent"
                           f" || ''; return ['{jobs[0]}', '{jobs[1]}'].every(j => "
                           "['rank0', 'rank1'].every(r => t.includes(`${j} · outputs/tb/${r}`)))"
                           " }")
    assert page.url.endswith(f"#/compare/{jobs[0]},{jobs[1]}")
    page.screenshot(path=str(artifacts / "compare.png"), full_page=True)

    # Smoothing (TensorBoard's formula) with the raw line faint behind, then a log scale.
    page.goto(f"{service.url}/dashboard#/jobs/{jobs[0]}")
    page.wait_for_function("() => Number(document.querySelector('.chart[data-tag=\"loss\"]')"
                           "?.dataset.points) > 10")
    got = page.evaluate("() => LineChart.smooth([1, 2, 3, 10], 0.6)")
    assert got == pytest.approx(_tensorboard_smoothing([1, 2, 3, 10], 0.6))
    assert got == pytest.approx(SMOOTHED)
    page.eval_on_selector("#smoothing", "e => { e.value = '0.9'; "
                          "e.dispatchEvent(new Event('input')); }")
    chart = '.chart[data-tag="loss"]'
    assert page.get_attribute(chart, "data-smoothing") == "0.9"
    raw = page.eval_on_selector_all(f"{chart} path.raw", "ps => ps.map(p => ["
                                    "p.getAttribute('stroke-opacity'), p.getAttribute('d')])")
    smooth = page.eval_on_selector_all(f"{chart} path.smoothed",
                                       "ps => ps.map(p => p.getAttribute('d'))")
    assert len(raw) == len(smooth) == 2 and all(float(o) < 0.5 for o, _ in raw)
    assert [d for _, d in raw] != smooth  # a line per rank, each smoothed
    page.check("#log-y")
    assert page.get_attribute(chart, "data-scale") == "log"
    assert page.get_attribute(chart, "data-hidden") == "0"  # losses are all > 0
    # Values <= 0 have no place on a log axis: left out, and the legend says how many.
    ticks = page.evaluate("""() => {
        const box = document.createElement('div'); document.body.appendChild(box);
        const c = new LineChart(box, 'signs');
        c.set([{name: 'a', color: '#000', xs: [0, 1, 2, 3, 4], ys: [-1, 0, 0.01, 1, 100]}],
              false, {smoothing: 0, logY: true});
        const out = [c.root.dataset.hidden, c.legend.textContent,
                     [...c.svg.querySelectorAll('.axis text')].map(t => t.textContent)];
        box.remove(); return out; }""")
    assert ticks[0] == "2" and "2 value(s) ≤ 0 not shown" in ticks[1]
    assert {"0.01", "0.1", "1", "10", "100"} <= set(ticks[2])
    page.screenshot(path=str(artifacts / "job-curves-smoothed-log.png"), full_page=True)
    page.reload()  # the settings stay with the browser
    page.wait_for_selector(f"{chart} path.smoothed")
    assert page.input_value("#smoothing") == "0.9" and page.is_checked("#log-y")
    assert page.get_attribute(chart, "data-scale") == "log"

    # Each rank's CPU and memory, and a rank's stack on demand.
    page.click('button[data-tab="ranks"]')
    page.wait_for_function("() => ['0', '1'].every(r => /\\d+%/.test(document.querySelector("
                           "`tr[data-rank=\"${r}\"]`)?.children[2].textContent || ''))")
    assert "MiB" in page.inner_text('tr[data-rank="1"]')
    page.click('button[data-stack="0"]')
    page.wait_for_function("() => document.querySelector('#stack').textContent"
                           ".includes('(train.py:')")
    assert "Thread" in page.inner_text("#stack")
    page.screenshot(path=str(artifacts / "job-processes.png"), full_page=True)
    for j in jobs:
        (Path(service.get_job(j).job_dir) / "release").write_text("")
    assert problems == [], "\n".join(problems)


def test_the_api_docs_render_every_operation_offline(service: JobsClient, browser: Any,
                                                     artifacts: Path) -> None:
    # FastAPI writes OpenAPI 3.1, which Swagger UI before 5 cannot render ("Unable to render
    # this definition"): assets that load are not enough, the operations must be listed.
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    problems: list[str] = []
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))

    def only_the_service(route: Any) -> None:
        if route.request.url.startswith(service.url):
            route.continue_()
        else:  # a CDN: the page must work offline
            problems.append(f"request off the service: {route.request.url}")
            route.abort()

    page.route("**/*", only_the_service)
    page.goto(service.dashboard_url().replace("/dashboard", "/docs"))
    page.wait_for_selector(".opblock")
    text = page.inner_text("body")
    paths = page.eval_on_selector_all(".opblock-summary-path",
                                      "nodes => nodes.map(n => n.textContent.trim())")
    page.screenshot(path=str(artifacts / "api-docs.png"), full_page=True)
    assert "Unable to render" not in text
    assert len(paths) >= 20 and "/v1/jobs" in paths and "/v1/clusters" in paths, paths
    assert problems == [], "\n".join(problems)
