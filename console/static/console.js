// The console's only script: countdowns, and live updates of the main
// part of the page from the server's change events. Every form works
// without it.
(function () {
  "use strict";
  const main = document.getElementById("main");
  if (!main) return;

  function fmt(s) {
    if (s < 60) return s + "s";
    if (s < 3600) return Math.floor(s / 60) + "m " + (s % 60) + "s";
    return Math.floor(s / 3600) + "h " + Math.floor((s % 3600) / 60) + "m";
  }
  function tick() {
    document.querySelectorAll("time[data-countdown]").forEach(function (el) {
      const d = Math.round((Date.parse(el.getAttribute("datetime")) - Date.now()) / 1000);
      el.textContent = d >= 0 ? "in " + fmt(d) : "passed " + fmt(-d) + " ago";
      el.classList.toggle("late", d < 60);
    });
  }
  function counts() {
    const c = main.querySelector("[data-counts]");
    if (!c) return;
    document.querySelectorAll("[data-count]").forEach(function (b) {
      b.textContent = c.dataset[b.dataset.count];
    });
  }
  tick();
  setInterval(tick, 1000);

  const live = main.dataset.live;
  if (!live || !window.EventSource) return;
  const banner = document.getElementById("updates");

  function relevant(topic) {
    if (topic === "all") return true;
    if (live === "runs") return topic.indexOf("run:") === 0;
    return topic === live;
  }
  // A person is busy when they are typing into, or have ticked something
  // in, a form that acts: replacing it would lose their work.
  function busy() {
    const forms = Array.prototype.slice.call(main.querySelectorAll('form[method="post"]'));
    return forms.some(function (f) {
      if (f.contains(document.activeElement) && document.activeElement.matches("input, textarea, select")) return true;
      return Array.prototype.some.call(f.querySelectorAll("input"), function (i) {
        return (i.type === "checkbox" && i.checked) || (i.type === "text" && i.value !== "");
      });
    });
  }
  let timer = null;
  let inflight = false;
  let again = false;
  async function refresh(force) {
    if (!force && busy()) {
      banner.hidden = false;
      return;
    }
    if (inflight) {
      again = true;
      return;
    }
    inflight = true;
    try {
      const r = await fetch(location.href, { headers: { "X-Console-Fragment": "1" }, credentials: "same-origin" });
      if (r.ok) {
        const html = await r.text();
        // They may have begun typing while the page was fetched.
        if (!force && busy()) {
          banner.hidden = false;
          return;
        }
        const focused = main.contains(document.activeElement) ? document.activeElement.id : "";
        main.innerHTML = html;
        if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
        banner.hidden = true;
        counts();
        tick();
        main.dispatchEvent(new CustomEvent("console:updated", { bubbles: true }));
      } else {
        banner.hidden = false; // not fetched: offer it again
      }
    } catch (e) {
      banner.hidden = false;
    } finally {
      inflight = false;
      if (again) {
        again = false;
        refresh(false);
      }
    }
  }
  document.getElementById("show-updates").addEventListener("click", function () {
    refresh(true);
  });
  // The stream starts from what the page has seen: a notice it missed
  // comes at once, and none reloads a page that is current.
  const es = new EventSource("/events?since=" + encodeURIComponent(main.dataset.since || "0"));
  es.addEventListener("change", function (e) {
    if (!relevant(e.data)) return;
    clearTimeout(timer);
    timer = setTimeout(function () {
      refresh(false);
    }, 100);
  });
  es.addEventListener("open", function () {
    document.documentElement.dataset.live = "connected";
  });
})();
