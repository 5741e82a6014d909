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

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form[data-bulk]").forEach(updateCount);
    // A portal magic link: post it on at once (a link scanner that only fetches the page
    // does not run this, so it cannot spend the link).
    var enter = document.querySelector("form[data-autosubmit]");
    if (enter) { enter.submit(); }
  });
})();
