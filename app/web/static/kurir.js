// Kurir UI and partner portal: progressive enhancement only — every form works without it.
(function () {
  "use strict";

  function updateCount(form) {
    var boxes = form.querySelectorAll('input[name="ids"]');
    var checked = form.querySelectorAll('input[name="ids"]:checked').length;
    var label = form.querySelector("[data-selected-count]");
    if (label) { label.textContent = checked + " selected"; }
    var all = form.querySelector("[data-select-all]");
    if (all) {
      all.checked = boxes.length > 0 && checked === boxes.length;
      all.indeterminate = checked > 0 && checked < boxes.length;
    }
  }

  document.addEventListener("change", function (event) {
    var target = event.target;
    var form = target.form;
    if (!form || !form.hasAttribute("data-bulk")) { return; }
    if (target.hasAttribute("data-select-all")) {
      form.querySelectorAll('input[name="ids"]').forEach(function (box) {
        box.checked = target.checked;
      });
    }
    updateCount(form);
  });

  document.addEventListener("click", function (event) {
    var copy = event.target.closest("[data-copy]");
    if (copy) {
      var source = document.querySelector(copy.getAttribute("data-copy"));
      if (source && navigator.clipboard) {
        navigator.clipboard.writeText(source.textContent.trim()).then(function () {
          copy.textContent = "Copied";
        });
      }
      return;
    }
    var button = event.target.closest("[data-confirm]");
    if (button && !window.confirm(button.getAttribute("data-confirm"))) {
      event.preventDefault();
    }
  });

  function pad(n) { return (n < 10 ? "0" : "") + n; }

  function localWall(date) {
    return date.getFullYear() + "-" + pad(date.getMonth() + 1) + "-" + pad(date.getDate()) +
      "T" + pad(date.getHours()) + ":" + pad(date.getMinutes()) + ":" + pad(date.getSeconds());
  }

  function zoneName() {
    try { return Intl.DateTimeFormat().resolvedOptions().timeZone || "local time"; }
    catch (e) { return "local time"; }
  }

  // Times: absolute ones in the reader's own zone; time filters typed in it too (the
  // form sends the offset, and the server turns the values back into UTC).
  function localTimes() {
    var zone = zoneName();
    document.querySelectorAll("[data-local]").forEach(function (el) {
      var date = new Date(el.getAttribute("data-local"));
      if (!isNaN(date)) { el.textContent = localWall(date).replace("T", " ") + " " + zone; }
    });
    document.querySelectorAll("input[data-utc]").forEach(function (input) {
      if (input.value) {
        var date = new Date(input.value + "Z");
        if (!isNaN(date)) { input.value = localWall(date); }
      }
    });
    document.querySelectorAll("input[data-tz]").forEach(function (input) {
      input.value = String(new Date().getTimezoneOffset());
    });
    document.querySelectorAll("[data-tz-label]").forEach(function (el) {
      el.textContent = "(" + zone + ")";
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    localTimes();
    // A form sent back with errors: its summary, at the top, gets the focus.
    var summary = document.querySelector("[data-error-summary]");
    if (summary) { summary.focus(); }
    document.querySelectorAll("form[data-bulk]").forEach(updateCount);
    // A portal magic link: post it on at once (a link scanner that only fetches the page
    // does not run this, so it cannot spend the link).
    var enter = document.querySelector("form[data-autosubmit]");
    if (enter) { enter.submit(); }
  });
})();
