// A figure opens full size on a click or a tap (added to every page by book/_ext/reading.py,
// which links each picture to its file): in a dialog over the page, larger than the page
// shows it: as large as the screen allows, and at least 1.25x the page's size (on a phone,
// larger than the screen: it scrolls, and pinching zooms further). A click, a tap or Escape
// closes it. Without JavaScript the link opens the file itself.
(function () {
  let dialog = null;

  function build() {
    const d = document.createElement("dialog");
    d.className = "minipar-zoom";
    d.setAttribute("aria-label", "Figure, full size");
    const close = document.createElement("button");
    close.type = "button";
    close.textContent = "×";
    close.setAttribute("aria-label", "Close");
    d.append(close, document.createElement("img"));
    d.addEventListener("click", () => d.close());
    // Sphinx's sphinx_highlight.js takes Escape for itself on the document: close here first.
    d.addEventListener("keydown", (event) => {
      if (event.key === "Escape") {
        event.preventDefault();
        event.stopPropagation();
        d.close();
      }
    });
    document.body.append(d);
    return d;
  }

  // The width to show `img` at: the screen's size (keeping its proportions) or 1.25x its
  // width on the page, whichever is larger.
  function fullWidth(img) {
    const w = img.naturalWidth || img.width, h = img.naturalHeight || img.height;
    const fit = Math.min((innerWidth - 32) / w, (innerHeight - 32) / h) * w;
    return Math.max(fit, 1.25 * img.getBoundingClientRect().width);
  }

  function open(link, img) {
    dialog = dialog || build();
    const big = dialog.querySelector("img");
    big.src = link.href;
    big.alt = img.alt;
    big.style.width = fullWidth(img).toFixed(0) + "px";
    dialog.showModal();
  }

  document.addEventListener("click", (event) => {
    if (event.button !== 0 || event.ctrlKey || event.metaKey || event.shiftKey || event.altKey)
      return;                                   // a new tab, as the reader asked
    const link = event.target instanceof Element ? event.target.closest("a.image-reference") : null;
    const img = link && link.querySelector("img");
    if (!img) return;
    event.preventDefault();
    open(link, img);
  });
})();
