"""The runbook's alerts as Prometheus rules (docs/operations.md: Alerts and what to do) and the Grafana
dashboard: ``promtool test rules`` on synthetic series that fire and do not fire each alert, every metric a
rule or a panel names exported by a part (and each label a panel groups by carried by it), every runbook link
a heading of the runbook, and the PrometheusRule of the manifests the same rules.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from devtools import reference
from devtools.kustomize import load

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "chatexport-rules.yaml"
# A histogram is served as its _bucket, _sum and _count series.
SERIES_SUFFIXES = ("_bucket", "_sum", "_count")


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def unknown_metrics(expression: str) -> set[str]:
    """The ``chatexport_*`` names in ``expression`` that no part exports."""
    served = {metric.name for metric in reference.served_metrics()}
    named = set(re.findall(r"\bchatexport_[a-z0-9_]+", expression))
    return {name for name in named if name not in served and name.removesuffix(_suffix(name)) not in served}


def _suffix(name: str) -> str:
    return next((suffix for suffix in SERIES_SUFFIXES if name.endswith(suffix)), "")


def test_promtool_fires_and_keeps_quiet_each_alert() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "install Debian's prometheus package (make prerequisites)"
    tests = RULES.with_name("chatexport-rules.test.yaml")
    result = subprocess.run([promtool, "test", "rules", str(tests)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", tests.read_text()))
    assert tested == {rule["alert"] for rule in rules()}


def test_every_rule_names_only_exported_metrics() -> None:
    for rule in rules():
        assert unknown_metrics(rule["expr"]) == set(), rule["alert"]
    assert unknown_metrics("rate(chatexport_worker_exported_bytez_total[5m]) > 0") == {
        "chatexport_worker_exported_bytez_total"
    }


def test_every_runbook_link_is_a_heading_of_the_runbook() -> None:
    runbook = (REPO / "docs" / "operations.md").read_text()
    # As the site's table of contents makes them: lower case, punctuation dropped, runs of spaces one hyphen.
    anchors = {
        re.sub(r"[\s-]+", "-", re.sub(r"[^a-z0-9 -]", "", heading.lower()).strip())
        for heading in re.findall(r"^#+ (.+)$", runbook, re.MULTILINE)
    }
    for rule in rules():
        page, _, anchor = rule["annotations"]["runbook_url"].partition("#")
        assert page == "docs/operations.md" and anchor in anchors, rule["alert"]


def test_the_manifests_prometheus_rule_holds_the_same_rules() -> None:
    [resource] = load(REPO / "deploy" / "kubernetes" / "monitoring" / "prometheus-rules.yaml")
    assert resource["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def unknown_labels(expression: str) -> set[str]:
    """The labels grouped ``by (...)`` in ``expression`` that none of the metrics it names carries."""
    labels = {metric.name: set(metric.labels) for metric in reference.served_metrics()}
    carried = set().union(*(labels.get(name, set()) for name in re.findall(r"\bchatexport_[a-z0-9_]+", expression)))
    grouped = {label.strip() for group in re.findall(r"\bby \(([^)]*)\)", expression) for label in group.split(",")}
    return grouped - carried


def test_every_dashboard_query_names_exported_metrics_and_their_labels() -> None:
    dashboard = json.loads((REPO / "deploy" / "grafana" / "chatexport.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]
    assert len(expressions) >= 10
    for expression in expressions:
        assert unknown_metrics(expression) == set(), expression
        assert unknown_labels(expression) == set(), expression
    assert unknown_labels("sum by (colour) (rate(chatexport_http_requests_total[5m]))") == {"colour"}
