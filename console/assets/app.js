// Voyager console: sends the tab's token with every request, loads the
// page's server-rendered view, submits forms, and keeps sessions live from
// the API's event stream. No framework, no build step.
"use strict";
(() => {
  const TOKEN = "voyager.token", WHO = "voyager.who";
  const $ = (s, el = document) => el.querySelector(s);
  const view = $("#view"), signin = $("#signin"), notice = $("#notice");
  const page = document.body.dataset.page;
  let live = new AbortController(); // the current view's streams
  let logs = null;                   // the logs stream's controller

  const token = () => sessionStorage.getItem(TOKEN);
  const auth = () => ({ Authorization: "Bearer " + token() });

  async function problem(r) {
    const t = await r.text();
    try { const p = JSON.parse(t); return p.detail || p.title || t; } catch { return t; }
  }

  function showWho() {
    const who = JSON.parse(sessionStorage.getItem(WHO) || "null");
    $("#who").textContent = who ? "Signed in as " + who.subject + (who.admin ? " (admin)" : "") : "";
    $("#signout").hidden = !who;
    for (const li of document.querySelectorAll("[data-admin-only]")) li.hidden = !(who && who.admin);
  }

  function showSignin(msg) {
    live.abort();
    view.hidden = true;
    signin.hidden = false;
    const err = $("#signin-error");
    err.hidden = !msg;
    err.textContent = msg || "";
    $("#token").focus();
  }

  $("#signin-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    const t = $("#token").value.trim().replace(/^Bearer\s+/i, "");
    const r = await fetch("/api/v1/whoami", { headers: { Authorization: "Bearer " + t } });
    if (!r.ok) { showSignin("The API refused this token: " + await problem(r)); return; }
    const who = await r.json();
    sessionStorage.setItem(TOKEN, t);
    sessionStorage.setItem(WHO, JSON.stringify({ subject: who.subject, admin: who.admin }));
    $("#token").value = "";
    signin.hidden = true;
    view.hidden = false;
    showWho();
    load();
  });

  $("#signout").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN);
    sessionStorage.removeItem(WHO);
    showWho();
    showSignin("");
  });

  // load fetches the page's view and puts it in place.
  async function load() {
    live.abort();
    live = new AbortController();
    const started = performance.now();
    const r = await fetch("/console/view/" + page, { headers: auth() });
    if (r.status === 401) {
      sessionStorage.removeItem(TOKEN);
      sessionStorage.removeItem(WHO);
      showWho();
      showSignin("Please sign in again: " + (await r.text()).replace(/<[^>]*>/g, " ").trim());
      return;
    }
    view.innerHTML = await r.text();
    view.dataset.apiCalls = r.headers.get("X-Voyager-API-Calls") || "";
    view.dataset.status = String(r.status);
    view.setAttribute("aria-busy", "false");
    view.dataset.loads = String(Number(view.dataset.loads || 0) + 1);
    // The benchmark reads when the view was first painted, in ms since
    // the navigation started.
    requestAnimationFrame(() => { view.dataset.painted = String(Math.round(performance.now())); });
    view.dataset.rendered = String(Math.round(performance.now() - started));
    enhance();
  }

  // Forms post through the script so that they carry the token.
  view.addEventListener("submit", async (ev) => {
    const form = ev.target.closest("form.act");
    if (!form) return;
    ev.preventDefault();
    const button = form.querySelector("button[type=submit]");
    if (button) button.disabled = true;
    try {
      const r = await fetch(form.dataset.action, {
        method: "POST",
        headers: { ...auth(), "Content-Type": "application/x-www-form-urlencoded" },
        body: new URLSearchParams(new FormData(form)),
      });
      notice.innerHTML = await r.text();
      if (r.ok) await load();
    } finally {
      if (button) button.disabled = false;
    }
  });

  view.addEventListener("click", (ev) => {
    const b = ev.target.closest("button.logs");
    if (b) openLogs(b.dataset.session);
    if (ev.target.closest("#logs-close")) closeLogs();
  });

  function closeLogs() {
    if (logs) logs.abort();
    logs = null;
    const sec = $("#logs");
    if (sec) sec.hidden = true;
  }

  async function openLogs(id) {
    closeLogs();
    logs = new AbortController();
    const sec = $("#logs"), pre = $("#logs-text");
    sec.hidden = false;
    $("#logs-title").textContent = "Logs of " + id + " (following)";
    pre.textContent = "";
    pre.focus();
    try {
      const r = await fetch("/api/v1/sessions/" + encodeURIComponent(id) + "/logs?follow=true&tail=500", { headers: auth(), signal: logs.signal });
      if (!r.ok) { sec.dataset.state = "failed"; pre.textContent = "No logs yet: " + await problem(r); return; }
      sec.dataset.state = "following";
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        pre.textContent = (pre.textContent + value).slice(-1 << 20);
        pre.scrollTop = pre.scrollHeight;
      }
      sec.dataset.state = "ended";
      $("#logs-title").textContent = "Logs of " + id + " (ended)";
    } catch (e) {
      if (e.name !== "AbortError") pre.textContent += "\n[logs stopped: " + e.message + "]";
    }
  }

  // follow reads a session's Server-Sent Events and updates its row.
  async function follow(row, signal) {
    const id = row.dataset.session;
    const r = await fetch("/api/v1/sessions/" + encodeURIComponent(id) + "/events", { headers: { ...auth(), Accept: "text/event-stream" }, signal });
    if (!r.ok) return;
    const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
    let buf = "", event = "message", data = [];
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += value;
      let i;
      while ((i = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, i);
        buf = buf.slice(i + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length) onEvent(row, event, JSON.parse(data.join("\n")));
          event = "message"; data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const c = line.indexOf(":");
        const field = c < 0 ? line : line.slice(0, c);
        let v = c < 0 ? "" : line.slice(c + 1);
        if (v.startsWith(" ")) v = v.slice(1);
        if (field === "event") event = v; else if (field === "data") data.push(v);
      }
    }
  }

  function onEvent(row, event, e) {
    if (event === "warning" || event === "warning-withdrawn") { load(); return; }
    if (event !== "status") return;
    row.dataset.phase = e.phase;
    const ph = row.querySelector("[data-field=phase]");
    ph.textContent = e.phase;
    ph.className = "phase phase-" + e.phase.toLowerCase();
    const pos = row.querySelector("[data-field=position]");
    if (pos) pos.textContent = e.status.queuePosition ? "(position " + e.status.queuePosition + ")" : "";
    row.querySelector("[data-field=message]").textContent = e.message;
    const urls = e.status.urls || {};
    const cell = row.querySelector("[data-field=jupyter]");
    if (cell.dataset.hub) {
      // A JupyterHub server opens through the hub, whose link the view
      // renders: the container's own URL is outside the hub's base URL.
      // (Rendered Running, a linked one has its link: no reload loop.)
      if (cell.dataset.hub === "link" && e.phase === "Running" && !cell.querySelector("a")) load();
    } else if (urls.jupyter) {
      const a = document.createElement("a");
      a.href = urls.jupyter; a.target = "_blank"; a.rel = "noopener"; a.textContent = "Jupyter";
      cell.replaceChildren(a);
    }
    if (e.terminal) row.classList.add("ended");
  }

  const TERMINAL = new Set(["Succeeded", "Failed", "Stopped"]);
  function enhance() {
    for (const row of view.querySelectorAll("#sessions tr[data-session]")) {
      if (!TERMINAL.has(row.dataset.phase)) follow(row, live.signal).catch(() => {});
    }
  }

  // Cluster and queue views refresh while the tab is visible and no form
  // is being filled in.
  if (page === "cluster" || page === "queue") {
    setInterval(() => {
      if (!document.hidden && token() && !view.contains(document.activeElement)) load();
    }, 15000);
  }

  showWho();
  if (token()) load(); else showSignin("");
})();
