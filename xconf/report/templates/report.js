(function () {
  var errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message || e)); }, true);
  var original = console.error;
  console.error = function () {
    errors.push(Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
  function cellValue(row, col, numeric) {
    var cell = row.cells[col];
    var v = cell.getAttribute("data-v");
    if (v === null) { v = cell.textContent.trim(); }
    return numeric ? parseFloat(v) : v.toLowerCase();
  }
  function sortBy(table, th, direction) {
    var col = th.cellIndex, numeric = th.getAttribute("data-type") === "num";
    var asc = direction ? direction === "asc" : th.getAttribute("aria-sort") !== "ascending";
    var body = table.tBodies[0];
    var rows = Array.prototype.slice.call(body.rows);
    var pinned = rows.filter(function (r) { return r.classList.contains("pinned"); });
    var rest = rows.filter(function (r) { return !r.classList.contains("pinned"); });
    rest.sort(function (a, b) {
      var x = cellValue(a, col, numeric), y = cellValue(b, col, numeric);
      var c = x < y ? -1 : (x > y ? 1 : 0);
      return asc ? c : -c;
    });
    Array.prototype.forEach.call(th.parentNode.cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    pinned.concat(rest).forEach(function (r) { body.appendChild(r); });
  }
  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("table.sortable").forEach(function (table) {
      table.tHead.querySelectorAll("th").forEach(function (th) {
        th.addEventListener("click", function () { sortBy(table, th); });
      });
    });
    // A link may carry a sort: #sort=<table id>:<column index>:<asc|desc>
    var wanted = /^#sort=([\w-]+):(\d+):(asc|desc)$/.exec(window.location.hash);
    var table = wanted && document.getElementById(wanted[1]);
    if (table && table.tHead.rows[0].cells[+wanted[2]]) {
      sortBy(table, table.tHead.rows[0].cells[+wanted[2]], wanted[3]);
    }
  });
  window.addEventListener("load", function () {
    var images = document.images, ok = 0;
    for (var i = 0; i < images.length; i++) {
      if (images[i].complete && images[i].naturalWidth > 0) { ok++; }
    }
    document.body.setAttribute("data-images-loaded", ok + "/" + images.length);
    document.body.setAttribute("data-console-errors", String(errors.length));
    document.body.setAttribute("data-report-ready", "1");
  });
})();
