"""jaxcap-serve as a person and as a crowd use it (slow): the page in headless Chromium, and a
load test on loopback.

A tiny Transformer is trained for 120 steps (~45 s on 2 cores: enough that its captions are
words, not noise) and served by the real program on a free port. The browser test picks a test
image, reads its caption from the page, hovers a word and checks the heatmap is drawn, uploads a
feature file, and saves the screenshot docs/figures/serve_page.png (docs/USAGE.md shows it). The
load test runs 8 concurrent clients x 200 requests, ~10 % of them bad, and prints p50 / p99
latency and throughput (the numbers in docs/USAGE.md, "Serving and the web page").

Chromium and its driver are Debian's ``chromium`` and ``chromium-driver`` (.ci/run installs
them); without them the browser test is skipped with that reason.
"""

import asyncio
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest

pytestmark = pytest.mark.slow

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCREENSHOT = os.path.join(REPO, "docs", "figures", "serve_page.png")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")


@pytest.fixture(scope="module")
def served(tmp_path_factory):
  """``(url, workdir)`` of jaxcap-serve on a freshly trained tiny run; SIGTERM at the end: exit 0."""
  wd = str(tmp_path_factory.mktemp("serve") / "transformer_synthetic_tiny")
  steps = 120
  subprocess.run([sys.executable, "train.py", "--config", "configs/transformer.py:synthetic,tiny",
                  "--workdir", wd, "--config.test_after_training=False", f"--config.num_train_steps={steps}",
                  f"--config.eval_every_steps={steps}", f"--config.checkpoint_every_steps={steps}",
                  "--config.warmup_steps=20"], cwd=REPO, check=True, capture_output=True, timeout=600)
  proc = subprocess.Popen([sys.executable, "-m", "jaxcap.commands.serve", "--workdir", wd, "--port", "0",
                           "--max_batch", "8", "--max_wait_ms", "5"], cwd=REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  line = proc.stdout.readline()
  m = re.fullmatch(r"serving .* at (http://127\.0\.0\.1:\d+/)\n", line)
  if not m:
    proc.kill()
    pytest.fail(f"jaxcap-serve printed {line!r}: {proc.stderr.read()}")
  try:
    yield m.group(1), wd
  finally:
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
  assert proc.returncode == 0 and "Traceback" not in err, err


def _post(url, data=b"", ctype="application/x-npy"):
  req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": ctype})
  with urllib.request.urlopen(req, timeout=60) as r:
    return json.load(r)


def _npy(x) -> bytes:
  buf = io.BytesIO()
  np.save(buf, x)
  return buf.getvalue()


@pytest.mark.skipif(CHROMIUM is None or CHROMEDRIVER is None,
                    reason="needs Chromium and chromedriver (apt-get install chromium chromium-driver; .ci/run does)")
def test_the_page_captions_an_example_and_shows_a_word_s_attention(served, tmp_path):
  webdriver = pytest.importorskip("selenium.webdriver")
  from selenium.webdriver.common.action_chains import ActionChains
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.ui import WebDriverWait
  url, _ = served
  options = webdriver.ChromeOptions()
  options.binary_location = CHROMIUM
  for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
              "--window-size=1100,760", "--hide-scrollbars"):
    options.add_argument(arg)
  driver = webdriver.Chrome(service=webdriver.ChromeService(executable_path=CHROMEDRIVER), options=options)
  driver.set_page_load_timeout(60)
  wait = WebDriverWait(driver, 90)
  try:
    driver.get(url)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
    assert "transformer" in driver.find_element(By.ID, "model").text
    # A run on embedded features takes no image: the page says so and names the runs that do,
    # instead of hiding the image drop without a word.
    assert not driver.find_element(By.ID, "drop").is_displayed()
    why = driver.find_element(By.ID, "no-drop-why")
    assert why.is_displayed() and "configs/pixels.py:synthetic" in why.text, why.text

    # A feature file of the reader's own: the caption is the server's for those features.
    feats = np.random.default_rng(0).standard_normal((6, 128)).astype(np.float32)
    path = tmp_path / "regions.npy"
    path.write_bytes(_npy(feats))
    driver.find_element(By.ID, "npy-file").send_keys(str(path))
    want = _post(url + "caption?method=greedy", _npy(feats))["captions"][0]["caption"]
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#captions .caption").text.strip() == want)

    # A test image of the split, greedy.
    thumbs = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "#thumbs img"))
    assert len(thumbs) == 12
    example = 1
    thumbs[example].click()
    want = _post(url + f"caption?example={example}&method=greedy")["captions"][0]
    assert want["words"], "the trained run captioned the example with no words"
    wait.until(lambda d: d.find_element(By.CSS_SELECTOR, "#captions .caption").text.strip() == want["caption"])
    wait.until(lambda d: d.execute_script("return document.getElementById('picture').complete && "
                                          "document.getElementById('picture').naturalWidth") == 256)

    # Hovering a content word draws its attention over the image's region boxes.
    words = driver.find_elements(By.CSS_SELECTOR, "#captions .caption .word")
    assert [w.text for w in words] == want["words"]
    t = next((i for i, w in enumerate(want["words"]) if w not in ("a", "is", "the", "there")), 0)
    ActionChains(driver).move_to_element(words[t]).perform()
    heat = driver.find_element(By.ID, "heatmap")
    wait.until(lambda d: heat.get_attribute("data-word") == want["words"][t])
    alpha = driver.execute_script(
        "const c = document.getElementById('heatmap'); const px = c.getContext('2d')"
        ".getImageData(0, 0, c.width, c.height).data; let n = 0; for (let i = 3; i < px.length; i += 4)"
        " if (px[i] > 0) n++; return n / (px.length / 4);")
    if want["attention"] is not None:  # the overlay covers the image, lighter where it looked
      assert alpha > 0.2, alpha
      assert "attention of" in driver.find_element(By.ID, "heat-label").text
    os.makedirs(os.path.dirname(SCREENSHOT), exist_ok=True)
    assert driver.save_screenshot(SCREENSHOT)

    # Beam search from the menu: the best beam and the others listed.
    from selenium.webdriver.support.ui import Select
    Select(driver.find_element(By.ID, "method")).select_by_value("beam")
    want = _post(url + f"caption?example={example}&method=beam&beam_size=3")["captions"][0]
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#captions .caption")) == 3)
    assert driver.find_element(By.CSS_SELECTOR, "#captions .caption").text.strip() == want["caption"]
    logs = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    assert not logs, logs
  finally:
    driver.quit()


BAD_EVERY = 10  # every 10th request of a client is a bad one


def test_load_8_clients_x_200_requests_with_bad_ones_mixed_in(served):
  aiohttp = pytest.importorskip("aiohttp")
  url, _ = served
  clients, per_client = 8, 200
  rng = np.random.default_rng(0)
  good = [_npy(rng.standard_normal((int(rng.integers(2, 11)), 128)).astype(np.float32)) for _ in range(16)]
  bad = [("caption?method=nucleus", good[0], "application/x-npy"),
         ("caption", _npy(np.zeros((4, 128), np.float64)), "application/x-npy"),
         ("caption", _npy(np.zeros((4, 7), np.float32)), "application/x-npy"),
         ("caption", b"hello", "text/plain"),
         ("caption", b"\x89PNG\r\n not an image", "image/png"),
         ("caption?example=100000", b"", "application/x-npy")]

  async def client(k, session):
    out = []
    for i in range(per_client):
      if i % BAD_EVERY == BAD_EVERY - 1:
        path, data, ctype = bad[(k + i) % len(bad)]
        kind = "bad"
      elif i % 3 == 0:
        path, data, ctype, kind = f"caption?example={(k * 7 + i) % 16}", b"", "application/x-npy", "good"
      else:
        path, data, ctype, kind = "caption", good[(k + i) % len(good)], "application/x-npy", "good"
      start = time.perf_counter()
      try:
        async with session.post(url + path, data=data, headers={"Content-Type": ctype}) as r:
          body, status = await r.text(), r.status
      except aiohttp.ClientError as e:  # a dropped connection is a failure, counted below
        body, status = repr(e), 0
      out.append((kind, status, body, time.perf_counter() - start))
    return out

  async def main():
    timeout = aiohttp.ClientTimeout(total=120)
    sessions = [aiohttp.ClientSession(timeout=timeout) for _ in range(clients)]
    try:
      # One warm-up request per shape the load uses (compilation is not what is measured).
      async def warm(session):
        async with session.post(url + "caption", data=good[0], headers={"Content-Type": "application/x-npy"}) as r:
          await r.read()
      for s in (1, 2, 4, 8):
        await asyncio.gather(*(warm(sessions[j]) for j in range(s)))
      with urllib.request.urlopen(url + "health", timeout=30) as r:
        before = json.load(r)
      start = time.perf_counter()
      results = await asyncio.gather(*(client(k, s) for k, s in enumerate(sessions)))
      wall = time.perf_counter() - start
      with urllib.request.urlopen(url + "health", timeout=30) as r:
        after = json.load(r)
      return [x for r in results for x in r], wall, before, after
    finally:
      for s in sessions:
        await s.close()

  results, wall, before, after = asyncio.run(main())
  assert len(results) == clients * per_client
  goods = [r for r in results if r[0] == "good"]
  bads = [r for r in results if r[0] == "bad"]
  failed = [r[1:3] for r in goods if r[1] != 200 or not json.loads(r[2]).get("captions")]
  assert not failed, f"{len(failed)} valid requests failed or were dropped: {failed[:3]}"
  for _, status, body, _ in bads:
    assert 400 <= status < 500, (status, body)
    error = json.loads(body)
    assert set(error) == {"error"} and "\n" not in error["error"]
  lat = np.array([r[3] for r in goods]) * 1000
  calls = after["decode_calls"] - before["decode_calls"]
  report = {"clients": clients, "requests": len(results), "valid": len(goods), "bad": len(bads),
            "p50_ms": round(float(np.percentile(lat, 50)), 1), "p99_ms": round(float(np.percentile(lat, 99)), 1),
            "throughput_rps": round(len(results) / wall, 1), "valid_rps": round(len(goods) / wall, 1),
            "wall_s": round(wall, 1), "decode_calls": calls,
            "images_per_call": round((after["images"] - before["images"]) / max(calls, 1), 2)}
  print("\nload test:", json.dumps(report))
  assert len(bads) == clients * per_client // BAD_EVERY
  assert calls < len(goods), "concurrent requests were not batched"
  assert wall < 600
