// An explorer's scripts load when the reader comes within a screen of it (book/_ext/
// page_weight.py puts this script, with their addresses in data-scripts, in their place):
// Plotly alone is 1.2 MB, and a reader who never scrolls that far need not load it. They are
// added in their order (Plotly, the frames, minipar-explorer.js), each run before the next;
// the explorer's static picture shows until they have drawn. window.miniparExplorersAskedMs
// is when (performance.now()) the loading began: `make test-html` times the first draw
// from it.
(function () {
  const scripts = document.currentScript.dataset.scripts.split(" ").filter(Boolean);
  let asked = false;

  function load() {
    if (asked) return;
    asked = true;
    window.miniparExplorersAskedMs = performance.now();
    for (const src of scripts) {
      const script = document.createElement("script");
      script.src = src;
      script.async = false;          // run in the order added
      document.head.append(script);
    }
  }

  function watch() {
    const explorers = document.querySelectorAll(".minipar-explorer");
    if (!explorers.length || !("IntersectionObserver" in window)) return load();
    const near = new IntersectionObserver((entries) => {
      if (entries.some((e) => e.isIntersecting)) {
        near.disconnect();
        load();
      }
    }, { rootMargin: "100% 0px 100% 0px" });        // a screen above and below
    explorers.forEach((el) => near.observe(el));
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", watch);
  else watch();
})();
