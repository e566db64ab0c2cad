// Pages of running trials refresh themselves: poll a cheap "stamp" every 2 s and, when it
// changes, swap in the re-rendered live part of the page (curves, checkpoints, state).
(function () {
  "use strict";
  var POLL_MS = 2000;
  function root() { return document.getElementById("live"); }
  function tick() {
    var el = root();
    if (!el || el.dataset.active !== "1") { return; }
    fetch(el.dataset.stampUrl, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (data) {
        if (!data || data.stamp === el.dataset.stamp) { return null; }
        return fetch(el.dataset.liveUrl, { credentials: "same-origin", cache: "no-store" })
          .then(function (r) { return r.ok ? r.text() : null; })
          .then(function (html) {
            if (html === null) { return; }
            var holder = document.createElement("div");
            holder.innerHTML = html;
            var fresh = holder.querySelector("#live");
            if (fresh) { el.replaceWith(fresh); }
          });
      })
      .catch(function () { /* the server restarts or the network blinks: try again */ })
      .finally(function () { setTimeout(tick, POLL_MS); });
  }
  setTimeout(tick, POLL_MS);
})();
