// The table of contents on a phone, and folding it away on a laptop (added to every page by
// book/_ext/reading.py; `make test-html` checks both at 390 and at 1280 px).
//
// sphinx-book-theme 1.3.0 puts its own ☰ (`.primary-toggle`) and "contents"
// (`.secondary-toggle`) buttons in the article's header, and pydata-sphinx-theme 0.17.1 puts
// a second pair in the page's header. Each theme's script listens on the first button of
// each class in the page (querySelector), the header's, which this layout hides; the buttons
// a reader sees do nothing but show their tooltip (pydata-sphinx-theme #2451,
// sphinx-book-theme #988). Here a click on any other toggle is passed to the first one,
// whose listeners do what the themes meant: open the sidebar as a dialog on a narrow screen,
// fold the left sidebar away on a wide one. The click stops here (capture, on the document,
// before the button's own listeners), so a theme that one day listens on every toggle does
// not get it twice.
(function () {
  const KINDS = [".primary-toggle", ".secondary-toggle"];

  function passOn(event) {
    for (const kind of KINDS) {
      const button = event.target instanceof Element ? event.target.closest(kind) : null;
      const first = document.querySelector(kind);
      if (button && first && button !== first) {
        event.preventDefault();
        event.stopImmediatePropagation();
        button.blur();            // its tooltip would stay over the open sidebar
        first.click();
        return;
      }
    }
  }

  document.addEventListener("click", passOn, true);
})();
