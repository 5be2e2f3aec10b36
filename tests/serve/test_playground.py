"""The Playground: what /api/playground gathers, the static files, and the page in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from llmir_core.errors import InputError
from llmir_core.serve.app import STATIC_DIR
from llmir_core.serve.playground import collect
from tests.conftest import import_or_skip, skip_or_fail

from .conftest import start_server

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"


@pytest.fixture(scope="module")
def playground_files(
    tiny_module: Any, tiny_artifact: Path, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, str]:
    """A real source IR, a 2-pass dump folder (cse then dce), a report and `llmir bench` JSON."""
    from llmir_core.ir.printer import print_module
    from llmir_core.runtime.textgen import bench_artifact

    d = tmp_path_factory.mktemp("playground")
    source = print_module(tiny_module)
    (d / "tiny.llmir").write_text(source)
    dumps = d / "dumps"
    dumps.mkdir()
    (dumps / "01-cse.llmir").write_text("// after pass 1 (cse)\n" + source)
    lines = source.splitlines()
    cut = next(i for i, x in enumerate(lines) if " = core." in x)
    (dumps / "02-dce.llmir").write_text(
        "// after pass 2 (dce)\n" + "\n".join(lines[:cut] + lines[cut + 1 :])
    )
    (d / "report.txt").write_text("== optimization report ==\nops: 78 -> 77\n")
    bench = bench_artifact(str(tiny_artifact), prompt_len=8, gen_len=8, runs=2, warmup=0, threads=1)
    (d / "bench.json").write_text(json.dumps(bench.to_json()))
    return {
        "ir": str(d / "tiny.llmir"),
        "lowered": str(dumps / "02-dce.llmir"),
        "dump_dir": str(dumps),
        "report": str(d / "report.txt"),
        "bench": str(d / "bench.json"),
    }


def test_collect(tiny_artifact: Path, playground_files: dict[str, str]) -> None:
    manifest = json.loads((tiny_artifact / "manifest.json").read_text())
    data = collect(str(tiny_artifact), manifest, **playground_files)
    assert data["source"]["file"] == "tiny.llmir" and "core.matmul" in data["source"]["text"]
    assert [p["pass"] for p in data["passes"]] == ["cse", "dce"]
    assert not data["passes"][0]["changed"]  # the same module as the source
    assert data["passes"][1]["changed"] and re.search(
        r"^-\s+%\S+ = core\.", data["passes"][1]["diff"], re.M
    )
    assert data["bench"]["results"]["decode_tokens_per_s_aggregate"]["mean"] > 0
    assert data["report"].startswith("== optimization report ==")
    nothing = collect(str(tiny_artifact), manifest)
    assert nothing["source"] is None and nothing["passes"] == [] and nothing["bench"] is None
    with pytest.raises(InputError, match="no such folder"):
        collect(str(tiny_artifact), manifest, dump_dir=str(tiny_artifact / "nope"))


def test_static_files_ship_without_a_cdn() -> None:
    names = {p.name for p in STATIC_DIR.iterdir()}
    assert {"index.html", "app.js", "style.css"} <= names
    for name in names:
        text = (STATIC_DIR / name).read_text()
        assert not re.search(r"(src|href)=\"(https?:)?//", text), (
            f"{name} loads something from the network"
        )
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert '"llmir_core.serve" = ["static/*"]' in pyproject and '"llmir_core.serve",' in pyproject


def _driver(tmp_path: Path) -> Any:
    webdriver = import_or_skip("selenium.webdriver", "the test extra (selenium) is not installed")
    if not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)):
        skip_or_fail(
            "Chromium is not installed (apt-get install -y chromium chromium-driver; .ci/run does)"
        )
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--disable-dev-shm-usage",
        "--window-size=1400,1000",
        f"--user-data-dir={tmp_path / 'chrome'}",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)


def _wait(cond: Any, what: str, timeout: float = 60) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = cond()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_playground_in_headless_chromium(
    tiny_artifact: Path, tiny_module: Any, playground_files: dict[str, str], tmp_path: Path
) -> None:
    from llmir_core.runtime.textgen import TextGenerator, TextGenOptions

    driver = _driver(tmp_path)
    manifest = json.loads((tiny_artifact / "manifest.json").read_text())
    srv = start_server(
        tiny_artifact,
        max_batch=2,
        playground=collect(str(tiny_artifact), manifest, **playground_files),
    )
    shot = tmp_path / "playground.png"
    try:
        from selenium.webdriver.common.by import By

        driver.get(srv.url + "/")
        _wait(
            lambda: driver.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "1",
            "the page data",
        )
        box = driver.find_element(By.ID, "chat-input")
        box.send_keys("Hello there")
        driver.find_element(By.ID, "send").click()
        reply = _wait(
            lambda: driver.find_elements(By.CSS_SELECTOR, ".msg.assistant.done .body"), "the reply"
        )[0]
        tokens = reply.find_elements(By.CSS_SELECTOR, ".tok")
        assert len(tokens) > 1 and all("ms" in (t.get_attribute("title") or "") for t in tokens[:3])
        gen = TextGenerator(
            str(tiny_artifact), TextGenOptions(threads=1, max_new_tokens=64, chat=True)
        )
        assert (
            reply.get_attribute("textContent")
            == gen.generate([{"role": "user", "content": "Hello there"}]).result.text
        )
        assert driver.find_elements(By.CSS_SELECTOR, "#latency-chart svg rect.bar")
        driver.save_screenshot(str(tmp_path / "chat.png"))

        driver.find_element(By.CSS_SELECTOR, 'nav button[data-tab="ir"]').click()
        assert len(driver.find_elements(By.CSS_SELECTOR, "#ir-source .line")) > 20
        assert driver.find_elements(By.CSS_SELECTOR, "#ir-source .k-op")
        loc = driver.find_elements(By.CSS_SELECTOR, "#ir-lowered a.k-loc")[5]
        driver.execute_script("arguments[0].scrollIntoView()", loc)
        loc.click()
        assert driver.find_elements(
            By.CSS_SELECTOR, "#ir-source .line.hl"
        )  # linked to the source view
        driver.save_screenshot(str(tmp_path / "ir.png"))
        driver.find_element(By.CSS_SELECTOR, 'nav button[data-tab="passes"]').click()
        assert driver.find_elements(By.CSS_SELECTOR, "#passes details.pass .d-del")
        driver.find_element(By.CSS_SELECTOR, 'nav button[data-tab="bench"]').click()
        assert len(driver.find_elements(By.CSS_SELECTOR, "#chart-decode svg rect.bar")) == 2
        assert len(driver.find_elements(By.CSS_SELECTOR, "#chart-itl svg rect.bar")) == 3
        driver.save_screenshot(str(shot))
        print(f"playground screenshots: {tmp_path / 'chat.png'}, {tmp_path / 'ir.png'}, {shot}")
        assert shot.stat().st_size > 1000
    finally:
        driver.quit()
        srv.stop()


def test_collect_finds_dumps_and_bench_beside_the_artifact(
    tmp_path: Path, playground_files: dict[str, str]
) -> None:
    """`optimize --print-after-all` (default folder llmir-dumps) then `build` and `bench > bench.json`
    in one folder: the Playground finds them, and diffs the first pass against optimize's input."""
    source = Path(playground_files["ir"]).read_text()
    lines = source.splitlines()
    cut = next(i for i, x in enumerate(lines) if " = core." in x)
    optimized = "\n".join(lines[:cut] + lines[cut + 1 :]) + "\n"
    (tmp_path / "model.llmir").write_text(source)
    (tmp_path / "model.opt.llmir").write_text(optimized)
    dumps = tmp_path / "llmir-dumps"
    dumps.mkdir()
    head = (
        "// after pass {n} ({p}); reproduce with:\n//   llmir optimize model.llmir --passes {p}\n"
    )
    (dumps / "01-dce.llmir").write_text(head.format(n=1, p="dce") + optimized)
    (dumps / "02-cse.llmir").write_text(head.format(n=2, p="cse") + optimized)
    shutil.copy(playground_files["bench"], tmp_path / "bench.json")
    art = tmp_path / "model.build"
    art.mkdir()
    manifest = {"source": {"file": "model.opt.llmir"}, "decoder": {}}
    data = collect(str(art), manifest)
    assert data["source"]["file"] == "model.opt.llmir"
    assert [p["pass"] for p in data["passes"]] == ["dce", "cse"]
    assert (
        data["passes"][0]["diff"].startswith("--- model.llmir") and not data["passes"][1]["changed"]
    )
    assert data["bench"]["bench_schema"]
    (dumps / "02-cse.llmir").write_text(
        head.format(n=2, p="cse") + source
    )  # not this artifact's run
    assert collect(str(art), manifest)["passes"] == []
