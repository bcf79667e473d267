/**
 * The console's page script, served as /console/dashboard.js and type-checked by
 * `npm run typecheck` (JSDoc types, tsconfig.json beside it). It does four things:
 *
 * - keeps the API token for this tab: the demo hands it over once in the URL's fragment
 *   (`#token=…`, never sent to the server, removed from the address bar at once); otherwise the
 *   buttons ask for it the first time;
 * - sends the buttons' POSTs (Run now, Dry run, Pause, Resume) and says what came back;
 * - writes every time in one format (`2026-11-25 17:56:00 UTC`, as views/Time.ts and the CLI do),
 *   with the viewer's local time in the tooltip;
 * - patches the page from the shared `/api/stream`: each `page` event carries the changed cards'
 *   HTML, so a change costs the server nothing per tab. A batch page re-reads its history only when
 *   its own batch finished a run, from `/batches/:name/live`, which the server renders once per run.
 */
// @ts-check
;(function() {
  const TOKEN_KEY = "sweeper-token"

  /** @param {string} text @param {boolean} [bad] */
  function flash(text, bad) {
    const f = document.getElementById("flash")
    if (f) {
      f.textContent = text
      f.className = bad ? "bad" : ""
    }
  }

  /** The token the demo passed in the fragment, kept for the tab and taken out of the address bar. */
  function takeTokenFromFragment() {
    const match = /(?:^#|&)token=([^&]+)/.exec(location.hash)
    if (match === null) return
    sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(match[1] ?? ""))
    history.replaceState(null, "", location.pathname + location.search)
  }

  /** @returns {string | null} */
  function token() {
    let t = sessionStorage.getItem(TOKEN_KEY)
    if (!t) {
      t = window.prompt("API token (SWEEPER_API_TOKEN)")
      if (t) sessionStorage.setItem(TOKEN_KEY, t)
    }
    return t
  }

  /** @param {number} n */
  const pad = (n) => String(n).padStart(2, "0")

  /**
   * The one date format; `utc` false gives the viewer's local time in the same shape.
   * @param {Date} d
   * @param {boolean} utc
   */
  function format(d, utc) {
    const parts = utc
      ? [d.getUTCFullYear(), d.getUTCMonth() + 1, d.getUTCDate(), d.getUTCHours(), d.getUTCMinutes(), d.getUTCSeconds()]
      : [d.getFullYear(), d.getMonth() + 1, d.getDate(), d.getHours(), d.getMinutes(), d.getSeconds()]
    const [y, mo, da, h, mi, s] = parts
    const date = `${y}-${pad(mo)}-${pad(da)} ${pad(h)}:${pad(mi)}:${pad(s)}`
    if (utc) return `${date} UTC`
    const offset = -d.getTimezoneOffset()
    const sign = offset < 0 ? "−" : "+"
    return `${date} local (UTC${sign}${pad(Math.floor(Math.abs(offset) / 60))}:${pad(Math.abs(offset) % 60)})`
  }

  /** @param {number} ms */
  function ago(ms) {
    const s = Math.max(0, Math.round(ms / 1000))
    if (s < 120) return `${s}s ago`
    if (s < 7200) return `${Math.round(s / 60)}m ago`
    if (s < 172800) return `${Math.round(s / 3600)}h ago`
    return `${Math.round(s / 86400)}d ago`
  }

  /** @param {ParentNode} root */
  function localize(root) {
    root.querySelectorAll("time[datetime]").forEach((el) => {
      const d = new Date(el.getAttribute("datetime") ?? "")
      if (Number.isNaN(d.getTime())) return
      if (el.getAttribute("data-mode") === "ago") el.textContent = ago(Date.now() - d.getTime())
      else el.textContent = format(d, true)
      el.setAttribute("title", `${format(d, true)} · ${format(d, false)}`)
    })
  }

  /**
   * What a run's answer says, one line.
   * @param {string} batch
   * @param {{outcome?: string, dryRun?: boolean, targetsTotal?: number, targets?: Array<string>, error?: string}} j
   */
  function outcomeLine(batch, j) {
    let text = `${batch} ${j.outcome}`
    if (j.dryRun) {
      let would = ""
      if (j.targetsTotal !== undefined) {
        const listed = j.targets && j.targets.length ? `: ${j.targets.slice(0, 10).join(", ")}` : ""
        would = `, would change ${j.targetsTotal}${listed}${j.targetsTotal > 10 ? ", …" : ""}`
      }
      text += ` (dry run${would})`
    }
    return j.error ? `${text}: ${j.error}` : text
  }

  /** @param {HTMLButtonElement} button */
  async function act(button) {
    const batch = button.getAttribute("data-batch") ?? ""
    const action = button.getAttribute("data-action") ?? ""
    const t = token()
    if (!t) {
      flash("No token given; nothing done.", true)
      return
    }
    const path = `/api/batches/${encodeURIComponent(batch)}/${action === "dry-run" ? "run" : action}`
    const body = action === "dry-run" ? JSON.stringify({ dryRun: true }) : action === "run" ? "{}" : undefined
    const doing = { "dry-run": "Dry run of ", run: "Running ", pause: "Pausing " }[action] ?? "Resuming "
    button.disabled = true
    flash(`${doing}${batch}…`)
    try {
      /** @type {RequestInit} */
      const init = {
        method: "POST",
        headers: { authorization: `Bearer ${t}`, "content-type": "application/json", "x-sweeper-actor": "dashboard" }
      }
      if (body !== undefined) init.body = body
      const r = await fetch(path, init)
      const j = await r.json()
      if (!r.ok) {
        if (r.status === 401) sessionStorage.removeItem(TOKEN_KEY)
        flash(`${batch}: ${j.error ? j.error.message : r.status}`, true)
      } else if (j.outcome) {
        flash(outcomeLine(batch, j), j.outcome === "failed" || j.outcome === "timed_out")
      } else {
        flash(`${batch} ${action === "pause" ? "paused" : "resumed"}`)
      }
    } catch (err) {
      flash(String(err), true)
    } finally {
      button.disabled = false
    }
  }

  /** @param {string} html @returns {Element | null} */
  function fragment(html) {
    const template = document.createElement("template")
    template.innerHTML = html.trim()
    return template.content.firstElementChild
  }

  /**
   * Re-reads the batch page's history and runs (only when its batch finished a run): a fragment the
   * server renders once per run for every open tab of the page.
   */
  async function reloadHistory() {
    try {
      const r = await fetch(`${location.pathname.replace(/\/$/, "")}/live${location.search}`)
      if (!r.ok) return
      const template = document.createElement("template")
      template.innerHTML = await r.text()
      for (const selector of ["#history", "section.runs"]) {
        const next = template.content.querySelector(selector)
        const cur = document.querySelector(selector)
        if (next && cur) {
          cur.replaceWith(next)
          localize(next)
        }
      }
    } catch {
      // The next finished run tries again.
    }
  }

  /**
   * Replaces each card the event carries, and the holds banner on the overview.
   * @param {{cards: Record<string, string>, holds: string}} data
   */
  function patch(data) {
    let ranOnThisPage = false
    for (const [name, html] of Object.entries(data.cards)) {
      const cur = document.querySelector(`section.card[data-batch="${CSS.escape(name)}"]`)
      if (cur === null || cur.outerHTML === html) continue
      const next = fragment(html)
      if (next === null) continue
      const before = cur.getAttribute("data-last-run")
      cur.replaceWith(next)
      localize(next)
      if (document.body.hasAttribute("data-batch-page") && before !== next.getAttribute("data-last-run")) {
        ranOnThisPage = true
      }
    }
    const live = document.querySelector("[data-live][data-overview]")
    if (live !== null) {
      const banner = document.getElementById("holds")
      const next = data.holds === "" ? null : fragment(data.holds)
      if (banner !== null && next === null) banner.remove()
      else if (banner !== null && next !== null) banner.replaceWith(next)
      else if (next !== null) live.prepend(next)
    }
    if (ranOnThisPage) void reloadHistory()
  }

  takeTokenFromFragment()
  document.addEventListener("click", (ev) => {
    const target = /** @type {Element | null} */ (ev.target)
    const b = target?.closest("button[data-action]")
    if (b instanceof HTMLButtonElement) {
      ev.preventDefault()
      void act(b)
    }
  })
  localize(document)
  setInterval(() => localize(document), 15000)
  // Only a page with cards listens: a run page has nothing the stream changes.
  if (window.EventSource && document.querySelector("section.card[data-batch]") !== null) {
    const es = new EventSource("/api/stream")
    es.addEventListener("page", (ev) => patch(JSON.parse(/** @type {MessageEvent<string>} */ (ev).data)))
  }
})()
