"""Reports opened in real headless Chromium (Debian's chromium and chromedriver, selenium):
what the live page holds, not what the Python side meant to draw."""

from __future__ import annotations

from pathlib import Path

import pytest

# every plot's traces, axes and titles as the browser holds them (after plotly drew them)
PLOTS_JS = """
return Array.from(document.querySelectorAll('.js-plotly-plot')).map(function (gd) {
  var axes = {};
  Object.keys(gd._fullLayout).forEach(function (k) {
    if (/^[xy]axis\\d*$/.test(k)) {
      var a = gd._fullLayout[k];
      axes[k] = {title: (a.title && a.title.text) || '', type: a.type, range: a.range.slice(),
                 id: a._id, visible: a.visible};
    }
  });
  return {title: (gd.layout.title && (gd.layout.title.text || gd.layout.title)) || '', axes: axes,
          data: gd._fullData.map(function (t) {
            return {name: t.name || '', type: t.type || 'scatter', xaxis: t.xaxis || 'x', yaxis: t.yaxis || 'y',
                    x: Array.from(t.x || []),
                    y: Array.from(t.y || []).map(function (v) { return v === null || isNaN(v) ? null : Number(v); })};
          })};
});
"""


@pytest.fixture
def open_report(browser):
    """``open_report(path)``: load the report in Chromium; its plots (PLOTS_JS) and the
    browser log's SEVERE entries."""
    return lambda path: _open(browser, path)


def _open(driver, path: Path) -> tuple[list[dict], list[dict]]:
    from selenium.webdriver.support.ui import WebDriverWait

    driver.get_log("browser")  # drop what an earlier page logged
    driver.get(path.resolve().as_uri())
    WebDriverWait(driver, 30).until(lambda d: d.execute_script(
        "return document.readyState === 'complete' && typeof Plotly !== 'undefined' && "
        "document.querySelectorAll('.js-plotly-plot').length === "
        "document.querySelectorAll('.plotly-graph-div').length"))
    plots = driver.execute_script(PLOTS_JS)
    severe = [e for e in driver.get_log("browser") if e.get("level") == "SEVERE"]
    return plots, severe
