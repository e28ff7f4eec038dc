"""Gate reports: GX's JSON result and a readable, self-contained HTML page (no scripts, no external CSS).

Reports live under `<lakehouse>/_reports/<suite>/<trace>/<run or "trace">/<UTC time>/` (SPEC §7: the path is
in the error message). Every path component that comes from a trace or a policy is reduced to a safe slug and
the final path is checked to be inside the reports root (SPEC §11).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import html
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from conf import page_css
from expectations.runner import offending_rows, unexpected_count
from schemas.errors import ReplabError

_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_component(text: str, *, max_len: int = 80) -> str:
    """A path component that cannot climb out of its folder: [A-Za-z0-9._-], no leading dot, never empty.

    Distinct inputs that reduce to the same slug get a short hash suffix, so reports never collide.
    """
    slug = _SAFE.sub("_", text).lstrip(".") or "_"
    if slug != text or len(slug) > max_len:
        slug = f"{slug[: max_len - 9]}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"
    return slug


def inside(root: Path, *parts: str) -> Path:
    """root/parts..., refusing any result outside root (SPEC §11)."""
    base = root.resolve()
    path = base.joinpath(*parts).resolve()
    if path != base and base not in path.parents:
        raise ReplabError(f"refusing a path outside the lakehouse root: {path}")
    return path


@dataclass(frozen=True)
class ReportPaths:
    json_path: Path
    html_path: Path


def report_dir(reports_root: Path, suite: str, trace_id: str, run_id: str | None) -> Path:
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return inside(reports_root, safe_component(suite), safe_component(trace_id),
                  safe_component(run_id or "trace"), stamp)


def write_report(folder: Path, payload: dict[str, Any]) -> ReportPaths:
    """Write `result.json` (the payload, GX results included) and `report.html` into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    json_path, html_path = folder / "result.json", folder / "report.html"
    json_path.write_text(json.dumps(payload, indent=1, default=str) + "\n")
    html_path.write_text(render_html(payload))
    return ReportPaths(json_path, html_path)




def _status(success: bool, severity: str = "critical") -> str:
    if success:
        return '<span class="ok">passed</span>'
    cls = "warn" if severity != "critical" else "bad"
    return f'<span class="{cls}">failed ({html.escape(severity)})</span>'


def _rows_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return ""
    cols: list[str] = []
    for r in rows:
        for c in (r if isinstance(r, dict) else {"value": r}):
            if c not in cols:
                cols.append(c)
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in cols)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str((r if isinstance(r, dict) else {'value': r}).get(c, '')))}</td>"
                         for c in cols) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _expectation_label(cfg: dict[str, Any]) -> str:
    kwargs = {k: v for k, v in (cfg.get("kwargs") or {}).items() if k not in ("batch_id",)}
    desc = cfg.get("description")
    text = f"<b>{html.escape(desc)}</b><br>" if desc else ""
    shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return text + f"<code>{html.escape(cfg.get('type', '?'))}</code> <span class='muted'>{html.escape(shown)}</span>"


def render_html(payload: dict[str, Any]) -> str:
    title = f"replab {payload.get('suite', 'gate')} report: {payload.get('trace_id', '')}"
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
             f"<style>{page_css()}</style></head><body><h1>{html.escape(title)}</h1>"]
    facts = {k: payload.get(k) for k in ("suite", "trace_id", "run_ids", "success", "created_at", "message")
             if payload.get(k) is not None}
    parts.append(_rows_table([facts]))
    if payload.get("rules"):
        parts.append("<h2>Rules</h2>")
        parts.append(_rows_table([{k: r[k] for k in ("rule", "severity", "count", "description")}
                                  for r in payload["rules"]]))
    for validation in payload.get("validations", []):
        stats = validation.get("statistics", {})
        target = validation.get("target", validation.get("suite_name", ""))
        parts.append(f"<h2>{html.escape(str(target))}: {_status(bool(validation.get('success')))}</h2>")
        parts.append(f"<p class='muted'>{stats.get('successful_expectations', 0)} of "
                     f"{stats.get('evaluated_expectations', 0)} expectations met</p>")
        rows = []
        details = []
        for res in validation.get("results", []):
            cfg = res.get("expectation_config", {})
            count = unexpected_count(res)
            rows.append("<tr><td>" + _expectation_label(cfg) + "</td><td>"
                        + _status(bool(res.get("success")), cfg.get("severity", "critical"))
                        + f"</td><td>{count}</td></tr>")
            if not res.get("success"):
                label = cfg.get("description") or cfg.get("type")
                exc = (res.get("exception_info") or {}).get("exception_message")
                details.append(f"<h3>{html.escape(str(label))}</h3>"
                               + (f"<pre>{html.escape(str(exc))}</pre>" if exc else "")
                               + _rows_table(offending_rows(res)))
        parts.append("<table><tr><th>expectation</th><th>status</th><th>offending rows</th></tr>"
                     + "".join(rows) + "</table>")
        parts.extend(details)
    parts.append("</body></html>\n")
    return "".join(parts)
