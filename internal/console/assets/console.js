// runledger console: the runs page follows the console's watch of the API
// server through Server-Sent Events (/events); a run's page, a schedule's
// and the schedules page their live part (/runs/NS/NAME/live,
// /schedules/NS/NAME/live, /schedules/live); no framework, no CDN.
"use strict";

// countUpdate counts the updates a page applied (the tests read it).
function countUpdate() {
  document.body.dataset.updates = String(Number(document.body.dataset.updates || "0") + 1);
}

// A page with a live part follows it: the server renders that part (a
// run's status, actions, shards, conditions and Events; a schedule's status,
// ticks and runs; the schedules) at each change and sends it here.
(function () {
  const live = document.getElementById("live");
  if (!live || !live.dataset.live || !window.EventSource) {
    return;
  }
  const source = new EventSource(live.dataset.live);
  source.addEventListener("live", function (ev) {
    const msg = JSON.parse(ev.data);
    if (msg.gone) {
      source.close();
      const gone = document.createElement("p");
      gone.className = "error";
      gone.id = "gone";
      gone.setAttribute("role", "alert");
      gone.textContent = msg.gone;
      live.prepend(gone);
      return;
    }
    if (msg.version === live.dataset.version) {
      countUpdate(); // the page shows it already
      return;
    }
    // Keep the keyboard focus on the control it was on.
    const focused = live.contains(document.activeElement) ? document.activeElement.id : "";
    live.innerHTML = msg.html;
    live.dataset.version = msg.version;
    if (focused) {
      const again = document.getElementById(focused);
      if (again) {
        again.focus();
      }
    }
    countUpdate();
  });
})();

(function () {
  const table = document.getElementById("runs");
  if (!table || !table.dataset.live || !window.EventSource) {
    return;
  }
  const tbody = table.tBodies[0];
  const live = document.getElementById("live");
  const errorLine = document.getElementById("runs-error");
  const empty = document.getElementById("no-runs");

  function cell(tr, cls, text) {
    const td = document.createElement("td");
    td.className = cls;
    td.textContent = text;
    tr.appendChild(td);
    return td;
  }

  function row(r) {
    const tr = document.createElement("tr");
    tr.dataset.run = r.namespace + "/" + r.name;
    cell(tr, "ns", r.namespace);
    const name = cell(tr, "name", "");
    const a = document.createElement("a");
    a.href = "/runs/" + encodeURIComponent(r.namespace) + "/" + encodeURIComponent(r.name);
    a.textContent = r.name;
    name.appendChild(a);
    const phase = cell(tr, "phase", "");
    const badge = document.createElement("span");
    badge.className = "badge phase-" + r.phase;
    badge.textContent = r.phase;
    phase.appendChild(badge);
    const progress = cell(tr, "progress", "");
    const bar = document.createElement("progress");
    bar.max = 100;
    bar.value = r.percent;
    bar.textContent = r.percent + "%";
    bar.setAttribute("aria-label", r.percent + "% processed");
    const pct = document.createElement("span");
    pct.className = "pct";
    pct.textContent = r.percent + "%";
    progress.append(bar, " ", pct);
    cell(tr, "num completed", String(r.completed));
    cell(tr, "num already-handled", String(r.alreadyHandled));
    cell(tr, "num failed", String(r.failed));
    cell(tr, "num total", String(r.total));
    cell(tr, "age", r.age);
    const sched = cell(tr, "schedule", "");
    if (r.schedule) {
      const sa = document.createElement("a");
      sa.href = "/schedules/" + encodeURIComponent(r.namespace) + "/" + encodeURIComponent(r.schedule);
      sa.textContent = r.schedule;
      sched.appendChild(sa);
    }
    const queue = cell(tr, "queue", r.queue || "");
    if (r.queue && r.admission) {
      const adm = document.createElement("span");
      adm.className = "admission";
      adm.textContent = r.admission;
      queue.append(": ", adm);
    }
    return tr;
  }

  const source = new EventSource(table.dataset.live);
  source.addEventListener("runs", function (ev) {
    const msg = JSON.parse(ev.data);
    // Keep the keyboard focus on the run it was on.
    const focused = document.activeElement && document.activeElement.closest("tr[data-run]");
    const focusedRun = focused ? focused.dataset.run : null;
    tbody.replaceChildren.apply(tbody, msg.runs.map(row));
    if (focusedRun) {
      const again = tbody.querySelector('tr[data-run="' + CSS.escape(focusedRun) + '"] a');
      if (again) {
        again.focus();
      }
    }
    empty.hidden = msg.runs.length > 0;
    errorLine.hidden = !msg.error;
    errorLine.textContent = msg.error || "";
    live.hidden = false;
    live.classList.remove("stale");
    live.textContent = "live";
    countUpdate();
  });
  source.onerror = function () {
    live.classList.add("stale");
    live.textContent = "reconnecting";
  };
})();
