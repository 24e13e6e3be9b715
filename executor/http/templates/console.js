// toolfence console: keeps a page's live region current (decision 0223).
// Every page is complete without this script; with it, the element marked
// data-live="N" is fetched again every N seconds and swapped in place, unless the
// person is working in it (focus inside, or a field they changed). A session that
// ended sends the page to sign in. Same origin only (the CSP allows nothing else).
(function () {
  "use strict";
  var region = document.querySelector("[data-live]");
  if (!region || !window.fetch || !window.DOMParser) { return; }
  var seconds = Math.max(1, parseInt(region.getAttribute("data-live"), 10) || 5);
  var busy = false;

  function working() {
    if (region.contains(document.activeElement) && document.activeElement !== region) {
      return true;
    }
    var fields = region.querySelectorAll("input, textarea, select");
    for (var i = 0; i < fields.length; i++) {
      var f = fields[i];
      if (f.type === "hidden") { continue; }
      if (f.type === "checkbox" || f.type === "radio") {
        if (f.checked !== f.defaultChecked) { return true; }
      } else if (f.value !== f.defaultValue) { return true; }
    }
    return region.querySelector("details[open]") !== null;
  }

  function refresh() {
    if (busy || document.hidden || working()) { return; }
    busy = true;
    fetch(window.location.href, { credentials: "same-origin", headers: { "X-Toolfence-Live": "1" } })
      .then(function (response) {
        if (response.redirected && new URL(response.url).pathname === "/console/login") {
          window.location.assign(response.url);
          return null;
        }
        return response.ok ? response.text() : null;
      })
      .then(function (html) {
        if (html === null || working()) { return; }
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("[data-live]");
        if (fresh && fresh.innerHTML !== region.innerHTML) {
          region.innerHTML = fresh.innerHTML;
          region.setAttribute("data-refreshed", String(Date.now()));
        }
      })
      .catch(function () { /* the next tick tries again */ })
      .then(function () { busy = false; });
  }

  window.setInterval(refresh, seconds * 1000);
})();
