// fleetrate status page: polls status.json beside this file and renders
// it. Plain DOM, no dependencies; all text is set with textContent.
"use strict";
(function () {
  var timer = null;
  var interval = 1000;

  function $(id) { return document.getElementById(id); }
  function el(tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = text;
    return e;
  }
  function cell(row, text, cls, field) {
    var td = el("td", cls, text);
    if (field) td.dataset.field = field;
    row.appendChild(td);
    return td;
  }
  function rate(x) { return (x || 0).toFixed(1); }
  function dur(ms) {
    if (!ms) return "0";
    if (ms < 1000) return ms.toFixed(0) + " ms";
    var s = ms / 1000;
    if (s < 120) return s.toFixed(1) + " s";
    var m = s / 60;
    if (m < 120) return m.toFixed(1) + " min";
    return (m / 60).toFixed(1) + " h";
  }
  function clear(tbody) { while (tbody.firstChild) tbody.removeChild(tbody.firstChild); }

  function renderBuckets(st) {
    var tbody = $("buckets").tBodies[0];
    clear(tbody);
    st.buckets.forEach(function (b) {
      var tr = el("tr");
      tr.dataset.bucket = b.name;
      cell(tr, b.name, null, "name");
      cell(tr, b.limits.join(", "), "limits", "limits");
      var td = el("td");
      if (b.error) {
        td.className = "err";
        td.textContent = b.error;
      } else {
        var pct = Math.max(0, Math.min(1, b.fill)) * 100;
        var bar = el("div", "bar" + (pct <= 0 ? " empty" : pct < 25 ? " low" : ""));
        bar.setAttribute("role", "meter");
        bar.setAttribute("aria-valuenow", pct.toFixed(0));
        bar.title = pct.toFixed(0) + "% of " + (b.limit ? b.limit + " " : "") + "burst " + b.burst;
        var fill = el("span");
        fill.style.width = pct.toFixed(1) + "%";
        bar.appendChild(fill);
        td.appendChild(bar);
        if (b.in_debt_ms > 0) td.appendChild(el("div", "debt", "in debt " + dur(b.in_debt_ms)));
      }
      td.dataset.field = "fill";
      tr.appendChild(td);
      cell(tr, b.error ? "" : b.remaining + " / " + b.burst, "n", "remaining");
      cell(tr, b.error ? "" : dur(b.time_to_full_ms), "n", "to_full");
      cell(tr, st.counting ? rate(b.decisions_per_s) : "", "n", "decisions_per_s");
      cell(tr, st.counting ? rate(b.denied_per_s) : "", "n", "denied_per_s");
      cell(tr, st.counting ? String(b.decisions) : "", "n", "decisions");
      cell(tr, st.counting ? String(b.denied) : "", "n", "denied");
      tbody.appendChild(tr);
    });
    var other = [];
    if (st.hidden) other.push(st.hidden + " more buckets not shown.");
    if (st.counting && st.totals.other_decisions) {
      other.push("Other buckets (not listed): " + st.totals.other_decisions + " decisions, " +
        st.totals.other_denied + " denied.");
    }
    $("other").textContent = other.join(" ");
  }

  function renderTopDenied(st) {
    var tbody = $("top-denied").tBodies[0];
    clear(tbody);
    $("td-window").textContent = "(last " + Math.round(st.top_denied_window_s) + " s)";
    if (!st.counting) {
      var tr = el("tr");
      cell(tr, "not counted: the page has no Counter", "note").colSpan = 3;
      tbody.appendChild(tr);
      return;
    }
    if (st.top_denied.length === 0) {
      var empty = el("tr");
      cell(empty, "no denials", "note").colSpan = 3;
      tbody.appendChild(empty);
    }
    st.top_denied.forEach(function (k) {
      var tr = el("tr");
      tr.dataset.key = k.key;
      cell(tr, k.key, null, "key");
      cell(tr, k.bucket || "", null, "bucket");
      cell(tr, String(k.denied), "n", "denied");
      tbody.appendChild(tr);
    });
  }

  // effective shows an effective rate with its share of the documented
  // one, e.g. "3.60/s (80 %)"; "" when unknown.
  function effective(rate, documented) {
    if (!rate) return "";
    var s = rate.toFixed(2) + "/s";
    if (documented) s += " (" + Math.round(100 * rate / documented) + " %)";
    return s;
  }

  function renderUpstreams(st) {
    var section = $("upstreams-section");
    section.hidden = st.upstreams.length === 0 && !st.upstream_error;
    var table = $("upstreams");
    table.classList.toggle("hidden-col", !st.has_effective_rate);
    var tbody = table.tBodies[0];
    clear(tbody);
    st.upstreams.forEach(function (u) {
      var tr = el("tr");
      tr.dataset.upstream = u.channel + "/" + u.endpoint;
      cell(tr, u.channel, null, "channel");
      cell(tr, u.endpoint, null, "endpoint");
      if (u.paused_until) {
        var t = new Date(u.paused_until);
        cell(tr, t.toLocaleTimeString() + " (" + dur(u.paused_for_ms) + ")", "paused", "paused_until");
      } else {
        cell(tr, "not paused", null, "paused_until");
      }
      var why = u.reason || "";
      if (u.last_retry_after_ms) why += (why ? "; " : "") + "last Retry-After " + dur(u.last_retry_after_ms);
      cell(tr, why, null, "reason");
      cell(tr, u.rate_limited_per_min < 0 ? "" : u.rate_limited_per_min.toFixed(1), "n", "rate_limited_per_min");
      cell(tr, u.documented_rate ? u.documented_rate + "/s" : "", "n", "documented_rate");
      var eff = effective(u.effective_rate, u.documented_rate);
      var cred = effective(u.credential_effective_rate, u.credential_rate);
      if (cred) eff += (eff ? "; " : "") + "credential " + cred;
      var lowered = (u.effective_rate && u.effective_rate < u.documented_rate) ||
        (u.credential_effective_rate && u.credential_effective_rate < u.credential_rate);
      cell(tr, eff, lowered ? "n eff lowered" : "n eff", "effective_rate");
      var fl = u.in_flight_bound ? (u.in_flight || 0) + " / " + u.in_flight_bound : "";
      if (u.credential_in_flight_bound) fl += (fl ? "; " : "") + "credential " + (u.credential_in_flight || 0) + " / " + u.credential_in_flight_bound;
      cell(tr, fl, "n", "in_flight");
      tbody.appendChild(tr);
    });
    $("upstream-error").textContent = st.upstream_error || "";
  }

  function render(st) {
    document.title = st.title + " status";
    $("title").textContent = st.title;
    $("state").textContent = "live";
    $("state").className = "state live";
    $("updated").textContent = "updated " + new Date(st.at).toLocaleTimeString() +
      (st.rate_window_s ? ", rates over " + st.rate_window_s.toFixed(1) + " s" : "");
    var t = st.totals;
    $("t-dps").textContent = st.counting ? rate(t.decisions_per_s) : "–";
    $("t-nps").textContent = st.counting ? rate(t.denied_per_s) : "–";
    $("t-decisions").textContent = st.counting ? String(t.decisions) : "–";
    $("t-denied").textContent = st.counting ? String(t.denied) : "–";
    $("t-errors").textContent = st.counting ? String(t.errors) : "–";
    renderBuckets(st);
    renderTopDenied(st);
    renderUpstreams(st);
    document.body.dataset.at = st.at;
    if (st.interval_ms > 0) interval = st.interval_ms;
  }

  // The document's URL may carry the Basic credentials a person typed
  // (http://user:token@host/status/); fetch refuses such a URL, and the
  // browser sends the credentials it cached for the page anyway.
  function dataURL() {
    var u = new URL("status.json", location.href);
    u.username = "";
    u.password = "";
    return u.href;
  }

  function poll() {
    fetch(dataURL(), { cache: "no-store", credentials: "same-origin" })
      .then(function (r) {
        if (!r.ok) throw new Error("HTTP " + r.status);
        return r.json();
      })
      .then(render)
      .catch(function (e) {
        $("state").textContent = "disconnected: " + e.message;
        $("state").className = "state down";
      })
      .then(function () { timer = document.hidden ? null : setTimeout(poll, interval); });
  }

  document.addEventListener("visibilitychange", function () {
    // A hidden tab stops polling, so a forgotten tab costs the store nothing.
    if (document.hidden) { clearTimeout(timer); timer = null; }
    else if (timer === null) poll();
  });
  poll();
})();
