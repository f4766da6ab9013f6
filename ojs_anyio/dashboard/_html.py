"""Server-rendered HTML of the dashboard's pages: plain functions from data to text.

Every value that came from the broker (job ids, types, reasons, host names: anything a
client of the vhost can write) goes through :func:`h` (HTML escaping, quotes included).
Each page is a frame (:func:`page`) around a *live region* whose HTML the page's script
fetches again every few seconds (the same function renders both).  No inline script or
style: the Content-Security-Policy allows only this server's own files.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from .. import JobInfo
from ._state import SERIES, DeadRow, Overview, SchedulerGroup, WorkerRow

__all__ = [
    "Frame",
    "cron_fragment",
    "dead_fragment",
    "job_fragment",
    "overview_fragment",
    "page",
    "workers_fragment",
]


def h(value: object) -> str:
    """Escaped text for HTML (``None`` is a dash)."""
    return "\u2013" if value is None else html.escape(str(value), quote=True)


def _url(*parts: str, query: dict[str, str] | None = None) -> str:
    path = "/" + "/".join(quote(p, safe="") for p in parts)
    if query:
        path += "?" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query.items())
    return h(path)


def duration(seconds: float | None) -> str:
    """``4.2 s``, ``3 min 20 s``, ``2 h 5 min``, ``3 d 4 h``."""
    if seconds is None:
        return "\u2013"
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m} min {sec} s"
    hours, m = divmod(m, 60)
    if hours < 48:
        return f"{hours} h {m} min"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h"


def _ago(seconds: float | None) -> str:
    return "never" if seconds is None else f"{duration(seconds)} ago"


# ------------------------------------------------------------------ the frame


@dataclass(frozen=True, slots=True)
class Frame:
    """What every page shows around its live region."""

    broker: str  # the URL with the password as *** (AMQPURL.redacted())
    prefix: str
    #: "on" (a token is configured), "off" (none: actions refused), "read-only" (removed)
    actions: str
    refresh: float


_NAV = (("/", "Overview"), ("/workers", "Workers"), ("/cron", "Cron"))


def page(frame: Frame, title: str, section: str, live: str, *, source: str, extra: str = "") -> str:
    """A whole page: header, navigation, ``extra`` (static controls), the live region
    (``live``, refreshed from ``source``) and the status line actions report to."""
    nav = "".join(
        f'<li><a href="{href}"{" aria-current=page" if href == section else ""}>{label}</a></li>'
        for href, label in _NAV
    )
    token = ""
    if frame.actions == "on":
        token = (
            '<form id="token-form" class="token" autocomplete="off">'
            '<label for="token">Action token</label>'
            '<input id="token" name="token" type="password" autocomplete="off" spellcheck="false">'
            '<button type="submit">Use</button>'
            '<span id="token-state" class="muted"></span></form>'
        )
    elif frame.actions == "off":
        token = (
            '<p class="note">Actions are off: this dashboard was started without a token '
            "(<code>--token</code> or <code>$OJS_DASHBOARD_TOKEN</code>).</p>"
        )
    else:
        token = '<p class="note">Read-only dashboard: cancel, requeue and purge are not available.</p>'
    prefix = f", prefix <code>{h(frame.prefix)}</code>" if frame.prefix else ""
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{h(title)} \u00b7 ojs-anyio dashboard</title>
<link rel="stylesheet" href="/static/dashboard.css">
<script src="/static/dashboard.js" defer></script>
</head>
<body data-refresh="{int(frame.refresh * 1000)}" data-actions="{h(frame.actions)}">
<a class="skip" href="#main">Skip to the content</a>
<header>
<p class="brand">ojs-anyio dashboard</p>
<p class="broker">Broker <code>{h(frame.broker)}</code>{prefix}</p>
<nav aria-label="Sections"><ul>{nav}</ul></nav>
<form class="find" role="search" action="/jobs" method="get">
<label for="find-job">Job id</label>
<input id="find-job" name="id" type="search" spellcheck="false" autocomplete="off" size="38">
<button type="submit">Show</button></form>
{token}
</header>
<main id="main">
<h1>{h(title)}</h1>
{extra}
<div id="status" role="status" aria-live="polite"></div>
<div id="live" data-source="{h(source)}">
{live}
</div>
</main>
<footer><p>Updated every {frame.refresh:g} s without reloading the page.
Figures from AMQP passive declares and the workers' presence messages.</p></footer>
</body>
</html>
"""


def _table(caption: str, headers: Sequence[str], rows: Iterable[str], empty: str, cls: str = "") -> str:
    body = "".join(rows)
    if not body:
        return f'<p class="empty">{empty}</p>'
    head = "".join(f'<th scope="col">{x}</th>' for x in headers)
    attr = f' class="{cls}"' if cls else ""
    return (
        f'<div class="scroll" tabindex="0" role="region" aria-label="{h(caption)}">'
        f'<table{attr}><caption class="sr-only">{h(caption)}</caption>'
        f"<thead><tr>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
    )


def _error(text: str | None) -> str:
    return "" if not text else f'<p class="error" role="alert">{h(text)}</p>'


def _button(action: str, label: str, text: str, **data: str) -> str:
    attrs = "".join(f' data-{k.replace("_", "-")}="{h(v)}"' for k, v in data.items())
    return (
        f'<button type="button" class="act" data-action="{action}" aria-label="{h(label)}"{attrs}>'
        f"{text}</button>"
    )


# ------------------------------------------------------------------ sparklines

_SERIES_LABEL = {"completed": "Completed", "retried": "Retried", "dead_lettered": "Dead-lettered"}


def sparkline(values: Sequence[float], label: str, cls: str = "") -> str:
    """An inline SVG line of ``values`` (oldest first), described in words for screen readers."""
    width, height = 160, 32
    if len(values) < 2:
        points = f"0,{height - 1} {width},{height - 1}"
    else:
        top = max(values) or 1.0
        step = width / (len(values) - 1)
        points = " ".join(
            f"{i * step:.1f},{height - 1 - (v / top) * (height - 2):.1f}" for i, v in enumerate(values)
        )
    return (
        f'<svg class="spark {cls}" viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
        f'role="img" aria-label="{h(label)}" preserveAspectRatio="none">'
        f'<polyline points="{points}" /></svg>'
    )


def _rate(value: float) -> str:
    return f"{value:.1f}/s" if value < 100 else f"{value:.0f}/s"


def _throughput(ov: Overview) -> str:
    window = duration(ov.refresh * max(1, max((len(v) for v in ov.throughput.values()), default=1)))
    figures = []
    for key in SERIES:
        values = ov.throughput.get(key, ())
        now = values[-1] if values else 0.0
        top = max(values, default=0.0)
        name = _SERIES_LABEL[key]
        label = f"{name} jobs per second over the last {window}: now {_rate(now)}, peak {_rate(top)}"
        figures.append(
            f'<figure class="series {key}"><figcaption><span class="name">{_SERIES_LABEL[key]}</span> '
            f'<span class="now" data-series="{key}">{_rate(now)}</span> '
            f'<span class="muted">peak {_rate(top)}</span></figcaption>'
            f"{sparkline(values, label, key)}</figure>"
        )
    return (
        '<section aria-labelledby="tp"><h2 id="tp">Throughput, all workers</h2>'
        f'<div class="figures">{"".join(figures)}</div>'
        '<p class="muted">Jobs per second from the workers\' own outcome counters, '
        f"over the last {window}.</p>"
        "</section>"
    )


# ------------------------------------------------------------------ pages' live regions


def overview_fragment(ov: Overview) -> str:
    rows = []
    for q in ov.queues:
        name = f'<th scope="row">{h(q.queue)}</th>'
        if not q.exists:
            rows.append(
                f'<tr data-queue="{h(q.queue)}">{name}'
                '<td colspan="6" class="muted">no such queue yet</td></tr>'
            )
            continue
        dead = h(q.dead) if not q.dead else f'<a href="{_url("dead", q.queue)}">{h(q.dead)}</a>'
        spark = sparkline(q.history, f"Ready jobs in {q.queue}, last {len(q.history)} polls: now {q.ready}")
        rows.append(
            f'<tr data-queue="{h(q.queue)}">{name}'
            f'<td class="num" data-col="ready">{h(q.ready)}</td>'
            f'<td class="num" data-col="running">{h(q.running)}</td>'
            f'<td class="num" data-col="retrying">{h(q.retrying)}</td>'
            f'<td class="num" data-col="dead">{dead}</td>'
            f'<td class="num" data-col="consumers">{h(q.consumers)}</td>'
            f'<td class="spark-cell">{spark}</td></tr>'
        )
    table = _table(
        "Jobs per queue",
        ["Queue", "Ready", "Running", "Retrying", "Dead", "Consumers", "Ready, recent"],
        rows,
        "No queue to show: name some with <code>--queues</code> or <code>--app</code>, or start a worker.",
        "queues",
    )
    scheduled = (
        "no scheduled job is waiting (the delay levels do not exist yet)"
        if ov.scheduled is None
        else f'<strong data-col="scheduled">{h(ov.scheduled)}</strong> scheduled job(s) waiting in the '
        "delay levels, which all queues share"
    )
    live = sum(1 for w in ov.workers if w.status in ("live", "stopping"))
    polled = "" if ov.polled_ago is None else f" Last read {_ago(ov.polled_ago)}."
    return (
        f"{_error(ov.error)}"
        f'<section aria-labelledby="qs"><h2 id="qs">Queues</h2>{table}'
        f'<p class="muted">{scheduled}.  Running: jobs that live workers say they run (AMQP does not '
        f"count jobs being run).{polled}</p>"
        f'<p><a href="/workers">{live} live worker(s)</a></p></section>'
        f"{_throughput(ov)}"
    )


def _status(status: str, seen_ago: float) -> str:
    text = {"live": "live", "stopping": "stopping", "stopped": "stopped", "lost": "lost (silent)"}[status]
    return f'<span class="badge {status}">{text}</span> <span class="muted">{_ago(seen_ago)}</span>'


def workers_fragment(workers: Sequence[WorkerRow], error: str | None, actions: str) -> str:
    rows = []
    jobs = []
    for w in workers:
        p = w.presence
        rows.append(
            f'<tr data-worker="{h(p.worker_id)}"><th scope="row">{h(p.worker_id)}</th>'
            f"<td>{h(p.host)}</td><td class=num>{h(p.pid)}</td><td>{h(', '.join(p.queues))}</td>"
            f'<td class="num">{h(p.concurrency)}</td><td class="num">{h(p.running_total)}</td>'
            f"<td>{h(p.backend)}</td><td>{_status(w.status, w.seen_ago)}</td></tr>"
        )
        for r in w.running:
            cancel = ""
            if actions != "read-only":
                cancel = _button("cancel", f"Cancel job {r.job_id}", "Cancel", job_id=r.job_id, queue=r.queue)
            jobs.append(
                f'<tr data-job="{h(r.job_id)}"><th scope="row">'
                f'<a href="{_url("jobs", r.job_id, query={"queue": r.queue})}">'
                f"<code>{h(r.job_id)}</code></a></th>"
                f"<td>{h(r.type)}</td><td>{h(r.queue)}</td><td class=num>{h(r.attempt)}</td>"
                f"<td>{duration(r.age)}</td><td>{h(r.worker_id)}</td><td>{_ago(r.beat_ago)}</td>"
                f"<td>{cancel}</td></tr>"
            )
    return (
        f"{_error(error)}"
        '<section aria-labelledby="ws"><h2 id="ws">Workers</h2>'
        + _table(
            "Workers heard from",
            ["Worker", "Host", "PID", "Queues", "Concurrency", "Running", "Backend", "Status"],
            rows,
            "No worker heard from yet (workers announce themselves every few seconds).",
        )
        + '</section><section aria-labelledby="rj"><h2 id="rj">Running jobs</h2>'
        + _table(
            "Jobs running now",
            ["Job", "Type", "Queue", "Attempt", "Age", "Worker", "Last BEAT", "Action"],
            jobs,
            "No job is running.",
            "jobs",
        )
        + "</section>"
    )


def cron_fragment(groups: Sequence[SchedulerGroup], error: str | None) -> str:
    if not groups:
        return _error(error) + '<p class="empty">No scheduler heard from yet.</p>'
    out = [_error(error)]
    for i, g in enumerate(groups):
        if g.leader is not None:
            lp = g.leader.presence
            leader = (
                f"Leader: instance <code>{h(lp.instance_id)}</code> on {h(lp.host)} (pid {h(lp.pid)}), "
                f"leading since {h(lp.leader_since)}"
            )
        else:
            leader = "No leader heard from: no live instance says it leads."
        instances = [
            f"<tr><th scope=row><code>{h(r.presence.instance_id)}</code></th><td>{h(r.presence.host)}</td>"
            f"<td class=num>{h(r.presence.pid)}</td>"
            f"<td>{'leader' if r.presence.leader and r.status == 'live' else 'standby'}</td>"
            f"<td>{_status(r.status, r.seen_ago)}</td><td class=num>{h(r.presence.fired)}</td></tr>"
            for r in g.instances
        ]
        schedules = [
            f"<tr><th scope=row>{h(s.name)}</th><td><code>{h(s.cron)}</code></td><td>{h(s.job_type)}</td>"
            f"<td>{h(s.queue)}</td><td>{h(s.timezone)}</td><td>{h(s.last_fired)}</td><td>{h(s.next_tick)}</td></tr>"
            for s in g.schedules
        ]
        out.append(
            f'<section aria-labelledby="g{i}"><h2 id="g{i}">Group {h(g.group)}</h2>'
            f'<p class="leader">{leader}</p><h3>Instances</h3>'
            + _table(
                f"Instances of {g.group}",
                ["Instance", "Host", "PID", "Role", "Status", "Fired"],
                instances,
                "",
            )
            + "<h3>Schedules</h3>"
            + _table(
                f"Schedules of {g.group}",
                ["Schedule", "Cron", "Job type", "Queue", "Time zone", "Last fired", "Next tick"],
                schedules,
                "No schedule.",
            )
            + "</section>"
        )
    return "".join(out)


def _backtrace(error: dict[str, Any] | None, show: bool) -> str:
    frames = (error or {}).get("backtrace")
    if not show or not frames:
        return ""
    text = "\n".join(str(f) for f in frames) if isinstance(frames, list | tuple) else str(frames)
    return f"<details><summary>Backtrace</summary><pre>{h(text)}</pre></details>"


def dead_fragment(
    queue: str, dlq: str, total: int | None, rows: Sequence[DeadRow], actions: str, show_backtraces: bool
) -> str:
    if total is None:
        return (
            f'<p class="empty">Queue <code>{h(queue)}</code> has no dead-letter queue '
            f"(<code>{h(dlq)}</code>).</p>"
        )
    now = datetime.now(UTC)
    body = []
    for r in rows:
        act = ""
        if actions != "read-only" and r.malformed is None and r.job_id:
            act = _button("requeue", f"Requeue job {r.job_id}", "Requeue", queue=queue, job_id=r.job_id)
        died = "\u2013" if r.died_at is None else f"{duration((now - r.died_at).total_seconds())} ago"
        body.append(
            f'<tr data-job="{h(r.job_id)}"><th scope="row"><code>{h(r.job_id)}</code></th>'
            f"<td>{h(r.type)}</td><td class=num>{h(r.attempt)}</td><td>{died}</td>"
            f'<td class="reason">{h(r.reason)}{_backtrace(r.error, show_backtraces)}</td><td>{act}</td></tr>'
        )
    shown = f"the oldest {len(rows)}" if len(rows) < total else "all"
    return (
        f'<p><strong data-col="dead-total">{h(total)}</strong> dead job(s) in <code>{h(dlq)}</code>; '
        f"showing {shown}, oldest first.</p>"
        + _table(
            f"Dead jobs of {queue}",
            ["Job", "Type", "Attempt", "Died", "Reason", "Action"],
            body,
            "No dead job.",
            "dead",
        )
    )


def dead_controls(queue: str, actions: str) -> str:
    """The DLQ page's static controls (outside the live region, so a refresh keeps them)."""
    if actions == "read-only":
        return ""
    return (
        '<div class="controls">'
        '<p><input type="checkbox" id="reset-attempts" checked> '
        '<label for="reset-attempts">Requeued jobs start again at attempt 1</label></p>'
        + _button("requeue-all", f"Requeue every dead job of {queue}", "Requeue all", queue=queue)
        + " "
        + _button("purge", f"Delete every dead job of {queue}", "Purge", queue=queue)
        + "</div>"
    )


_INFO_FIELDS = (
    ("state", "State"),
    ("attempt", "Attempt"),
    ("worker_id", "Worker"),
    ("started_at", "Started"),
    ("finished_at", "Finished"),
    ("detail", "Detail"),
)


def job_fragment(
    job_id: str, queue: str | None, info: JobInfo, actions: str, show_backtraces: bool, error: str | None
) -> str:
    if error:
        return _error(error)
    if info.state == "unknown":
        where = f"queue <code>{h(queue)}</code>" if queue else "the queues shown"
        return (
            f'<p class="empty" data-state="unknown">No worker of {where} knows job <code>{h(job_id)}</code>: '
            "it is not running, and no live worker finished it recently.  A dead job is listed in "
            "its queue's dead letters.</p>"
        )
    items = [f"<dt>Job</dt><dd><code>{h(job_id)}</code></dd>", f"<dt>Queue</dt><dd>{h(queue)}</dd>"]
    for attr, label in _INFO_FIELDS:
        value = getattr(info, attr)
        if value is not None:
            items.append(f'<dt>{label}</dt><dd data-field="{attr}">{h(value)}</dd>')
    if info.state == "active":
        items.append(f"<dt>Cancel requested</dt><dd>{'yes' if info.cancel_requested else 'no'}</dd>")
        if info.interruptible is not None:
            items.append(
                "<dt>Interruptible</dt><dd>"
                + ("yes" if info.interruptible else "no (a plain def handler)")
                + "</dd>"
            )
    if info.error is not None:
        err = info.error
        items.append(f'<dt>Last error</dt><dd data-field="error">{h(err.type)}: {h(err.message)}'
                     f"{_backtrace({'backtrace': err.backtrace}, show_backtraces)}</dd>")  # fmt: skip
    if info.result is not None:
        items.append(
            f'<dt>Result</dt><dd><pre data-field="result">{h(json.dumps(info.result, indent=2))}</pre></dd>'
        )
    cancel = ""
    if info.state == "active" and actions != "read-only" and queue:
        cancel = (
            "<p>"
            + _button("cancel", f"Cancel job {job_id}", "Cancel this job", job_id=job_id, queue=queue)
            + "</p>"
        )
    return f'<dl class="info" data-state="{h(info.state)}">{"".join(items)}</dl>{cancel}'
