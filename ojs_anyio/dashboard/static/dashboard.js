// ojs-anyio dashboard: refresh the live region, send actions.  No build step, no library.
"use strict";
(function () {
  var TOKEN_KEY = "ojs-dashboard-token";
  var body = document.body;
  var live = document.getElementById("live");
  var status = document.getElementById("status");
  var refreshMs = parseInt(body.getAttribute("data-refresh"), 10) || 2000;
  var last = live ? live.innerHTML : "";
  var busy = false;

  function say(text, ok) {
    if (!status) return;
    status.textContent = text;
    status.className = ok ? "ok" : "error";
  }

  function focusKey(el) {
    if (!el || !el.getAttribute) return null;
    var action = el.getAttribute("data-action");
    if (!action) return null;
    return [action, el.getAttribute("data-job-id") || "", el.getAttribute("data-queue") || ""];
  }

  function refresh() {
    if (!live || busy) return Promise.resolve();
    var src = live.getAttribute("data-source");
    var url = src + (src.indexOf("?") >= 0 ? "&" : "?") + "fragment=1";
    busy = true;
    return fetch(url, { headers: { Accept: "text/html" }, credentials: "same-origin", cache: "no-store" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.text();
      })
      .then(function (html) {
        body.classList.remove("stale");
        if (html === last) return;
        var key = focusKey(document.activeElement);
        var open = [];
        live.querySelectorAll("details[open]").forEach(function (d, i) { open.push(i); });
        live.innerHTML = html;
        last = html;
        var details = live.querySelectorAll("details");
        open.forEach(function (i) { if (details[i]) details[i].open = true; });
        if (key) {
          live.querySelectorAll("[data-action]").forEach(function (el) {
            var k = focusKey(el);
            if (k[0] === key[0] && k[1] === key[1] && k[2] === key[2]) el.focus();
          });
        }
      })
      .catch(function (err) {
        body.classList.add("stale");
        say("Cannot reach the dashboard server (" + err.message + "); the figures shown may be old.", false);
      })
      .then(function () { busy = false; });
  }

  function act(button) {
    var action = button.getAttribute("data-action");
    var queue = button.getAttribute("data-queue");
    var jobId = button.getAttribute("data-job-id");
    var reset = document.getElementById("reset-attempts");
    var resetAttempts = reset ? reset.checked : true;
    var name, payload;
    if (action === "cancel") {
      name = "cancel";
      payload = { job_id: jobId, queue: queue };
    } else if (action === "requeue") {
      name = "requeue";
      payload = { queue: queue, ids: [jobId], reset_attempts: resetAttempts };
    } else if (action === "requeue-all") {
      if (!window.confirm("Requeue every dead job of " + queue + "?")) return;
      name = "requeue";
      payload = { queue: queue, ids: null, reset_attempts: resetAttempts };
    } else if (action === "purge") {
      if (!window.confirm("Delete every dead job of " + queue + "? This cannot be undone.")) return;
      name = "purge";
      payload = { queue: queue };
    } else {
      return;
    }
    var headers = { "Content-Type": "application/json" };
    var token = window.sessionStorage.getItem(TOKEN_KEY);
    if (token) headers.Authorization = "Bearer " + token;
    button.disabled = true;
    say("Working\u2026", true);
    fetch("/api/" + name, {
      method: "POST", headers: headers, body: JSON.stringify(payload), credentials: "same-origin"
    })
      .then(function (r) {
        return r.json().then(function (data) { return { ok: r.ok, status: r.status, data: data }; });
      })
      .then(function (res) {
        if (res.ok && res.data.ok) say(res.data.message, true);
        else say("Refused (" + res.status + "): " + (res.data.error || "unknown error"), false);
      })
      .catch(function (err) { say("The action failed: " + err.message, false); })
      .then(function () { button.disabled = false; return refresh(); });
  }

  document.addEventListener("click", function (ev) {
    var el = ev.target.closest ? ev.target.closest("button[data-action]") : null;
    if (el) { ev.preventDefault(); act(el); }
  });

  var form = document.getElementById("token-form");
  if (form) {
    var input = document.getElementById("token");
    var state = document.getElementById("token-state");
    var show = function () {
      if (state) state.textContent = window.sessionStorage.getItem(TOKEN_KEY) ? "token set for this tab" : "no token set";
    };
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var value = input.value.trim();
      if (value) window.sessionStorage.setItem(TOKEN_KEY, value);
      else window.sessionStorage.removeItem(TOKEN_KEY);
      input.value = "";
      show();
    });
    show();
  }

  if (live) window.setInterval(refresh, refreshMs);
})();
