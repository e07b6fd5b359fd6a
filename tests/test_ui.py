"""The Temporal Web UI as a user sees it: headless Chromium from Debian's packages, driven by Playwright
with an explicit executable (no browser download), lists the peerings of one foreign cluster through
the ForeignCluster search attribute (and not the home cluster's peering with another one), opens the peering
and finds its current details (the markdown table of resources, with the advertised amounts). Saves a
screenshot in the test's tmp directory."""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Callable
from pathlib import Path

import pytest
from playwright.async_api import Frame, Locator, Page, async_playwright

from deploy.localenv.clusters import LocalCluster
from deploy.localenv.env import EnvState
from kube.objects import read_cluster_object
from models.names import ADVERTISEMENTS, advertisement_name, peering_workflow_id
from tests.conftest import Clusters
from tests.kube import create_node
from tests.running import eventually, running_worker, worker_settings
from workers.peer import request_peering

pytestmark = [pytest.mark.env, pytest.mark.ui, pytest.mark.provider]

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
UI_TIMEOUT_MS = 60_000  # a single-page app on a loaded machine: it renders when its API calls return


async def frame_with(page: Page, text: str) -> Frame | None:
    """The frame (the page or one of its iframes: the UI renders user markdown in a sandboxed one) whose
    text contains `text`."""
    for frame in page.frames:
        try:
            if text in await frame.inner_text("body", timeout=1_000):
                return frame
        except Exception:  # noqa: BLE001 - a frame that is navigating or gone has no text yet
            continue
    return None


async def test_the_web_ui_lists_a_peering_by_foreign_cluster_and_shows_its_resources(
    localenv: EnvState, clusters: Clusters, make_cluster: Callable[[str], LocalCluster], unique: str,
    tmp_path: Path,
) -> None:  # fmt: skip
    assert localenv.temporal_ui, "the environment's Temporal runs without its Web UI"
    home = make_cluster("home")
    create_node(home.api_client(), "n1", cpu="8", memory="16Gi")
    home_id, foreign_id, other_id = f"home-{unique}", f"b-{unique}", f"c-{unique}"
    request_peering(home.api_client(), clusters.b.api_client(), provider_id=home_id, consumer_id=foreign_id)
    # Another peering of the same home cluster, which the list filtered by b's id must leave out.
    request_peering(home.api_client(), clusters.c.api_client(), provider_id=home_id, consumer_id=other_id)

    def by_foreign_cluster(cluster_id: str) -> str:
        query = urllib.parse.quote(f"ForeignCluster='{cluster_id}'")
        return f"{localenv.temporal_ui}/namespaces/default/workflows?query={query}"

    screenshot = tmp_path / "peering-in-web-ui.png"

    async with running_worker(worker_settings(localenv, home, home_id)), async_playwright() as playwright:
        browser = await playwright.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1000},
        )  # fmt: skip
        try:
            page = browser.pages[0] if browser.pages else await browser.new_page()
            # The list is filtered by the search attribute: the peering's row, and no other peering's.
            row = page.get_by_role("link", name=peering_workflow_id(home_id, foreign_id))
            other_row = page.get_by_role("link", name=peering_workflow_id(home_id, other_id))

            async def listed(url: str, link: Locator) -> bool:
                await page.goto(url)
                try:
                    await link.first.wait_for(timeout=10_000)
                except Exception:  # noqa: BLE001 - not indexed yet: load the list again
                    return False
                return True

            # The other peering is indexed and listed under its own id first: its absence below then says something.
            await eventually(lambda: listed(by_foreign_cluster(other_id), other_row), timeout=UI_TIMEOUT_MS / 1000,
                             what="the other peering's row in the Web UI")  # fmt: skip
            await eventually(lambda: listed(by_foreign_cluster(foreign_id), row), timeout=UI_TIMEOUT_MS / 1000,
                             what="the peering's row in the Web UI")  # fmt: skip
            assert await other_row.count() == 0, "the list filtered by ForeignCluster shows another peering"
            await row.first.click()
            # The workflow's page; its summary and current details are under "User Metadata". The
            # details' table of resources (header "allocatable") is there once the first push is in.
            await page.get_by_role("tab", name="User Metadata").click()
            frame = await eventually(lambda: frame_with(page, "allocatable"), timeout=UI_TIMEOUT_MS / 1000,
                                     what="the peering's current details")  # fmt: skip
            details = await frame.inner_text("body")
            await page.screenshot(path=str(screenshot), full_page=True)
        finally:
            await browser.close()
    print(f"Web UI screenshot: {screenshot}")
    assert f"Peering with {foreign_id}" in details
    # The table's cpu row: the home cluster's 8 CPU, and what the Advertisement on b carries.
    advertisement = read_cluster_object(clusters.b.api_client(), ADVERTISEMENTS, advertisement_name(home_id))
    assert advertisement is not None
    cpu = advertisement["spec"]["resourceQuota"]["hard"]["cpu"]
    assert re.search(rf"^cpu\s+8\s+{re.escape(cpu)}$", details, re.MULTILINE), details
    assert screenshot.stat().st_size > 0
